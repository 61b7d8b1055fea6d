//! Per region and phase of a run with a dark region: attainment and the share of
//! requests routed out of region.
//!
//! A request belongs to the region of the router node that took it; it is *remote*
//! when placed on a replica of another region; *phases* split arrivals at the first
//! dark window (`before` < from ≤ `during` < to ≤ `after`), one `all` phase without
//! one. Attainment counts every request of the phase, rejected ones as misses.

use serde::Serialize;

use crate::{
    live::table::{Table, num},
    sim::{RunResult, SimConfig},
};

/// One region in one phase.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseRow {
    pub region: String,
    pub phase: &'static str,
    pub requests: usize,
    /// Share meeting both objectives.
    pub attainment: Option<f64>,
    /// Share placed on another region's replica.
    pub remote_share: Option<f64>,
    /// Share meeting both objectives among the remote ones.
    pub remote_attainment: Option<f64>,
}

/// The rows of `run` as simulated with `cfg`, by region (the fleet's order) then phase.
pub fn region_phases(run: &RunResult, cfg: &SimConfig) -> Vec<PhaseRow> {
    let replica_regions = cfg.replica_regions();
    let node_regions: Vec<String> = (0..run.routers).map(|n| cfg.node_region(n)).collect();
    let phases: Vec<(&'static str, f64, f64)> = match cfg.dark.first() {
        Some(d) => vec![
            ("before", f64::NEG_INFINITY, d.from_s),
            ("during", d.from_s, d.to_s),
            ("after", d.to_s, f64::INFINITY),
        ],
        None => vec![("all", f64::NEG_INFINITY, f64::INFINITY)],
    };
    let share = |n: usize, d: usize| (d > 0).then(|| n as f64 / d as f64);
    let mut out = Vec::new();
    for region in cfg.region_names() {
        for &(phase, from, to) in &phases {
            let recs: Vec<_> = run
                .records
                .iter()
                .filter(|r| node_regions.get(r.node as usize) == Some(&region))
                .filter(|r| r.arrival_s >= from && r.arrival_s < to)
                .collect();
            let remote: Vec<_> = recs
                .iter()
                .filter(|r| {
                    r.replica
                        .and_then(|i| replica_regions.get(i as usize))
                        .is_some_and(|rr| *rr != region)
                })
                .collect();
            out.push(PhaseRow {
                region: region.clone(),
                phase,
                requests: recs.len(),
                attainment: share(recs.iter().filter(|r| r.met_both()).count(), recs.len()),
                remote_share: share(remote.len(), recs.len()),
                remote_attainment: share(
                    remote.iter().filter(|r| r.met_both()).count(),
                    remote.len(),
                ),
            });
        }
    }
    out
}

/// The rows as a markdown table, one per region and phase.
pub fn markdown(policy: &str, rows: &[PhaseRow]) -> String {
    let mut t = Table::new(&[
        "policy",
        "region",
        "phase",
        "requests",
        "attainment",
        "routed remote",
        "remote attainment",
    ]);
    let pct = |v: Option<f64>| num(v.map(|x| x * 100.0), 1);
    for r in rows {
        t.push(vec![
            policy.to_string(),
            r.region.clone(),
            r.phase.to_string(),
            r.requests.to_string(),
            pct(r.attainment),
            pct(r.remote_share),
            pct(r.remote_attainment),
        ]);
    }
    t.to_markdown()
}
