//! The predictor's configuration: the one source of defaults, serde-deserialisable.
//!
//! Invariant: [`PredictorConfig::sanitized`] always yields a usable configuration (every
//! invalid field replaced by its default); [`PredictorConfig::validate`] reports what
//! was wrong so a router can refuse a bad config file with a clear message.

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::features::{FeatureParams, TPOT_DIM, TTFT_DIM};

/// When the per-replica multiplicative correction applies to TPOT.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionMode {
    /// Never: TPOT uses the class model only.
    Off,
    /// Only while a drift alarm is active for the replica (reference §6.2: on average the
    /// TPOT correction hurts, but it is what absorbs a slowed replica).
    #[default]
    OnDrift,
    /// Always, like TTFT.
    Always,
}

/// Page–Hinkley drift detection on per-replica log residuals, in units of the replica's
/// tracked residual spread σ̂ (so one setting suits TTFT and TPOT alike).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DriftConfig {
    /// Shifts smaller than this many σ̂ are tolerated (PH δ).
    pub tolerance_sigmas: f64,
    /// Alarm when the cumulative deviation exceeds this many σ̂ (PH λ).
    pub threshold_sigmas: f64,
    /// Rate of the EWMA that serves as the PH reference mean.
    pub mean_rate: f64,
    /// Multiplier on the correction step while an alarm is active.
    pub boost: f64,
    /// How long an alarm stays active (seconds).
    pub boost_s: f64,
    /// Floor on σ̂ (log units): shifts well below this are not worth an alarm, however
    /// tight the replica's residuals are.
    pub min_sigma: f64,
    /// Labels a replica needs before its detector is armed (its σ̂ must have settled).
    pub min_labels: u64,
}

impl Default for DriftConfig {
    fn default() -> Self {
        Self {
            tolerance_sigmas: 1.0,
            threshold_sigmas: 10.0,
            mean_rate: 0.02,
            boost: 4.0,
            boost_s: 60.0,
            min_sigma: 0.1,
            min_labels: 10,
        }
    }
}

/// A configured TTFT prior's length is usable: every coefficient, or all but the
/// learned-only `kv_deficit` (the features module docs).
pub(crate) fn ttft_prior_len_ok(len: usize) -> bool {
    len == TTFT_DIM || len + 1 == TTFT_DIM
}

/// A physical prior for one class: θ₀ worth `kappa` pseudo-samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassPrior {
    pub class: u64,
    /// TTFT coefficients, one per TTFT feature (see `TTFT_FEATURE_NAMES`); the last,
    /// `kv_deficit`'s, may be left out (a prior of 0, as before that feature existed).
    pub ttft_theta: Vec<f64>,
    /// TPOT coefficients, one per TPOT feature (see `TPOT_FEATURE_NAMES`).
    pub tpot_theta: Vec<f64>,
    /// How many average samples the prior is worth.
    pub kappa: f64,
}

/// Every tunable of the predictor. Times are seconds on the caller's time axis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PredictorConfig {
    /// Forward-decay time constant of the class models (seconds). Must match across nodes.
    pub tau_s: f64,
    /// Landmark spacing for forward decay (seconds). Must match across nodes; ≤ 5τ keeps
    /// weights below e⁵.
    pub landmark_interval_s: f64,
    /// Ridge δ: the solve adds δ·tr(A)/d toward the prior on the diagonal.
    pub ridge: f64,
    /// Re-solve a class model after this many labels.
    pub solve_every: u32,
    /// Floor on labels in their weight (`1/max(y, floor)²` or `1/(max(y, floor)·fit)`)
    /// and on predictions (ms).
    pub min_target_ms: f64,
    /// Huber threshold on |log(y/ŷ)|: labels further from the forecast than this count
    /// with weight h/|log(y/ŷ)| (an L1 tail), so a minority of disturbed outcomes (a
    /// document arriving mid-decode) does not pull the typical forecast; the label's
    /// scale weight is then `1/(y·fit)` too (`learner::learn_target`). 0 = plain
    /// relative L2, `1/y²`, a function of the label alone.
    pub huber_log: f64,
    /// Token budget used when an observation does not say (vLLM's fallback is 2048).
    pub default_max_batched_tokens: f64,
    /// Scraped values older than this are ignored by the features (seconds).
    pub metric_fresh_s: f64,
    /// Coverage target of the upper bounds (0.9 = p90).
    pub upper_quantile: f64,
    /// Quantile-tracking (ACI) step on the log score for the upper quantile.
    pub quantile_step: f64,
    /// Quantile-tracking step for the median of the log score.
    pub median_step: f64,
    /// Sign step of the per-replica median log-correction.
    pub correction_step: f64,
    /// Apply the per-replica correction to TTFT.
    pub ttft_correction: bool,
    /// When to apply the per-replica correction to TPOT.
    pub tpot_correction: CorrectionMode,
    /// A replica (class) needs this many labels before its own quantiles are used;
    /// until then bounds back off replica → class → global → cold.
    pub backoff_min_labels: u64,
    /// Labels a class needs (fleet-wide) before it can be Warm. Past it, the class's
    /// warm/cold gate decides: Warm when its forecasts are no worse than a load-only
    /// baseline on the same labels and its bound covers, Cold again only when clearly
    /// worse (see `class_model::Gate`).
    pub warm_min_labels: u64,
    /// Absolute backstop of the gate: entering Warm also needs the recent mean
    /// |log(y/ŷ)| at or below this, and a Warm class (or a replica on its own) whose error
    /// exceeds 1.5× this goes Cold even if the load baseline is no better. The class's
    /// error counts each label at most `class_model::GATE_ERR_CLIP` (1.5), so from 1.0 up
    /// only entry and the replica's own error are held to it.
    pub warm_max_log_err: f64,
    /// No label for this long makes a replica or class Stale (seconds).
    pub stale_after_s: f64,
    /// EWMA rate for coverage and recent-error trackers (per label).
    pub ewma_rate: f64,
    /// Coverage below `upper_quantile − coverage_collapse` makes a replica Stale.
    pub coverage_collapse: f64,
    /// Bound factor U/μ while nothing calibrated is available.
    pub cold_upper_factor: f64,
    /// Recent-error guard: when the replica's recent relative error e (fast EWMA of
    /// |log(y/ŷ)|) exceeds a prediction's relative headroom log(U/μ) — i.e. its recent
    /// absolute error scaled to this prediction exceeds U − μ — the bound is widened to
    /// μ·exp(guard_factor·e).
    pub guard_factor: f64,
    /// EWMA rate (per label) of the guard's recent error: ≈ the last 1/rate labels.
    pub guard_rate: f64,
    /// Peer slots whose export is older than this are dropped (seconds).
    pub peer_max_age_s: f64,
    pub drift: DriftConfig,
    /// Pseudo-samples given to the generic physical prior for classes without their own
    /// prior: steadies the first few fits, fades as labels arrive.
    pub generic_prior_kappa: f64,
    /// Optional per-class priors (θ₀ worth κ samples); others use the generic constants.
    pub priors: Vec<ClassPrior>,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        Self {
            tau_s: 300.0,
            landmark_interval_s: 600.0,
            ridge: 1e-4,
            solve_every: 8,
            min_target_ms: 1.0,
            huber_log: 0.1,
            default_max_batched_tokens: 2048.0,
            metric_fresh_s: 5.0,
            upper_quantile: 0.9,
            quantile_step: 0.05,
            median_step: 0.02,
            correction_step: 0.01,
            ttft_correction: true,
            tpot_correction: CorrectionMode::OnDrift,
            backoff_min_labels: 30,
            warm_min_labels: 20,
            warm_max_log_err: 0.7,
            stale_after_s: 120.0,
            ewma_rate: 0.05,
            coverage_collapse: 0.25,
            cold_upper_factor: 3.0,
            guard_factor: 1.5,
            guard_rate: 0.2,
            peer_max_age_s: 1800.0,
            drift: DriftConfig::default(),
            generic_prior_kappa: 1.0,
            priors: Vec::new(),
        }
    }
}

fn positive(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

fn unit_open(v: f64) -> bool {
    v.is_finite() && v > 0.0 && v < 1.0
}

impl PredictorConfig {
    /// Every violated constraint, as `field: reason`.
    fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let mut check = |ok: bool, what: &str| {
            if !ok {
                p.push(what.to_string());
            }
        };
        check(positive(self.tau_s), "tau_s must be > 0");
        check(
            positive(self.landmark_interval_s)
                && self.landmark_interval_s <= 20.0 * self.tau_s.max(1e-9),
            "landmark_interval_s must be > 0 and ≤ 20·tau_s",
        );
        check(
            self.ridge.is_finite() && self.ridge >= 0.0,
            "ridge must be ≥ 0",
        );
        check(self.solve_every >= 1, "solve_every must be ≥ 1");
        check(positive(self.min_target_ms), "min_target_ms must be > 0");
        check(
            self.huber_log.is_finite() && self.huber_log >= 0.0,
            "huber_log must be ≥ 0",
        );
        check(
            positive(self.default_max_batched_tokens),
            "default_max_batched_tokens must be > 0",
        );
        check(
            self.metric_fresh_s.is_finite() && self.metric_fresh_s >= 0.0,
            "metric_fresh_s must be ≥ 0",
        );
        check(
            unit_open(self.upper_quantile) && self.upper_quantile > 0.5,
            "upper_quantile must be in (0.5, 1)",
        );
        check(
            unit_open(self.quantile_step),
            "quantile_step must be in (0, 1)",
        );
        check(unit_open(self.median_step), "median_step must be in (0, 1)");
        check(
            unit_open(self.correction_step),
            "correction_step must be in (0, 1)",
        );
        check(
            self.warm_max_log_err.is_finite() && self.warm_max_log_err > 0.0,
            "warm_max_log_err must be > 0",
        );
        check(positive(self.stale_after_s), "stale_after_s must be > 0");
        check(unit_open(self.ewma_rate), "ewma_rate must be in (0, 1)");
        check(
            unit_open(self.coverage_collapse),
            "coverage_collapse must be in (0, 1)",
        );
        check(
            self.cold_upper_factor.is_finite() && self.cold_upper_factor > 1.0,
            "cold_upper_factor must be > 1",
        );
        check(
            self.guard_factor.is_finite() && self.guard_factor >= 1.0,
            "guard_factor must be ≥ 1",
        );
        check(positive(self.peer_max_age_s), "peer_max_age_s must be > 0");
        check(
            self.generic_prior_kappa.is_finite() && self.generic_prior_kappa >= 0.0,
            "generic_prior_kappa must be ≥ 0",
        );
        let d = &self.drift;
        check(
            d.tolerance_sigmas.is_finite() && d.tolerance_sigmas >= 0.0,
            "drift.tolerance_sigmas must be ≥ 0",
        );
        check(
            positive(d.threshold_sigmas),
            "drift.threshold_sigmas must be > 0",
        );
        check(unit_open(d.mean_rate), "drift.mean_rate must be in (0, 1)");
        check(
            d.boost.is_finite() && d.boost >= 1.0,
            "drift.boost must be ≥ 1",
        );
        check(
            d.boost_s.is_finite() && d.boost_s >= 0.0,
            "drift.boost_s must be ≥ 0",
        );
        for pr in &self.priors {
            let ok = ttft_prior_len_ok(pr.ttft_theta.len())
                && pr.tpot_theta.len() == TPOT_DIM
                && pr
                    .ttft_theta
                    .iter()
                    .chain(&pr.tpot_theta)
                    .all(|v| v.is_finite())
                && pr.kappa.is_finite()
                && pr.kappa >= 0.0;
            check(
                ok,
                &format!(
                    "priors[class={}] needs {TTFT_DIM} (or {}) TTFT and {TPOT_DIM} TPOT finite coefficients and kappa ≥ 0",
                    pr.class,
                    TTFT_DIM - 1
                ),
            );
        }
        p
    }

    /// `Ok` if every field is usable, else every problem in one error.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let p = self.problems();
        if p.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(p.join("; ")))
        }
    }

    /// A usable configuration: each invalid field replaced by its default (invalid priors
    /// are dropped).
    pub fn sanitized(&self) -> PredictorConfig {
        let d = PredictorConfig::default();
        let mut c = self.clone();
        macro_rules! keep_if {
            ($f:ident, $ok:expr) => {
                if !$ok(c.$f) {
                    c.$f = d.$f;
                }
            };
        }
        keep_if!(tau_s, positive);
        keep_if!(ridge, |v: f64| v.is_finite() && v >= 0.0);
        keep_if!(solve_every, |v: u32| v >= 1);
        keep_if!(min_target_ms, positive);
        keep_if!(huber_log, |v: f64| v.is_finite() && v >= 0.0);
        keep_if!(default_max_batched_tokens, positive);
        keep_if!(metric_fresh_s, |v: f64| v.is_finite() && v >= 0.0);
        keep_if!(upper_quantile, |v: f64| unit_open(v) && v > 0.5);
        keep_if!(quantile_step, unit_open);
        keep_if!(median_step, unit_open);
        keep_if!(correction_step, unit_open);
        keep_if!(warm_max_log_err, positive);
        keep_if!(stale_after_s, positive);
        keep_if!(ewma_rate, unit_open);
        keep_if!(coverage_collapse, unit_open);
        keep_if!(cold_upper_factor, |v: f64| v.is_finite() && v > 1.0);
        keep_if!(guard_factor, |v: f64| v.is_finite() && v >= 1.0);
        keep_if!(guard_rate, unit_open);
        keep_if!(peer_max_age_s, positive);
        keep_if!(generic_prior_kappa, |v: f64| v.is_finite() && v >= 0.0);
        if !(positive(c.landmark_interval_s) && c.landmark_interval_s <= 20.0 * c.tau_s) {
            c.landmark_interval_s = (2.0 * c.tau_s).min(d.landmark_interval_s.max(c.tau_s));
        }
        let dd = DriftConfig::default();
        let dr = &mut c.drift;
        if !(dr.tolerance_sigmas.is_finite() && dr.tolerance_sigmas >= 0.0) {
            dr.tolerance_sigmas = dd.tolerance_sigmas;
        }
        if !positive(dr.threshold_sigmas) {
            dr.threshold_sigmas = dd.threshold_sigmas;
        }
        if !unit_open(dr.mean_rate) {
            dr.mean_rate = dd.mean_rate;
        }
        if !(dr.boost.is_finite() && dr.boost >= 1.0) {
            dr.boost = dd.boost;
        }
        if !(dr.boost_s.is_finite() && dr.boost_s >= 0.0) {
            dr.boost_s = dd.boost_s;
        }
        if !positive(dr.min_sigma) {
            dr.min_sigma = dd.min_sigma;
        }
        c.priors.retain(|pr| {
            ttft_prior_len_ok(pr.ttft_theta.len())
                && pr.tpot_theta.len() == TPOT_DIM
                && pr
                    .ttft_theta
                    .iter()
                    .chain(&pr.tpot_theta)
                    .all(|v| v.is_finite())
                && pr.kappa.is_finite()
                && pr.kappa >= 0.0
        });
        c
    }

    pub(crate) fn feature_params(&self) -> FeatureParams {
        FeatureParams {
            default_max_batched_tokens: self.default_max_batched_tokens,
            metric_fresh_s: self.metric_fresh_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_partial_files_fill_in_defaults() {
        PredictorConfig::default()
            .validate()
            .expect("defaults valid");
        let c: PredictorConfig =
            serde_json::from_str(r#"{"tau_s": 120, "drift": {"boost": 8}}"#).expect("parses");
        assert_eq!(c.tau_s, 120.0);
        assert_eq!(c.drift.boost, 8.0);
        assert_eq!(c.upper_quantile, 0.9);
        c.validate().expect("valid");
    }

    #[test]
    fn invalid_fields_are_reported_and_sanitised() {
        let c = PredictorConfig {
            tau_s: -1.0,
            upper_quantile: 1.5,
            ..Default::default()
        };
        let err = c.validate().expect_err("invalid").to_string();
        assert!(
            err.contains("tau_s") && err.contains("upper_quantile"),
            "{err}"
        );
        let s = c.sanitized();
        s.validate().expect("sanitised config is valid");
        assert_eq!(s.tau_s, 300.0);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(serde_json::from_str::<PredictorConfig>(r#"{"tua_s": 1}"#).is_err());
    }
}
