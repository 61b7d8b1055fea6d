//! What a prediction carries, and the per-target parameters a snapshot evaluates.
//!
//! Invariant: every field of a [`Prediction`] is finite; `*_upper_ms ≥ *_ms > 0`.

use serde::Serialize;

use crate::calibration::REGIMES;
use crate::features::dot;
use crate::normal::normal_sf;

/// How far a prediction can be trusted.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[rkyv(derive(Debug, PartialEq))]
pub enum ModelState {
    /// Not enough labels (or too large a recent error): the prediction comes from a physics
    /// prior with a wide bound; prefer load-aware routing.
    #[default]
    Cold,
    /// Learned and recently confirmed.
    Warm,
    /// Learned once, but no label for a while, or the bound's coverage collapsed.
    Stale,
}

impl ModelState {
    /// The less trustworthy of two states (Stale worst, then Cold, then Warm).
    pub fn worst(self, other: ModelState) -> ModelState {
        fn rank(s: ModelState) -> u8 {
            match s {
                ModelState::Warm => 0,
                ModelState::Cold => 1,
                ModelState::Stale => 2,
            }
        }
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// TTFT and TPOT forecasts for one (request, replica) placement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Prediction {
    /// Point forecast of TTFT (ms), ≈ the median.
    pub ttft_ms: f64,
    /// Calibrated upper bound at the configured quantile (ms).
    pub ttft_upper_ms: f64,
    /// Point forecast of TPOT (ms per output token).
    pub tpot_ms: f64,
    /// Calibrated upper bound of TPOT (ms).
    pub tpot_upper_ms: f64,
    /// Worse of `ttft_state` and `tpot_state`.
    pub state: ModelState,
    pub ttft_state: ModelState,
    pub tpot_state: ModelState,
    /// Recent mean absolute TTFT error on this replica (ms; 0 if unknown).
    pub ttft_recent_abs_err_ms: f64,
    /// Recent mean absolute TPOT error on this replica (ms; 0 if unknown).
    pub tpot_recent_abs_err_ms: f64,
    /// Median of the TTFT distribution implied by the tracked quantiles (ms).
    pub ttft_median_ms: f64,
    /// Log-spread σ of that distribution.
    pub ttft_log_sigma: f64,
    pub tpot_median_ms: f64,
    pub tpot_log_sigma: f64,
    /// True when the recent-error guard widened the TTFT bound.
    pub ttft_guarded: bool,
    /// True when the recent-error guard widened the TPOT bound.
    pub tpot_guarded: bool,
    /// The admission-wait feature this TTFT forecast used (ms; 0 when the replica was not
    /// capacity-bound): the learner learns the label with it, i.e. with the replica's
    /// step time and slot state as known at dispatch.
    pub ttft_wait_ms: f64,
}

impl Prediction {
    /// P(TTFT > slo_ttft_ms) and P(TPOT > slo_tpot_ms).
    ///
    /// Lognormal through the tracked median and upper quantile: it agrees with the
    /// calibrated bound exactly (P(y > upper) = α) and with the median (P = ½), and
    /// interpolates between and beyond them. A non-positive or NaN SLO yields 1.
    pub fn violation_probability(&self, slo_ttft_ms: f64, slo_tpot_ms: f64) -> (f64, f64) {
        (
            lognormal_tail(self.ttft_median_ms, self.ttft_log_sigma, slo_ttft_ms),
            lognormal_tail(self.tpot_median_ms, self.tpot_log_sigma, slo_tpot_ms),
        )
    }
}

/// P(y > slo) for a lognormal with this median and log-spread: 1 for a non-positive or
/// NaN `slo`, 0 for an infinite one.
#[inline]
pub fn lognormal_tail(median: f64, sigma: f64, slo: f64) -> f64 {
    if slo.is_nan() || slo <= 0.0 {
        return 1.0;
    }
    if slo.is_infinite() {
        return 0.0;
    }
    // One log of the ratio; beyond ±8.5σ the tail is 0 or 1 to double precision, which
    // spares erfc's exp on most candidates (a comfortable objective is the usual case).
    let z = (slo / median).ln() / sigma;
    if z > TAIL_SATURATES {
        0.0
    } else if z < -TAIL_SATURATES {
        1.0
    } else {
        normal_sf(z)
    }
}

/// |z| beyond which P(Z > z) is below 1e-17: [`lognormal_tail`] is 0 or 1 there.
pub const TAIL_SATURATES: f64 = 8.5;

/// Everything needed to evaluate one target for one replica: coefficients and cached
/// exponentials, so predict() is a dot product and a few multiplications.
#[derive(Clone, Copy, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct TargetParams<const D: usize> {
    pub theta: [f64; D],
    /// exp(per-replica correction) (1 if none applies).
    pub mult: f64,
    /// The calibrated band of each regime ([`crate::calibration::regime`]), with the
    /// recent errors the guard and the reported error read in that regime.
    pub bands: [RegimeBand; REGIMES],
    pub state: ModelState,
}

/// The band of one regime, as multiples of the point forecast.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct RegimeBand {
    /// exp(tracked upper log quantile).
    pub upper_mult: f64,
    /// exp(tracked median log quantile).
    pub median_mult: f64,
    pub log_sigma: f64,
    /// max(upper log quantile, 0) of the tracker `recent_log_err` is compared with: the
    /// relative headroom the guard allows before it widens the bound.
    pub guard_log: f64,
    /// Recent mean absolute error (ms) in this regime, 0 if unknown (reported, and
    /// `slo`'s effective bound).
    pub abs_err_ms: f64,
    /// Fast EWMA of |log(y/ŷ)| in this regime (0 if unknown); feeds the guard.
    pub recent_log_err: f64,
}

/// One evaluated target.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Evaluated {
    pub mu: f64,
    pub upper: f64,
    pub median: f64,
    pub sigma: f64,
    pub guarded: bool,
    /// The regime's recent mean absolute error (ms).
    pub abs_err_ms: f64,
}

impl<const D: usize> TargetParams<D> {
    /// μ alone.
    #[inline(always)]
    pub(crate) fn mean(&self, x: &[f64; D], floor_ms: f64) -> f64 {
        dot(&self.theta, x).max(floor_ms) * self.mult
    }

    /// μ = max(θ·x, floor)·e^c, U = μ·e^q with q the upper quantile of `regime`'s
    /// band, widened to μ·e^(g·err) by the guard when the regime's recent log error
    /// exceeds its band's headroom (a model gone wrong faster than ACI follows).
    #[inline(always)]
    pub(crate) fn eval(
        &self,
        x: &[f64; D],
        regime: usize,
        floor_ms: f64,
        guard_factor: f64,
        z_hi: f64,
    ) -> Evaluated {
        let b = &self.bands[regime.min(REGIMES - 1)];
        let mu = self.mean(x, floor_ms);
        let mut upper = mu * b.upper_mult.max(1.0);
        let median = mu * b.median_mult;
        let mut sigma = b.log_sigma;
        let guarded = b.recent_log_err > b.guard_log;
        if guarded {
            // Both arguments are the band's constants up to rounding: memoised (exact).
            upper = upper.max(mu * crate::memo::exp(guard_factor * b.recent_log_err));
            sigma = sigma.max(crate::memo::ln(upper / median) / z_hi);
        }
        Evaluated {
            mu,
            upper,
            median,
            sigma,
            guarded,
            abs_err_ms: b.abs_err_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violation_probability_is_alpha_at_the_bound_and_half_at_the_median() {
        let p = Prediction {
            ttft_median_ms: 100.0,
            ttft_log_sigma: 0.5,
            tpot_median_ms: 20.0,
            tpot_log_sigma: 0.3,
            ..Default::default()
        };
        let upper = 100.0 * (0.5 * crate::normal::normal_quantile(0.9)).exp();
        let (a, b) = p.violation_probability(upper, 20.0);
        assert!((a - 0.1).abs() < 1e-6, "{a}");
        assert!((b - 0.5).abs() < 1e-6, "{b}");
        let (lo, hi) = (
            p.violation_probability(50.0, 1.0),
            p.violation_probability(400.0, 1e9),
        );
        assert!(lo.0 > a && hi.0 < a && lo.1 > 0.999 && hi.1 < 1e-6);
        assert_eq!(p.violation_probability(f64::NAN, -1.0), (1.0, 1.0));
    }

    #[test]
    fn guard_widens_only_when_recent_error_exceeds_the_headroom() {
        let band = RegimeBand {
            upper_mult: 1.5,
            median_mult: 1.0,
            log_sigma: 0.3,
            guard_log: 1.5f64.ln(),
            abs_err_ms: 30.0,
            recent_log_err: 0.3,
        };
        let tp = TargetParams::<2> {
            theta: [10.0, 1.0],
            mult: 1.0,
            bands: [band; REGIMES],
            state: ModelState::Warm,
        };
        let z = crate::normal::normal_quantile(0.9);
        let calm = tp.eval(&[1.0, 10.0], 0, 1.0, 2.0, z); // headroom ln 1.5 = 0.405 > 0.3
        assert!(!calm.guarded);
        assert_eq!(calm.upper, 30.0);
        assert_eq!(calm.abs_err_ms, 30.0);
        let rough = TargetParams {
            bands: [RegimeBand {
                recent_log_err: 0.6,
                ..band
            }; REGIMES],
            ..tp
        }
        .eval(&[1.0, 10.0], 0, 1.0, 2.0, z);
        assert!(rough.guarded);
        assert!((rough.upper - 20.0 * 1.2f64.exp()).abs() < 1e-9);
    }

    #[test]
    fn a_rough_queued_regime_leaves_the_unqueued_bound_alone() {
        // Real vLLM, 2026-12-04: errors behind a queue (|log| ~1) guarded every forecast,
        // so bounds with nothing queued were 4-5x the point where their p90 was 1.3x.
        let calm = RegimeBand {
            upper_mult: 1.3,
            median_mult: 1.0,
            log_sigma: 0.2,
            guard_log: 1.3f64.ln(),
            abs_err_ms: 20.0,
            recent_log_err: 0.15,
        };
        let rough = RegimeBand {
            upper_mult: 3.0,
            median_mult: 1.2,
            log_sigma: 0.7,
            guard_log: 3.0f64.ln(),
            abs_err_ms: 900.0,
            recent_log_err: 1.4,
        };
        let tp = TargetParams::<1> {
            theta: [100.0],
            mult: 1.0,
            bands: [calm, rough],
            state: ModelState::Warm,
        };
        let z = crate::normal::normal_quantile(0.9);
        let idle = tp.eval(&[1.0], 0, 1.0, 1.5, z);
        assert!(!idle.guarded);
        assert!((idle.upper - 130.0).abs() < 1e-9);
        assert_eq!(idle.abs_err_ms, 20.0);
        let queued = tp.eval(&[1.0], 1, 1.0, 1.5, z);
        assert!(queued.guarded);
        assert!((queued.upper - 100.0 * (1.5f64 * 1.4).exp()).abs() < 1e-6);
        assert_eq!(queued.abs_err_ms, 900.0);
    }
}
