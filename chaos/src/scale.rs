//! The mesh at scale with real processes: the same seeded load (clients spread
//! evenly over the node list) is played first against one router node, then against
//! `nodes` router nodes meshed over QUIC, both in front of one set of emulated
//! replicas started afresh for each side. Compared: SLO attainment, load imbalance
//! across replicas, and — for the mesh — gossip bytes and CPU per node.
//!
//! Definitions (per side, over the requests of the schedule):
//! - attainment = share of requests answered whole whose TTFT ≤ the TTFT objective
//!   and, for streams of ≥ 2 tokens, whose TPOT ≤ the TPOT objective (non-streamed
//!   requests count by success; every failure is a miss);
//! - imbalance = max over replicas of requests served / their mean − 1;
//! - gossip bytes per node per second = UDP payload bytes the node sent, measured at
//!   the harness's relay (no faults), over the load window;
//! - CPU per node = user + system CPU of its process over the load window, per second.
//!
//! Invariant: both sides get the same schedule (same seed), the same emulators'
//! seeds and the same objectives; everything started is stopped and checked gone.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::check::{self, Check};
use crate::client::{EndClass, Kind, Record};
use crate::cluster::{Cluster, ClusterSpec};
use crate::load::{self, LoadShape};
use crate::router_config::RouterTimings;
use crate::{Binaries, ChaosError, os};

/// What to run.
#[derive(Clone, Debug)]
pub struct ScaleOptions {
    pub nodes: usize,
    pub replicas: usize,
    pub duration_s: f64,
    pub rate_per_s: f64,
    pub seed: u64,
    pub time_scale: f64,
    /// TTFT and TPOT objectives (model ms; scaled to wall ms by the time scale).
    pub slo_model_ms: (f64, f64),
    /// Largest difference accepted, in percentage points, for attainment and imbalance.
    pub tolerance_pp: f64,
    pub out_dir: PathBuf,
    pub bins: Binaries,
    /// Every router node's timings (gossip interval, probe and scrape periods).
    pub timings: RouterTimings,
}

/// One side's measurements.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Side {
    pub nodes: usize,
    pub requests: usize,
    pub answered: usize,
    pub attainment: f64,
    pub imbalance: f64,
    pub served_by: BTreeMap<String, usize>,
    /// Per replica, how many requests each node (by index) had it serve: whether an
    /// under-served replica is under-served by every node (a shared view) or by a few.
    pub served_by_node: BTreeMap<String, Vec<usize>>,
    /// Per replica, requests it served in each [`WINDOW_S`] window of send time:
    /// whether a shortfall lasts the run or comes in spells.
    pub served_by_window: BTreeMap<String, Vec<usize>>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    /// Mean and largest over nodes (None for a single node: no mesh).
    pub gossip_bytes_per_s_mean: Option<f64>,
    pub gossip_bytes_per_s_max: Option<f64>,
    pub cpu_ms_per_s_mean: f64,
    pub cpu_ms_per_s_max: f64,
    pub leftovers: usize,
    pub crashed: Vec<String>,
}

/// Width of the windows of [`Side::served_by_window`] (s).
pub const WINDOW_S: f64 = 10.0;

/// Both sides and the verdict.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleReport {
    pub nodes: usize,
    pub replicas: usize,
    pub duration_s: f64,
    pub rate_per_s: f64,
    pub seed: u64,
    pub time_scale: f64,
    pub slo_model_ms: (f64, f64),
    pub timings: RouterTimings,
    pub single: Side,
    pub mesh: Side,
    pub checks: Vec<Check>,
    pub pass: bool,
}

fn spec(o: &ScaleOptions, routers: usize) -> ClusterSpec {
    ClusterSpec {
        replica_profiles: vec!["h100-llama3-8b".into(); o.replicas],
        bad_metrics: None,
        routers,
        relay: routers > 1,
        clock_offsets_ms: Vec::new(),
        policy: "slo".into(),
        timings: o.timings.clone(),
        time_scale: o.time_scale,
        seed: o.seed,
        model: "llama-3-8b".into(),
    }
}

fn shape(o: &ScaleOptions) -> LoadShape {
    LoadShape {
        rate_per_s: o.rate_per_s,
        duration_s: o.duration_s,
        max_tokens: (32, 192),
        prompt_words: (20, 200),
        chat_share: 0.2,
        whole_share: 0.1,
        max_inflight: 1024,
        abandon_share: 0.0,
        abandon_window: (0.0, 0.0),
        burst: None,
    }
}

/// Whether `r` met its objectives (wall seconds).
fn met(r: &Record, ttft_s: f64, tpot_s: f64) -> bool {
    if r.class != EndClass::Ok {
        return false;
    }
    if r.kind == Kind::Whole {
        return true;
    }
    let ttft_ok = r.first_token_s.is_some_and(|t| t - r.sent_s <= ttft_s);
    ttft_ok && r.tpot_s().is_none_or(|t| t <= tpot_s)
}

/// Runs one side: start, load, measure, stop.
async fn side(o: &ScaleOptions, routers: usize) -> Result<Side, ChaosError> {
    let dir = o.out_dir.join("logs").join(format!("{routers}-nodes"));
    let mut cluster = Cluster::start(spec(o, routers), o.bins.clone(), &dir).await?;
    let urls = cluster.router_urls();
    let (ttft_s, tpot_s) = (
        o.slo_model_ms.0 * o.time_scale / 1e3,
        o.slo_model_ms.1 * o.time_scale / 1e3,
    );
    let client = crate::client::ClientSettings {
        model: "llama-3-8b".into(),
        header_failover: None,
        deadline: crate::scenarios::REQUEST_DEADLINE,
        slo_ms: Some((ttft_s * 1e3, tpot_s * 1e3)),
        next_on_unavailable: false,
    };
    let pids: Vec<u32> = (0..routers).filter_map(|i| cluster.router_pid(i)).collect();
    let cpu0: Vec<f64> = pids.iter().map(|p| os::cpu_s(*p).unwrap_or(0.0)).collect();
    let bytes0 = cluster.relay.as_ref().map(|r| r.sent_bytes());
    let t0 = Instant::now();
    let schedule = load::schedule(&shape(o), urls.len(), o.seed);
    let sh = shape(o);
    let loaded = load::drive(schedule, urls, client, sh.max_inflight, t0).await;
    let window = t0.elapsed().as_secs_f64().max(1e-3);
    let cpu: Vec<f64> = pids
        .iter()
        .zip(&cpu0)
        .map(|(p, c0)| (os::cpu_s(*p).unwrap_or(*c0) - c0) * 1e3 / window)
        .collect();
    let gossip: Option<Vec<f64>> = match (&cluster.relay, bytes0) {
        (Some(r), Some(b0)) => Some(
            r.sent_bytes()
                .iter()
                .zip(&b0)
                .map(|(b, a)| (b - a) as f64 / window)
                .collect(),
        ),
        _ => None,
    };
    save_decisions(&cluster, &dir).await;
    let crashed = cluster.crashed();
    cluster.teardown().await;
    let leftovers = cluster.leftovers().len();

    let records = &loaded.records;
    let mut served_by: BTreeMap<String, usize> = cluster
        .replicas
        .iter()
        .map(|r| (r.name.clone(), 0))
        .collect();
    for r in records.iter().filter(|r| r.class == EndClass::Ok) {
        if let Some(n) = &r.replica {
            *served_by.entry(n.clone()).or_insert(0) += 1;
        }
    }
    let mut served_by_node: BTreeMap<String, Vec<usize>> = served_by
        .keys()
        .map(|k| (k.clone(), vec![0; routers]))
        .collect();
    let windows = (o.duration_s / WINDOW_S).ceil().max(1.0) as usize;
    let mut served_by_window: BTreeMap<String, Vec<usize>> = served_by
        .keys()
        .map(|k| (k.clone(), vec![0; windows]))
        .collect();
    for r in records.iter().filter(|r| r.class == EndClass::Ok) {
        let Some(n) = &r.replica else { continue };
        if let (Some(node), Some(v)) = (r.node, served_by_node.get_mut(n))
            && let Some(c) = v.get_mut(node)
        {
            *c += 1;
        }
        if let Some(v) = served_by_window.get_mut(n) {
            let w = ((r.sent_s / WINDOW_S).max(0.0) as usize).min(windows - 1);
            v[w] += 1;
        }
    }
    let counts: Vec<f64> = served_by.values().map(|v| *v as f64).collect();
    let mean = counts.iter().sum::<f64>() / counts.len().max(1) as f64;
    let max = counts.iter().copied().fold(0.0, f64::max);
    let ttft: Vec<f64> = records
        .iter()
        .filter_map(|r| Some((r.first_token_s? - r.sent_s) * 1e3))
        .collect();
    let stat = |v: &[f64], f: fn(f64, f64) -> f64| v.iter().copied().reduce(f);
    Ok(Side {
        nodes: routers,
        requests: records.len(),
        answered: records.iter().filter(|r| r.class == EndClass::Ok).count(),
        attainment: records.iter().filter(|r| met(r, ttft_s, tpot_s)).count() as f64
            / records.len().max(1) as f64,
        imbalance: if mean > 0.0 { max / mean - 1.0 } else { 0.0 },
        served_by,
        served_by_node,
        served_by_window,
        ttft_p50_ms: check::quantile(&ttft, 0.5),
        ttft_p99_ms: check::quantile(&ttft, 0.99),
        gossip_bytes_per_s_mean: gossip
            .as_ref()
            .map(|g| g.iter().sum::<f64>() / g.len().max(1) as f64),
        gossip_bytes_per_s_max: gossip.as_ref().and_then(|g| stat(g.as_slice(), f64::max)),
        cpu_ms_per_s_mean: cpu.iter().sum::<f64>() / cpu.len().max(1) as f64,
        cpu_ms_per_s_max: stat(cpu.as_slice(), f64::max).unwrap_or(0.0),
        leftovers,
        crashed,
    })
}

/// Runs the single node, then the mesh, and judges.
pub async fn run_scale(o: &ScaleOptions) -> Result<ScaleReport, ChaosError> {
    let single = side(o, 1).await?;
    let mesh = side(o, o.nodes).await?;
    let pp = |x: f64| x * 100.0;
    let tol = o.tolerance_pp;
    let d_att = pp(mesh.attainment - single.attainment);
    let d_imb = pp(mesh.imbalance - single.imbalance);
    let mut checks = vec![
        Check::new(
            "nothing lost: every request answered whole on both sides",
            single.answered == single.requests && mesh.answered == mesh.requests,
            format!(
                "1 node: {}/{}; {} nodes: {}/{}",
                single.answered, single.requests, mesh.nodes, mesh.answered, mesh.requests
            ),
        ),
        Check::new(
            &format!("attainment of the mesh within {tol} points of the single node (or better)"),
            d_att >= -tol,
            format!(
                "{:.1}% with {} nodes vs {:.1}% with 1 ({d_att:+.1} points)",
                pp(mesh.attainment),
                mesh.nodes,
                pp(single.attainment)
            ),
        ),
        Check::new(
            &format!(
                "load imbalance of the mesh within {tol} points of the single node (or better)"
            ),
            d_imb <= tol,
            format!(
                "max/mean − 1 = {:.1}% with {} nodes vs {:.1}% with 1 ({d_imb:+.1} points)",
                pp(mesh.imbalance),
                mesh.nodes,
                pp(single.imbalance)
            ),
        ),
    ];
    checks.push(Check::new(
        "no process crashed or was left behind",
        single.crashed.is_empty()
            && mesh.crashed.is_empty()
            && single.leftovers == 0
            && mesh.leftovers == 0,
        format!(
            "crashed: {:?} / {:?}; left running: {} / {}",
            single.crashed, mesh.crashed, single.leftovers, mesh.leftovers
        ),
    ));
    let pass = checks.iter().all(|c| c.pass);
    Ok(ScaleReport {
        nodes: o.nodes,
        replicas: o.replicas,
        duration_s: o.duration_s,
        rate_per_s: o.rate_per_s,
        seed: o.seed,
        time_scale: o.time_scale,
        slo_model_ms: o.slo_model_ms,
        timings: o.timings.clone(),
        single,
        mesh,
        checks,
        pass,
    })
}

/// The Markdown form of a scale report.
pub fn markdown(r: &ScaleReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Mesh at scale: {} router nodes vs 1\n\nVerdict: {}. {} emulated replicas (h100-llama3-8b, time scale {}), {:.0} s of Poisson load at {} req/s (seed {}), clients spread evenly over the node list; objectives TTFT {} ms, TPOT {} ms (model time).\n",
        r.nodes,
        if r.pass { "PASS" } else { "**FAIL**" },
        r.replicas,
        r.time_scale,
        r.duration_s,
        r.rate_per_s,
        r.seed,
        r.slo_model_ms.0,
        r.slo_model_ms.1
    );
    let t = &r.timings;
    let _ = writeln!(
        s,
        "Router timings: gossip every {} ms, health probes every {} ms, scrapes every {} ms (shared at most every {} ms).\n",
        t.gossip_interval_ms, t.probe_interval_ms, t.scrape_interval_ms, t.scrape_publish_ms
    );
    let _ = writeln!(
        s,
        "| nodes | sent | answered | attainment | imbalance (max/mean − 1) | TTFT p50 / p99 ms | gossip B/s per node mean / max | CPU ms/s per node mean / max |\n|---|---|---|---|---|---|---|---|"
    );
    for x in [&r.single, &r.mesh] {
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1}% | {:.1}% | {} / {} | {} / {} | {:.1} / {:.1} |",
            x.nodes,
            x.requests,
            x.answered,
            x.attainment * 100.0,
            x.imbalance * 100.0,
            f(x.ttft_p50_ms),
            f(x.ttft_p99_ms),
            f(x.gossip_bytes_per_s_mean),
            f(x.gossip_bytes_per_s_max),
            x.cpu_ms_per_s_mean,
            x.cpu_ms_per_s_max
        );
    }
    for x in [&r.single, &r.mesh] {
        let _ = write!(s, "{}", where_served(x));
    }
    let _ = writeln!(s, "\n| check | verdict | detail |\n|---|---|---|");
    for c in &r.checks {
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            c.name,
            if c.pass { "PASS" } else { "**FAIL**" },
            c.detail
        );
    }
    s
}

/// Per replica of one side: its share of the requests served, how many nodes sent it
/// less than a fair share of their own requests, and its share per window — where an
/// imbalance sits (one node, every node; a spell, the whole run).
fn where_served(x: &Side) -> String {
    use std::fmt::Write as _;
    let k = x.served_by.len().max(1) as f64;
    let node_totals: Vec<usize> = (0..x.nodes)
        .map(|i| {
            x.served_by_node
                .values()
                .map(|v| v.get(i).copied().unwrap_or(0))
                .sum()
        })
        .collect();
    let windows = x.served_by_window.values().map(Vec::len).max().unwrap_or(0);
    let window_totals: Vec<usize> = (0..windows)
        .map(|w| {
            x.served_by_window
                .values()
                .map(|v| v.get(w).copied().unwrap_or(0))
                .sum()
        })
        .collect();
    let total: usize = x.served_by.values().sum();
    let pct = |a: usize, b: usize| {
        if b > 0 {
            a as f64 * 100.0 / b as f64
        } else {
            0.0
        }
    };
    let mut s = format!(
        "\n{} node(s), per replica (fair share {:.1}%):\n\n| replica | share | nodes under a fair share / nodes | share per {WINDOW_S:.0} s window |\n|---|---|---|---|\n",
        x.nodes,
        100.0 / k
    );
    for (name, served) in &x.served_by {
        let per_node = x.served_by_node.get(name);
        let under = (0..x.nodes)
            .filter(|&i| {
                let got = per_node.and_then(|v| v.get(i)).copied().unwrap_or(0);
                node_totals[i] > 0 && (got as f64) < node_totals[i] as f64 / k
            })
            .count();
        let per_window: Vec<String> = x
            .served_by_window
            .get(name)
            .map(|v| {
                v.iter()
                    .zip(&window_totals)
                    .map(|(a, b)| format!("{:.0}", pct(*a, *b)))
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "| {name} | {:.1}% | {under} / {} | {} |",
            pct(*served, total),
            x.nodes,
            per_window.join(" ")
        );
    }
    s
}

/// Writes `scale.json` and `scale.md` into `dir`.
pub fn write(dir: &std::path::Path, r: &ScaleReport) -> Result<(), ChaosError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| ChaosError::io(format!("creating {}", dir.display()), e))?;
    std::fs::write(dir.join("scale.json"), serde_json::to_string_pretty(r)?)
        .map_err(|e| ChaosError::io("writing scale.json", e))?;
    std::fs::write(dir.join("scale.md"), markdown(r))
        .map_err(|e| ChaosError::io("writing scale.md", e))?;
    Ok(())
}

/// Each node's recent decision records (`/debug/decisions`, newest first, up to the
/// ring's size), as `decisions-n<i>.json` beside the nodes' logs: which replicas each
/// node saw as near-equal, and why, when the mesh's spread differs from the single
/// node's. Best effort: a node that does not answer leaves no file.
async fn save_decisions(cluster: &Cluster, dir: &std::path::Path) {
    for (i, r) in cluster.routers.iter().enumerate() {
        let url = format!("{}/debug/decisions?limit=100000", r.url());
        if let Ok(text) =
            crate::http::get_text(&cluster.client, &url, Duration::from_secs(30)).await
        {
            let _ = std::fs::write(dir.join(format!("decisions-n{i}.json")), text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica every node sends less than a fair share to is reported as under-served
    /// by all of them, and its shortfall shows in each window it lasts.
    #[test]
    fn where_served_names_who_under_serves_a_replica_and_when() {
        let x = Side {
            nodes: 2,
            served_by: BTreeMap::from([("a".into(), 12), ("b".into(), 8)]),
            served_by_node: BTreeMap::from([("a".into(), vec![6, 6]), ("b".into(), vec![4, 4])]),
            served_by_window: BTreeMap::from([("a".into(), vec![5, 7]), ("b".into(), vec![5, 3])]),
            ..Side::default()
        };
        let md = where_served(&x);
        assert!(md.contains("| a | 60.0% | 0 / 2 | 50 70 |"), "{md}");
        assert!(md.contains("| b | 40.0% | 2 / 2 | 50 30 |"), "{md}");
    }
}
