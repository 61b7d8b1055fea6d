//! Regions: where a replica is relative to the deciding node, what the distance costs,
//! and what other regions say about themselves.
//!
//! Every node and replica has a region; a replica configured without one is in its
//! node's region. A replica in another region is *remote*: its view answers
//! [`crate::view::ReplicaView::remote_rtt_ms`] with the round trip between the two
//! regions (configured, [`RegionsConfig`]). The network adds that round trip once to
//! the TTFT the client sees (the request travels there, the first token back: two
//! one-way delays = one RTT); in steady state tokens stream back one RTT/2 late each,
//! so the TPOT is unchanged.
//!
//! Invariants:
//! - the `slo` policy judges a remote candidate's TTFT against the objective less the
//!   RTT (`P(engine TTFT + RTT > objective) = P(engine TTFT > objective − RTT)`, exact
//!   for a fixed RTT), and routes out of region only when no local candidate meets both
//!   objectives and a remote one, RTT included, does; other policies see only local
//!   candidates while there is one ([`local_first`]);
//! - what the predictor learns is engine-side: a measured TTFT less the RTT, against the
//!   prediction less the RTT ([`without_rtt`]), so a replica's model and its class's
//!   federated statistics are the same whichever region measured them; what headers,
//!   metrics and forecast errors show is client-side ([`with_rtt`]);
//! - predictor statistics cross regions per class only ([`cross_region_slot`]): a
//!   per-replica correction stays with the region that measures the replica;
//! - a remote region's summary ([`RegionBook`]) is believed only while fresh (`ttl_s`):
//!   a fresh summary of zero healthy replicas marks the region dark, and a silent
//!   region's summaries simply age out (its replicas' own health then decides).

use std::collections::BTreeMap;

use headroom_predictor::{FederationSlot, Prediction};
use serde::{Deserialize, Serialize};

use crate::policy::{Candidate, Choice, DecideCtx, Decision, Policy, RequestProfile};

/// `[regions]`: the round trips between regions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegionsConfig {
    /// Round trip between two regions (ms), keyed `"a/b"` (either order serves both).
    pub rtt_ms: BTreeMap<String, f64>,
    /// Round trip assumed between two regions without an entry (ms).
    pub default_rtt_ms: f64,
    /// A remote region's summary older than this says nothing (ms).
    pub summary_ttl_ms: u64,
    /// How often each node publishes its region's summary (ms).
    pub summary_interval_ms: u64,
}

impl Default for RegionsConfig {
    fn default() -> Self {
        Self {
            rtt_ms: BTreeMap::new(),
            default_rtt_ms: 100.0,
            summary_ttl_ms: 5000,
            summary_interval_ms: 1000,
        }
    }
}

/// Why a `[regions]` table is refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RegionsError {
    #[error("regions.rtt_ms key `{0}` must name two different regions as \"a/b\"")]
    BadPair(String),
    #[error("regions.rtt_ms.\"{0}\" must be a finite number of ms in [0, 10000]")]
    BadRtt(String),
    #[error("regions.rtt_ms names the pair {0} twice (as \"a/b\" and \"b/a\")")]
    Duplicate(String),
}

/// Longest round trip accepted (ms): beyond it a typo is likelier than a link.
const MAX_RTT_MS: f64 = 10_000.0;

impl RegionsConfig {
    /// Checks every entry (the numbers' ranges live in the router's `validate.rs`, which
    /// calls this for the table's shape).
    pub fn check(&self) -> Result<(), RegionsError> {
        let mut seen = std::collections::BTreeSet::new();
        for (k, v) in &self.rtt_ms {
            let (a, b) = split_pair(k).ok_or_else(|| RegionsError::BadPair(k.clone()))?;
            if !(v.is_finite() && (0.0..=MAX_RTT_MS).contains(v)) {
                return Err(RegionsError::BadRtt(k.clone()));
            }
            let pair = if a < b { (a, b) } else { (b, a) };
            if !seen.insert(pair) {
                return Err(RegionsError::Duplicate(format!("{}/{}", pair.0, pair.1)));
            }
        }
        Ok(())
    }

    /// The round trip between regions `a` and `b` (ms): 0 within one region.
    pub fn rtt_between(&self, a: &str, b: &str) -> f64 {
        if a == b {
            return 0.0;
        }
        self.rtt_ms
            .get(&format!("{a}/{b}"))
            .or_else(|| self.rtt_ms.get(&format!("{b}/{a}")))
            .copied()
            .unwrap_or(self.default_rtt_ms)
    }

    /// What a replica in `replica_region` (None: the node's own) is to a node in
    /// `node_region`: `None` in region, else the round trip (ms).
    pub fn remote_rtt_ms(&self, node_region: &str, replica_region: Option<&str>) -> Option<f64> {
        match replica_region {
            Some(r) if r != node_region => Some(self.rtt_between(node_region, r)),
            _ => None,
        }
    }
}

fn split_pair(k: &str) -> Option<(&str, &str)> {
    let (a, b) = k.split_once('/')?;
    let (a, b) = (a.trim(), b.trim());
    (!a.is_empty() && !b.is_empty() && a != b && !b.contains('/')).then_some((a, b))
}

/// The candidate's round trip (ms), 0 in region.
pub fn rtt_of(c: &Candidate<'_>) -> f64 {
    c.replica.remote_rtt_ms().unwrap_or(0.0)
}

/// Whether a candidate is in the deciding node's region.
pub fn is_local(c: &Candidate<'_>) -> bool {
    c.replica.remote_rtt_ms().is_none()
}

/// `p` as the client sees it through `rtt_ms` of network: every TTFT quantile later by
/// the round trip (a constant shift moves each quantile by itself); TPOT unchanged.
pub fn with_rtt(p: Prediction, rtt_ms: f64) -> Prediction {
    shift_ttft(p, rtt_ms)
}

/// The engine-side prediction behind a client-side `p` (inverse of [`with_rtt`]).
pub fn without_rtt(p: Prediction, rtt_ms: f64) -> Prediction {
    shift_ttft(p, -rtt_ms)
}

fn shift_ttft(mut p: Prediction, d: f64) -> Prediction {
    if d == 0.0 || !d.is_finite() {
        return p;
    }
    p.ttft_ms = (p.ttft_ms + d).max(0.0);
    p.ttft_upper_ms = (p.ttft_upper_ms + d).max(0.0);
    p.ttft_median_ms = (p.ttft_median_ms + d).max(f64::MIN_POSITIVE);
    p
}

/// Runs `policy` on the local candidates only while there is one (a region's own
/// replicas first, whatever the policy); with none, on all. Indices in the returned
/// choice are `cands`' own; the policy's predictions and evaluations are kept only when
/// it saw every candidate (the caller fills them otherwise).
pub fn local_first(
    policy: &dyn Policy,
    req: &RequestProfile,
    cands: &[Candidate<'_>],
    ctx: &mut DecideCtx<'_>,
) -> Decision {
    if !cands.iter().any(is_local) {
        return policy.decide(req, cands, ctx);
    }
    decide_within(policy, req, cands, ctx, &|i| is_local(&cands[i]))
}

/// Runs `policy` on the candidates `keep` admits (all, when it admits none), with the
/// indices, predictions and evaluations as in [`local_first`].
pub fn decide_within(
    policy: &dyn Policy,
    req: &RequestProfile,
    cands: &[Candidate<'_>],
    ctx: &mut DecideCtx<'_>,
    keep: &dyn Fn(usize) -> bool,
) -> Decision {
    let local: Vec<usize> = (0..cands.len()).filter(|&i| keep(i)).collect();
    if local.is_empty() || local.len() == cands.len() {
        return policy.decide(req, cands, ctx);
    }
    let sub: Vec<Candidate<'_>> = local.iter().map(|&i| cands[i].clone()).collect();
    let mut d = policy.decide(req, &sub, ctx);
    let map = |v: &mut Vec<usize>| {
        for i in v.iter_mut() {
            *i = local[*i];
        }
    };
    match &mut d.choice {
        Choice::Route(o) => map(o),
        Choice::Defer { fallback_order, .. } => map(fallback_order),
        Choice::Reject(_) => {}
    }
    d.predictions.clear();
    d.evals.clear();
    d
}

/// Predictor statistics received from a node in another region: the class statistics
/// (shared hardware physics) without the per-replica corrections, which stay with the
/// region that measures those replicas.
pub fn cross_region_slot(mut slot: FederationSlot) -> FederationSlot {
    slot.corrections.clear();
    slot
}

/// What one region says about itself (the mesh's `RegionSummary`, on the node's axis).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RegionReport {
    pub region: String,
    /// Router nodes live in the region, as its publisher sees them.
    pub routers: u32,
    pub replicas: u32,
    pub healthy_replicas: u32,
    /// Mean free KV-cache share over the healthy replicas with a fresh scrape, [0, 1].
    pub free_kv_fraction: f64,
    /// Requests in flight on the region's replicas, as its publisher knows them.
    pub in_flight: f64,
    /// When it was received (node axis, s).
    pub at_s: f64,
}

/// The latest report of each other region, and what they imply.
#[derive(Clone, Debug, Default)]
pub struct RegionBook {
    reports: BTreeMap<String, RegionReport>,
}

impl RegionBook {
    /// Keeps `r` unless a later report of its region is held.
    pub fn note(&mut self, r: RegionReport) {
        match self.reports.get(&r.region) {
            Some(old) if old.at_s > r.at_s => {}
            _ => {
                self.reports.insert(r.region.clone(), r);
            }
        }
    }

    /// The report of `region` if younger than `ttl_s` at `now_s`.
    pub fn fresh(&self, region: &str, now_s: f64, ttl_s: f64) -> Option<&RegionReport> {
        self.reports.get(region).filter(|r| now_s - r.at_s <= ttl_s)
    }

    /// A fresh report says the region has replicas and none is healthy.
    pub fn dark(&self, region: &str, now_s: f64, ttl_s: f64) -> bool {
        self.fresh(region, now_s, ttl_s)
            .is_some_and(|r| r.replicas > 0 && r.healthy_replicas == 0)
    }

    /// Every report held, freshest knowledge first per region name.
    pub fn reports(&self) -> impl Iterator<Item = &RegionReport> {
        self.reports.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, f64)]) -> RegionsConfig {
        RegionsConfig {
            rtt_ms: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..RegionsConfig::default()
        }
    }

    #[test]
    fn rtt_is_symmetric_zero_in_region_and_defaulted() {
        let c = cfg(&[("eu-1/us-1", 50.0)]);
        c.check().unwrap();
        assert_eq!(c.rtt_between("eu-1", "us-1"), 50.0);
        assert_eq!(c.rtt_between("us-1", "eu-1"), 50.0);
        assert_eq!(c.rtt_between("eu-1", "eu-1"), 0.0);
        assert_eq!(c.rtt_between("eu-1", "ap-1"), c.default_rtt_ms);
        assert_eq!(c.remote_rtt_ms("eu-1", None), None, "no region: the node's");
        assert_eq!(c.remote_rtt_ms("eu-1", Some("eu-1")), None);
        assert_eq!(c.remote_rtt_ms("eu-1", Some("us-1")), Some(50.0));
    }

    #[test]
    fn bad_tables_are_refused_naming_the_entry() {
        for (k, v) in [
            ("eu-1", 5.0),
            ("eu-1/eu-1", 5.0),
            ("/x", 5.0),
            ("a/b/c", 5.0),
        ] {
            assert_eq!(cfg(&[(k, v)]).check(), Err(RegionsError::BadPair(k.into())));
        }
        for v in [-1.0, f64::NAN, 1e9] {
            assert_eq!(
                cfg(&[("a/b", v)]).check(),
                Err(RegionsError::BadRtt("a/b".into()))
            );
        }
        assert_eq!(
            cfg(&[("a/b", 1.0), ("b/a", 2.0)]).check(),
            Err(RegionsError::Duplicate("a/b".into()))
        );
    }

    #[test]
    fn rtt_shifts_ttft_quantiles_and_back() {
        let p = Prediction {
            ttft_ms: 200.0,
            ttft_upper_ms: 260.0,
            ttft_median_ms: 190.0,
            tpot_ms: 20.0,
            ..Prediction::default()
        };
        let c = with_rtt(p, 50.0);
        assert_eq!(
            (c.ttft_ms, c.ttft_upper_ms, c.ttft_median_ms),
            (250.0, 310.0, 240.0)
        );
        assert_eq!(c.tpot_ms, 20.0, "TPOT is not shifted");
        assert_eq!(without_rtt(c, 50.0), p);
    }

    #[test]
    fn a_fresh_summary_of_no_healthy_replica_is_dark_and_ages_out() {
        let mut b = RegionBook::default();
        let r = |healthy, at_s| RegionReport {
            region: "us-1".into(),
            routers: 1,
            replicas: 4,
            healthy_replicas: healthy,
            free_kv_fraction: 0.5,
            in_flight: 0.0,
            at_s,
        };
        assert!(!b.dark("us-1", 0.0, 5.0), "nothing heard: not dark");
        b.note(r(0, 10.0));
        assert!(b.dark("us-1", 12.0, 5.0));
        assert!(!b.dark("us-1", 16.0, 5.0), "stale: says nothing");
        b.note(r(4, 9.0));
        assert!(b.dark("us-1", 12.0, 5.0), "an older report does not win");
        b.note(r(4, 13.0));
        assert!(!b.dark("us-1", 14.0, 5.0), "back");
    }
}
