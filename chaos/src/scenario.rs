//! Running one scenario: start its cluster, watch it, drive load, inject the fault on
//! schedule, drain, stop everything, and judge.
//!
//! Order (times in seconds since the load started, `t0`): the sampler and the load
//! start together; the scenario's `inject` runs beside the load (it sleeps until its
//! fault times and may wait for the system's reaction); when both are done the
//! scenario's `after_load` runs, then the ledgers are polled until they read zero (bounded), the routers' `/metrics` are
//! read, the cluster is torn down and its pids are checked. Checks are computed last,
//! from records and samples only, so a run's verdict never depends on harness timing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::bins::Binaries;
use crate::check::{self, Check, Drain};
use crate::client::{ClientSettings, EndClass, Record};
use crate::cluster::{Cluster, ClusterSpec};
use crate::http::get_text;
use crate::load::{self, LoadShape};
use crate::observe::{NodeSample, Sampler, sample_node};
use crate::scenarios::Scenario;

/// Options of a whole run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Seconds of load per scenario.
    pub duration_s: f64,
    pub seed: u64,
    /// Emulators' `--time-scale`.
    pub time_scale: f64,
    /// Arrivals per second (None = the scenario's default).
    pub rate_per_s: Option<f64>,
    /// TTFT and TPOT objectives (model ms) sent with every request as `x-slo-*`
    /// headers (scaled to wall ms by the time scale); None = the tenant's defaults.
    pub slo_model_ms: Option<(f64, f64)>,
    /// Where logs go (`<out>/logs/<scenario>/`).
    pub out_dir: PathBuf,
    pub bins: Binaries,
}

/// What a scenario runs.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub cluster: ClusterSpec,
    pub load: LoadShape,
    #[serde(skip)]
    pub client: ClientSettings,
    /// When the fault is injected and (if it heals) lifted, s after `t0`.
    pub fault_s: f64,
    pub recover_s: f64,
}

/// Something that happened, for the report's timeline.
#[derive(Clone, Debug, Serialize)]
pub struct Event {
    pub t_s: f64,
    pub what: String,
}

/// What `inject` did and measured while it ran.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FaultLog {
    /// When the fault actually hit (s), if it did.
    pub fault_s: Option<f64>,
    pub recover_s: Option<f64>,
    /// Requests sent from here on must succeed.
    pub settle_s: f64,
    /// Checks measured live (membership convergence, …).
    pub checks: Vec<Check>,
    /// Failures of the harness to inject (reported as a failed check).
    pub errors: Vec<String>,
    /// Named numbers for the report.
    pub numbers: BTreeMap<String, f64>,
}

/// The scenario's handle on the running system while it injects.
pub struct Ctx<'a> {
    pub cluster: &'a mut Cluster,
    pub plan: &'a Plan,
    pub t0: Instant,
    pub events: Vec<Event>,
    pub log: FaultLog,
}

impl Ctx<'_> {
    pub fn now_s(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
    /// Sleeps until `t_s` after `t0`.
    pub async fn at(&self, t_s: f64) {
        let due = self.t0 + Duration::from_secs_f64(t_s.max(0.0));
        tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
    }
    pub fn note(&mut self, what: impl Into<String>) {
        let t_s = self.now_s();
        self.events.push(Event {
            t_s,
            what: what.into(),
        });
    }
    pub fn fail(&mut self, what: impl Into<String>) {
        let w = what.into();
        self.note(format!("harness error: {w}"));
        self.log.errors.push(w);
    }
    /// Polls `nodes` together until `pred` has held on each or `bound_s` passes;
    /// returns, per node, the time (s after `t0`) it first held.
    pub async fn wait_all(
        &self,
        nodes: &[usize],
        bound_s: f64,
        pred: impl Fn(&NodeSample) -> bool,
    ) -> Vec<Option<f64>> {
        self.wait_all_joint(nodes, bound_s, |s, _| pred(s)).await
    }

    /// [`Self::wait_all`] where `pred` also sees every node's sample of the same round
    /// (e.g. to excuse a peer that itself has nothing to report). Every node is sampled
    /// every round, including those whose predicate already held.
    pub async fn wait_all_joint(
        &self,
        nodes: &[usize],
        bound_s: f64,
        pred: impl Fn(&NodeSample, &[NodeSample]) -> bool,
    ) -> Vec<Option<f64>> {
        let mesh = self.cluster.routers.len() > 1;
        let urls: Vec<Option<String>> = nodes
            .iter()
            .map(|n| self.cluster.routers.get(*n).map(|r| r.url()))
            .collect();
        let mut got: Vec<Option<f64>> = vec![None; nodes.len()];
        let end = Instant::now() + Duration::from_secs_f64(bound_s.max(0.0));
        loop {
            let polls = nodes
                .iter()
                .zip(&urls)
                .enumerate()
                .filter_map(|(k, (n, u))| {
                    let u = u.as_ref()?;
                    Some(async move {
                        let s = sample_node(
                            &self.cluster.client,
                            u,
                            *n,
                            mesh,
                            self.t0,
                            Duration::from_millis(300),
                        )
                        .await;
                        (k, s)
                    })
                });
            let round: Vec<(usize, NodeSample)> = futures_util::future::join_all(polls).await;
            let samples: Vec<NodeSample> = round.iter().map(|(_, s)| s.clone()).collect();
            for (k, s) in &round {
                if got[*k].is_none() && pred(s, &samples) {
                    got[*k] = Some(s.t_s);
                }
            }
            if got.iter().all(Option::is_some) || Instant::now() > end {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls node `node` until `pred` holds on its sample or `bound_s` passes; returns
    /// the time (s after `t0`) it first held.
    pub async fn wait_for(
        &self,
        node: usize,
        bound_s: f64,
        pred: impl Fn(&NodeSample) -> bool,
    ) -> Option<f64> {
        let url = self.cluster.routers.get(node)?.url();
        let mesh = self.cluster.routers.len() > 1;
        let end = Instant::now() + Duration::from_secs_f64(bound_s);
        loop {
            let s = sample_node(
                &self.cluster.client,
                &url,
                node,
                mesh,
                self.t0,
                Duration::from_millis(300),
            )
            .await;
            if pred(&s) {
                return Some(s.t_s);
            }
            if Instant::now() > end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Everything a scenario's checks read.
pub struct Finished<'a> {
    pub plan: &'a Plan,
    pub records: &'a [Record],
    pub samples: &'a [NodeSample],
    pub log: &'a FaultLog,
    pub load_end_s: f64,
    /// Each node's `/metrics` at the end (None for a dead node).
    pub metrics: &'a [Option<String>],
    pub router_ids: Vec<String>,
    /// Ends by node that the scenario excuses from the clean-end check.
    pub killed_node: Option<(usize, f64)>,
}

/// Per-scenario result.
#[derive(Clone, Debug, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub about: String,
    pub seed: u64,
    pub pass: bool,
    /// Setup failure (no checks could run).
    pub error: Option<String>,
    pub wall_s: f64,
    pub plan: Option<Plan>,
    pub timeline: Vec<Event>,
    pub fault: FaultLog,
    pub requests: usize,
    /// Requests answered with their whole result (the rest: refused, errors, cut,
    /// abandoned by plan — see `outcomes`).
    pub answered: usize,
    pub outcomes: BTreeMap<String, usize>,
    pub e2e_p50_s: Option<f64>,
    pub e2e_p99_s: Option<f64>,
    pub max_send_lag_s: f64,
    pub served_by: BTreeMap<String, usize>,
    pub checks: Vec<Check>,
    pub log_dir: String,
}

/// How long ledgers may take to drain after the load (peer reports expire in 3 s).
const DRAIN_BOUND_S: f64 = 10.0;

/// Runs `sc` end to end; never panics, always stops what it started.
pub async fn run(sc: Scenario, opts: &RunOptions) -> ScenarioReport {
    let wall = Instant::now();
    let plan = sc.plan(opts);
    let dir = opts.out_dir.join("logs").join(sc.name());
    let mut report = ScenarioReport {
        name: sc.name().into(),
        about: sc.about().into(),
        seed: opts.seed,
        pass: false,
        error: None,
        wall_s: 0.0,
        plan: Some(plan.clone()),
        timeline: Vec::new(),
        fault: FaultLog::default(),
        requests: 0,
        answered: 0,
        outcomes: BTreeMap::new(),
        e2e_p50_s: None,
        e2e_p99_s: None,
        max_send_lag_s: 0.0,
        served_by: BTreeMap::new(),
        checks: Vec::new(),
        log_dir: dir.display().to_string(),
    };
    let mut cluster = match Cluster::start(plan.cluster.clone(), opts.bins.clone(), &dir).await {
        Ok(c) => c,
        Err(e) => {
            report.error = Some(e.to_string());
            report.wall_s = wall.elapsed().as_secs_f64();
            return report;
        }
    };
    let urls = cluster.router_urls();
    let mesh = urls.len() > 1;
    let t0 = Instant::now();
    let sampler = Sampler::start(urls.clone(), mesh, t0, Duration::from_millis(100));
    let schedule = load::schedule(&plan.load, urls.len(), opts.seed);
    let driver = tokio::spawn(load::drive(
        schedule,
        urls.clone(),
        plan.client.clone(),
        plan.load.max_inflight,
        t0,
    ));
    let mut ctx = Ctx {
        cluster: &mut cluster,
        plan: &plan,
        t0,
        events: Vec::new(),
        log: FaultLog::default(),
    };
    ctx.note("load starts");
    sc.inject(&mut ctx).await;
    let loaded = driver.await.unwrap_or_default();
    let load_end_s = t0.elapsed().as_secs_f64();
    ctx.note(format!(
        "load done: {} requests ended",
        loaded.records.len()
    ));
    sc.after_load(&mut ctx).await;
    let (mut timeline, mut log) = (
        std::mem::take(&mut ctx.events),
        std::mem::take(&mut ctx.log),
    );
    log.numbers
        .insert("startup_converge_s".into(), cluster.converge_s);
    let drain = drain_ledgers(&cluster, t0, load_end_s).await;
    let metrics = read_metrics(&cluster).await;
    save_debug_views(&cluster, &dir).await;
    let samples = sampler.finish().await;
    let crashed = cluster.crashed();
    cluster.teardown().await;
    let left = cluster.leftovers();
    timeline.push(Event {
        t_s: t0.elapsed().as_secs_f64(),
        what: "teardown done".into(),
    });

    let records = &loaded.records;
    write_lines(&dir.join("records.jsonl"), records);
    write_lines(&dir.join("samples.jsonl"), &samples);
    let fin = Finished {
        plan: &plan,
        records,
        samples: &samples,
        log: &log,
        load_end_s,
        metrics: &metrics,
        router_ids: cluster.routers.iter().map(|r| r.id.clone()).collect(),
        killed_node: sc.killed_node(&log),
    };
    let mut checks = vec![
        check::ends_within_bound(records, plan.client.deadline.as_secs_f64()),
        check::clean_ends(records, |r| excused(&fin, r)),
        check::output_integrity(records),
        check::no_client_errors(records),
        check::success_after(records, log.settle_s, plan.load.duration_s, 0.99),
        crate::scenarios::balanced_before(&fin),
    ];
    checks.extend(log.checks.iter().cloned());
    checks.extend(sc.checks(&fin));
    if !log.errors.is_empty() {
        checks.push(Check::new(
            "fault injected as planned",
            false,
            log.errors.join("; "),
        ));
    }
    checks.push(check::ledgers_drain(&drain));
    checks.push(check::no_crash(&crashed));
    checks.push(check::no_leftovers(&cluster.started, &left));

    let e2e: Vec<f64> = records.iter().map(|r| r.end_s - r.sent_s).collect();
    report.pass = checks.iter().all(|c| c.pass);
    report.checks = checks;
    report.timeline = timeline;
    report.fault = log;
    report.requests = records.len();
    report.answered = records.iter().filter(|r| r.class == EndClass::Ok).count();
    report.outcomes = check::class_counts(records)
        .into_iter()
        .map(|(k, v)| (class_name(k), v))
        .collect();
    report.e2e_p50_s = check::quantile(&e2e, 0.5);
    report.e2e_p99_s = check::quantile(&e2e, 0.99);
    report.max_send_lag_s = loaded.max_send_lag_s;
    for r in records {
        *report
            .served_by
            .entry(r.replica.clone().unwrap_or_else(|| "-".into()))
            .or_insert(0) += 1;
    }
    report.wall_s = wall.elapsed().as_secs_f64();
    report
}

/// One JSON object per line (request records, samples), next to the logs (best
/// effort: a write failure only loses debugging detail).
fn write_lines<T: Serialize>(path: &std::path::Path, items: &[T]) {
    let mut text = String::new();
    for r in items {
        if let Ok(line) = serde_json::to_string(r) {
            text.push_str(&line);
            text.push('\n');
        }
    }
    if let Err(e) = std::fs::write(path, text) {
        tracing::warn!("cannot write {}: {e}", path.display());
    }
}

pub fn class_name(c: EndClass) -> String {
    serde_json::to_value(c)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A cut stream is excused only when it ran through a router node the scenario killed,
/// was sent before the kill and ended after it.
fn excused(fin: &Finished<'_>, r: &Record) -> bool {
    match fin.killed_node {
        Some((node, at)) => {
            r.class == EndClass::Cut && r.node == Some(node) && r.sent_s <= at && r.end_s >= at
        }
        None => false,
    }
}

/// Polls every running, unpaused node until its own and peers' in-flight counts read
/// zero on every replica, or the bound passes.
async fn drain_ledgers(cluster: &Cluster, t0: Instant, load_end_s: f64) -> Drain {
    let mut d = Drain {
        nodes: Vec::new(),
        bound_s: DRAIN_BOUND_S,
    };
    let live: Vec<(usize, String, String)> = cluster
        .routers
        .iter()
        .enumerate()
        .filter(|(_, r)| r.proc.is_some() && !r.paused)
        .map(|(i, r)| (i, r.id.clone(), r.url()))
        .collect();
    let mesh = cluster.routers.len() > 1;
    let end = Instant::now() + Duration::from_secs_f64(DRAIN_BOUND_S);
    let mut state: Vec<(String, Option<f64>, f64, f64)> = live
        .iter()
        .map(|(_, id, _)| (id.clone(), None, f64::NAN, f64::NAN))
        .collect();
    loop {
        for (k, (i, _, url)) in live.iter().enumerate() {
            if state[k].1.is_some() {
                continue;
            }
            let s = sample_node(
                &cluster.client,
                url,
                *i,
                mesh,
                t0,
                Duration::from_millis(500),
            )
            .await;
            if let Some(reps) = &s.replicas {
                let own: f64 = reps.iter().map(|r| r.inflight).sum();
                let peer: f64 = reps.iter().map(|r| r.peer_inflight).sum();
                state[k].2 = own;
                state[k].3 = peer;
                if own == 0.0 && peer == 0.0 {
                    state[k].1 = Some((s.t_s - load_end_s).max(0.0));
                }
            }
        }
        if state.iter().all(|s| s.1.is_some()) || Instant::now() > end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    d.nodes = state;
    d
}

/// Each live node's `/debug/replicas` and `/debug/predictor` at the end, next to the
/// logs (best effort: for reading a failure afterwards).
async fn save_debug_views(cluster: &Cluster, dir: &std::path::Path) {
    for r in cluster
        .routers
        .iter()
        .filter(|r| r.proc.is_some() && !r.paused)
    {
        for view in ["replicas", "predictor", "cluster"] {
            let url = format!("{}/debug/{view}", r.url());
            if let Ok(text) = get_text(&cluster.client, &url, Duration::from_secs(2)).await {
                let _ = std::fs::write(dir.join(format!("{}-{view}.json", r.id)), text);
            }
        }
    }
}

async fn read_metrics(cluster: &Cluster) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for r in &cluster.routers {
        if r.proc.is_none() || r.paused {
            out.push(None);
            continue;
        }
        out.push(
            get_text(
                &cluster.client,
                &format!("{}/metrics", r.url()),
                Duration::from_secs(2),
            )
            .await
            .ok(),
        );
    }
    out
}
