//! The `headroom` binary: `serve` a router node, bring a local deployment `up`.

use std::{net::SocketAddr, path::PathBuf};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use headroom::{
    config::{ModelConfig, ReplicaConfig, RouterConfig},
    node::Node,
    policy::PolicyName,
    up,
};
use tokio_util::sync::CancellationToken;

/// The binary's allocator (the decision bench uses it too, so that it times what runs).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "headroom",
    version,
    about = "SLO-aware router mesh for LLM inference"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `headroom=debug`.
    #[arg(long, global = true, default_value = "info", env = "HEADROOM_LOG")]
    log: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a router node.
    Serve(Box<ServeArgs>),
    /// Start a local deployment on loopback: emulated replicas and router nodes.
    Up(UpArgs),
    /// Write a development CA and node certificates for the mesh's mutual TLS.
    Certs(CertsArgs),
}

#[derive(Args)]
struct CertsArgs {
    /// Output directory (created); an existing `ca.key` there is reused.
    #[arg(long)]
    dir: PathBuf,
    /// Node ids (repeatable).
    #[arg(long = "node", required = true)]
    nodes: Vec<String>,
}

#[derive(Args)]
struct ServeArgs {
    /// TOML config file; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Replica `URL[,name=..,class=..,region=..,role=prefill|decode|both,max_batched_tokens=..]`
    /// (repeatable).
    #[arg(long = "replica")]
    replicas: Vec<String>,
    /// Replicas from DNS: `host:port`, re-resolved periodically.
    #[arg(long)]
    replica_dns: Option<String>,
    #[arg(long)]
    policy: Option<PolicyName>,
    #[arg(long)]
    node_id: Option<String>,
    /// Tokenizer for a model: `MODEL=cl100k|o200k|estimate|hf:/path/tokenizer.json`
    /// (repeatable; `hf:` takes the chat template from the tokenizer_config.json beside it).
    #[arg(long = "tokenizer")]
    tokenizers: Vec<String>,
    /// Seed for the node's random choices.
    #[arg(long)]
    seed: Option<u64>,
    /// Join the mesh: gossip (QUIC) listen address.
    #[arg(long)]
    gossip_listen: Option<SocketAddr>,
    /// Address peers should use to reach this node's gossip.
    #[arg(long)]
    gossip_advertise: Option<SocketAddr>,
    /// A mesh seed `host:port` (repeatable; a DNS name resolving to every router works).
    #[arg(long = "peer")]
    peers: Vec<String>,
    /// Directory with the cluster CA and this node's certificate (`headroom certs`).
    #[arg(long)]
    gossip_tls_dir: Option<PathBuf>,
    /// This node's region.
    #[arg(long)]
    region: Option<String>,
    /// Seeds of other regions (summaries and predictor federation only).
    #[arg(long = "remote-region-peer")]
    remote_region_peers: Vec<String>,
    /// `A/B=MS`: the round trip between regions A and B (`[regions] rtt_ms`; repeatable).
    #[arg(long = "region-rtt")]
    region_rtts: Vec<String>,
    /// Recent decision records kept for `/debug/decisions` (0 = off).
    #[arg(long)]
    decision_records: Option<usize>,
    /// Append one JSON line per finished request to this file (see `request_log`).
    #[arg(long)]
    request_log: Option<PathBuf>,
    /// Export request traces to this OTLP/HTTP collector (`http://HOST:4318`; see
    /// `[tracing]`).
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Async worker threads (default: one per core). The node's own background tasks
    /// and every connection share them; long prompts still tokenize on the blocking pool.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_threads: Option<u16>,
    /// Keep the kernel's transparent huge pages for this process. Off by default (Linux):
    /// the allocator returns freed memory to the kernel, and every fault in a returned
    /// 2 MiB region then zeroes a whole huge page; with prompts of 100k tokens that was
    /// 13% of the router's CPU and its p99 latency (`bench/PROXY_OVERHEAD.md`).
    #[arg(long)]
    transparent_huge_pages: bool,
}

#[derive(Args)]
struct UpArgs {
    #[arg(long, default_value = "llama-3-8b")]
    model: String,
    /// Router port.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// First replica port (replicas take consecutive ports).
    #[arg(long, default_value_t = 8101)]
    replica_base_port: u16,
    /// Replica profiles, comma-separated (default: 2×h100, a100, l4).
    #[arg(long, value_delimiter = ',')]
    profiles: Vec<String>,
    /// Emulated time multiplier (1.0 = real GPU speed; 0.1 = ten times faster).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    #[arg(long, default_value = "slo")]
    policy: PolicyName,
    /// Router nodes; more than one forms a mesh (QUIC gossip, development certificates).
    #[arg(long, default_value_t = 1)]
    nodes: u16,
    /// First gossip (UDP) port of the mesh.
    #[arg(long, default_value_t = 7946)]
    gossip_base_port: u16,
}

fn serve_config(a: ServeArgs) -> anyhow::Result<RouterConfig> {
    let mut cfg = match &a.config {
        Some(p) => RouterConfig::from_file(p)?,
        None => RouterConfig::default(),
    };
    if let Some(l) = a.listen {
        cfg.listen = l;
    }
    for r in &a.replicas {
        cfg.replicas
            .push(ReplicaConfig::parse_flag(r).map_err(anyhow::Error::msg)?);
    }
    if let Some(name) = a.replica_dns {
        cfg.discovery = Some(headroom::config::DnsDiscovery {
            name,
            interval_ms: 5_000,
            class: None,
            region: None,
            role: Default::default(),
        });
    }
    if let Some(p) = a.policy {
        cfg.policy = p;
    }
    if a.node_id.is_some() {
        cfg.node_id = a.node_id;
    }
    if let Some(s) = a.seed {
        cfg.seed = s;
    }
    if let Some(n) = a.decision_records {
        cfg.decision_records = n;
    }
    if a.request_log.is_some() {
        cfg.request_log = a.request_log;
    }
    if a.otlp_endpoint.is_some() {
        cfg.tracing.otlp_endpoint = a.otlp_endpoint;
    }
    if a.gossip_listen.is_some() {
        cfg.mesh.listen = a.gossip_listen;
    }
    if a.gossip_advertise.is_some() {
        cfg.mesh.advertise = a.gossip_advertise;
    }
    cfg.mesh.peers.extend(a.peers);
    cfg.mesh.remote_region_peers.extend(a.remote_region_peers);
    for spec in &a.region_rtts {
        let (pair, ms) = spec
            .split_once('=')
            .and_then(|(p, v)| Some((p.trim(), v.trim().parse::<f64>().ok()?)))
            .with_context(|| format!("--region-rtt `{spec}`: expected A/B=MS"))?;
        cfg.regions.rtt_ms.insert(pair.to_string(), ms);
    }
    if a.gossip_tls_dir.is_some() {
        cfg.mesh.tls_dir = a.gossip_tls_dir;
    }
    if let Some(r) = a.region {
        cfg.mesh.region = r;
    }
    for t in a.tokenizers {
        let (model, tok) = t.split_once('=').context("--tokenizer wants MODEL=NAME")?;
        cfg.models.push(ModelConfig {
            name: model.into(),
            tokenizer: Some(tok.into()),
            chat_template: None,
        });
    }
    if cfg.replicas.is_empty() && cfg.discovery.is_none() {
        anyhow::bail!(
            "no replicas: give --replica URL (repeatable), --replica-dns, or a --config file"
        );
    }
    cfg.validate()?;
    Ok(cfg)
}

async fn serve(cfg: RouterConfig, config_path: Option<PathBuf>) -> anyhow::Result<()> {
    let skew = headroom_gossip::clock::offset_from_env().map_err(anyhow::Error::msg)?;
    if skew != 0 {
        tracing::warn!(
            offset_ms = skew,
            "wall clock shifted by HEADROOM_CLOCK_OFFSET_MS"
        );
    }
    let cancel = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("cannot listen on {}", cfg.listen))?;
    let hup = headroom::edge::reload::watch_sighup();
    let node = Node::start(cfg, cancel.child_token()).await?;
    let tenants = node.path.tenants.clone();
    headroom::edge::reload::spawn_sighup(hup, config_path, cancel.child_token(), move |cfg| {
        tenants.reload_from(cfg)
    });
    let stop = cancel.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!("cannot watch SIGTERM: {e}");
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
            _ = stop.cancelled() => return,
        }
        tracing::info!("shutting down");
        stop.cancel();
    });
    headroom::server::serve(node.path.clone(), listener, cancel.clone()).await?;
    node.shutdown().await
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // Before the runtime's threads and buffers exist: the setting governs later faults.
    let thp = match &cli.cmd {
        Cmd::Serve(a) if !a.transparent_huge_pages => Some(disable_huge_pages()),
        _ => None,
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if let Cmd::Serve(a) = &cli.cmd
        && let Some(n) = a.worker_threads
    {
        rt.worker_threads(usize::from(n));
    }
    rt.build()
        .context("cannot start the async runtime")?
        .block_on(run(cli, thp))
}

/// Turns transparent huge pages off for this process (see `--transparent-huge-pages`).
#[cfg(target_os = "linux")]
fn disable_huge_pages() -> Result<(), String> {
    rustix::thread::disable_transparent_huge_pages(true).map_err(|e| e.to_string())
}

#[cfg(not(target_os = "linux"))]
fn disable_huge_pages() -> Result<(), String> {
    Ok(())
}

async fn run(cli: Cli, thp: Option<Result<(), String>>) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Some(Err(e)) = thp {
        // Not fatal: the router works with huge pages, at a cost in its tail latency.
        tracing::warn!("could not turn transparent huge pages off for this process: {e}");
    }
    match cli.cmd {
        Cmd::Serve(a) => {
            let path = a.config.clone();
            serve(serve_config(*a)?, path).await
        }
        Cmd::Certs(a) => {
            let nodes: Vec<&str> = a.nodes.iter().map(String::as_str).collect();
            let report = headroom_gossip::write_dev_certs(&a.dir, &nodes)?;
            println!(
                "wrote development certificates to {}: {report:?}",
                a.dir.display()
            );
            Ok(())
        }
        Cmd::Up(a) => {
            let fleet = if a.profiles.is_empty() {
                up::default_fleet()
            } else {
                a.profiles
                    .iter()
                    .map(|p| up::LocalReplica {
                        profile: p.clone(),
                        max_batched_tokens: if p.starts_with("h100") { 8192 } else { 2048 },
                    })
                    .collect()
            };
            up::run(up::UpOptions {
                model: a.model,
                fleet,
                router_port: a.port,
                replica_base_port: a.replica_base_port,
                time_scale: a.time_scale,
                policy: a.policy.to_string(),
                nodes: a.nodes,
                gossip_base_port: a.gossip_base_port,
                serve_args: Vec::new(),
            })
            .await
        }
    }
}
