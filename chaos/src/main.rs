//! `headroom-chaos`: run fault scenarios against real Headroom processes on loopback.
//!
//! `headroom-chaos list` prints the scenarios; `headroom-chaos run` runs them one
//! after another, writes `report.md` and `report.json` into `--out`, and exits 1 if
//! any invariant failed (2 on a usage or setup error before any scenario ran).

use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::{Parser, Subcommand};
use headroom_chaos::report::{self, RunReport};
use headroom_chaos::{Binaries, RunOptions, Scenario, run};

#[derive(Parser)]
#[command(
    name = "headroom-chaos",
    version,
    about = "Fault scenarios against real Headroom processes on loopback"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// List the scenarios.
    List,
    /// Run scenarios and check their invariants.
    Run(RunArgs),
    /// The mesh at scale: the same load through 1 node, then through `--nodes` meshed
    /// nodes in front of one emulated fleet; attainment, imbalance, gossip, CPU.
    Scale(ScaleArgs),
}

#[derive(clap::Args)]
struct ScaleArgs {
    #[arg(long, default_value_t = 16)]
    nodes: usize,
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// Seconds of load per side.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Arrivals per second (total, spread over the nodes).
    #[arg(long, default_value_t = 30.0)]
    rate: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 0.5)]
    time_scale: f64,
    /// TTFT,TPOT objectives (model ms).
    #[arg(long, value_parser = parse_slo, default_value = "300,20")]
    slo: (f64, f64),
    /// Largest accepted gap to the single node (percentage points).
    #[arg(long, default_value_t = 2.0)]
    tolerance: f64,
    #[arg(long, default_value = "chaos/results/scale")]
    out: PathBuf,
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Every node's gossip round (ms); large meshes need longer rounds (chitchat's
    /// digest grows with the member count).
    #[arg(long, default_value_t = 100)]
    gossip_interval_ms: u64,
    /// Health-probe period (ms): every node probes every replica.
    #[arg(long, default_value_t = 100)]
    probe_interval_ms: u64,
    /// Scrape period (ms) of each replica's owners.
    #[arg(long, default_value_t = 100)]
    scrape_interval_ms: u64,
    /// A TOML file appended to every node's config (both sides), e.g. a `[slo]` table
    /// for an A/B run of a setting.
    #[arg(long)]
    router_toml: Option<PathBuf>,
}

async fn scale_cmd(a: ScaleArgs) -> anyhow::Result<bool> {
    if !(2..=64).contains(&a.nodes) || !(1..=256).contains(&a.replicas) {
        anyhow::bail!("--nodes must be in 2..=64 and --replicas in 1..=256");
    }
    let periods = [
        a.gossip_interval_ms,
        a.probe_interval_ms,
        a.scrape_interval_ms,
    ];
    if periods.iter().any(|p| !(10..=60_000).contains(p)) {
        anyhow::bail!(
            "--gossip-interval-ms, --probe-interval-ms and --scrape-interval-ms must be in [10, 60000]"
        );
    }
    let mut timings = headroom_chaos::router_config::RouterTimings {
        gossip_interval_ms: a.gossip_interval_ms,
        probe_interval_ms: a.probe_interval_ms,
        scrape_interval_ms: a.scrape_interval_ms,
        ..Default::default()
    };
    if let Some(p) = &a.router_toml {
        timings.extra_toml = std::fs::read_to_string(p)
            .map_err(|e| anyhow::anyhow!("--router-toml {}: {e}", p.display()))?;
    }
    // Scrapes stay fresh for ten periods (at least the default second), and are shared
    // at most twice per staleness window.
    timings.stale_after_ms = timings.stale_after_ms.max(10 * a.scrape_interval_ms);
    timings.scrape_publish_ms = timings
        .scrape_publish_ms
        .max(a.scrape_interval_ms)
        .min(timings.stale_after_ms / 2);
    let ok = a.duration.is_finite()
        && (3.0..=3600.0).contains(&a.duration)
        && a.rate.is_finite()
        && a.rate > 0.0
        && a.rate <= 500.0
        && a.time_scale.is_finite()
        && a.time_scale > 0.0
        && a.time_scale <= 10.0
        && a.tolerance.is_finite()
        && a.tolerance >= 0.0;
    if !ok {
        anyhow::bail!(
            "--duration in [3, 3600], --rate in (0, 500], --time-scale in (0, 10], --tolerance ≥ 0"
        );
    }
    let opts = headroom_chaos::scale::ScaleOptions {
        nodes: a.nodes,
        replicas: a.replicas,
        duration_s: a.duration,
        rate_per_s: a.rate,
        seed: a.seed,
        time_scale: a.time_scale,
        slo_model_ms: a.slo,
        tolerance_pp: a.tolerance,
        out_dir: a.out.clone(),
        bins: Binaries::find(a.bin_dir.as_deref())?,
        timings,
    };
    let r = headroom_chaos::scale::run_scale(&opts).await?;
    headroom_chaos::scale::write(&a.out, &r)?;
    eprintln!("{}", headroom_chaos::scale::markdown(&r));
    Ok(r.pass)
}

#[derive(clap::Args)]
struct RunArgs {
    /// Scenario name, or `all` (repeatable or comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    scenario: Vec<String>,
    /// Seconds of load per scenario.
    #[arg(long, default_value_t = 30.0)]
    duration: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output directory for report.md, report.json and logs.
    #[arg(long, default_value = "chaos/results/latest")]
    out: PathBuf,
    /// Emulators' time scale (wall seconds per modelled second).
    #[arg(long, default_value_t = 0.5)]
    time_scale: f64,
    /// Arrivals per second (default: each scenario's own, 20).
    #[arg(long)]
    rate: Option<f64>,
    /// Send TTFT,TPOT objectives (model ms) with every request, e.g. `1000,14`
    /// (default: none; the router's tenant defaults apply).
    #[arg(long, value_parser = parse_slo)]
    slo: Option<(f64, f64)>,
    /// Directory holding `headroom` and `headroom-replica` (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

fn parse_slo(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| "want TTFT_MS,TPOT_MS".to_string())?;
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
            .ok_or_else(|| format!("`{x}` is not a positive number of ms"))
    };
    Ok((num(a)?, num(b)?))
}

fn pick(names: &[String]) -> anyhow::Result<Vec<Scenario>> {
    if names.iter().any(|n| n == "all") {
        return Ok(Scenario::ALL.to_vec());
    }
    names
        .iter()
        .map(|n| {
            Scenario::by_name(n.trim()).with_context(|| {
                format!(
                    "unknown scenario `{n}`; known: {}",
                    Scenario::ALL.map(Scenario::name).join(", ")
                )
            })
        })
        .collect()
}

fn validate(a: &RunArgs) -> anyhow::Result<()> {
    if !(a.duration.is_finite() && (3.0..=3600.0).contains(&a.duration)) {
        anyhow::bail!(
            "--duration must be in [3, 3600] seconds, got {}",
            a.duration
        );
    }
    if !(a.time_scale.is_finite() && a.time_scale > 0.0 && a.time_scale <= 10.0) {
        anyhow::bail!("--time-scale must be in (0, 10], got {}", a.time_scale);
    }
    if let Some(r) = a.rate
        && !(r.is_finite() && r > 0.0 && r <= 500.0)
    {
        anyhow::bail!("--rate must be in (0, 500], got {r}");
    }
    Ok(())
}

async fn run_cmd(a: RunArgs) -> anyhow::Result<bool> {
    validate(&a)?;
    let scenarios = pick(&a.scenario)?;
    let bins = Binaries::find(a.bin_dir.as_deref())?;
    let opts = RunOptions {
        duration_s: a.duration,
        seed: a.seed,
        time_scale: a.time_scale,
        rate_per_s: a.rate,
        slo_model_ms: a.slo,
        out_dir: a.out.clone(),
        bins,
    };
    let started_unix_s = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let wall = Instant::now();
    let mut reports = Vec::new();
    for sc in scenarios {
        eprintln!("== {} — {}", sc.name(), sc.about());
        let r = run(sc, &opts).await;
        if let Some(e) = &r.error {
            eprintln!("   setup failed: {e}");
        }
        for c in &r.checks {
            eprintln!(
                "   [{}] {}: {}",
                if c.pass { "pass" } else { "FAIL" },
                c.name,
                c.detail
            );
        }
        eprintln!(
            "   {} in {:.1} s",
            if r.pass { "PASS" } else { "FAIL" },
            r.wall_s
        );
        reports.push(r);
    }
    let run = RunReport {
        started_unix_s,
        duration_s: a.duration,
        seed: a.seed,
        time_scale: a.time_scale,
        wall_s: wall.elapsed().as_secs_f64(),
        pass: reports.iter().all(|r| r.pass),
        scenarios: reports,
    };
    report::write(&a.out, &run)?;
    eprintln!(
        "{}: {} failed checks; wrote {}",
        if run.pass { "PASS" } else { "FAIL" },
        run.failed_checks(),
        a.out.join("report.md").display()
    );
    Ok(run.pass)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    type Job = std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<bool>>>>;
    let job: Job = match cli.cmd {
        Cmd::List => {
            for s in Scenario::ALL {
                println!("{:<18} {}", s.name(), s.about());
            }
            return std::process::ExitCode::SUCCESS;
        }
        Cmd::Run(a) => Box::pin(run_cmd(a)),
        Cmd::Scale(a) => Box::pin(scale_cmd(a)),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match rt.block_on(job) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
