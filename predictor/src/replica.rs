//! Per-replica state: the multiplicative log-correction (an online median), calibration
//! quantiles, coverage, recent errors and drift detection — for each target.
//!
//! Invariants: `corr` is this node's own median tracker; peers' corrections enter only
//! through `peer_wc/peer_w` (their count-weighted sums, rebuilt on every slot change), so
//! merging never feeds back into the own tracker. Calibration quantiles are local only.

use crate::calibration::{Band, REGIMES, ewma};
use crate::class_model::ErrTrack;
use crate::decay_stats::landmark_for;
use crate::drift::PageHinkley;

/// Bound on a replica's log correction (±ln 4). A replica more than 4× off its class
/// model is not a slow replica but a wrong model for the regime it is in (the RTX PRO
/// 6000 replay: the first labels from a slot-bound queue were 20× the forecast, a run
/// jump moved the correction to ln 20, and every later forecast — the queue's wait by then
/// in the model — was 20× too long). The warm gate sends such a class cold; the
/// correction must not paper over it.
pub(crate) const CORR_LIMIT: f64 = 1.386_294_361_119_890_6;

#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct TargetTrack {
    /// Own median of log(y/ŷ_class).
    pub corr: f64,
    /// Fast EWMA of log(y/ŷ_class): where the residual sits now. A drift alarm moves
    /// `corr` here at once; the median tracker's small steps would take dozens of labels
    /// to absorb a replica that became 3× slower.
    pub fast: f64,
    /// Consecutive residuals beyond the jump threshold on one side of `corr`: their
    /// count (signed by side) and sum. Three in a row are a change too sharp to wait
    /// for Page–Hinkley's evidence (a replica that recovered after being avoided gets
    /// only occasional probes).
    pub run_n: i32,
    pub run_sum: f64,
    /// Label time of the run's first far residual: a run counts as a change only once a
    /// later label measured a window after it (see `learn_target`).
    pub run_first_end_s: f64,
    /// Forward-decayed label weight behind `corr`, relative to `corr_landmark`.
    pub corr_w: f64,
    pub corr_landmark: f64,
    /// Calibration of this replica's bounds, per regime.
    pub q: Band,
    /// EWMA of 1{y ≤ issued upper bound}.
    pub coverage: f64,
    pub coverage_n: u64,
    pub err: ErrTrack,
    /// The same errors per regime: the guard and the reported error of a forecast read
    /// its regime's, so errors behind a queue do not widen bounds where none is.
    pub err_by_regime: [ErrTrack; REGIMES],
    pub labels: u64,
    pub last_label_s: f64,
    pub ph: PageHinkley,
    pub boost_until_s: f64,
    pub alarms: u64,
    /// TPOT in `OnDrift` mode: the correction applies from an alarm until it returns near 0.
    pub latched: bool,
    /// Σ w·c and Σ w over peers' corrections for this replica, relative to `peer_landmark`.
    pub peer_wc: f64,
    pub peer_w: f64,
    pub peer_landmark: f64,
    pub peer_labels: u64,
    pub peer_last_label_s: f64,
}

impl TargetTrack {
    pub fn new(q: Band) -> Self {
        Self {
            corr: 0.0,
            fast: 0.0,
            run_n: 0,
            run_sum: 0.0,
            run_first_end_s: 0.0,
            corr_w: 0.0,
            corr_landmark: f64::NEG_INFINITY,
            q: q.unearned(),
            coverage: 0.0,
            coverage_n: 0,
            err: ErrTrack::default(),
            err_by_regime: [ErrTrack::default(); REGIMES],
            labels: 0,
            last_label_s: f64::NEG_INFINITY,
            ph: PageHinkley::default(),
            boost_until_s: f64::NEG_INFINITY,
            alarms: 0,
            latched: false,
            peer_wc: 0.0,
            peer_w: 0.0,
            peer_landmark: f64::NEG_INFINITY,
            peer_labels: 0,
            peer_last_label_s: f64::NEG_INFINITY,
        }
    }

    /// Count-weighted mean of the own and peers' corrections.
    pub fn merged_correction(&self, tau_s: f64) -> f64 {
        if self.peer_w <= 0.0 {
            return self.corr;
        }
        if self.corr_w <= 0.0 {
            return self.peer_wc / self.peer_w;
        }
        let lm = self.corr_landmark.max(self.peer_landmark);
        let fo = (-(lm - self.corr_landmark) / tau_s).exp();
        let fp = (-(lm - self.peer_landmark) / tau_s).exp();
        let (wo, wp) = (self.corr_w * fo, self.peer_w * fp);
        if wo + wp > 0.0 {
            (wo * self.corr + self.peer_wc * fp) / (wo + wp)
        } else {
            self.corr
        }
    }

    /// One sign step of the median tracker toward `r = log(y/ŷ_class)`, and its weight.
    pub fn step_correction(&mut self, r: f64, eta: f64, at_s: f64, tau_s: f64, interval_s: f64) {
        let d = r - self.corr;
        let step = if d > 0.0 {
            eta.min(d)
        } else if d < 0.0 {
            -eta.min(-d)
        } else {
            0.0
        };
        self.corr = (self.corr + step).clamp(-CORR_LIMIT, CORR_LIMIT);
        let lm = landmark_for(at_s, interval_s);
        if lm > self.corr_landmark {
            if self.corr_landmark.is_finite() {
                self.corr_w *= (-(lm - self.corr_landmark) / tau_s).exp();
            }
            self.corr_landmark = lm;
        }
        let g = ((at_s - self.corr_landmark) / tau_s).exp();
        if g.is_finite() {
            self.corr_w += g;
        }
    }

    pub fn record_coverage(&mut self, covered: bool, rate: f64) {
        let v = if covered { 1.0 } else { 0.0 };
        self.coverage = ewma(self.coverage, v, rate, self.coverage_n);
        self.coverage_n += 1;
    }

    pub fn all_labels(&self) -> (u64, f64) {
        (
            self.labels + self.peer_labels,
            self.last_label_s.max(self.peer_last_label_s),
        )
    }
}

#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct ReplicaTrack {
    pub class: u64,
    pub ttft: TargetTrack,
    pub tpot: TargetTrack,
    /// EWMA of the decode step measured from streamed tokens (ms), when it was last
    /// measured, and how many measurements.
    pub step_ms: f64,
    pub step_at_s: f64,
    pub step_n: u64,
    /// EWMA of TPOT labels (ms): the mean step over finished decodes, the fallback when no
    /// stream gap is fresh.
    pub tpot_step_ms: f64,
    pub tpot_step_n: u64,
    /// Most requests seen decoding at once (the engine's slot cap once it saturated).
    pub peak_running: f64,
    /// EWMA of 1{decoding ≥ 0.95·peak} over the running counts seen: a cap pins the
    /// count at the peak, while a count that merely varies touches its maximum rarely
    /// (uniform on 0..=64 it is within 5% of 64 for ~5% of observations).
    pub at_peak: f64,
    pub running_n: u64,
    /// When the running count last left the 5% band above `stable_base` (seconds): a
    /// count still climbing (a burst ramping up) keeps resetting it and is no evidence of
    /// a cap.
    pub peak_grew_at_s: f64,
    /// The running count when it last grew out of the band.
    pub stable_base: f64,
}

/// How long the count must have held without growing before its peak is taken as a cap
/// (seconds): in the RTX PRO 6000 replay the count climbs ~10 requests/s for 12 s to its
/// 128 slots; 20 observations a second see it inside a 5% band half of the time.
const PEAK_STABLE_S: f64 = 2.0;
/// Running counts to see before a peak can be a cap: the first few are all "at the peak".
const PEAK_MIN_SEEN: u64 = 20;

/// Rate of the at-peak EWMA (≈ the last 10 running counts).
const PEAK_RATE: f64 = 0.1;
/// The replica is slot-bound (its peak is a cap) when the at-peak EWMA is at least this.
const PINNED: f64 = 0.5;

/// Rate of the step-time EWMAs (≈ the last 3–5 measurements: the step moves with load).
pub(crate) const STEP_RATE: f64 = 0.3;
/// One step-time measurement moves the estimate by at most this factor (log ±ln 2): a
/// gap read across a long prefill step, or a scrape window dominated by prefill, reads
/// several times the decode step (279 ms against ~30 ms in the measured RTX 4090 run's
/// scrapes) and must not set the price of every queued request's wait on its own.
const STEP_CLIP_LOG: f64 = std::f64::consts::LN_2;

/// Robust EWMA of a step time in log space (a geometric mean that tolerates spikes).
pub(crate) fn step_ewma(prev_ms: f64, x_ms: f64, n_before: u64) -> f64 {
    if n_before == 0 || prev_ms <= 0.0 {
        return x_ms;
    }
    let d = (x_ms / prev_ms).ln().clamp(-STEP_CLIP_LOG, STEP_CLIP_LOG);
    let r = STEP_RATE.max(1.0 / (n_before as f64 + 1.0));
    prev_ms * (r * d).exp()
}
/// A stream-gap measurement older than this no longer describes the replica (seconds).
pub(crate) const STEP_FRESH_S: f64 = 30.0;

impl ReplicaTrack {
    pub fn new(class: u64, ttft: TargetTrack, tpot: TargetTrack) -> Self {
        Self {
            class,
            ttft,
            tpot,
            step_ms: 0.0,
            step_at_s: f64::NEG_INFINITY,
            step_n: 0,
            tpot_step_ms: 0.0,
            tpot_step_n: 0,
            peak_running: 0.0,
            at_peak: 0.0,
            running_n: 0,
            peak_grew_at_s: f64::NEG_INFINITY,
            stable_base: 0.0,
        }
    }

    /// One running count (decoding requests) seen on the replica.
    pub fn see_running(&mut self, n_dec: f64, at_s: f64) {
        if !(n_dec.is_finite() && n_dec >= 0.0 && at_s.is_finite()) {
            return;
        }
        // The peak "grew" when it left the 5% band around the value it held when the
        // counter last restarted (slow growth in small steps is still growth).
        if n_dec > self.stable_base / crate::features::SLOT_BOUND_FRACTION {
            self.peak_grew_at_s = self.peak_grew_at_s.max(at_s);
            self.stable_base = n_dec;
        }
        self.peak_running = self.peak_running.max(n_dec);
        let at = if n_dec >= crate::features::SLOT_BOUND_FRACTION * self.peak_running {
            1.0
        } else {
            0.0
        };
        self.at_peak = ewma(self.at_peak, at, PEAK_RATE, self.running_n);
        self.running_n += 1;
    }

    /// The slot cap the admission wait may assume at `now_s`: the peak once the count is
    /// pinned there and has not grown for a while, else 0 (unknown).
    pub fn slot_cap(&self, now_s: f64) -> f64 {
        if self.running_n >= PEAK_MIN_SEEN
            && self.at_peak >= PINNED
            && now_s - self.peak_grew_at_s >= PEAK_STABLE_S
        {
            self.peak_running
        } else {
            0.0
        }
    }

    /// The step time the admission wait uses at `now_s`: a fresh stream gap, else recent
    /// TPOT labels, else `class_step_ms` (the class's, or the default).
    pub fn step_for(&self, now_s: f64, class_step_ms: f64) -> f64 {
        if self.step_n > 0 && now_s - self.step_at_s <= STEP_FRESH_S {
            self.step_ms
        } else if self.tpot_step_n > 0 {
            self.tpot_step_ms
        } else {
            class_step_ms
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibration::ScoreQuantiles;

    #[test]
    fn sign_steps_track_the_median_not_the_mean() {
        let mut t = TargetTrack::new(Band::uniform(ScoreQuantiles::new(0.5, 0.0)));
        // Right-skewed residuals: median 0.1, mean far higher.
        let seq = [0.0, 0.1, 0.2, 0.05, 3.0];
        for i in 0..5000 {
            t.step_correction(seq[i % 5], 0.01, i as f64, 300.0, 600.0);
        }
        assert!((t.corr - 0.1).abs() < 0.03, "{}", t.corr);
    }

    #[test]
    fn merged_correction_weights_by_count() {
        let mut t = TargetTrack::new(Band::uniform(ScoreQuantiles::new(0.5, 0.0)));
        for i in 0..100 {
            t.step_correction(0.4, 0.05, i as f64, 1e9, 600.0);
        }
        t.peer_wc = 300.0 * 0.0;
        t.peer_w = 300.0;
        t.peer_landmark = 0.0;
        let m = t.merged_correction(1e9);
        assert!(
            (m - 0.1).abs() < 1e-3,
            "100 labels at 0.4 and 300 at 0 → 0.1, got {m}"
        );
    }
}
