//! `headroom-replica`: an emulated vLLM replica (OpenAI API, vLLM metrics, faults).
//!
//! Prints `headroom-replica listening on http://ADDR` on stdout once bound (with
//! `--listen 127.0.0.1:0` the line names the chosen port), then serves until
//! SIGINT or SIGTERM.

use anyhow::Context;
use clap::Parser;
use headroom_engine::Profile;
use headroom_replica::faults::Faults;
use headroom_replica::{ReplicaConfig, serve};
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(
    name = "headroom-replica",
    version,
    about = "Emulated vLLM replica paced by Headroom's engine model"
)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8001")]
    listen: String,
    /// Served model name.
    #[arg(long, default_value = "llama-3-8b")]
    model: String,
    /// Hardware/model profile (see --list-profiles).
    #[arg(long, default_value = "h100-llama3-8b")]
    profile: String,
    /// Engine profile file (TOML, or JSON by extension) overriding the profile's
    /// constants: a replica that runs slower or faster than its published profile.
    #[arg(long)]
    profile_file: Option<std::path::PathBuf>,
    /// Tokens per streamed chunk (vLLM's --stream-interval; default: the profile's, 1).
    #[arg(long)]
    stream_interval: Option<u32>,
    /// Print the profile names and exit.
    #[arg(long)]
    list_profiles: bool,
    /// Wall seconds per modelled second: 1.0 = real GPU speed, 0.1 = ten times faster.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Seed for output lengths, text, fault draws and step noise.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Override the profile's max_model_len.
    #[arg(long)]
    max_model_len: Option<u32>,
    /// Override the profile's num_gpu_blocks (KV capacity, incl. the null block).
    #[arg(long)]
    num_gpu_blocks: Option<u32>,
    /// Override the profile's per-step token budget.
    #[arg(long)]
    max_num_batched_tokens: Option<u32>,
    /// Override the profile's running-request cap.
    #[arg(long)]
    max_num_seqs: Option<u32>,
    /// Serve a LoRA adapter of this name on top of the model (repeatable).
    #[arg(long = "lora")]
    loras: Vec<String>,
    /// Step-time noise: log-sd of a mean-1 lognormal factor (0 = off, for exactness).
    /// Default: the profile file's, else 0.05 (bench/CALIBRATION.md, "Step noise").
    #[arg(long)]
    step_noise: Option<f64>,
    /// Fault: probability that a request gets HTTP 500 before any byte.
    #[arg(long, default_value_t = 0.0)]
    error_rate: f64,
    /// Fault: start with the engine stalled (no steps; /health hangs).
    #[arg(long)]
    stall: bool,
    /// Fault: multiply every step duration by this factor.
    #[arg(long, default_value_t = 1.0)]
    slowdown: f64,
    /// Fault: probability that a request fails mid-generation.
    #[arg(long, default_value_t = 0.0)]
    midstream_error_rate: f64,
    /// Publish vLLM KV events (BlockStored/BlockRemoved, ZMQ PUB) bound here, e.g.
    /// `tcp://127.0.0.1:5557`; `/kv_event_sources` then describes the publisher.
    #[arg(long)]
    kv_events_endpoint: Option<String>,
    /// The KV events' replay endpoint (ZMQ ROUTER), bound here.
    #[arg(long, requires = "kv_events_endpoint")]
    kv_events_replay_endpoint: Option<String>,
    /// Topic of the KV events.
    #[arg(long, default_value = "")]
    kv_events_topic: String,
    /// Batches the replay endpoint keeps (vLLM's buffer_steps).
    #[arg(long, default_value_t = 10_000)]
    kv_events_buffer_steps: usize,
    /// Part in disaggregated serving: `prefill` (answers vLLM NixlConnector
    /// `do_remote_decode` requests with `kv_transfer_params`), `decode` (takes them
    /// back and pulls the KV instead of prefilling) or `both`.
    #[arg(long, default_value = "both")]
    role: headroom_core::view::Role,
    /// KV cache bytes per token of the served model (K and V, all layers).
    #[arg(long, default_value_t = 131_072.0)]
    kv_bytes_per_token: f64,
    /// P→D link bandwidth for KV transfers (GB/s).
    #[arg(long, default_value_t = 10.0)]
    transfer_gbytes_per_s: f64,
    /// P→D link latency for KV transfers (ms).
    #[arg(long, default_value_t = 1.0)]
    transfer_latency_ms: f64,
}

fn config(args: &Args) -> anyhow::Result<ReplicaConfig> {
    let (mut profile, file_noise) = match &args.profile_file {
        Some(path) => {
            let (p, f) = Profile::from_file(path, &args.profile)?;
            (p, f.step_noise)
        }
        None => (Profile::by_name(&args.profile)?, None),
    };
    if let Some(v) = args.stream_interval {
        profile.stream_interval = v;
    }
    if let Some(v) = args.max_model_len {
        profile.max_model_len = v;
    }
    if let Some(v) = args.num_gpu_blocks {
        profile.num_gpu_blocks = v;
    }
    if let Some(v) = args.max_num_batched_tokens {
        profile.max_num_batched_tokens = v;
    }
    if let Some(v) = args.max_num_seqs {
        profile.max_num_seqs = v;
    }
    let cfg = ReplicaConfig {
        model: args.model.clone(),
        adapters: args.loras.clone(),
        profile,
        time_scale: args.time_scale,
        seed: args.seed,
        step_noise: args
            .step_noise
            .or(file_noise)
            .unwrap_or(headroom_engine::DEFAULT_STEP_NOISE),
        faults: Faults {
            error_rate: args.error_rate,
            stall: args.stall,
            slowdown: args.slowdown,
            midstream_error_rate: args.midstream_error_rate,
        },
        kv_events: args.kv_events_endpoint.as_ref().map(|e| {
            headroom_replica::kv_events::KvEventsOptions {
                endpoint: e.clone(),
                replay_endpoint: args.kv_events_replay_endpoint.clone(),
                topic: args.kv_events_topic.clone(),
                buffer_steps: args.kv_events_buffer_steps,
            }
        }),
        pd: headroom_replica::pd::PdEmulation {
            role: args.role,
            kv_bytes_per_token: args.kv_bytes_per_token,
            transfer_gbytes_per_s: args.transfer_gbytes_per_s,
            transfer_latency_ms: args.transfer_latency_ms,
        },
    };
    cfg.validate()?;
    Ok(cfg)
}

async fn shutdown_signal(cancel: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!("no SIGTERM handler: {e}");
                    let _ = ctrl_c.await;
                    cancel.cancel();
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
            _ = cancel.cancelled() => {},
        }
    }
    #[cfg(not(unix))]
    {
        tokio::select! {
            _ = ctrl_c => {},
            _ = cancel.cancelled() => {},
        }
    }
    cancel.cancel();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    if args.list_profiles {
        for name in Profile::names() {
            let p = Profile::by_name(name)?;
            println!("{name}\t{}", p.summary);
        }
        return Ok(());
    }
    let cfg = config(&args)?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    println!("headroom-replica listening on http://{addr}");
    tracing::info!(
        model = %cfg.model, profile = %cfg.profile.name, time_scale = cfg.time_scale,
        "serving"
    );
    let cancel = CancellationToken::new();
    let signals = tokio::spawn(shutdown_signal(cancel.clone()));
    let result = serve(cfg, listener, cancel.clone()).await;
    cancel.cancel();
    let _ = signals.await;
    result.context("replica failed")
}
