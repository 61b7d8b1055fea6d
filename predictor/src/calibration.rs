//! Online quantile tracking of log scores s = log(y/ŷ) (ACI on the score scale) and small
//! EWMA trackers.
//!
//! `hi` tracks the (1−α) quantile: q ← q + η(1{s > q} − α). Summing the updates gives
//! q_T − q_0 = η·Σ(miss_t − α), so the long-run miss rate is α + O(1/(ηT)) for any score
//! sequence (Gibbs & Candès 2021) — this is the coverage guarantee. `mid` tracks the median
//! the same way. Invariant: both stay within ±[`Q_LIMIT`] (ACI's infinite sets are avoided).
//!
//! ACI comes down from a too-wide bound by only η·α per label (~300 labels from ×5 to a
//! tight fit), so `hi` is also capped by the largest score of the last 32–64 labels: a
//! bound above every recent score only over-covers. That maximum is below the true p90
//! with probability 0.9³² ≈ 3%, so the cap costs the guarantee almost nothing.

/// Bound on tracked log quantiles (e^8 ≈ 3000×): beyond this a bound is meaningless.
pub const Q_LIMIT: f64 = 8.0;
/// Floor on the log-spread used for violation probabilities.
pub const SIGMA_FLOOR: f64 = 0.02;
/// Early steps are Robbins–Monro's `c/(n+1)` until they fall to the constant ACI step:
/// from the cold default (×3) a constant 0.05 step needs ~200 labels to come down to a
/// typical p90 (ACI moves down by η·α per covered label), and the bound is that much
/// too wide meanwhile. `c` ≈ 1/density of a log score with σ ≈ 0.3 at its p90 / median.
const EARLY_GAIN_HI: f64 = 1.5;
const EARLY_GAIN_MID: f64 = 0.75;
/// Labels per block of the recent-maximum cap.
const CAP_BLOCK: u32 = 32;

/// Tracked upper and median quantiles of a log score stream.
#[derive(Clone, Copy, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ScoreQuantiles {
    pub hi: f64,
    pub mid: f64,
    /// Largest score of the block in progress and of the previous full block (−∞ until
    /// one closes): `hi` never exceeds the larger.
    pub blk_max: f64,
    pub prev_max: f64,
    pub blk_n: u32,
    /// Scores seen (uncensored, plus informative censored ones).
    pub n: u64,
}

impl ScoreQuantiles {
    pub fn new(hi: f64, mid: f64) -> Self {
        Self {
            hi,
            mid,
            blk_max: f64::NEG_INFINITY,
            prev_max: f64::INFINITY,
            blk_n: 0,
            n: 0,
        }
    }

    /// One fully observed score; the upper quantile moves on `miss` (normally s > hi, or
    /// "the issued bound was exceeded" when this tracker produced the issued bound).
    #[inline]
    pub fn update_with(&mut self, s: f64, miss: bool, alpha: f64, eta_hi: f64, eta_mid: f64) {
        let (eta_hi, eta_mid) = self.steps(eta_hi, eta_mid);
        let m = if miss { 1.0 } else { 0.0 };
        self.see(s);
        self.hi = (self.hi + eta_hi * (m - alpha))
            .min(self.recent_max())
            .clamp(-Q_LIMIT, Q_LIMIT);
        let above = if s > self.mid { 1.0 } else { 0.0 };
        self.mid = (self.mid + eta_mid * (above - 0.5)).clamp(-Q_LIMIT, Q_LIMIT);
        self.n += 1;
    }

    /// Folds a score into the recent-maximum blocks.
    #[inline]
    fn see(&mut self, s: f64) {
        self.blk_max = self.blk_max.max(s);
        self.blk_n += 1;
        if self.blk_n >= CAP_BLOCK {
            self.prev_max = self.blk_max;
            self.blk_max = f64::NEG_INFINITY;
            self.blk_n = 0;
        }
    }

    /// The largest score of the last 32–64 labels (+∞ before the first block closes).
    #[inline]
    fn recent_max(&self) -> f64 {
        self.prev_max.max(self.blk_max)
    }

    /// The steps for the next update: large while few scores were seen, then constant.
    #[inline]
    fn steps(&self, eta_hi: f64, eta_mid: f64) -> (f64, f64) {
        let k = 1.0 / (self.n as f64 + 1.0);
        (
            eta_hi.max(EARLY_GAIN_HI * k),
            eta_mid.max(EARLY_GAIN_MID * k),
        )
    }

    /// One fully observed score, plain quantile tracking.
    #[inline]
    pub fn update(&mut self, s: f64, alpha: f64, eta_hi: f64, eta_mid: f64) {
        self.update_with(s, s > self.hi, alpha, eta_hi, eta_mid);
    }

    /// A censored score: the true score is at least `s_lower`, and `miss` says whether
    /// that alone proves a miss. Only the known "above" outcomes move the quantiles.
    #[inline]
    pub fn update_censored_with(
        &mut self,
        s_lower: f64,
        miss: bool,
        alpha: f64,
        eta_hi: f64,
        eta_mid: f64,
    ) {
        let (eta_hi, eta_mid) = self.steps(eta_hi, eta_mid);
        let mut informative = false;
        self.see(s_lower);
        if miss {
            self.hi = (self.hi + eta_hi * (1.0 - alpha)).clamp(-Q_LIMIT, Q_LIMIT);
            informative = true;
        }
        if s_lower > self.mid {
            self.mid = (self.mid + eta_mid * 0.5).clamp(-Q_LIMIT, Q_LIMIT);
            informative = true;
        }
        if informative {
            self.n += 1;
        }
    }

    /// A censored score with plain quantile tracking.
    #[inline]
    pub fn update_censored(&mut self, s_lower: f64, alpha: f64, eta_hi: f64, eta_mid: f64) {
        self.update_censored_with(s_lower, s_lower > self.hi, alpha, eta_hi, eta_mid);
    }

    /// Log-spread σ such that a lognormal through (mid, hi) puts `z_hi` σ between them.
    #[inline]
    pub fn sigma(&self, z_hi: f64) -> f64 {
        ((self.hi - self.mid) / z_hi).max(SIGMA_FLOOR)
    }
}

/// Regimes a bound is calibrated in apart ([`Band`]): 0 = the request starts at once
/// (nothing queued ahead of it, and room for it in the KV cache), 1 = it waits behind
/// queued work or its placement fills the KV cache.
pub const REGIMES: usize = 2;

/// The regime of a forecast made from `o`: does the request wait behind queued work, or
/// take the replica's KV footprint to its capacity ([`crate::kv_footprint_tokens`])?
///
/// Why the footprint: with the queue alone, the "free" regime held the placements onto
/// a full cache, whose TTFT is bimodal (admitted at once or seconds later), and its band
/// was the widest: real vLLM at 2.9 req/s (2026-12-04, `slo`), p90 log score +0.96 in the
/// free regime by the queue alone, +0.12 with the footprint test added (the queued one
/// +1.20 and +1.24).
#[inline]
pub fn regime(o: &crate::Observation) -> usize {
    let queued = o.queued_prefill_tokens > 0.0 || o.queued_requests > 0.0;
    let full = o.kv_capacity_tokens > 0.0 && o.kv_footprint_tokens() >= o.kv_capacity_tokens;
    usize::from(queued | full)
}

/// One [`ScoreQuantiles`] per regime (Mondrian conformal: ACI run apart on each part of a
/// partition the forecast fixes, so each part covers 1−α on its own), and one over all
/// labels for a regime that has too few of its own yet.
///
/// Why: one spread for all forecasts is too wide where nothing is queued and too narrow
/// where a queue is draining. Real vLLM at 8 req/s (2026-12-02, `slo`'s placements): with
/// no queue ahead the p90 log score was +0.42/+0.50 (fast/slow server) and the issued
/// bound's +0.96/+1.11 covered 0.95; behind a queue of under 1k tokens the p90 was
/// +2.10/+1.66 and the same bound covered 0.75/0.77.
#[derive(Clone, Copy, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct Band {
    pub by_regime: [ScoreQuantiles; REGIMES],
    pub pooled: ScoreQuantiles,
}

impl Band {
    /// The same quantiles in every regime.
    pub fn uniform(q: ScoreQuantiles) -> Self {
        Self {
            by_regime: [q; REGIMES],
            pooled: q,
        }
    }

    #[inline]
    pub fn get(&self, regime: usize) -> &ScoreQuantiles {
        &self.by_regime[regime.min(REGIMES - 1)]
    }

    /// Every tracker with its label count reset (a new replica or class starts from
    /// borrowed quantiles but must earn its own count).
    pub fn unearned(&self) -> Self {
        let z = |q: ScoreQuantiles| ScoreQuantiles { n: 0, ..q };
        Self {
            by_regime: self.by_regime.map(z),
            pooled: z(self.pooled),
        }
    }

    /// One fully observed score in `regime`. `issued_miss` (the label exceeded the bound
    /// actually issued, guard included) moves the upper quantile of the tracker that
    /// issued it — the regime's once it has `issuing_min` labels, else the pooled one — so
    /// issued bounds cover 1−α in the long run (ACI); the other moves on its plain score.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn update(
        &mut self,
        regime: usize,
        s: f64,
        issued_miss: Option<bool>,
        issuing_min: u64,
        alpha: f64,
        eta_hi: f64,
        eta_mid: f64,
    ) {
        let q = &mut self.by_regime[regime.min(REGIMES - 1)];
        let own = q.n >= issuing_min;
        let miss = |issuing: bool, hi: f64| match issued_miss {
            Some(m) if issuing => m,
            _ => s > hi,
        };
        q.update_with(s, miss(own, q.hi), alpha, eta_hi, eta_mid);
        let p = &mut self.pooled;
        p.update_with(s, miss(!own, p.hi), alpha, eta_hi, eta_mid);
    }

    /// A censored score in `regime` (see [`ScoreQuantiles::update_censored`]).
    #[inline]
    pub fn update_censored(
        &mut self,
        regime: usize,
        s_lower: f64,
        alpha: f64,
        eta_hi: f64,
        eta_mid: f64,
    ) {
        self.by_regime[regime.min(REGIMES - 1)].update_censored(s_lower, alpha, eta_hi, eta_mid);
        self.pooled.update_censored(s_lower, alpha, eta_hi, eta_mid);
    }
}

/// Exponentially weighted mean whose early values are plain averages (rate ≥ 1/(n+1)).
#[inline]
pub fn ewma(prev: f64, x: f64, rate: f64, n_before: u64) -> f64 {
    let r = rate.max(1.0 / (n_before as f64 + 1.0));
    prev + r * (x - prev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_run_miss_rate_equals_alpha_for_any_sequence() {
        // An adversarial-looking deterministic sequence: a sawtooth with jumps.
        let mut q = ScoreQuantiles::new(0.0, 0.0);
        let mut misses = 0u32;
        let n = 20_000;
        for i in 0..n {
            let s = ((i * 7919) % 1000) as f64 / 500.0 + if i > n / 2 { 1.5 } else { 0.0 };
            if s > q.hi {
                misses += 1;
            }
            q.update(s, 0.1, 0.05, 0.02);
        }
        let rate = f64::from(misses) / f64::from(n);
        assert!((rate - 0.1).abs() < 0.005, "{rate}");
    }

    #[test]
    fn starting_far_too_wide_the_bound_comes_down_within_dozens_of_labels() {
        // Scores ~ uniform on [-0.3, 0.3]: the p90 is 0.24. Start at the cold ln 3.
        let mut q = ScoreQuantiles::new(3f64.ln(), 0.0);
        for i in 0..40 {
            let s = ((i * 37) % 61) as f64 / 60.0 * 0.6 - 0.3;
            q.update(s, 0.1, 0.05, 0.02);
        }
        assert!(q.hi < 0.5, "{}", q.hi);
        assert!(q.hi > 0.1, "{}", q.hi);
    }

    #[test]
    fn an_early_miss_does_not_leave_the_bound_wide_for_hundreds_of_labels() {
        // One far score early (a cold-start outlier), then tight scores ~ ±0.05.
        let mut q = ScoreQuantiles::new(3f64.ln(), 0.0);
        q.update(2.0, 0.1, 0.05, 0.02);
        let mut misses = 0;
        for i in 0..80 {
            let s = ((i * 37) % 61) as f64 / 60.0 * 0.1 - 0.05;
            if s > q.hi {
                misses += 1;
            }
            q.update(s, 0.1, 0.05, 0.02);
        }
        assert!(q.hi < 0.15, "still {} after 80 tight labels", q.hi);
        assert!(q.hi > 0.0, "{} below the scores' p90", q.hi);
        assert!(misses <= 16, "{misses} misses of 80");
    }

    #[test]
    fn a_placement_that_fills_the_kv_cache_is_in_the_waiting_regime() {
        // 8,192 KV tokens; 6,000 decoding, a 1,000-token prompt with 200 cached, 256 out:
        // F = 6,000 + 800 + 256 = 7,056 fits; with 1,500 more decoding it does not.
        let o = crate::Observation {
            prompt_tokens: 1000.0,
            cached_tokens: 200.0,
            expected_output_tokens: 256.0,
            decode_context_tokens: 6000.0,
            kv_capacity_tokens: 8192.0,
            ..Default::default()
        };
        assert_eq!(o.kv_footprint_tokens(), 7056.0);
        assert_eq!(regime(&o), 0);
        let full = crate::Observation {
            decode_context_tokens: 7500.0,
            ..o
        };
        assert_eq!(regime(&full), 1);
        let unknown = crate::Observation {
            kv_capacity_tokens: 0.0,
            ..full
        };
        assert_eq!(
            regime(&unknown),
            0,
            "no capacity known: only a queue counts"
        );
        let queued = crate::Observation {
            queued_requests: 1.0,
            queued_prefill_tokens: 300.0,
            ..o
        };
        assert_eq!(regime(&queued), 1);
    }

    #[test]
    fn censored_scores_only_push_upward() {
        let mut q = ScoreQuantiles::new(0.5, 0.0);
        q.update_censored(0.1, 0.1, 0.05, 0.02);
        assert_eq!(q.hi, 0.5, "≥0.1 says nothing about exceeding 0.5");
        assert!(q.mid > 0.0);
        q.update_censored(0.9, 0.1, 0.05, 0.02);
        assert!(q.hi > 0.5);
    }
}
