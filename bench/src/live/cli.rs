//! Command-line front ends of `headroom-bench live` and `headroom-bench
//! proxy-overhead`, kept in the library so the binary only declares the subcommands:
//!
//! ```ignore
//! Live(headroom_bench::live::cli::LiveArgs),
//! ProxyOverhead(headroom_bench::live::cli::OverheadArgs),
//! …
//! Cmd::Live(a) => headroom_bench::live::cli::live(a),
//! Cmd::ProxyOverhead(a) => headroom_bench::live::cli::proxy_overhead(a),
//! ```
//!
//! `live` writes into `--out`: `run-<system>.json` (the `RunResult`, as the simulator
//! produces), `live-<system>.json` (the [`LiveRun`]: that `RunResult` plus router
//! CPU/RSS, send lag, failures), then rebuilds from every
//! `live-*.json` in the directory `side_by_side.md` (attainment, TTFT/TPOT p50/p95,
//! router CPU and RSS per system) and the common report (`report.md`, `report.json`,
//! plots). Running `live` several times into one directory — our policies, then
//! `--target` runs against peer routers — therefore builds one side-by-side table.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::orchestrate::{LiveMode, LiveOptions, LiveRun, SpawnOptions, run_live};
use super::overhead::{OverheadOptions, OverheadTarget};
use super::table::{Table, num};
use crate::report::{PolicyReport, Report, RunSummary, write_report};
use crate::sim::config::parse_fleet;
use crate::workload::{SloRule, Workload};

/// The fleet `live` starts by default: `headroom up`'s (2×H100, A100, L4 classes).
pub const DEFAULT_LIVE_FLEET: &str = "h100-llama3-8b:2,a100-llama3-8b:1,l4-llama3-8b:1";

#[derive(Args, Debug, Clone)]
pub struct LiveArgs {
    /// Workload: a JSONL/CSV trace, or a generator spec (`poisson:…`, `incident:…`).
    #[arg(long)]
    pub workload: String,
    /// Fleet to start: `profile:count,…`.
    #[arg(long, default_value = DEFAULT_LIVE_FLEET)]
    pub fleet: String,
    /// Router nodes to start.
    #[arg(long, default_value_t = 1)]
    pub routers: u32,
    /// Router policies, comma-separated: each runs on a fresh fleet, one after another.
    #[arg(long, default_value = "slo")]
    pub policy: String,
    /// Drive this existing endpoint instead of starting anything (repeatable: requests
    /// are spread over them).
    #[arg(long)]
    pub target: Vec<String>,
    /// Name of the system behind `--target` in results.
    #[arg(long, default_value = "target")]
    pub label: String,
    /// PIDs of the `--target` router processes, for CPU and RSS (repeatable).
    #[arg(long = "target-pid")]
    pub target_pids: Vec<u32>,
    /// Wall seconds per model second; the emulators run at the same scale.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Arrival-rate multiplier.
    #[arg(long, default_value_t = 1.0)]
    pub rate_scale: f64,
    /// Objectives for requests without them: a preset or rule (`SloRule::parse`).
    /// Default: by trace name.
    #[arg(long)]
    pub slo: Option<String>,
    /// Use only the first N requests.
    #[arg(long)]
    pub limit: Option<usize>,
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    /// `--target` mode: the servers' context window, so `max_tokens` stays valid.
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// Fold prompt token ids below this: a real model's vocabulary size.
    #[arg(long)]
    pub vocab: Option<u32>,
    /// Send prompts as text (one common word per token id) instead of token ids: for
    /// routers that accept only string prompts (sglang-router).
    #[arg(long)]
    pub text_prompts: bool,
    /// Most requests in flight at once (the load generator's task pool).
    #[arg(long, default_value_t = 1024)]
    pub max_inflight: usize,
    /// Wall seconds before a request is abandoned.
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout_s: f64,
    /// Requests arriving in the first this many model seconds are sent (the routers
    /// learn from them) but not scored.
    #[arg(long, default_value_t = 0.0)]
    pub warmup_s: f64,
    /// Model seconds between load samples (0 = none).
    #[arg(long, default_value_t = 1.0)]
    pub load_sample_s: f64,
    /// Emulator step-time noise (lognormal log-sd; 0 = off).
    #[arg(long, default_value_t = headroom_engine::DEFAULT_STEP_NOISE)]
    pub step_noise: f64,
    /// Extra argument for every `headroom serve` (repeatable).
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
    /// Directory of `headroom` and `headroom-replica` (default: next to this binary).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub out: PathBuf,
}

fn slug(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    if s.is_empty() { "run".into() } else { s }
}

fn options(a: &LiveArgs, wl: &Workload, mode: LiveMode) -> LiveOptions {
    LiveOptions {
        model: a.model.clone(),
        time_scale: a.time_scale,
        rate_scale: a.rate_scale,
        seed: a.seed,
        max_inflight: a.max_inflight,
        request_timeout: Duration::from_secs_f64(a.request_timeout_s.max(0.001)),
        load_sample_interval_s: a.load_sample_s,
        log_dir: Some(a.out.join("logs")),
        max_model_len: a.max_model_len,
        vocab: a.vocab,
        prompt_form: if a.text_prompts {
            super::body::PromptForm::Text
        } else {
            super::body::PromptForm::Ids
        },
        ..LiveOptions::new(wl.clone(), mode)
    }
}

/// `headroom-bench live`.
pub fn live(a: LiveArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    rt.block_on(live_async(a))
}

async fn live_async(a: LiveArgs) -> anyhow::Result<()> {
    let mut wl =
        Workload::from_spec(&a.workload).with_context(|| format!("workload {}", a.workload))?;
    if let Some(n) = a.limit {
        wl.requests.truncate(n);
    }
    let rule = match &a.slo {
        Some(s) => SloRule::parse(s)?,
        None => SloRule::for_trace(&wl.name),
    };
    let wl = wl.with_slo(&rule);
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut runs: Vec<(String, LiveMode)> = Vec::new();
    if a.target.is_empty() {
        let fleet = parse_fleet(&a.fleet).map_err(anyhow::Error::msg)?;
        for p in a.policy.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            runs.push((
                p.to_string(),
                LiveMode::Spawn(SpawnOptions {
                    fleet: fleet.clone(),
                    routers: a.routers,
                    policy: p.to_string(),
                    bin_dir: a.bin_dir.clone(),
                    serve_args: a.serve_args.clone(),
                    step_noise: a.step_noise,
                }),
            ));
        }
    } else {
        runs.push((
            a.label.clone(),
            LiveMode::Target {
                urls: a.target.clone(),
                label: a.label.clone(),
                pids: a.target_pids.clone(),
            },
        ));
    }
    for (name, mode) in runs {
        eprintln!("live: {name} on {} requests …", wl.requests.len());
        anyhow::ensure!(
            a.warmup_s.is_finite() && a.warmup_s >= 0.0,
            "--warmup-s must be a non-negative number of seconds"
        );
        let mut run = run_live(options(&a, &wl, mode)).await?;
        run.warmup_s = a.warmup_s;
        if run.max_send_lag_s > 0.05 {
            eprintln!(
                "warning: sends fell up to {:.0} ms behind schedule (raise --max-inflight?)",
                run.max_send_lag_s * 1e3
            );
        }
        let path = a.out.join(format!("live-{}.json", slug(&name)));
        std::fs::write(&path, serde_json::to_string_pretty(&run)?)
            .with_context(|| format!("writing {}", path.display()))?;
        let plain = a.out.join(format!("run-{}.json", slug(&name)));
        std::fs::write(&plain, serde_json::to_string_pretty(&run.scored())?)
            .with_context(|| format!("writing {}", plain.display()))?;
        eprintln!("wrote {} and {}", path.display(), plain.display());
    }
    let all = load_runs(&a.out)?;
    let table = side_by_side(&all);
    let md = format!(
        "# Live runs side by side\n\nworkload `{}`, time scale {}, rate scale {}; latencies \
         in model ms (wall ÷ time scale); router CPU = all router processes over the \
         replay, background work included (\"net of idle\" subtracts the idle rate \
         measured just before)\n\n{}",
        a.workload,
        a.time_scale,
        a.rate_scale,
        table.to_markdown()
    );
    std::fs::write(a.out.join("side_by_side.md"), &md)?;
    println!("{md}");
    let mut settings = BTreeMap::new();
    settings.insert("mode".into(), "live (real processes on loopback)".into());
    settings.insert("workload".into(), a.workload.clone());
    settings.insert("time_scale".into(), a.time_scale.to_string());
    settings.insert("rate_scale".into(), a.rate_scale.to_string());
    settings.insert("fleet".into(), a.fleet.clone());
    settings.insert("routers".into(), a.routers.to_string());
    let report = Report {
        title: format!("Headroom live: {}", wl.name),
        settings,
        policies: all
            .into_iter()
            .map(|r| PolicyReport::new(r.scored(), None))
            .collect(),
    };
    let files = write_report(&a.out, &report)?;
    eprintln!("wrote {}", files.markdown.display());
    Ok(())
}

/// Every `live-*.json` in `dir`, by file name.
pub fn load_runs(dir: &Path) -> anyhow::Result<Vec<LiveRun>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("live-") && n.ends_with(".json"))
        })
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p)?;
            serde_json::from_str(&text).with_context(|| format!("reading {}", p.display()))
        })
        .collect()
}

/// One row per run: attainment, latencies (model ms), router CPU and memory.
pub fn side_by_side(runs: &[LiveRun]) -> Table {
    let mut t = Table::new(&[
        "system",
        "requests",
        "failed",
        "attainment",
        "TTFT p50 ms",
        "TTFT p95 ms",
        "TPOT p50 ms",
        "TPOT p95 ms",
        "router CPU s",
        "router CPU ms/req",
        "net of idle ms/req",
        "router peak RSS MiB",
    ]);
    for r in runs {
        let s = RunSummary::of(&r.scored());
        let cpu: f64 = r.routers.iter().map(|u| u.cpu_s).sum();
        let rss: f64 = r.routers.iter().map(|u| u.peak_rss_mib).sum();
        let has = !r.routers.is_empty();
        t.push(vec![
            r.result.policy.clone(),
            s.requests.to_string(),
            r.failed.to_string(),
            format!("{:.1}%", s.attainment * 100.0),
            num(s.ttft_ms.map(|p| p.p50), 1),
            num(s.ttft_ms.map(|p| p.p95), 1),
            num(s.tpot_ms.map(|p| p.p50), 2),
            num(s.tpot_ms.map(|p| p.p95), 2),
            num(has.then_some(cpu), 2),
            num(r.router_cpu_ms_per_request(), 3),
            num(r.router_net_cpu_ms_per_request(), 3),
            num(has.then_some(rss), 1),
        ]);
    }
    t
}

#[derive(Args, Debug, Clone)]
pub struct OverheadArgs {
    /// Systems: `direct`, `nginx`, `headroom` (round-robin), `headroom:POLICY`,
    /// `headroom:POLICY:no-records`, `headroom:POLICY:threads=N` (N async workers).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "direct,nginx,headroom:round-robin,headroom:slo"
    )]
    pub targets: Vec<String>,
    /// Closed-loop connection counts.
    #[arg(long, value_delimiter = ',', default_value = "8,64")]
    pub concurrency: Vec<usize>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 10.0)]
    pub duration_s: f64,
    #[arg(long, default_value_t = 1.0)]
    pub warmup_s: f64,
    /// Interleaved repeats (the table shows medians).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Token events per answer.
    #[arg(long, default_value_t = 20)]
    pub tokens: u32,
    /// Request body size (bytes, approximate).
    #[arg(long, default_value_t = 2048)]
    pub request_bytes: usize,
    /// Directory of `headroom` (default: next to this binary).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// nginx binary (default: on PATH or /usr/sbin/nginx).
    #[arg(long)]
    pub nginx: Option<PathBuf>,
    /// Extra argument for `headroom serve` (repeatable).
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
    /// `headroom`'s tokenizer for the model: cl100k, o200k, estimate (the byte
    /// estimator) or hf:/path/tokenizer.json.
    #[arg(long, default_value = "cl100k")]
    pub tokenizer: String,
    /// How prompts differ between requests: same (one prompt), suffix (a shared prompt
    /// with a unique end), prefix (a unique start: nothing to reuse).
    #[arg(long, default_value = "same")]
    pub vary_prompt: super::overhead::PromptVariation,
    /// Also write the table (markdown) and raw measurements (JSON) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `headroom-bench proxy-overhead`. The load generator runs on one thread (a
/// current-thread runtime), like `wrk -t1`.
pub fn proxy_overhead(a: OverheadArgs) -> anyhow::Result<()> {
    let targets = a
        .targets
        .iter()
        .map(|t| OverheadTarget::parse(t))
        .collect::<Result<Vec<_>, _>>()?;
    let secs = |v: f64, what: &str| {
        anyhow::ensure!(v.is_finite() && v >= 0.0, "{what} must be >= 0");
        Ok(Duration::from_secs_f64(v))
    };
    let opts = OverheadOptions {
        targets,
        concurrencies: a.concurrency.clone(),
        warmup: secs(a.warmup_s, "--warmup-s")?,
        duration: secs(a.duration_s, "--duration-s")?,
        repeats: a.repeats,
        bin_dir: a.bin_dir.clone(),
        nginx: a.nginx.clone(),
        tokens: a.tokens,
        request_bytes: a.request_bytes,
        serve_args: a.serve_args.clone(),
        tokenizer: a.tokenizer.clone(),
        vary: a.vary_prompt,
        ..OverheadOptions::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let rep = rt.block_on(super::overhead::proxy_overhead(opts))?;
    let mut md = rep.table.to_markdown();
    md.push_str(&format!(
        "\nload average before/after: {} / {} on {} cores\n",
        rep.loadavg_before,
        rep.loadavg_after,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    ));
    for (k, v) in &rep.settings {
        md.push_str(&format!("- {k}: {v}\n"));
    }
    for (k, v) in &rep.proxy_peak_rss_mib {
        md.push_str(&format!("- peak RSS {k}: {v:.1} MiB\n"));
    }
    println!("{md}");
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("proxy_overhead.md"), &md)?;
        std::fs::write(
            dir.join("proxy_overhead.json"),
            serde_json::to_string_pretty(&rep)?,
        )?;
    }
    Ok(())
}

#[derive(Args, Debug, Clone)]
pub struct StreamsArgs {
    /// Streams held at once, comma-separated: each count runs on a fresh router and
    /// upstream.
    #[arg(long, value_delimiter = ',', default_value = "10000")]
    pub streams: Vec<usize>,
    /// Client protocols, comma-separated: http1 (a connection per stream) and/or h2
    /// (streams multiplexed, --streams-per-conn each).
    #[arg(long, value_delimiter = ',', default_value = "http1")]
    pub protocol: Vec<super::streams::ClientProtocol>,
    #[arg(long, default_value_t = 100)]
    pub streams_per_conn: usize,
    /// Token events per stream.
    #[arg(long, default_value_t = 60)]
    pub tokens: u32,
    /// Milliseconds between two token events of a stream.
    #[arg(long, default_value_t = 500.0)]
    pub interval_ms: f64,
    /// Seconds over which the streams are opened.
    #[arg(long, default_value_t = 5.0)]
    pub ramp_s: f64,
    /// Upstream ports (replicas) behind the router: 1 or 2.
    #[arg(long, default_value_t = 2)]
    pub upstreams: usize,
    #[arg(long, default_value = "round-robin")]
    pub policy: String,
    /// `headroom`'s tokenizer for the model.
    #[arg(long, default_value = "cl100k")]
    pub tokenizer: String,
    /// Request body size (bytes, approximate).
    #[arg(long, default_value_t = 1024)]
    pub request_bytes: usize,
    /// Extra argument for `headroom serve` (repeatable).
    #[arg(long = "serve-arg", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
    /// Directory of `headroom` and `headroom-bench` (default: next to this binary).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Milliseconds between two readings of the router's /proc entry.
    #[arg(long, default_value_t = 1000.0)]
    pub sample_ms: f64,
    /// Loads run one after another on the same router: memory a later round does not
    /// grow was kept by the allocator, not leaked.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Also write the table (markdown), the runs with their samples (JSON) and the
    /// router and upstream logs here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Raises this process's soft open-files limit to its hard limit (children, the
/// router included, inherit it); returns (soft, hard) after.
fn raise_open_files() -> anyhow::Result<(u64, u64)> {
    rlimit::increase_nofile_limit(u64::MAX).context("raising RLIMIT_NOFILE")?;
    Ok(rlimit::getrlimit(rlimit::Resource::NOFILE)?)
}

/// `headroom-bench streams`. The client runs on one thread (a current-thread
/// runtime); the router has the remaining cores.
pub fn streams(a: StreamsArgs) -> anyhow::Result<()> {
    use super::streams::{StreamsOptions, run_streams, table};
    let ms = |v: f64, what: &str| {
        anyhow::ensure!(v.is_finite() && v > 0.0, "{what} must be > 0");
        Ok(Duration::from_secs_f64(v / 1e3))
    };
    anyhow::ensure!(
        a.ramp_s.is_finite() && a.ramp_s >= 0.0,
        "--ramp-s must be >= 0"
    );
    anyhow::ensure!(
        !a.streams.is_empty() && !a.protocol.is_empty(),
        "need a stream count and a protocol"
    );
    let base = StreamsOptions {
        tokens: a.tokens,
        interval: ms(a.interval_ms, "--interval-ms")?,
        ramp: Duration::from_secs_f64(a.ramp_s),
        upstreams: a.upstreams,
        streams_per_conn: a.streams_per_conn,
        policy: a.policy.clone(),
        tokenizer: a.tokenizer.clone(),
        request_bytes: a.request_bytes,
        serve_args: a.serve_args.clone(),
        bin_dir: a.bin_dir.clone(),
        rounds: a.rounds,
        sample_every: ms(a.sample_ms, "--sample-ms")?,
        log_dir: a.out.as_ref().map(|d| d.join("logs")),
        ..StreamsOptions::default()
    };
    let (soft, hard) = raise_open_files()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let mut runs = Vec::new();
    for &n in &a.streams {
        for &p in &a.protocol {
            let opts = StreamsOptions {
                streams: n,
                protocol: p,
                ..base.clone()
            };
            eprintln!(
                "streams: {n} over {} ({} client connections; router needs ~{} descriptors, \
                 open-files limit {soft}) …",
                p.name(),
                opts.client_conns(),
                opts.router_fds_needed()
            );
            let run = rt.block_on(run_streams(&opts))?;
            eprintln!(
                "  {} completed, {} errors, peak router RSS {:.1} MiB",
                run.completed, run.errors, run.router_hwm_mib
            );
            runs.push(run);
        }
    }
    let mut md = table(&runs).to_markdown();
    md.push_str(&format!(
        "\n{} token events {} ms apart per stream (first at once), opened over {} s; \
         {} upstream port(s) in a separate process; policy {}; client on one thread of \
         this process; open-files limit {soft} (hard {hard}) for every process; {} cores; \
         load average after: {}\n",
        a.tokens,
        a.interval_ms,
        a.ramp_s,
        a.upstreams,
        a.policy,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|_| "unknown".into()),
    ));
    for r in &runs {
        md.push_str(&format!(
            "- {} {}: router CPU {:.1} s over the {:.1} s load ({:.0} stream-seconds), \
             upstream {:.1} s, client {:.1} s; RSS after each round's streams ended {:?} MiB; \
             peak threads {}; stream lifetime p50 {} s, max {} s\n",
            r.streams,
            r.protocol,
            r.router_load_cpu_s,
            r.load_wall_s,
            r.stream_seconds,
            r.upstream_load_cpu_s,
            r.client_load_cpu_s,
            r.router_rss_after_round_mib
                .iter()
                .map(|m| (m * 10.0).round() / 10.0)
                .collect::<Vec<_>>(),
            r.router_peak_threads,
            num(r.lifetime_p50_s, 1),
            num(r.lifetime_max_s, 1),
        ));
        for (k, v) in &r.error_kinds {
            md.push_str(&format!("  - errors `{k}`: {v}\n"));
        }
        for e in r.first_errors.iter().take(3) {
            md.push_str(&format!("  - e.g. {e}\n"));
        }
    }
    println!("{md}");
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("streams.md"), &md)?;
        std::fs::write(
            dir.join("streams.json"),
            serde_json::to_string_pretty(&runs)?,
        )?;
    }
    let failed: u64 = runs.iter().map(|r| r.errors).sum();
    anyhow::ensure!(failed == 0, "{failed} streams failed (see the table)");
    Ok(())
}

#[derive(Args, Debug, Clone)]
pub struct SlowUpstreamArgs {
    /// Listen address (repeatable: one replica per port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: Vec<std::net::SocketAddr>,
    /// Token events per stream.
    #[arg(long, default_value_t = 60)]
    pub tokens: u32,
    /// Milliseconds between two token events.
    #[arg(long, default_value_t = 500.0)]
    pub interval_ms: f64,
    #[arg(long, default_value = "llama-3-8b")]
    pub model: String,
    /// Prompt tokens reported in usage.
    #[arg(long, default_value_t = 200)]
    pub prompt_tokens: u32,
}

/// `headroom-bench slow-upstream`: the upstream `streams` starts, on one thread.
pub fn slow_upstream(a: SlowUpstreamArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.interval_ms.is_finite() && a.interval_ms > 0.0,
        "--interval-ms must be > 0"
    );
    let chunks = super::slow_upstream::SlowChunks::new(
        &a.model,
        a.tokens,
        a.prompt_tokens,
        Duration::from_secs_f64(a.interval_ms / 1e3),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(super::slow_upstream::run_process(&a.listen, chunks))?;
    Ok(())
}
