//! Exact order statistics by sorting (no histogram approximation): runs hold at most a
//! few hundred thousand values, so sorting costs milliseconds and every percentile in a
//! report is a value that was actually observed.
//!
//! Percentiles use the nearest-rank definition: the p-th percentile of n sorted values
//! is the smallest value with at least p% of the values at or below it, i.e. element
//! `ceil(p/100 · n) − 1` (0-based), and the minimum for p = 0.

/// Nearest-rank percentile of an ascending slice; `None` when empty.
pub fn nearest_rank(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let p = p.clamp(0.0, 100.0);
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.saturating_sub(1).min(sorted.len() - 1)])
}

/// Sorts (total order; NaN sorts last) and returns the values.
pub fn sorted(mut values: Vec<f64>) -> Vec<f64> {
    values.sort_by(f64::total_cmp);
    values
}

pub fn mean(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        None
    } else {
        Some(values.iter().sum::<f64>() / values.len() as f64)
    }
}

/// p50/p95/p99 of a set of values.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Percentiles {
    pub fn of(values: Vec<f64>) -> Option<Self> {
        let s = sorted(values);
        Some(Percentiles {
            p50: nearest_rank(&s, 50.0)?,
            p95: nearest_rank(&s, 95.0)?,
            p99: nearest_rank(&s, 99.0)?,
        })
    }
}
