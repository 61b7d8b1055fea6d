//! `headroom-bench`: the fleet simulator, live runs and reports.

use std::{collections::BTreeMap, path::PathBuf, sync::Mutex};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use headroom_bench::{
    report::{CapacitySearch, PolicyReport, Report, write_report},
    sim::{ALL_POLICIES, SimConfig, parse_fleet, simulate},
    workload::{SloRule, Workload},
};
use headroom_engine::ProfileFile;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(
    name = "headroom-bench",
    version,
    about = "Headroom's fleet simulator, live runs and reports"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Simulate policies on a fleet in virtual time and write a report.
    Sim(SimArgs),
    /// Replay a workload through real emulators and router nodes on loopback (or --target URL).
    Live(headroom_bench::live::cli::LiveArgs),
    /// Requests/s, added latency and CPU/request of headroom serve vs direct vs nginx.
    ProxyOverhead(headroom_bench::live::cli::OverheadArgs),
    /// Thousands of slow streams held open through one headroom serve: router RSS, CPU,
    /// descriptors, errors, time to first byte.
    Streams(headroom_bench::live::cli::StreamsArgs),
    /// The slow streaming upstream `streams` starts (a token every --interval-ms).
    SlowUpstream(headroom_bench::live::cli::SlowUpstreamArgs),
    /// How many replicas of each class serve a recorded workload (the router's
    /// `request_log`) at its own objectives.
    Plan(PlanArgs),
}

#[derive(Args)]
struct PlanArgs {
    /// The workload: the router's request log, or any trace `sim` reads.
    #[arg(long)]
    workload: String,
    /// Replica classes (engine profiles) to size, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    classes: Vec<String>,
    /// Share of requests that must meet both objectives.
    #[arg(long, default_value_t = 0.9)]
    target: f64,
    /// Largest fleet tried per class.
    #[arg(long, default_value_t = 64)]
    max_replicas: u32,
    /// Objectives for requests without them (a router log always has them).
    #[arg(long, default_value = "generic")]
    slo: String,
    #[arg(long, default_value = "slo")]
    policy: String,
    /// Router nodes.
    #[arg(long, default_value_t = 1)]
    routers: u32,
    /// Arrival-rate multiplier: plan for this much more (or less) of the same traffic.
    #[arg(long, default_value_t = 1.0)]
    rate_scale: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the answer (Markdown and JSON) into this directory too.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn plan(a: PlanArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.target.is_finite() && a.target > 0.0 && a.target <= 1.0,
        "--target {} not in (0, 1]",
        a.target
    );
    anyhow::ensure!(a.max_replicas >= 1, "--max-replicas must be at least 1");
    anyhow::ensure!(
        a.rate_scale.is_finite() && a.rate_scale > 0.0,
        "--rate-scale {} must be > 0",
        a.rate_scale
    );
    let wl = Workload::from_spec(&a.workload)
        .with_context(|| format!("workload {}", a.workload))?
        .with_slo(&SloRule::parse(&a.slo)?);
    anyhow::ensure!(
        !wl.requests.is_empty(),
        "workload {} has no requests",
        a.workload
    );
    for c in &a.classes {
        headroom_engine::Profile::by_name(c)?;
    }
    let ask = headroom_bench::plan::PlanAsk {
        classes: a.classes.clone(),
        target: a.target,
        max_replicas: a.max_replicas,
        base: SimConfig {
            policy: a.policy.clone(),
            routers: a.routers,
            seed: a.seed,
            rate_scale: a.rate_scale,
            ..SimConfig::default()
        },
    };
    let answers = headroom_bench::plan::plan(&wl, &ask)?;
    let md = headroom_bench::plan::markdown(&answers, a.target, wl.requests.len());
    print!("{md}");
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::write(dir.join("plan.md"), &md)?;
        std::fs::write(
            dir.join("plan.json"),
            serde_json::to_string_pretty(&answers)?,
        )?;
    }
    Ok(())
}

#[derive(Args)]
struct SimArgs {
    /// Workload: a JSONL/CSV trace, or a generator spec (`poisson:…`, `incident:…`).
    #[arg(long)]
    workload: String,
    /// Fleet: `profile:count:role@region,…` (role `prefill`, `decode` or `both`, the
    /// default; default fleet: 6×h100, 6×a100, 4×l4 Llama-3-8B).
    #[arg(long, default_value = headroom_bench::sim::config::DEFAULT_FLEET)]
    fleet: String,
    /// Disaggregation (a fleet with prefill replicas): prompts with fewer uncached
    /// tokens run unified (`[pd] min_prompt_tokens`; 0 = every request it can).
    #[arg(long, default_value_t = headroom_core::pd::PdConfig::default().min_prompt_tokens)]
    pd_min_prompt_tokens: u32,
    /// The true P→D link: bandwidth (GB/s) and latency (ms) of each KV transfer. The
    /// router starts from `[pd]`'s defaults and learns the links.
    #[arg(long, default_value_t = headroom_core::pd::PdConfig::default().link_gbytes_per_s)]
    link_gbytes_per_s: f64,
    #[arg(long, default_value_t = headroom_core::pd::PdConfig::default().link_latency_ms)]
    link_latency_ms: f64,
    /// Router nodes.
    #[arg(long, default_value_t = 1)]
    routers: u32,
    /// Policies, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    policies: String,
    /// Objectives for requests without them: a preset (`mooncake`, `azure-conv`,
    /// `azure-code`, `generic`) or a rule (see `SloRule::parse`). Default: by trace name.
    #[arg(long)]
    slo: Option<String>,
    /// Arrival-rate multiplier of the main run.
    #[arg(long, default_value_t = 1.0)]
    rate_scale: f64,
    /// Also find each policy's SLO capacity (highest rate with ≥ 90% attainment).
    #[arg(long)]
    capacity: bool,
    /// Use only the first N requests.
    #[arg(long)]
    limit: Option<usize>,
    /// Share in-flight placements between router nodes (the mesh).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    mesh: bool,
    /// How often each node publishes its in-flight vector (ms).
    #[arg(long, default_value_t = 20.0)]
    gossip_interval_ms: f64,
    /// Pin each tenant's requests to one router node.
    #[arg(long)]
    pin_tenants: bool,
    /// Gossip delay between nodes (ms).
    #[arg(long, default_value_t = 2.0)]
    gossip_delay_ms: f64,
    /// Metric scrape interval (ms).
    #[arg(long, default_value_t = 100.0)]
    scrape_ms: f64,
    /// Lognormal step-time noise of the engines (log-sd of a mean-1 factor per step;
    /// 0 turns it off for exactness checks). Default: measured bound, see CALIBRATION.md.
    #[arg(long, default_value_t = headroom_engine::DEFAULT_STEP_NOISE)]
    step_noise: f64,
    /// Mismatched engines: scale every replica's step-time constants by 1 ± this
    /// (sign per constant and replica, from the seed) away from what its profile says.
    #[arg(long, default_value_t = 0.0)]
    engine_mismatch: f64,
    /// `CLASS=PATH`: the engines of fleet class CLASS run the constants of this engine
    /// profile file (TOML, or JSON by extension); the router still sees CLASS. Repeatable.
    #[arg(long = "engine-profile")]
    engine_profiles: Vec<String>,
    /// Admission: requests per replica each node runs before tenants are held to
    /// their weighted shares (`[admission] per_replica_in_flight`; 0 = off).
    #[arg(long, default_value_t = 0)]
    admission_per_replica: u32,
    /// Admission: longest any request waits (ms), gate and deferral together.
    #[arg(long, default_value_t = 5000)]
    admission_max_wait_ms: u64,
    /// `TENANT=WEIGHT`: a tenant's share of capacity under overload (default 1).
    /// Repeatable.
    #[arg(long = "tenant-weight")]
    tenant_weights: Vec<String>,
    /// Route on every engine's exact cached tokens (a precise KV-event feed)
    /// instead of the router's approximate prefix index.
    #[arg(long)]
    precise_prefix: bool,
    /// `slo.shortlist`: on fleets with more eligible replicas than this, the `slo`
    /// policy forecasts only this many (0: every one).
    #[arg(long, default_value_t = headroom_core::policy::slo::SloConfig::default().shortlist)]
    slo_shortlist: usize,
    /// `A/B=MS`: round trip between regions A and B of the fleet (`profile:n@region`).
    /// Repeatable; pairs without one get `--default-rtt-ms`.
    #[arg(long = "rtt-ms")]
    rtt_ms: Vec<String>,
    #[arg(long, default_value_t = headroom_core::region::RegionsConfig::default().default_rtt_ms)]
    default_rtt_ms: f64,
    /// `REGION:FROM_S:TO_S`: the region's replicas go dark for that window (simulated
    /// seconds). Repeatable; the per-region report splits at the first.
    #[arg(long)]
    dark: Vec<String>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Parallel simulations (default: available cores).
    #[arg(long)]
    jobs: Option<usize>,
    #[arg(long)]
    out: PathBuf,
}

fn policies(spec: &str) -> Vec<String> {
    if spec == "all" {
        ALL_POLICIES.iter().map(|s| s.to_string()).collect()
    } else {
        spec.split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

fn sim(a: SimArgs) -> anyhow::Result<()> {
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
    let fleet = parse_fleet(&a.fleet).map_err(anyhow::Error::msg)?;
    let fleet_disaggregated = fleet
        .iter()
        .any(|g| g.role == headroom_core::view::Role::Prefill);
    let mut engine_files = Vec::new();
    for spec in &a.engine_profiles {
        let (class, path) = spec
            .split_once('=')
            .with_context(|| format!("--engine-profile `{spec}`: expected CLASS=PATH"))?;
        anyhow::ensure!(
            fleet.iter().any(|g| g.profile == class),
            "--engine-profile `{spec}`: no fleet class `{class}`"
        );
        let file = ProfileFile::read(std::path::Path::new(path))?;
        file.apply(class)?;
        engine_files.push((class.to_string(), file));
    }
    anyhow::ensure!(
        a.step_noise.is_finite() && (0.0..=2.0).contains(&a.step_noise),
        "--step-noise {} not in [0, 2]",
        a.step_noise
    );
    anyhow::ensure!(
        a.engine_mismatch.is_finite() && (0.0..=0.9).contains(&a.engine_mismatch),
        "--engine-mismatch {} not in [0, 0.9]",
        a.engine_mismatch
    );
    let names = policies(&a.policies);
    let mut tenant_limits = Vec::new();
    for spec in &a.tenant_weights {
        let weight = spec
            .split_once('=')
            .and_then(|(t, w)| Some((t.trim(), w.trim().parse::<f64>().ok()?)))
            .filter(|(t, w)| !t.is_empty() && w.is_finite() && *w > 0.0);
        let Some((tenant, weight)) = weight else {
            anyhow::bail!("--tenant-weight `{spec}`: expected TENANT=WEIGHT with WEIGHT > 0");
        };
        tenant_limits.push((
            tenant.to_string(),
            headroom_core::admission::TenantLimits {
                weight,
                ..Default::default()
            },
        ));
    }
    if a.admission_max_wait_ms == 0 {
        anyhow::bail!("--admission-max-wait-ms must be > 0");
    }
    let mut regions = headroom_core::region::RegionsConfig {
        default_rtt_ms: a.default_rtt_ms,
        ..Default::default()
    };
    for spec in &a.rtt_ms {
        let (pair, ms) = spec
            .split_once('=')
            .and_then(|(p, v)| Some((p.trim(), v.trim().parse::<f64>().ok()?)))
            .with_context(|| format!("--rtt-ms `{spec}`: expected A/B=MS"))?;
        regions.rtt_ms.insert(pair.to_string(), ms);
    }
    regions.check()?;
    anyhow::ensure!(
        a.default_rtt_ms.is_finite() && (0.0..=10_000.0).contains(&a.default_rtt_ms),
        "--default-rtt-ms {} not in [0, 10000]",
        a.default_rtt_ms
    );
    let dark = a
        .dark
        .iter()
        .map(|d| headroom_bench::sim::Dark::parse(d))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::msg)?;
    for d in &dark {
        anyhow::ensure!(
            fleet
                .iter()
                .any(|g| g.region.as_deref() == Some(d.region.as_str())),
            "--dark `{}`: no fleet region `{}`",
            d.region,
            d.region
        );
    }
    anyhow::ensure!(
        a.link_gbytes_per_s.is_finite() && a.link_gbytes_per_s > 0.0,
        "--link-gbytes-per-s {} must be > 0",
        a.link_gbytes_per_s
    );
    anyhow::ensure!(
        a.link_latency_ms.is_finite() && (0.0..=10_000.0).contains(&a.link_latency_ms),
        "--link-latency-ms {} not in [0, 10000]",
        a.link_latency_ms
    );
    let base = SimConfig {
        pd: headroom_core::pd::PdConfig {
            min_prompt_tokens: a.pd_min_prompt_tokens,
            ..Default::default()
        },
        link_gbytes_per_s: a.link_gbytes_per_s,
        link_latency_ms: a.link_latency_ms,
        admission: headroom_core::admission::GateConfig {
            per_replica: a.admission_per_replica,
            max_wait_s: a.admission_max_wait_ms as f64 / 1e3,
            ..Default::default()
        },
        tenant_limits,
        fleet,
        routers: a.routers,
        mesh: a.mesh,
        pin_tenants: a.pin_tenants,
        gossip_delay_s: a.gossip_delay_ms / 1e3,
        gossip_interval_s: a.gossip_interval_ms / 1e3,
        scrape_interval_s: a.scrape_ms / 1e3,
        step_noise: a.step_noise,
        engine_mismatch: a.engine_mismatch,
        engine_files,
        seed: a.seed,
        rate_scale: a.rate_scale,
        precise_prefix: a.precise_prefix,
        slo: headroom_core::policy::slo::SloConfig {
            shortlist: a.slo_shortlist,
            ..Default::default()
        },
        regions,
        dark,
        ..SimConfig::default()
    };
    let search = CapacitySearch::default();
    let per_policy = 1 + if a.capacity {
        search.max_runs + search.verify.len()
    } else {
        0
    };
    let bar = ProgressBar::new((names.len() * per_policy) as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} runs {msg}")
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    );
    let jobs = a
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let queue = Mutex::new(names.iter().cloned().enumerate().collect::<Vec<_>>());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.min(names.len()) {
            s.spawn(|| {
                loop {
                    let Some((ix, name)) = queue.lock().ok().and_then(|mut q| q.pop()) else {
                        return;
                    };
                    let cfg = SimConfig {
                        policy: name.clone(),
                        ..base.clone()
                    };
                    let out = (|| -> anyhow::Result<PolicyReport> {
                        let run = simulate(&wl, cfg.clone())?;
                        bar.inc(1);
                        let capacity = if a.capacity {
                            let c = search.try_search_with(
                                |scale| {
                                    simulate(
                                        &wl,
                                        SimConfig {
                                            rate_scale: scale,
                                            ..cfg.clone()
                                        },
                                    )
                                },
                                |p, _, _| {
                                    bar.inc(1);
                                    bar.set_message(format!(
                                        "{name} @ {:.2}: {:.3}",
                                        p.rate_scale, p.attainment
                                    ));
                                },
                            )?;
                            Some(c)
                        } else {
                            None
                        };
                        Ok(PolicyReport::new(run, capacity))
                    })();
                    if let Ok(mut r) = results.lock() {
                        r.push((ix, out));
                    }
                }
            });
        }
    });
    bar.finish_and_clear();
    let mut results = results
        .into_inner()
        .map_err(|_| anyhow::anyhow!("a simulation thread panicked"))?;
    results.sort_by_key(|(ix, _)| *ix);
    let mut settings = BTreeMap::new();
    settings.insert("workload".into(), a.workload.clone());
    settings.insert("requests".into(), wl.requests.len().to_string());
    settings.insert("fleet".into(), a.fleet.clone());
    if fleet_disaggregated {
        settings.insert(
            "pd_min_prompt_tokens".into(),
            a.pd_min_prompt_tokens.to_string(),
        );
        settings.insert(
            "link".into(),
            format!("{} GB/s, {} ms", a.link_gbytes_per_s, a.link_latency_ms),
        );
    }
    settings.insert("routers".into(), a.routers.to_string());
    settings.insert("mesh".into(), a.mesh.to_string());
    settings.insert("pin_tenants".into(), a.pin_tenants.to_string());
    settings.insert(
        "gossip_interval_ms".into(),
        a.gossip_interval_ms.to_string(),
    );
    settings.insert("gossip_delay_ms".into(), a.gossip_delay_ms.to_string());
    settings.insert("scrape_ms".into(), a.scrape_ms.to_string());
    settings.insert("rate_scale".into(), a.rate_scale.to_string());
    settings.insert("seed".into(), a.seed.to_string());
    settings.insert("step_noise".into(), a.step_noise.to_string());
    settings.insert("engine_mismatch".into(), a.engine_mismatch.to_string());
    if !a.engine_profiles.is_empty() {
        settings.insert("engine_profiles".into(), a.engine_profiles.join(" "));
    }
    settings.insert(
        "slo".into(),
        a.slo
            .clone()
            .unwrap_or_else(|| format!("by trace ({})", wl.name)),
    );
    let mut report = Report {
        title: format!("Headroom simulation: {}", wl.name),
        settings,
        policies: Vec::new(),
    };
    if !a.rtt_ms.is_empty() {
        settings_rtt(&mut report.settings, &a);
    }
    for (_, r) in results {
        report.policies.push(r?);
    }
    let files = write_report(&a.out, &report)?;
    if base.region_names().len() > 1 {
        write_regions(&a.out, &report, &base)?;
    }
    println!(
        "{}",
        std::fs::read_to_string(&files.markdown).unwrap_or_default()
    );
    eprintln!("wrote {}", files.markdown.display());
    Ok(())
}

fn settings_rtt(settings: &mut BTreeMap<String, String>, a: &SimArgs) {
    settings.insert("rtt_ms".into(), a.rtt_ms.join(" "));
    settings.insert("default_rtt_ms".into(), a.default_rtt_ms.to_string());
    if !a.dark.is_empty() {
        settings.insert("dark".into(), a.dark.join(" "));
    }
}

/// `regions.md` and `regions.json`: per region and phase, each policy's attainment and
/// share routed out of region.
fn write_regions(out: &std::path::Path, report: &Report, cfg: &SimConfig) -> anyhow::Result<()> {
    use headroom_bench::report::regions::{markdown, region_phases};
    let mut md = String::from("# Regions: attainment and share routed remote, per phase\n\n");
    let mut json = serde_json::Map::new();
    for p in &report.policies {
        let rows = region_phases(&p.run, cfg);
        md.push_str(&markdown(&p.run.policy, &rows));
        md.push('\n');
        json.insert(p.run.policy.clone(), serde_json::to_value(&rows)?);
    }
    std::fs::write(out.join("regions.md"), &md)?;
    std::fs::write(
        out.join("regions.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    println!("{md}");
    Ok(())
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("HEADROOM_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Sim(a) => sim(a),
        Cmd::Live(a) => headroom_bench::live::cli::live(a),
        Cmd::ProxyOverhead(a) => headroom_bench::live::cli::proxy_overhead(a),
        Cmd::Streams(a) => headroom_bench::live::cli::streams(a),
        Cmd::SlowUpstream(a) => headroom_bench::live::cli::slow_upstream(a),
        Cmd::Plan(a) => plan(a),
    }
}
