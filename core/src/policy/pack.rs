//! Slack packing: a request whose TTFT objective is loose beside the tightest one this
//! node has placed lately goes, among the placements that fit it with room to spare, to
//! the slowest hardware among them, so that the replicas a tight request needs most keep
//! short queues.
//!
//! **Rule.** With `T` the tightest TTFT objective of the requests this node decided in
//! the last [`TIGHT_WINDOW_S`] seconds, a request with objective `O ≥ ratio · T` is
//! loose. Its candidates are the allowed ones that meet both objectives (tier 0), repeat
//! at most [`COLD_TRY_MAX_WASTE`] of a prefill another candidate holds, and whose TTFT
//! bound `B` is at most `share · O` (headroom `O − B ≥ (1 − share) · O`): the roomy
//! ones. Of those, the slowest hardware: the candidates whose TTFT forecast for this
//! request on an idle replica (the best-cached prefix held, nothing queued or running)
//! is within `cost_tolerance` of the largest; among them the usual pick (violation
//! probability, cost, two choices). None roomy: the usual pick over all.
//!
//! Why: the cheapest placement of every request is the fastest replica's, so requests
//! with seconds of slack queue there ahead of requests with hundreds of milliseconds,
//! and those then meet their objective nowhere. A loose request loses nothing by the
//! slower replica while its bound is within `share` of its objective; what it leaves
//! on the fast one is queue the tight ones do not wait behind. The slowest hardware,
//! not the replica nearest the limit (best fit): best fit builds every replica's queue
//! of loose requests up to the limit, the fast one's included, and tight requests wait
//! behind them there too.
//!
//! Measured (real vLLM pair, 9 req/s, `chat` 500 ms beside `batch` 5 s, four seeds per
//! share, `bench/results/real-vllm/2026-12-07` §7): the segregation happens (`batch` on
//! the slow server 150–192 per run against 94–127 without), the attainment does not
//! move (+0.2 points at share 0.5, −0.2 at 0.2): the `chat` that spills to the slow
//! server finds its queue of `batch`. Off by default (`slo.pack_share = 0`).
//!
//! `slo.pack_by = "load"` takes, among the roomy placements, the one with the fewest
//! outstanding tokens ([`PackBy::Load`], `token-load`'s order) instead of the slowest
//! hardware. Why: over 13 same-run pairs at 9 req/s, `slo` sent the fast server 57.7% of
//! the prompt tokens against `token-load`'s 54.7% (12 of 13 pairs), mostly `batch` that
//! its cost (own latency against the objective) put on the fast hardware, and `chat`
//! queued behind it (`bench/results/real-vllm/2026-12-07` §9).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

use super::slo::{COLD_TRY_MAX_WASTE, Eval};

/// Which roomy placement a packed request takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PackBy {
    /// The slowest hardware (the rule above).
    #[default]
    Slowest,
    /// The fewest outstanding tokens, `token-load`'s order: a loose request gains
    /// nothing from the fastest replica, and the fewest outstanding tokens leaves every
    /// queue as short as the loose work allows for the tight requests that follow.
    Load,
}

/// How long (s) the tightest objective seen stays the reference once no request that
/// tight has come.
pub const TIGHT_WINDOW_S: f64 = 60.0;

/// The tightest TTFT objective this node decided lately (lock-free; a race between
/// two deciding threads loses one update, which the next request repeats).
#[derive(Debug)]
pub struct Tightest {
    ms: AtomicU64,
    at_s: AtomicU64,
}

impl Default for Tightest {
    fn default() -> Self {
        Self {
            ms: AtomicU64::new(f64::INFINITY.to_bits()),
            at_s: AtomicU64::new(0f64.to_bits()),
        }
    }
}

impl Tightest {
    /// Records a request's TTFT objective at `now_s`; returns the tightest of the
    /// window, this one included.
    pub fn observe(&self, ttft_ms: f64, now_s: f64) -> f64 {
        let cur = f64::from_bits(self.ms.load(Relaxed));
        let at = f64::from_bits(self.at_s.load(Relaxed));
        if ttft_ms <= cur || now_s - at > TIGHT_WINDOW_S {
            self.ms.store(ttft_ms.to_bits(), Relaxed);
            self.at_s.store(now_s.to_bits(), Relaxed);
            ttft_ms
        } else {
            cur
        }
    }
}

/// The `allowed` candidates that fit a loose request with TTFT objective `ttft_slo_ms`
/// with the room `share` leaves (module docs).
pub fn roomy(
    evals: &[Eval],
    ttft_slo_ms: f64,
    share: f64,
    allowed: &dyn Fn(usize) -> bool,
) -> Vec<usize> {
    let room = (1.0 - share) * ttft_slo_ms;
    (0..evals.len())
        .filter(|&i| {
            let e = &evals[i];
            e.tier == 0
                && e.wasted_prefill <= COLD_TRY_MAX_WASTE
                && e.ttft_headroom_ms >= room
                && allowed(i)
        })
        .collect()
}

/// Of `roomy` (candidate indices) with `idle_ms[k]` the idle forecast of `roomy[k]`, the
/// slowest: those within `tolerance` (relative) of the largest idle forecast. Empty in,
/// empty out.
pub fn slowest(roomy: &[usize], idle_ms: &[f64], tolerance: f64) -> Vec<usize> {
    let most = idle_ms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    roomy
        .iter()
        .zip(idle_ms)
        .filter(|&(_, &t)| t * (1.0 + tolerance) >= most)
        .map(|(&i, _)| i)
        .collect()
}

/// Whether a request with TTFT objective `ttft_ms` is loose beside the tightest
/// objective `tightest_ms`, for `ratio` ≥ 1.
pub fn loose(ttft_ms: f64, tightest_ms: f64, ratio: f64) -> bool {
    ttft_ms >= ratio * tightest_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(tier: u8, headroom: f64, wasted: f64) -> Eval {
        Eval {
            tier,
            p_violate: 0.0,
            cost: 0.0,
            lateness: 0.0,
            ttft_ok: tier == 0,
            tpot_ok: true,
            ttft_headroom_ms: headroom,
            tpot_headroom_ms: 10.0,
            kv_overflow: 0.0,
            wasted_prefill: wasted,
        }
    }

    #[test]
    fn the_tightest_objective_holds_for_its_window_then_gives_way() {
        let t = Tightest::default();
        assert_eq!(t.observe(5000.0, 0.0), 5000.0);
        assert_eq!(t.observe(500.0, 1.0), 500.0);
        assert_eq!(t.observe(5000.0, 30.0), 500.0);
        // Refreshed by another as tight.
        assert_eq!(t.observe(500.0, 50.0), 500.0);
        assert_eq!(t.observe(5000.0, 100.0), 500.0);
        // A window with none so tight.
        assert_eq!(t.observe(5000.0, 111.0), 5000.0);
        assert!(loose(5000.0, 500.0, 4.0));
        assert!(!loose(1000.0, 500.0, 4.0));
    }

    #[test]
    fn a_loose_request_fits_with_room_on_the_slowest_hardware() {
        // Objective 5,000 ms, share 0.5: bounds up to 2,500 ms (headroom ≥ 2,500).
        let evals = [
            eval(0, 4800.0, 0.0), // bound 200
            eval(0, 3000.0, 0.0), // bound 2,000
            eval(0, 2000.0, 0.0), // bound 3,000: past the share
            eval(1, 4900.0, 0.0), // misses TPOT
            eval(0, 4000.0, 0.5), // would repeat half a prefill held elsewhere
        ];
        let roomy = roomy(&evals, 5000.0, 0.5, &|_| true);
        assert_eq!(roomy, vec![0, 1]);
        assert_eq!(super::roomy(&evals, 5000.0, 0.5, &|i| i != 1), vec![0]);
        // Idle forecasts: the first is the slow hardware, though its queue is shorter.
        assert_eq!(slowest(&roomy, &[300.0, 100.0], 0.1), vec![0]);
        assert_eq!(slowest(&roomy, &[300.0, 280.0], 0.1), vec![0, 1]);
        assert!(slowest(&[], &[], 0.1).is_empty());
    }
}
