//! SLO capacity: the highest rate scale at which attainment stays at or above a target
//! (0.90 by default), as DistServe defines goodput capacity.
//!
//! Search: probe `start`; grow (or shrink) by `growth` until the target is bracketed
//! between a passing and a failing scale; bisect geometrically (scales are ratios)
//! until `hi / lo − 1 ≤ rel_tol`; then re-probe a few fractions of the result
//! (`verify`) as a check, because attainment need not be monotone in load (noise,
//! admission control, cache effects). At most `max_runs + verify.len()` runs.
//!
//! The answer never rests on monotonicity: from *all* probes, the capacity is the
//! highest passing scale below the lowest failing one, and `monotone` says whether the
//! probes were consistent with a single threshold. Every probe is kept for plotting.

use serde::{Deserialize, Serialize};

use super::summary::RunSummary;
use crate::sim::result::RunResult;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CapacitySearch {
    /// Attainment a scale must reach to pass.
    pub target: f64,
    /// First scale probed.
    pub start: f64,
    /// Bracketing factor (> 1).
    pub growth: f64,
    /// Stop bisecting when `hi / lo − 1` is at most this.
    pub rel_tol: f64,
    /// Runs for bracketing and bisection together.
    pub max_runs: usize,
    /// Scales outside `[min_scale, max_scale]` are never probed.
    pub min_scale: f64,
    pub max_scale: f64,
    /// Fractions of the found capacity to re-probe as a monotonicity check.
    pub verify: Vec<f64>,
}

impl Default for CapacitySearch {
    fn default() -> Self {
        CapacitySearch {
            target: 0.90,
            start: 1.0,
            growth: 2.0,
            rel_tol: 0.05,
            max_runs: 12,
            min_scale: 1.0 / 64.0,
            max_scale: 256.0,
            verify: vec![0.8],
        }
    }
}

/// One run of the search.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub rate_scale: f64,
    pub attainment: f64,
    pub passed: bool,
    pub offered_rps: f64,
    pub goodput_rps: f64,
    pub ttft_p95_ms: Option<f64>,
    pub tpot_p95_ms: Option<f64>,
    pub requests: usize,
    pub rejected_share: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacityStatus {
    /// A passing and a failing scale were found and bisected to tolerance.
    Converged,
    /// Bracketed, but the run budget ended before the tolerance was reached.
    RunLimit,
    /// Every probe failed (down to `min_scale` or the run budget): capacity is 0.
    AllFailed,
    /// Some passing probe lies above a failing one (seen by the verification probes):
    /// the capacity is the conservative answer below the lowest failure.
    NonMonotone,
    /// Every probe passed, up to `max_scale`: capacity is a lower bound.
    NeverFailed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// Highest passing scale below the lowest failing scale (0 when none passed).
    pub capacity: f64,
    pub status: CapacityStatus,
    pub target: f64,
    /// Whether all passing probes lie below all failing ones.
    pub monotone: bool,
    pub lowest_failing: Option<f64>,
    /// Offered requests/s of the probe at `capacity` (0 when none passed).
    pub capacity_rps: f64,
    /// In the order they were run.
    pub probes: Vec<Probe>,
}

impl Capacity {
    /// Probes sorted by rate scale (for plotting).
    pub fn curve(&self) -> Vec<&Probe> {
        let mut v: Vec<&Probe> = self.probes.iter().collect();
        v.sort_by(|a, b| a.rate_scale.total_cmp(&b.rate_scale));
        v
    }
}

impl CapacitySearch {
    /// Runs the search with `run(rate_scale)`; see the module docs.
    pub fn search(&self, mut run: impl FnMut(f64) -> RunResult) -> Capacity {
        let r: Result<Capacity, std::convert::Infallible> =
            self.try_search_with(|s| Ok(run(s)), |_, _, _| {});
        match r {
            Ok(c) => c,
            Err(never) => match never {},
        }
    }

    /// Fallible runs and a progress hook `progress(probe, runs_done, max_runs)`, called
    /// after every run (for a progress bar in the caller). The first error stops the
    /// search and is returned.
    pub fn try_search_with<E>(
        &self,
        mut run: impl FnMut(f64) -> Result<RunResult, E>,
        mut progress: impl FnMut(&Probe, usize, usize),
    ) -> Result<Capacity, E> {
        let budget = self.max_runs.max(1) + self.verify.len();
        let growth = if self.growth.is_finite() && self.growth > 1.0 {
            self.growth
        } else {
            2.0
        };
        let (min_s, max_s) = (
            self.min_scale.max(f64::MIN_POSITIVE),
            self.max_scale.max(self.min_scale),
        );
        let mut probes: Vec<Probe> = Vec::new();
        let mut probe = |scale: f64, probes: &mut Vec<Probe>| -> Result<bool, E> {
            let result = run(scale)?;
            let s = RunSummary::of(&result);
            let p = Probe {
                rate_scale: scale,
                attainment: s.attainment,
                passed: s.attainment >= self.target,
                offered_rps: s.offered_rps,
                goodput_rps: s.goodput_rps,
                ttft_p95_ms: s.ttft_ms.map(|p| p.p95),
                tpot_p95_ms: s.tpot_ms.map(|p| p.p95),
                requests: s.requests,
                rejected_share: s.rejected_share,
            };
            probes.push(p);
            progress(probes.last().expect("just pushed"), probes.len(), budget);
            Ok(probes.last().is_some_and(|p| p.passed))
        };

        // Bracket.
        let mut scale = self.start.clamp(min_s, max_s);
        let (mut lo, mut hi): (Option<f64>, Option<f64>) = (None, None);
        if probe(scale, &mut probes)? {
            lo = Some(scale);
            while hi.is_none() && probes.len() < self.max_runs && scale < max_s {
                scale = (scale * growth).min(max_s);
                if probe(scale, &mut probes)? {
                    lo = Some(scale)
                } else {
                    hi = Some(scale)
                }
            }
        } else {
            hi = Some(scale);
            while lo.is_none() && probes.len() < self.max_runs && scale > min_s {
                scale = (scale / growth).max(min_s);
                if probe(scale, &mut probes)? {
                    lo = Some(scale)
                } else {
                    hi = Some(scale)
                }
            }
        }
        // Bisect.
        let mut converged = false;
        if let (Some(mut l), Some(mut h)) = (lo, hi) {
            loop {
                if h / l - 1.0 <= self.rel_tol {
                    converged = true;
                    break;
                }
                if probes.len() >= self.max_runs {
                    break;
                }
                let mid = (l * h).sqrt();
                if probe(mid, &mut probes)? {
                    l = mid
                } else {
                    h = mid
                }
            }
        }
        // Verify below the answer.
        let found = conservative(&probes);
        if found > 0.0 {
            for f in self.verify.iter().copied().filter(|f| *f > 0.0 && *f < 1.0) {
                let s = found * f;
                let near = probes
                    .iter()
                    .any(|p| (p.rate_scale / s - 1.0).abs() <= self.rel_tol / 2.0);
                if !near && s >= min_s {
                    probe(s, &mut probes)?;
                }
            }
        }

        let capacity = conservative(&probes);
        let lowest_failing = probes
            .iter()
            .filter(|p| !p.passed)
            .map(|p| p.rate_scale)
            .min_by(f64::total_cmp);
        let highest_passing = probes
            .iter()
            .filter(|p| p.passed)
            .map(|p| p.rate_scale)
            .max_by(f64::total_cmp);
        let monotone = match (highest_passing, lowest_failing) {
            (Some(p), Some(f)) => p < f,
            _ => true,
        };
        let status = match (highest_passing, lowest_failing) {
            (None, _) => CapacityStatus::AllFailed,
            (Some(_), None) => CapacityStatus::NeverFailed,
            _ if !monotone => CapacityStatus::NonMonotone,
            _ if converged => CapacityStatus::Converged,
            _ => CapacityStatus::RunLimit,
        };
        let capacity_rps = probes
            .iter()
            .find(|p| p.rate_scale == capacity && p.passed)
            .map_or(0.0, |p| p.offered_rps);
        Ok(Capacity {
            capacity,
            status,
            target: self.target,
            monotone,
            lowest_failing,
            capacity_rps,
            probes,
        })
    }
}

/// Highest passing scale strictly below every failing one (0 when there is none).
fn conservative(probes: &[Probe]) -> f64 {
    let lowest_fail = probes
        .iter()
        .filter(|p| !p.passed)
        .map(|p| p.rate_scale)
        .fold(f64::INFINITY, f64::min);
    probes
        .iter()
        .filter(|p| p.passed && p.rate_scale < lowest_fail)
        .map(|p| p.rate_scale)
        .fold(0.0, f64::max)
}
