//! What a workload looks like at a glance: size, rate, length distributions and how
//! much of its prompt text an ideal (infinite, never-evicting) prefix cache would reuse.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::Workload;
use crate::report::quantile::{mean, nearest_rank};

/// Length distribution of one column (tokens).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LengthStats {
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl LengthStats {
    fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        LengthStats {
            mean: mean(&values).unwrap_or(0.0),
            p50: nearest_rank(&values, 50.0).unwrap_or(0.0),
            p99: nearest_rank(&values, 99.0).unwrap_or(0.0),
            max: values.last().copied().unwrap_or(0.0),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSummary {
    pub requests: usize,
    /// First to last arrival, seconds.
    pub duration_s: f64,
    /// Requests per second over `duration_s` (0 when it is 0).
    pub rate_rps: f64,
    pub input: LengthStats,
    pub output: LengthStats,
    /// Share of all input tokens an infinite prefix cache would serve (0..=1).
    pub prefix_reuse: f64,
    /// Requests per tenant (`-` for none).
    pub tenants: BTreeMap<String, usize>,
}

impl WorkloadSummary {
    pub fn of(w: &Workload) -> Self {
        let n = w.requests.len();
        let duration_s = w.duration_s();
        let mut tenants = BTreeMap::new();
        for r in &w.requests {
            *tenants
                .entry(r.tenant.clone().unwrap_or_else(|| "-".into()))
                .or_insert(0) += 1;
        }
        WorkloadSummary {
            requests: n,
            duration_s,
            rate_rps: if duration_s > 0.0 {
                n as f64 / duration_s
            } else {
                0.0
            },
            input: LengthStats::of(
                w.requests
                    .iter()
                    .map(|r| f64::from(r.input_tokens))
                    .collect(),
            ),
            output: LengthStats::of(
                w.requests
                    .iter()
                    .map(|r| f64::from(r.output_tokens))
                    .collect(),
            ),
            prefix_reuse: prefix_reuse(w),
            tenants,
        }
    }
}

/// Replays arrivals against a cache that keeps every block ever seen. A block hits
/// when the whole chain of ids up to and including it was seen before (prefix caching
/// matches from the start only); the last, partial block counts its real tokens.
fn prefix_reuse(w: &Workload) -> f64 {
    let mut seen: HashSet<u64> = HashSet::new();
    let (mut hit, mut total) = (0u64, 0u64);
    for r in &w.requests {
        total += u64::from(r.input_tokens);
        let block = u64::from(r.block_tokens.max(1));
        let mut chain = 0x9e37_79b9_7f4a_7c15_u64 ^ block;
        let mut matching = true;
        for (i, &id) in r.hash_ids.iter().enumerate() {
            let start = i as u64 * block;
            if start >= u64::from(r.input_tokens) {
                break;
            }
            chain = mix(chain ^ mix(id));
            let fresh = seen.insert(chain);
            if matching && !fresh {
                hit += block.min(u64::from(r.input_tokens) - start);
            } else {
                matching = false;
            }
        }
    }
    if total == 0 {
        0.0
    } else {
        hit as f64 / total as f64
    }
}

/// SplitMix64 finaliser: a cheap, well-spread 64-bit mix.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
