//! Where a replica is in its current engine step, from the tokens this node streams.
//!
//! An engine steps back to back while it decodes, and every running stream gets its
//! token at the end of a step. A request that arrives mid-step waits for the rest of
//! that step before its own prefill can start: at small prompts that residual is as
//! large as the prefill itself. The last token seen on the replica marks the last step
//! end, and the gap between a stream's tokens is the step time, so the residual is
//! `gap − (now − last token)`, within `[0, gap]`.
//!
//! Invariants: lock-free (written on every streamed chunk); times are seconds on the
//! router's clock axis; `gap_s` is 0 until a stream saw two tokens.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Weight of the newest gap in the step-time average.
const GAP_ALPHA: f64 = 0.2;

#[derive(Debug, Default)]
pub struct StepClock {
    /// Latest token arrival (f64 bits; non-negative floats order like their bits).
    last_token_s: AtomicU64,
    /// Average gap between consecutive tokens of one stream (f64 bits).
    gap_s: AtomicU64,
}

impl StepClock {
    /// `n` tokens of one stream arrived at `now_s`; its previous token came at `prev_s`.
    /// Only a chunk of one token marks a step's end: several in one chunk were coalesced
    /// (a stream interval, or a busy API server flushing), so their arrival says when
    /// they were sent, not when a step ended, and the phase is used only where the
    /// pacing is regular.
    pub fn tokens(&self, n: u32, prev_s: Option<f64>, now_s: f64) {
        if !(now_s.is_finite() && now_s >= 0.0) || n != 1 {
            return;
        }
        self.last_token_s.fetch_max(now_s.to_bits(), Relaxed);
        let Some(prev) = prev_s else { return };
        let gap = now_s - prev;
        if !(gap.is_finite() && gap > 0.0) {
            return;
        }
        // Racing writers may lose an update; the average stays a blend of real gaps.
        let old = f64::from_bits(self.gap_s.load(Relaxed));
        let new = if old > 0.0 {
            (1.0 - GAP_ALPHA) * old + GAP_ALPHA * gap
        } else {
            gap
        };
        self.gap_s.store(new.to_bits(), Relaxed);
    }

    /// The average gap between one stream's tokens (s): the engine's step time; 0 until
    /// a stream saw two one-token chunks.
    pub fn gap_s(&self) -> f64 {
        f64::from_bits(self.gap_s.load(Relaxed))
    }

    /// Expected time left in the step in progress at `now_s` (0 when unknown).
    pub fn residual_s(&self, now_s: f64) -> f64 {
        let gap = f64::from_bits(self.gap_s.load(Relaxed));
        let last = f64::from_bits(self.last_token_s.load(Relaxed));
        if gap <= 0.0 || last <= 0.0 {
            return 0.0;
        }
        (gap - (now_s - last).max(0.0)).clamp(0.0, gap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residual_is_the_rest_of_the_average_step() {
        let c = StepClock::default();
        assert_eq!(c.residual_s(1.0), 0.0);
        c.tokens(1, None, 1.00);
        c.tokens(1, Some(1.00), 1.02);
        c.tokens(1, Some(1.02), 1.04);
        assert!((c.residual_s(1.045) - 0.015).abs() < 1e-9);
        // Past one step without a token: a longer step is running; nothing is known.
        assert_eq!(c.residual_s(1.10), 0.0);
    }

    #[test]
    fn coalesced_chunks_mark_no_step() {
        let c = StepClock::default();
        c.tokens(1, None, 2.0);
        c.tokens(1, Some(2.0), 2.02);
        // Four tokens in one chunk: a flush, not a step end; the phase stays the last
        // single token's.
        c.tokens(4, Some(2.02), 2.1);
        assert!((c.residual_s(2.03) - 0.01).abs() < 1e-9);
    }
}
