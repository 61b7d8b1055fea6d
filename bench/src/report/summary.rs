//! One run's figures: SLO attainment, goodput, latency percentiles, per-tenant
//! attainment, forecast quality, decision cost, load balance, rejections, cache hits.
//!
//! Definitions (every share is in 0..=1; latencies in milliseconds; percentiles are
//! exact nearest-rank over sorted values, see [`super::quantile`]):
//! - attainment: requests meeting both objectives / all requests — rejected and never
//!   served requests count as misses (`RequestRecord::met_*`);
//! - goodput: requests meeting both / seconds from the first to the last arrival (the
//!   simulated duration when all arrive at once);
//! - TTFT/TPOT percentiles: over requests that have the value;
//! - forecast: APE = |predicted − actual| / actual over requests with both (actual > 0);
//!   MAPE its mean, MdAPE its median (both in percent); absolute-error percentiles;
//!   coverage = share with actual ≤ predicted upper bound, over requests with both;
//! - load CV: per load sample, population std / mean of in-flight counts across
//!   replicas, over samples with any load (idle samples say nothing about balance);
//! - replica share: placed requests per replica / all placed requests;
//! - cache hit share: cached prompt tokens / prompt tokens, over served requests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::quantile::{Percentiles, mean, nearest_rank, sorted};
use crate::sim::result::{RequestRecord, RunResult};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantSummary {
    pub requests: usize,
    pub attainment: f64,
    pub ttft_attainment: f64,
    pub tpot_attainment: f64,
    pub ttft_p95_ms: Option<f64>,
}

/// How good one kind of prediction was.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ForecastQuality {
    /// Requests with both a prediction and an actual value.
    pub samples: usize,
    pub mape_pct: f64,
    pub mdape_pct: f64,
    pub abs_err_p50_ms: f64,
    pub abs_err_p95_ms: f64,
    /// Requests with both an upper bound and an actual value.
    pub bound_samples: usize,
    /// Share of those with actual ≤ upper bound (`None` without bounds).
    pub coverage: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadBalance {
    /// Load samples with at least one request in flight.
    pub samples: usize,
    pub cv_mean: Option<f64>,
    pub cv_p95: Option<f64>,
    /// Placed requests per replica (index as in `RunResult::replicas`).
    pub replica_share: Vec<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub policy: String,
    pub workload: String,
    pub rate_scale: f64,
    pub requests: usize,
    /// Requests with a first token.
    pub served: usize,
    pub attainment: f64,
    pub ttft_attainment: f64,
    pub tpot_attainment: f64,
    pub goodput_rps: f64,
    /// Offered load: requests / arrival window.
    pub offered_rps: f64,
    pub arrival_window_s: f64,
    pub ttft_ms: Option<Percentiles>,
    pub tpot_ms: Option<Percentiles>,
    pub tenants: BTreeMap<String, TenantSummary>,
    pub ttft_forecast: Option<ForecastQuality>,
    pub tpot_forecast: Option<ForecastQuality>,
    /// Routing decision time in microseconds.
    pub decision_us: Option<Percentiles>,
    pub load: LoadBalance,
    pub rejected_share: f64,
    /// Requests where the policy fell back (nothing fitted).
    pub fallback_share: f64,
    /// That share by the fallback's label (`cold-model`, `no-fit`, `deferred`, …).
    #[serde(default)]
    pub fallback_by: BTreeMap<String, f64>,
    pub cache_hit_share: f64,
    /// Served requests that ran disaggregated (prefill on one replica, decode on
    /// another); 0 on a unified fleet.
    #[serde(default)]
    pub disaggregated_share: f64,
}

fn share(n: usize, d: usize) -> f64 {
    if d == 0 { 0.0 } else { n as f64 / d as f64 }
}

/// Tenant key for requests without one.
pub const NO_TENANT: &str = "-";

/// Share of the run (by arrival order) excluded from forecast quality: the predictor's
/// warm-up, when it has seen few outcomes.
pub const FORECAST_WARMUP_SHARE: f64 = 0.1;

/// Records after the warm-up share of arrivals.
fn after_warmup(recs: &[RequestRecord], share: f64) -> impl Iterator<Item = &RequestRecord> {
    let first = recs
        .iter()
        .map(|r| r.arrival_s)
        .fold(f64::INFINITY, f64::min);
    let last = recs
        .iter()
        .map(|r| r.arrival_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let cut = first + (last - first).max(0.0) * share.clamp(0.0, 1.0);
    recs.iter().filter(move |r| r.arrival_s >= cut)
}

impl RunSummary {
    /// The summary, with forecast quality after [`FORECAST_WARMUP_SHARE`].
    pub fn of(run: &RunResult) -> RunSummary {
        Self::with_warmup(run, FORECAST_WARMUP_SHARE)
    }

    /// The summary, with forecast quality over arrivals after `warmup_share` of the
    /// arrival window.
    pub fn with_warmup(run: &RunResult, warmup_share: f64) -> RunSummary {
        let recs = &run.records;
        let n = recs.len();
        let met_both = recs.iter().filter(|r| r.met_both()).count();
        let window = arrival_window(run);
        let ttft: Vec<f64> = recs
            .iter()
            .filter_map(|r| r.ttft_s.map(|t| t * 1e3))
            .collect();
        let tpot: Vec<f64> = recs
            .iter()
            .filter_map(|r| r.tpot_s.map(|t| t * 1e3))
            .collect();
        let served: Vec<&RequestRecord> = recs.iter().filter(|r| r.ttft_s.is_some()).collect();
        let input: u64 = served.iter().map(|r| u64::from(r.input_tokens)).sum();
        let cached: u64 = served
            .iter()
            .map(|r| u64::from(r.cached_tokens.min(r.input_tokens)))
            .sum();
        RunSummary {
            policy: run.policy.clone(),
            workload: run.workload.clone(),
            rate_scale: run.rate_scale,
            requests: n,
            served: served.len(),
            attainment: share(met_both, n),
            ttft_attainment: share(recs.iter().filter(|r| r.met_ttft()).count(), n),
            tpot_attainment: share(recs.iter().filter(|r| r.met_tpot()).count(), n),
            goodput_rps: if window > 0.0 {
                met_both as f64 / window
            } else {
                0.0
            },
            offered_rps: if window > 0.0 { n as f64 / window } else { 0.0 },
            arrival_window_s: window,
            ttft_ms: Percentiles::of(ttft),
            tpot_ms: Percentiles::of(tpot),
            tenants: tenants(recs),
            ttft_forecast: forecast(after_warmup(recs, warmup_share).map(|r| {
                (
                    r.ttft_s.map(|t| t * 1e3),
                    r.predicted_ttft_ms,
                    r.predicted_ttft_upper_ms,
                )
            })),
            tpot_forecast: forecast(after_warmup(recs, warmup_share).map(|r| {
                (
                    r.tpot_s.map(|t| t * 1e3),
                    r.predicted_tpot_ms,
                    r.predicted_tpot_upper_ms,
                )
            })),
            decision_us: Percentiles::of(
                run.decision_ns
                    .iter()
                    .map(|&ns| f64::from(ns) / 1e3)
                    .collect(),
            ),
            load: load_balance(run),
            rejected_share: share(recs.iter().filter(|r| r.rejected).count(), n),
            fallback_share: share(recs.iter().filter(|r| r.fallback.is_some()).count(), n),
            fallback_by: {
                let mut by: BTreeMap<String, f64> = BTreeMap::new();
                for label in recs.iter().filter_map(|r| r.fallback.as_deref()) {
                    *by.entry(label.to_string()).or_default() += 1.0;
                }
                by.values_mut().for_each(|v| *v = share(*v as usize, n));
                by
            },
            cache_hit_share: if input == 0 {
                0.0
            } else {
                cached as f64 / input as f64
            },
            disaggregated_share: share(
                served
                    .iter()
                    .filter(|r| r.prefill_replica.is_some())
                    .count(),
                served.len(),
            ),
        }
    }
}

fn arrival_window(run: &RunResult) -> f64 {
    let (lo, hi) = run
        .records
        .iter()
        .map(|r| r.arrival_s)
        .filter(|t| t.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), t| {
            (lo.min(t), hi.max(t))
        });
    if hi > lo {
        hi - lo
    } else if run.sim_duration_s.is_finite() && run.sim_duration_s > 0.0 {
        run.sim_duration_s
    } else {
        0.0
    }
}

fn tenants(recs: &[RequestRecord]) -> BTreeMap<String, TenantSummary> {
    let mut groups: BTreeMap<String, Vec<&RequestRecord>> = BTreeMap::new();
    for r in recs {
        groups
            .entry(r.tenant.clone().unwrap_or_else(|| NO_TENANT.into()))
            .or_default()
            .push(r);
    }
    groups
        .into_iter()
        .map(|(name, rs)| {
            let n = rs.len();
            let ttft = sorted(
                rs.iter()
                    .filter_map(|r| r.ttft_s.map(|t| t * 1e3))
                    .collect(),
            );
            let s = TenantSummary {
                requests: n,
                attainment: share(rs.iter().filter(|r| r.met_both()).count(), n),
                ttft_attainment: share(rs.iter().filter(|r| r.met_ttft()).count(), n),
                tpot_attainment: share(rs.iter().filter(|r| r.met_tpot()).count(), n),
                ttft_p95_ms: nearest_rank(&ttft, 95.0),
            };
            (name, s)
        })
        .collect()
}

/// `(actual, predicted, upper)` per request → quality, or `None` without any pairs.
fn forecast(
    rows: impl Iterator<Item = (Option<f64>, Option<f64>, Option<f64>)>,
) -> Option<ForecastQuality> {
    let (mut ape, mut abs_err) = (Vec::new(), Vec::new());
    let (mut bound_n, mut covered) = (0usize, 0usize);
    for (actual, pred, upper) in rows {
        let Some(a) = actual.filter(|a| a.is_finite()) else {
            continue;
        };
        if let Some(p) = pred.filter(|p| p.is_finite()) {
            abs_err.push((p - a).abs());
            if a > 0.0 {
                ape.push((p - a).abs() / a * 100.0);
            }
        }
        if let Some(u) = upper.filter(|u| !u.is_nan()) {
            bound_n += 1;
            covered += usize::from(a <= u);
        }
    }
    if abs_err.is_empty() && bound_n == 0 {
        return None;
    }
    let ape = sorted(ape);
    let abs_err = sorted(abs_err);
    Some(ForecastQuality {
        samples: abs_err.len(),
        mape_pct: mean(&ape).unwrap_or(0.0),
        mdape_pct: nearest_rank(&ape, 50.0).unwrap_or(0.0),
        abs_err_p50_ms: nearest_rank(&abs_err, 50.0).unwrap_or(0.0),
        abs_err_p95_ms: nearest_rank(&abs_err, 95.0).unwrap_or(0.0),
        bound_samples: bound_n,
        coverage: (bound_n > 0).then(|| share(covered, bound_n)),
    })
}

fn load_balance(run: &RunResult) -> LoadBalance {
    let cvs = sorted(
        run.load
            .iter()
            .filter_map(|s| {
                let xs: Vec<f64> = s.inflight.iter().map(|&x| f64::from(x)).collect();
                let m = mean(&xs)?;
                if m <= 0.0 {
                    return None;
                }
                let var = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / xs.len() as f64;
                Some(var.sqrt() / m)
            })
            .collect(),
    );
    let width = run
        .records
        .iter()
        .filter_map(|r| r.replica)
        .map(|i| i as usize + 1)
        .max()
        .unwrap_or(0)
        .max(run.replicas.len());
    let mut placed = vec![0usize; width];
    for r in run.records.iter().filter(|r| !r.rejected) {
        if let Some(i) = r.replica {
            placed[i as usize] += 1;
        }
    }
    let total: usize = placed.iter().sum();
    LoadBalance {
        samples: cvs.len(),
        cv_mean: mean(&cvs),
        cv_p95: nearest_rank(&cvs, 95.0),
        replica_share: placed.iter().map(|&p| share(p, total)).collect(),
    }
}
