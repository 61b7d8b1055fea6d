//! Per-class learning state: one decayed least-squares model per target, plus the class
//! level of the calibration back-off chain.
//!
//! Invariant: `peers` is exactly the sum of the current peer slots for this class (it is
//! rebuilt whenever a slot arrives, leaves or is pruned), so `own + peers` is the pooled
//! fleet statistic. `theta` is always finite: a failed solve keeps the previous θ.

use crate::calibration::{ScoreQuantiles, ewma};
use crate::decay_stats::DecayStats;

/// Recent error trackers for a group of labels.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub(crate) struct ErrTrack {
    /// EWMA of |y − ŷ| (ms).
    pub abs_ms: f64,
    /// EWMA of |log(y/ŷ)|.
    pub log: f64,
    /// Fast EWMA of |log(y/ŷ)| (the guard's "recent" error).
    pub recent_log: f64,
    pub n: u64,
}

impl ErrTrack {
    #[inline]
    pub fn update(&mut self, abs_ms: f64, log_abs: f64, rate: f64, fast_rate: f64) {
        self.abs_ms = ewma(self.abs_ms, abs_ms, rate, self.n);
        self.log = ewma(self.log, log_abs, rate, self.n);
        self.recent_log = ewma(self.recent_log, log_abs, fast_rate, self.n);
        self.n += 1;
    }
}

/// One target's model for one class.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct ClassModel<const D: usize> {
    pub own: DecayStats<D>,
    pub peers: DecayStats<D>,
    pub theta: [f64; D],
    pub prior: [f64; D],
    pub kappa: f64,
    pub since_solve: u32,
    /// θ has been fitted to data at least once (otherwise it is the prior).
    pub solved: bool,
    /// Weighted relative residual variance of the last solve.
    pub resid_var: f64,
}

/// Solver settings shared by every class model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SolveParams {
    pub ridge: f64,
    pub tau_s: f64,
    pub interval_s: f64,
    pub solve_every: u32,
}

impl<const D: usize> ClassModel<D> {
    pub fn new(prior: [f64; D], kappa: f64) -> Self {
        Self {
            own: DecayStats::default(),
            peers: DecayStats::default(),
            theta: prior,
            prior,
            kappa,
            since_solve: 0,
            solved: false,
            resid_var: 0.0,
        }
    }

    /// Own plus peers' statistics: the pooled fleet statistic for this class.
    pub fn merged(&self, tau_s: f64) -> DecayStats<D> {
        let mut m = self.own.clone();
        m.merge_from(&self.peers, tau_s);
        m
    }

    pub fn solve(&mut self, p: &SolveParams) {
        let m = self.merged(p.tau_s);
        if let Some(th) = m.solve(p.ridge, &self.prior, self.kappa) {
            self.resid_var = m.residual_variance(&th);
            self.theta = th;
            self.solved = true;
        }
        self.since_solve = 0;
    }

    /// Add one label; re-solve every `solve_every` labels, and on every label while the
    /// model is young (the first fits move the most).
    #[inline]
    pub fn add(&mut self, x: &[f64; D], y: f64, w: f64, at_s: f64, p: &SolveParams) {
        self.own.add(x, y, w, at_s, p.tau_s, p.interval_s);
        self.since_solve += 1;
        let young = self.own.n + self.peers.n < 4 * u64::from(p.solve_every);
        if young || self.since_solve >= p.solve_every {
            self.solve(p);
        }
    }

    /// Total labels behind the merged model, and the newest label time.
    pub fn labels(&self) -> (u64, f64) {
        (
            self.own.n + self.peers.n,
            self.own.last_at_s.max(self.peers.last_at_s),
        )
    }
}

/// Everything learned about one class.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct ClassTrack {
    pub ttft: ClassModel<{ crate::features::TTFT_DIM }>,
    pub tpot: ClassModel<{ crate::features::TPOT_DIM }>,
    pub ttft_q: ScoreQuantiles,
    pub tpot_q: ScoreQuantiles,
    pub ttft_err: ErrTrack,
    pub tpot_err: ErrTrack,
}
