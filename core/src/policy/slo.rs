//! The `slo` policy: route by predicted latency against the request's objectives.
//!
//! For each candidate the predictor gives TTFT and TPOT (point and calibrated upper
//! bound). A candidate *meets* an objective when its effective bound — the larger of
//! the calibrated bound and the point forecast plus its recent absolute error — is
//! within it. For TPOT the objective is the tighter of the request's and of the
//! tightest request already running there, so a placement never pushes running
//! requests past their own TPOT objectives. With `kv_room` on (off by default), a
//! placement that would overflow the replica's KV cache ([`kv_room`]: vLLM admits on
//! the prompt alone, so the request would wait for completions the TTFT forecast does
//! not see) misses its TTFT objective whatever the forecast, and is later by the share
//! it is over.
//!
//! Ranking: tier (both met, one missed, both missed), then violation probability, then
//! cost (predicted latency relative to the objectives, which rewards fast hardware and
//! prefix-cache hits, plus `cache_weight` × the prefill a prefix miss repeats there —
//! that replica's TTFT forecast less its forecast with the best-cached prefix held —
//! over the TTFT objective, both in ms); in a tier that misses, lateness (the effective bounds relative to
//! the objectives) instead of the violation probability, which is near 1 for all there
//! ([`within_tier_key`]). The choice is among near-equals — violation probability
//! within `near_equal` of the best, then cost within `cost_tolerance` of the cheapest —
//! the fewer in-flight requests of two drawn at random (on a tie, the one this node sent
//! fewer prompt tokens lately), with hysteresis for this node's previous pick, so nodes
//! holding the same view do not herd. While any candidate's TTFT model is cold or stale (`min_warm_fraction`) the policy says so and ranks
//! by outstanding tokens instead — this request's uncached prompt tokens and expected
//! output plus what is already there (with `kv_room`, among the candidates with KV
//! room when any has it) — which is prefix-aware and load-aware: on the
//! heterogeneous real-vLLM pair it met 58% of objectives where `cache_aware` (vllm-router
//! 38%, sglang-router 34%) did not (same run, `scripts/vllm/side-by-side.sh`); routing by
//! `cache_aware` itself while cold made the simulator's forecasts worse (one seed's TTFT
//! MAPE 12.7% against 10%). When nothing meets both objectives the tenant's
//! fallback applies: least-bad, defer (within the deadline), or reject — a refusal of
//! the fleet (503), made only when even the best candidate is more likely than
//! `reject_above` to miss (else least-bad), whose `Retry-After` is the queue the best
//! candidate must drain:
//! `max(TTFT bound − TTFT objective, 0)` in seconds, at least 1 s (a TPOT miss clears
//! as running streams finish, whose remaining lengths the router does not know).
//! Before any of that, a tenant that rejects is refused when every candidate has a
//! standing queue (`shed_queue_age`, [`standing_queue`]): a measured wait, not a
//! forecast, so it holds in a backlog, where the TTFT model is gated cold.
//!
//! Slack hold (`hold`, a share of the TTFT objective; 0 = off, the default): when the chosen
//! placement fits with its TTFT bound at most `hold` × the objective and its replica
//! has streamed requests queued for prefill (placed by this node, no token yet: a
//! non-streamed one shows no first token; peers' are not gossiped), the request goes to a fitting replica without a
//! queue if there is one, else waits at the router (`Choice::Defer`, label `hold`) and
//! decides again every `defer_poll_ms`, within the lifecycle's deadline (`defer_budget`
//! × the objective): forecast total `≤ (hold + defer_budget) × objective`. Engines
//! serve their queues first come, first served, so loose requests that wait at the
//! router leave the queues short for the tight ones that arrive after them ([`holds`]).
//!
//! Regions ([`crate::region`]): a remote candidate's TTFT is judged against the
//! objective less the round trip to its region; the choice is local while a local
//! candidate meets both objectives, else remote if a remote one does, else least-bad
//! among the local ones (all, when the node has no local candidate left).

use std::sync::{
    Arc,
    atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed},
};

use headroom_predictor::{
    ModelState, Observation, Prediction, SharedPredictor, Snapshot, TAIL_SATURATES, lognormal_tail,
    memo,
};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::{
    Candidate, Choice, DecideCtx, Decision, Fallback, Load, NoFit, Policy, RequestProfile,
    baselines::TokenLoad, features, kv_room, pack, rank,
};
use crate::region;

/// Knobs of the `slo` policy (`[slo]` in the config).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SloConfig {
    /// Candidates whose violation probability is within this of the best are equals.
    pub near_equal: f64,
    /// Among those, placements whose cost is within this fraction of the cheapest are
    /// equals too (chosen at random).
    pub cost_tolerance: f64,
    /// This node's previous pick stays among the equals up to this extra margin.
    pub hysteresis: f64,
    /// Cost of a placement per TTFT objective of prefill it repeats that the
    /// best-cached replica would not (prefix misses, priced by the replica's own TTFT
    /// model): rewards replicas that already hold the prompt's prefix.
    pub cache_weight: f64,
    /// Count the TPOT objectives a long prefill would break for requests already
    /// decoding on a replica against placing it there.
    pub interference_guard: bool,
    /// Probability of choosing uniformly among the feasible (unbiased learning data),
    /// leaving out placements that would repeat more than [`COLD_TRY_MAX_WASTE`] of a
    /// prefill another candidate has cached.
    pub explore: f64,
    /// Below this share of candidates whose TTFT model is warm the policy routes by
    /// load instead. Default 1: ranking compares forecasts, and a cold class's are not
    /// ones (real vLLM, seed 6 at 2.4 req/s: the fast server's cold forecasts ran
    /// 7-9 s for 0.3-1.7 s labels with bounds 10× the point, the least-bad choice sent
    /// 48 requests to the slow server, 56% met, where `token-load` met 84%).
    pub min_warm_fraction: f64,
    /// Judge a placement that would overflow the replica's KV cache (its prompt and
    /// expected output on top of what is placed there, [`kv_room`]) as missing its TTFT
    /// objective, and prefer a replica with room while the model is cold and when
    /// nothing fits. Off by default: the signal predicts TTFT misses on real vLLM (3%
    /// of placements with room missed, 78% of those 20% or more over), but on the real
    /// pair at 2 req/s `slo` with it met 93.9/57.1/90.2% (seeds 7/13/11) against
    /// 86.4/75.9/96.2% without and `token-load`'s 91.8/77.6/93.2%: no gain shown
    /// (`bench/results/real-vllm/2026-12-04`).
    pub kv_room: bool,
    /// How long a deferred request waits between attempts (ms).
    pub defer_poll_ms: u64,
    /// Share of the TTFT objective a request may spend deferred.
    pub defer_budget: f64,
    /// Most requests deferred at once; beyond it they go least-bad.
    pub max_deferred: usize,
    /// A replica nobody has placed work on for this long (s) and that is idle gets the
    /// next request it is predicted to serve within both objectives, whatever its
    /// cost, unless another replica holds most of that request's prefix: its model
    /// learns only from placements, so without such probes a replica once slow would
    /// never be seen to recover. 0 disables.
    pub probe_idle_s: f64,
    /// Slack hold ([`holds`]): a request whose chosen placement fits with its TTFT
    /// bound at most this share of its objective waits at the router while every
    /// replica it fits on has streams queued for prefill ([`busy`]), and goes to the first that
    /// drains (within the defer budget). 0 disables. Off by default: on the slower
    /// machine of 2026-12-04 (2.4 req/s) a hold of 0.5 was ahead of no hold in 5 runs of
    /// 5, but on the faster one of 2026-12-05 at 10 req/s it was behind on all three
    /// seeds (75.0/86.6/96.2% against 99.2/88.3/100.0%, same runs): the held requests
    /// grew from 2 to 29 per 10 s ahead of a KV surge the pair did not drain, a collapse
    /// worse than anything the hold gained (`bench/results/real-vllm/2026-12-05` §7).
    pub hold: f64,
    /// Standing-queue shed ([`standing_queue`]): for a tenant whose fallback is reject,
    /// refuse at once when on every candidate the oldest stream this node placed there
    /// has waited at least this multiple of the request's TTFT objective for its first
    /// token, whether the model is warm or cold. 0 disables. On by default (1): on the
    /// real-vLLM pair past its knee (7 req/s, three seeds) `slo` with a reject tenant
    /// met 87.5/70.0/63.2% with it where without it, and every other router, collapsed
    /// to 0-80% (`bench/results/real-vllm/2026-12-06` §3). Least-bad and defer tenants
    /// are never refused by it.
    pub shed_queue_age: f64,
    /// A tenant whose fallback is reject is refused when nothing fits only if even its
    /// best candidate's violation probability is at least this; below it the request
    /// goes least-bad. Nothing fitting means no candidate's *bound* is within the
    /// objectives, which at 0.9 coverage still leaves most such requests on time: on the
    /// real-vLLM pair at 7 req/s (`bench/results/real-vllm/2026-12-06` §3) refusing
    /// every one turned away chat requests bound at 506-611 ms against 500 ms.
    pub reject_above: f64,
    /// Slack packing ([`pack`]): a request whose TTFT objective is at least
    /// `pack_ratio` × the tightest this node placed in the last minute goes, among the
    /// placements that fit it with its TTFT bound at most this share of its objective,
    /// to the slowest hardware among them (or by load, `pack_by`). 0 disables. Off by default: on the real pair
    /// at 9 req/s it moved `batch` to the slow server and `chat` to the fast one as
    /// meant, and met −0.2 to +0.2 points of packing off (shares 0.2 and 0.5, four
    /// seeds each, `bench/results/real-vllm/2026-12-07` §7).
    pub pack_share: f64,
    /// How many times the tightest recent TTFT objective makes a request loose enough
    /// to pack (at least 1).
    pub pack_ratio: f64,
    /// Which of the roomy placements a packed request takes ([`pack::PackBy`]): the
    /// slowest hardware (`"slowest"`, the default) or the fewest outstanding tokens, as
    /// `token-load` places (`"load"`).
    pub pack_by: pack::PackBy,
    /// On a fleet of more eligible candidates than this, only this many are forecast
    /// and judged ([`super::shortlist`]: the previous pick, the largest prefix holders,
    /// and per hardware class the least loaded); 0 evaluates every one. At 1,024
    /// candidates the full evaluation is ≈ 180 µs a decision.
    pub shortlist: usize,
}

impl Default for SloConfig {
    fn default() -> Self {
        Self {
            near_equal: 0.03,
            cost_tolerance: 0.10,
            hysteresis: 0.03,
            cache_weight: 1.0,
            interference_guard: true,
            explore: 0.01,
            min_warm_fraction: 1.0,
            kv_room: false,
            defer_poll_ms: 20,
            defer_budget: 0.5,
            max_deferred: 1024,
            probe_idle_s: 0.5,
            hold: 0.0,
            shed_queue_age: 1.0,
            reject_above: 0.5,
            pack_share: 0.0,
            pack_ratio: 4.0,
            pack_by: pack::PackBy::Slowest,
            shortlist: 16,
        }
    }
}

/// How one candidate fares against the objectives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Eval {
    /// 0 both met, 1 one missed, 2 both missed.
    pub tier: u8,
    /// P(TTFT or TPOT objective missed).
    pub p_violate: f64,
    /// Predicted latency relative to the objectives (lower is better).
    pub cost: f64,
    /// The effective bounds relative to the objectives, `TTFT bound / TTFT objective +
    /// TPOT bound / TPOT objective` (plus the same prefix-miss cost as `cost`): how far
    /// past its objectives a placement is likely to land. Ranks when nothing fits.
    pub lateness: f64,
    pub ttft_ok: bool,
    pub tpot_ok: bool,
    pub ttft_headroom_ms: f64,
    pub tpot_headroom_ms: f64,
    /// How far past its KV capacity the placement takes the replica, as a share of the
    /// capacity ([`kv_room::overflow`]); 0 with room. Over, the TTFT is judged missed.
    pub kv_overflow: f64,
    /// Share of the prompt's prefill this placement repeats that the best-cached
    /// candidate would not (0 at the best cache). Probes and exploration, which place
    /// for the learning and not for the cost, skip placements that waste much of it.
    pub wasted_prefill: f64,
}

/// Judges one prediction against objectives. `tpot_guard_ms` is the tightest TPOT
/// objective among requests already running on the replica.
pub fn evaluate(
    p: &Prediction,
    ttft_slo_ms: f64,
    tpot_slo_ms: f64,
    tpot_guard_ms: Option<f64>,
) -> Eval {
    let tpot_slo = tpot_guard_ms.map_or(tpot_slo_ms, |g| g.min(tpot_slo_ms));
    let ttft_bound = p.ttft_upper_ms.max(p.ttft_ms + p.ttft_recent_abs_err_ms);
    let tpot_bound = p.tpot_upper_ms.max(p.tpot_ms + p.tpot_recent_abs_err_ms);
    let ttft_ok = ttft_bound <= ttft_slo_ms;
    let tpot_ok = tpot_bound <= tpot_slo;
    let pt = tail_within(
        p.ttft_median_ms,
        p.ttft_log_sigma,
        p.ttft_upper_ms,
        ttft_bound,
        ttft_slo_ms,
    );
    let pp = tail_within(
        p.tpot_median_ms,
        p.tpot_log_sigma,
        p.tpot_upper_ms,
        tpot_bound,
        tpot_slo,
    );
    Eval {
        tier: 2 - ttft_ok as u8 - tpot_ok as u8,
        p_violate: 1.0 - (1.0 - pt) * (1.0 - pp),
        // Against the request's own TPOT objective, not the guard: the guard decides
        // whether running streams stay within theirs (`tpot_ok`). Normalised by it, a
        // loose request's cost on a replica running tight streams was 4× its cost
        // elsewhere, so tenants segregated: on the real-vLLM pair (2026-12-07 §2) every
        // `batch` request (TPOT 120 ms) went to the server without `chat` (30 ms), and
        // `chat` was left one server, the slow one, where its queue built.
        cost: p.ttft_ms / ttft_slo_ms.max(1e-9) + p.tpot_ms / tpot_slo_ms.max(1e-9),
        lateness: ttft_bound / ttft_slo_ms.max(1e-9) + tpot_bound / tpot_slo.max(1e-9),
        ttft_ok,
        tpot_ok,
        ttft_headroom_ms: ttft_slo_ms - ttft_bound,
        tpot_headroom_ms: tpot_slo - tpot_bound,
        kv_overflow: 0.0,
        wasted_prefill: 0.0,
    }
}

/// Marks a placement that overflows the replica's KV room (`overflow`, a share of its
/// capacity, [`kv_room::overflow`]) as missing its TTFT objective, and makes it later by
/// that share: the TTFT forecast does not see the wait for KV (see [`kv_room`]).
pub fn judge_kv_room(e: &mut Eval, overflow: f64) {
    if overflow > 0.0 {
        e.kv_overflow = overflow;
        e.ttft_ok = false;
        e.tier = 2 - e.ttft_ok as u8 - e.tpot_ok as u8;
        e.lateness += overflow;
    }
}

/// Most of a prompt's prefill (share of its tokens) a try of a cold replica may repeat
/// that the best-cached replica would not.
pub const COLD_TRY_MAX_WASTE: f64 = 0.25;

/// Whether a candidate whose TTFT model is not warm is ranked as feasible anyway, so
/// that it gets the placements its model learns from: it is idle, and the try repeats
/// little prefill (`wasted`: share of the prompt cached on the best replica, not here).
pub fn cold_try_ok(ttft_state: ModelState, requests: f64, wasted: f64) -> bool {
    ttft_state != ModelState::Warm && requests == 0.0 && wasted <= COLD_TRY_MAX_WASTE
}

/// P(y > slo) under the forecast's lognormal, widened so that its upper quantile is the
/// effective bound the tier was judged by (`bound ≥ upper`: the calibrated bound, or the
/// point forecast plus the recent absolute error, whichever is larger).
///
/// Why: a replica whose recent labels run far above its forecasts (a model that misses
/// a queue, as the fast real-vLLM server did when every request went to it: forecasts
/// 0.4 s, labels 1-4 s) fails the tier test through its recent error, but its violation
/// probability from the un-widened spread stayed the lowest of the fleet, so the
/// least-bad choice kept sending it everything. With the spread stretched to the bound,
/// σ' = σ·ln(bound/median)/ln(upper/median), the probability agrees with the tier.
pub fn tail_within(median: f64, sigma: f64, upper: f64, bound: f64, slo: f64) -> f64 {
    if let Some(p) = saturated_tail(median, sigma, upper, bound, slo) {
        return p;
    }
    // The bound is the calibrated one (the usual case): nothing to widen, and two
    // logarithms per target spared (a third of `evaluate`). Exact: equal ratios have
    // equal logarithms, which the test below would find not greater.
    if bound == upper {
        return lognormal_tail(median, sigma, slo);
    }
    // upper/median is its band's constant up to rounding (memoised, exact); the bound's
    // ratio follows the forecast.
    let (lu, lb) = (memo::ln(upper / median), (bound / median).ln());
    let sigma = if lb > lu && lu > 0.0 && lu.is_finite() && lb.is_finite() {
        sigma * lb / lu
    } else {
        sigma
    };
    lognormal_tail(median, sigma, slo)
}

/// [`tail_within`]'s value where bounds on its logarithms, without computing them,
/// show that the tail is saturated (|z| past [`TAIL_SATURATES`]: exactly 0 or 1 there);
/// None where they do not (it is then computed).
///
/// Why: a comfortable objective is the usual case (most of a decision's tails are 0),
/// and its two logarithms and their chain of divisions were a tenth of a decision at
/// 1,024 candidates. Exact: the bounds hold for the real logarithms, with slack for
/// rounding, and the test is passed only with a relative margin of 1e-9, a million
/// times the rounding of the computation it replaces.
#[inline]
fn saturated_tail(median: f64, sigma: f64, upper: f64, bound: f64, slo: f64) -> Option<f64> {
    if !(slo.is_finite() && slo > 0.0 && sigma.is_finite() && sigma > 0.0) {
        return None;
    }
    // σ′ = σ·w: w = 1 without widening, else at most max(ln(bound/median), lu)/lu.
    // Both sides are multiplied by lu instead of divided (`lu` is 1 when not widened).
    let (lu, widest) = if bound == upper {
        (1.0, 1.0)
    } else {
        let lu = memo::ln(upper / median);
        if !(lu.is_finite() && lu > 0.0) {
            (1.0, 1.0)
        } else if lu < 1e-6 {
            // Too near 1 for the slack below to be small against it.
            return None;
        } else {
            (lu, ln_bounds(bound / median)?.1.max(lu))
        }
    };
    let bar = TAIL_SATURATES * sigma * widest * (1.0 + 1e-9);
    let (lo, hi) = ln_bounds(slo / median)?;
    if lo * lu > bar {
        Some(0.0)
    } else if -hi * lu > bar {
        Some(1.0)
    } else {
        None
    }
}

/// Lower and upper bounds on `ln x` for a positive normal `x`, without a logarithm:
/// `x = 2^e·(1 + t)`, `t ∈ [0, 1)`, and the alternating series of `ln(1 + t)` stopped
/// after a negative term (a lower bound) or a positive one (an upper bound); slack for
/// the rounding of these few operations (≤ 1e-15·(1 + |e|)).
#[inline(always)]
fn ln_bounds(x: f64) -> Option<(f64, f64)> {
    if !(x.is_normal() && x > 0.0) {
        return None;
    }
    let bits = x.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let t = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52)) - 1.0;
    let whole = e as f64 * std::f64::consts::LN_2;
    let slack = 1e-12 * (1.0 + e.unsigned_abs() as f64);
    let t2 = t * t;
    let hi = t - t2 * 0.5 + t2 * t * (1.0 / 3.0);
    let lo = hi - t2 * t2 * 0.25;
    Some((whole + lo - slack, whole + hi + slack))
}

/// Prefills shorter than this cost running requests less than a step's noise: the
/// interference guard skips them (and their second prediction).
const INTERFERENCE_MIN_TOKENS: u32 = 256;

/// How much more likely a running request is to miss its TPOT objective `slo_ms` when
/// every one of its remaining tokens takes `added_ms` longer. Running requests' TPOT
/// is taken to follow this candidate's TPOT forecast (same batch, same engine).
pub fn collateral_violations(p: &Prediction, added_ms: f64, slo_ms: f64) -> f64 {
    if added_ms <= 0.0 || !added_ms.is_finite() {
        return 0.0;
    }
    let (m, s) = (p.tpot_median_ms, p.tpot_log_sigma);
    let after = lognormal_tail(m + added_ms, s, slo_ms);
    if after == 0.0 {
        // Far inside the objective even when slowed (the usual case): nothing to add.
        return 0.0;
    }
    (after - lognormal_tail(m, s, slo_ms)).max(0.0)
}

/// Best-first order over evaluations: tier; within the tier that fits, violation
/// probability then cost; within a tier that misses, lateness.
pub fn order(evals: &[Eval], rng: &mut dyn rand::RngCore) -> Vec<usize> {
    order_top(evals, rng, usize::MAX)
}

/// As [`order`], with only the first `top` in order ([`rank::by_cost_top`]).
pub fn order_top(evals: &[Eval], rng: &mut dyn rand::RngCore, top: usize) -> Vec<usize> {
    let keys: Vec<f64> = evals.iter().map(order_key).collect();
    rank::by_cost_top(&keys, rng, top)
}

/// An evaluation's place in [`order`] (ascending).
#[inline]
pub fn order_key(e: &Eval) -> f64 {
    let within = if e.tier == 0 {
        e.p_violate + e.cost * 1e-3
    } else {
        e.lateness
    };
    e.tier as f64 * TIER_SPACING + within.min(TIER_SPACING / 2.0)
}

/// Keys of different tiers never overlap (violation probability with collateral is at
/// most 10; lateness is capped at half of this).
const TIER_SPACING: f64 = 1e6;

/// What orders candidates within one tier, and how near to the best is equal: the
/// violation probability (`near`, absolute) where the tier fits; where it does not,
/// the lateness alone (`cost_tolerance`, relative), then the cost for both.
///
/// Why lateness when nothing fits: every candidate's violation probability is then
/// near 1, and what separated them was the collateral of running requests. On the
/// real-vLLM pair at 1.8 req/s (2026-12-02, a slower machine) the least-bad choice went
/// by it to a slow server forecast at 7.8 s over a fast one at 3.9 s, split 75/75, and
/// the slow server's TTFT median reached 29 s: requests that would miss anyway were
/// piled where the queue never drained. The effective bound, not the point forecast:
/// a forecast with large recent errors is judged by them (see [`tail_within`]).
pub fn within_tier_key(e: &Eval) -> f64 {
    if e.tier == 0 { e.p_violate } else { e.lateness }
}

/// Whether a placement's cost makes it an equal of the cheapest: within
/// `cost_tolerance` of it, relative; `extra` widens it (hysteresis for the previous
/// pick). One rule for the replica pick and the P/D pair pick.
///
/// Relative, not absolute: an absolute slack (costs within a share of an objective are
/// equal, so that requests with seconds of slack go by load rather than to the
/// replica a few milliseconds faster) was tried and removed — on the real-vLLM pair it
/// collapsed once in three seeds at each of 0.1 and 0.3 and led on none, and in the
/// 16-node mesh it left the load less even, not more
/// (`bench/results/real-vllm/2026-12-05` §8, `chaos/README.md`).
pub fn cost_near(cost: f64, cheapest: f64, cfg: &SloConfig, extra: f64) -> bool {
    cost <= cheapest * (1.0 + cfg.cost_tolerance + extra) + 1e-9
}

/// Whether `e`'s [`within_tier_key`] is an equal of the tier's best: within
/// `near_equal` (absolute) where the tier fits, within `cost_tolerance` (relative)
/// where it misses; `extra` widens either (hysteresis for the previous pick).
pub fn near_best(e: &Eval, best: f64, cfg: &SloConfig, extra: f64) -> bool {
    let key = within_tier_key(e);
    if e.tier == 0 {
        key <= best + cfg.near_equal + extra
    } else {
        key <= best * (1.0 + cfg.cost_tolerance + extra) + 1e-9
    }
}

/// Among near-equal placements, the fewer in-flight requests (this node's and its
/// peers') of two drawn at random; the first drawn on a tie. Two choices, not the least
/// loaded of all: nodes whose views of their peers lag by a gossip period would all
/// send the same instant's requests to the one least-loaded replica, while a uniform
/// draw leaves the spread to chance (16 meshed nodes on 4 replicas: 8–12% imbalance
/// against a single node's 3–6%). On equal counts, the one this node has sent fewer
/// prompt tokens lately (the ledger's decayed dispatch rate, which sees this node's own
/// placements at once): in-flight counts are small integers that tie often, and a tie
/// drawn at random leaves each node's own spread to chance, while this one evens it, so
/// the sum over nodes is even too. The first drawn on a full tie. `near` must not be
/// empty.
fn two_choices(near: &[usize], cands: &[Candidate<'_>], ctx: &mut DecideCtx<'_>) -> usize {
    let n = near.len();
    let a = near[ctx.rng.random_range(0..n)];
    if n == 1 {
        return a;
    }
    // The second draw skips the first: two distinct candidates.
    let j = ctx.rng.random_range(0..n - 1);
    let b = near[if near[j] == a { n - 1 } else { j }];
    let (la, lb) = (cands[a].load(), cands[b].load());
    let lighter = lb.requests < la.requests
        || (lb.requests == la.requests && lb.prefill_inflow_tps < la.prefill_inflow_tps);
    if lighter { b } else { a }
}

pub struct SloPolicy {
    predictor: Arc<SharedPredictor>,
    cfg: SloConfig,
    /// This node's previous pick (replica id + 1; 0 = none), for hysteresis.
    last: AtomicU32,
    /// That pick's candidate index in its decision: where it is looked for first.
    last_index: AtomicUsize,
    /// The tightest TTFT objective decided lately, for slack packing.
    tightest: pack::Tightest,
}

impl SloPolicy {
    pub fn new(predictor: Arc<SharedPredictor>, cfg: SloConfig) -> Self {
        Self {
            predictor,
            cfg,
            last: AtomicU32::new(0),
            last_index: AtomicUsize::new(0),
            tightest: pack::Tightest::default(),
        }
    }

    /// Chooses among the `allowed` candidates of `tier` (`Some(0)`: those that fit;
    /// `None`: every one that misses, ranked by lateness alone), randomised among
    /// near-equals.
    fn pick(
        &self,
        cands: &[Candidate<'_>],
        evals: &[Eval],
        tier: Option<u8>,
        allowed: &dyn Fn(usize) -> bool,
        ctx: &mut DecideCtx<'_>,
    ) -> Option<usize> {
        let feasible: Vec<usize> = (0..evals.len())
            .filter(|&i| tier.map_or(evals[i].tier > 0, |t| evals[i].tier == t) && allowed(i))
            .collect();
        if feasible.is_empty() {
            return None;
        }
        if tier == Some(0) && ctx.rng.random::<f64>() < self.cfg.explore {
            // Not one that repeats the prefill of a prefix another candidate holds: such
            // a try costs every request behind it and teaches the model the least (the
            // real-vLLM suite's repeat of a cached 2,000-token prompt went to the other
            // server, forecast 35 ms there against 13 ms at home).
            let learnable: Vec<usize> = feasible
                .iter()
                .copied()
                .filter(|&i| evals[i].wasted_prefill <= COLD_TRY_MAX_WASTE)
                .collect();
            if !learnable.is_empty() {
                return Some(learnable[ctx.rng.random_range(0..learnable.len())]);
            }
        }
        let best = feasible
            .iter()
            .map(|&i| within_tier_key(&evals[i]))
            .fold(f64::INFINITY, f64::min);
        // The previous pick's candidate, if it is one (ids are unique): found once, not
        // by a virtual call per feasible candidate in each filter below.
        // Tried first at the index it had in the last decision (the fleet's order rarely
        // changes), so the scan of virtual calls runs only when it moved.
        let last = self.last.load(Relaxed);
        let is_last = |i: usize| cands[i].replica.id() + 1 == last;
        let hint = self.last_index.load(Relaxed);
        let prev = if last == 0 {
            None
        } else if feasible.binary_search(&hint).is_ok() && is_last(hint) {
            Some(hint)
        } else {
            feasible.iter().copied().find(|&i| is_last(i))
        };
        let band: Vec<usize> = feasible
            .into_iter()
            .filter(|&i| {
                let extra = if Some(i) == prev {
                    self.cfg.hysteresis
                } else {
                    0.0
                };
                near_best(&evals[i], best, &self.cfg, extra)
            })
            .collect();
        // Within the band, the cheapest placement (least predicted latency relative to
        // the objectives: fast hardware, prefix hits) wins, random among near-equals.
        let cheapest = band
            .iter()
            .map(|&i| evals[i].cost)
            .fold(f64::INFINITY, f64::min);
        let near: Vec<usize> = band
            .into_iter()
            .filter(|&i| {
                let extra = if Some(i) == prev {
                    self.cfg.hysteresis
                } else {
                    0.0
                };
                cost_near(evals[i].cost, cheapest, &self.cfg, extra)
            })
            .collect();
        if near.is_empty() {
            return None;
        }
        Some(two_choices(&near, cands, ctx))
    }
}

impl SloPolicy {
    /// How candidate `c` with observation `obs`, forecast `p` (engine-side) and load
    /// `load` fares against the request's objectives, its round trip `rtt` (remote only)
    /// taken from the TTFT objective; `best_cached` is the most any candidate holds of
    /// the prompt, and `held_ttft_ms` the TTFT forecast here had that much been cached
    /// (`Some` where `c` holds less and the miss is priced).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn judge(
        &self,
        snap: &Snapshot,
        req: &RequestProfile,
        c: &Candidate<'_>,
        obs: &Observation,
        p: &Prediction,
        load: &Load,
        rtt: Option<f64>,
        best_cached: u32,
        held_ttft_ms: Option<f64>,
    ) -> Eval {
        // The engine must answer within the objective less the round trip.
        let ttft_slo = (req.slo.ttft_ms - rtt.unwrap_or(0.0)).max(1e-6);
        let mut e = evaluate(p, ttft_slo, req.slo.tpot_ms, load.min_tpot_slo_ms);
        // This prefill stretches the steps of every request decoding there: the
        // expected objectives it would break count against the placement.
        let uncached_tokens = req.prompt_tokens.saturating_sub(c.cached_tokens);
        if self.cfg.interference_guard
            && load.decoding_requests >= 1.0
            && uncached_tokens >= INTERFERENCE_MIN_TOKENS
        {
            let mut alone = *obs;
            alone.queued_prefill_tokens = 0.0;
            alone.queued_requests = 0.0;
            alone.queued_attention_pairs = 0.0;
            let prefill_ms = snap.predict_ttft_ms(features::key(c), &alone);
            let remaining = (load.decode_remaining_tokens / load.decoding_requests).max(8.0);
            let slo = load.min_tpot_slo_ms.unwrap_or(req.slo.tpot_ms);
            let collateral =
                collateral_violations(p, prefill_ms / remaining, slo) * load.decoding_requests;
            e.p_violate = (e.p_violate + collateral).min(10.0);
            if collateral >= 0.5 {
                e.tpot_ok = false;
                e.tier = 2 - e.ttft_ok as u8 - e.tpot_ok as u8;
            }
        }
        // Prefill work this placement repeats that the best-cached one would not: a
        // replica holding the prefix costs less for everyone, not only for this request.
        // Priced in time, as this replica's own TTFT model prices those tokens (its
        // forecast less the forecast with the best-cached prefix held here), relative to
        // the TTFT objective: a 256-token system prompt missed on a fast server costs
        // what recomputing it there takes, not a share of the prompt. As a share (0.5 ×
        // 0.57 for a 450-token chat prompt) it outweighed a 2-3× faster server, and on the
        // real pair the tenants segregated by where their prefixes first landed.
        // Relative to the best, so equal caches add nothing.
        let wasted =
            best_cached.saturating_sub(c.cached_tokens) as f64 / req.prompt_tokens.max(1) as f64;
        if let Some(held_ms) = held_ttft_ms {
            let repeat_ms = (p.ttft_ms - held_ms).max(0.0);
            let w = self.cfg.cache_weight * repeat_ms / ttft_slo;
            e.cost += w;
            e.lateness += w;
        }
        e.wasted_prefill = wasted;
        // A cold replica with nothing on it is safe to try: that is how it warms. Not
        // with a request whose prefix another replica holds: the try would repeat that
        // prefill on unknown hardware (a 2,000-token repeat sent to the slow real-vLLM
        // server at 4× the cached TTFT).
        if cold_try_ok(p.ttft_state, load.requests, wasted) {
            e.tier = 0;
            e.p_violate = e.p_violate.min(0.1);
        }
        if self.cfg.kv_room {
            judge_kv_room(&mut e, kv_room::overflow(req, c, load));
        }
        e
    }

    /// Slack packing ([`pack`]): for a loose request, the usual pick among the roomy
    /// `allowed` candidates on the slowest hardware; `None` when none is roomy.
    #[allow(clippy::too_many_arguments)]
    fn pack(
        &self,
        snap: &Snapshot,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        evals: &[Eval],
        best_cached: u32,
        allowed: &dyn Fn(usize) -> bool,
        ctx: &mut DecideCtx<'_>,
    ) -> Option<usize> {
        let roomy = pack::roomy(evals, req.slo.ttft_ms, self.cfg.pack_share, allowed);
        if self.cfg.pack_by == pack::PackBy::Load {
            let mut keep = vec![false; cands.len()];
            for &i in &roomy {
                keep[i] = true;
            }
            if roomy.is_empty() {
                return None;
            }
            return match region::decide_within(&TokenLoad, req, cands, ctx, &|i| keep[i]).choice {
                Choice::Route(order) => order.first().copied(),
                _ => None,
            };
        }
        let idle_ms: Vec<f64> = roomy
            .iter()
            .map(|&i| {
                let c = &cands[i];
                snap.predict_ttft_ms(
                    features::key(c),
                    &features::idle_observation(req, c, best_cached),
                )
            })
            .collect();
        let mut keep = vec![false; cands.len()];
        for i in pack::slowest(&roomy, &idle_ms, self.cfg.cost_tolerance) {
            keep[i] = true;
        }
        self.pick(cands, evals, Some(0), &|i| keep[i], ctx)
    }

    /// An idle, long-unused candidate predicted to meet both objectives (see
    /// `probe_idle_s`); the longest unused first. Not one that would repeat more than
    /// [`COLD_TRY_MAX_WASTE`] of the prompt's prefill that the best-cached replica holds:
    /// a probe is for learning, and a request whose prefix lives elsewhere is the worst
    /// one to learn with (the real-vLLM suite's repeats of a 2,000-token prompt went to
    /// the idle slow server, forecast 63 ms there against 22 ms at home).
    fn probe(
        &self,
        cands: &[Candidate<'_>],
        evals: &[Eval],
        allowed: &dyn Fn(usize) -> bool,
        now_s: f64,
    ) -> Option<usize> {
        if self.cfg.probe_idle_s <= 0.0 {
            return None;
        }
        (0..cands.len())
            // `load().requests` without summing the rest of the load.
            .filter(|&i| {
                let c = &cands[i];
                evals[i].tier == 0
                    && allowed(i)
                    && c.own.requests + c.peers.requests == 0.0
                    && evals[i].wasted_prefill <= COLD_TRY_MAX_WASTE
            })
            .map(|i| (i, now_s - cands[i].replica.ledger().last_booked_s()))
            .filter(|&(_, idle)| idle >= self.cfg.probe_idle_s)
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i)
    }
}

impl Policy for SloPolicy {
    fn name(&self) -> &'static str {
        "slo"
    }

    fn regional(&self) -> bool {
        true
    }

    fn shortlist(&self) -> Option<super::shortlist::Shortlist> {
        (self.cfg.shortlist > 0).then(|| super::shortlist::Shortlist {
            size: self.cfg.shortlist,
            keep: self.last.load(Relaxed).checked_sub(1),
        })
    }

    fn decide(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision {
        let snap = self.predictor.load();
        let loose = self.cfg.pack_share > 0.0
            && pack::loose(
                req.slo.ttft_ms,
                self.tightest.observe(req.slo.ttft_ms, ctx.now_s),
                self.cfg.pack_ratio,
            );
        // One pass per candidate: its round trip, the engine-side forecast and its
        // evaluation, with the candidate's load summed once for both. Evaluating before
        // the warmth test below wastes the evaluations only when the home region is
        // cold (then the decision goes by load); a second pass over the rows and the
        // forecasts was ≈ 15% of a warm decision at 1,024 candidates. Loads and
        // observations are not kept per candidate: at 1,024 candidates each such table
        // is 100-150 kB, and their copies and page faults cost more than the sums.
        let best_cached = cands.iter().map(|c| c.cached_tokens).max().unwrap_or(0);
        let mut rtts: Vec<Option<f64>> = Vec::with_capacity(cands.len());
        let mut preds: Vec<Prediction> = Vec::with_capacity(cands.len());
        let mut evals: Vec<Eval> = Vec::with_capacity(cands.len());
        // The ranking's keys ([`order_top`]) too, while each evaluation is at hand.
        let mut keys: Vec<f64> = Vec::with_capacity(cands.len());
        for c in cands {
            let load = c.load();
            let rtt = c.replica.remote_rtt_ms();
            let obs = features::observation_with(req, c, &load);
            // A miss is priced by the forecast with the best-cached prefix held here,
            // made in the same pass as this one ([`Snapshot::predict_with_cached`]).
            let (p, held_ms) = if best_cached > c.cached_tokens && self.cfg.cache_weight > 0.0 {
                let held = best_cached.min(req.prompt_tokens) as f64;
                let (p, h) = snap.predict_with_cached(features::key(c), &obs, held);
                (p, Some(h))
            } else {
                (snap.predict(features::key(c), &obs), None)
            };
            let e = self.judge(&snap, req, c, &obs, &p, &load, rtt, best_cached, held_ms);
            keys.push(order_key(&e));
            evals.push(e);
            preds.push(p);
            rtts.push(rtt);
        }
        // TTFT decides placement when nothing fits well; a cold TPOT model only widens
        // its own bound (its labels are scarcer and noisier), so warmth is TTFT's. It is
        // the home region's: remote classes this node rarely places on stay cold under
        // its own gate, and counting them would pin it to load-routing at home forever.
        let local = |i: usize| rtts[i].is_none();
        let rtt = |i: usize| rtts[i].unwrap_or(0.0);
        let any_local = rtts.iter().any(Option::is_none);
        let home = |i: usize| local(i) || !any_local;
        let pool = (0..cands.len()).filter(|&i| home(i)).count();
        let warm = (0..cands.len())
            .filter(|&i| home(i) && preds[i].ttft_state == ModelState::Warm)
            .count();
        // What the client would see through each round trip (0 in region): the
        // predictions the decision reports. In place, once the engine-side ones are used.
        // Only remote ones change (a zero shift is the identity): no copy of the others.
        let to_seen = |preds: &mut Vec<Prediction>| {
            for (p, r) in preds.iter_mut().zip(&rtts) {
                if let Some(r) = *r {
                    *p = region::with_rtt(*p, r);
                }
            }
        };
        if req.fallback == Fallback::Reject
            && let Some(no) = standing_queue(req, cands, self.cfg.shed_queue_age)
        {
            to_seen(&mut preds);
            return Decision {
                choice: Choice::Reject(no),
                predictions: preds,
                evals,
                fallback: Some(STANDING_QUEUE),
            };
        }
        if (warm as f64) < self.cfg.min_warm_fraction * pool as f64 {
            // Home is cold: by load among the home candidates and any remote one whose
            // warm forecast meets both objectives with its round trip (else a cold
            // home region would never learn that it should hand work away).
            let remote_fit = |i: usize| {
                !home(i)
                    && preds[i].ttft_state == ModelState::Warm
                    && evaluate(
                        &preds[i],
                        (req.slo.ttft_ms - rtt(i)).max(1e-6),
                        req.slo.tpot_ms,
                        cands[i].load().min_tpot_slo_ms,
                    )
                    .tier
                        == 0
            };
            let keep: Vec<bool> = (0..cands.len()).map(|i| home(i) || remote_fit(i)).collect();
            // With `kv_room`, by load among those with room when any has it; the rest
            // follow as retry targets.
            let mut first = keep.clone();
            if self.cfg.kv_room {
                let room: Vec<bool> = (0..cands.len())
                    .map(|i| keep[i] && kv_room::overflow(req, &cands[i], &cands[i].load()) == 0.0)
                    .collect();
                if room.contains(&true) {
                    first = room;
                }
            }
            let mut d = region::decide_within(&TokenLoad, req, cands, ctx, &|i| first[i]);
            if let Choice::Route(order) = &mut d.choice {
                order.extend((0..cands.len()).filter(|&i| keep[i] && !first[i]));
            }
            to_seen(&mut preds);
            d.predictions = preds;
            d.fallback = Some(COLD_MODEL);
            return d;
        }
        to_seen(&mut preds);
        let mut ranked = rank::by_cost_top(&keys, ctx.rng, ctx.top);
        // Local first: out of region only when no local candidate meets both objectives
        // and a remote one, its round trip included, does; least-bad stays local.
        let away = |i: usize| !local(i);
        let probe = self.probe(cands, &evals, &home, ctx.now_s);
        let mut fit = probe
            .or_else(|| {
                loose
                    .then(|| self.pack(&snap, req, cands, &evals, best_cached, &home, ctx))
                    .flatten()
            })
            .or_else(|| self.pick(cands, &evals, Some(0), &home, ctx))
            .or_else(|| self.pick(cands, &evals, Some(0), &away, ctx));
        // Slack: with every replica it fits on busy, a request that can wait does, so
        // that the tight requests behind it find the engines' queues short.
        if let Some(c) = fit.filter(|_| probe.is_none())
            && holds(&evals[c], &cands[c].load(), req.slo.ttft_ms, self.cfg.hold)
        {
            let free = |i: usize| home(i) == home(c) && !busy(&cands[i].load());
            fit = self.pick(cands, &evals, Some(0), &free, ctx);
            if fit.is_none() {
                ranked.retain(|&i| i != c);
                ranked.insert(0, c);
                return Decision {
                    choice: Choice::Defer {
                        retry_after_s: self.cfg.defer_poll_ms as f64 / 1e3,
                        reason: format!(
                            "held: every replica that fits has a queue, and TTFT bound {:.0} ms leaves slack against {:.0} ms",
                            req.slo.ttft_ms - evals[c].ttft_headroom_ms,
                            req.slo.ttft_ms
                        ),
                        fallback_order: ranked,
                    },
                    predictions: preds,
                    evals,
                    fallback: Some(HOLD),
                };
            }
        }
        match fit {
            Some(choice) => {
                ranked.retain(|&i| i != choice);
                ranked.insert(0, choice);
                self.last.store(cands[choice].replica.id() + 1, Relaxed);
                self.last_index.store(choice, Relaxed);
                Decision {
                    choice: Choice::Route(ranked),
                    predictions: preds,
                    evals,
                    fallback: None,
                }
            }
            None => {
                let b = ranked[0];
                // Formatted only for a refusal or a deferral: a least-bad route (the
                // default) carries no reason, and overload is when this runs most.
                let reason = || {
                    format!(
                        "no replica can meet TTFT ≤ {:.0} ms and TPOT ≤ {:.0} ms; best is {} (TTFT bound {:.0} ms, TPOT bound {:.0} ms)",
                        req.slo.ttft_ms,
                        req.slo.tpot_ms,
                        cands[b].replica.name(),
                        preds[b].ttft_upper_ms,
                        preds[b].tpot_upper_ms,
                    )
                };
                // Least bad: with `kv_room`, a replica with room before one without;
                // then the lateness over every tier. Missing one objective or both is a
                // miss either way, and a tier is only as good as its bounds: on the
                // real-vLLM pair (2026-12-04, 2.4 req/s, `kv_room` on) the idle slow
                // server's TPOT bound was 3.3× its point (71 ms against 60), so its
                // "both missed" ranked below "TTFT missed" on the fast one with 14
                // running, 7 queued and its KV cache 89% over: 102 least-bad placements
                // went there, 71 missed.
                let mut in_pool = vec![false; evals.len()];
                for i in least_bad_pool(&evals, &home) {
                    in_pool[i] = true;
                }
                if let Some(c) = self.pick(cands, &evals, None, &|i| in_pool[i], ctx) {
                    ranked.retain(|&i| i != c);
                    ranked.insert(0, c);
                }
                let best_chance = (0..evals.len())
                    .filter(|&i| home(i))
                    .map(|i| evals[i].p_violate)
                    .fold(1.0, f64::min);
                let choice = match req.fallback {
                    Fallback::LeastBad => Choice::Route(ranked),
                    Fallback::Reject if best_chance < self.cfg.reject_above => {
                        Choice::Route(ranked)
                    }
                    Fallback::Reject => Choice::Reject(NoFit::new(
                        reason(),
                        retry_after_s(&preds[b], req.slo.ttft_ms),
                    )),
                    Fallback::Defer => Choice::Defer {
                        retry_after_s: self.cfg.defer_poll_ms as f64 / 1e3,
                        reason: reason(),
                        fallback_order: ranked,
                    },
                };
                Decision {
                    choice,
                    predictions: preds,
                    evals,
                    fallback: Some(NO_FIT),
                }
            }
        }
    }
}

/// The candidates the least-bad choice ranks by lateness when nothing fits: the
/// `allowed` ones with KV room, or all `allowed` ones when none has room.
pub fn least_bad_pool(evals: &[Eval], allowed: &dyn Fn(usize) -> bool) -> Vec<usize> {
    let ok: Vec<usize> = (0..evals.len()).filter(|&i| allowed(i)).collect();
    let room: Vec<usize> = ok
        .iter()
        .copied()
        .filter(|&i| evals[i].kv_overflow == 0.0)
        .collect();
    if room.is_empty() { ok } else { room }
}

/// Seconds until the best candidate could meet the request's TTFT objective: the
/// excess of its TTFT bound over the objective is queue that must drain first
/// (`NoFit::new` clamps it to 1–60 s).
pub fn retry_after_s(best: &Prediction, ttft_objective_ms: f64) -> f64 {
    let bound = best
        .ttft_upper_ms
        .max(best.ttft_ms + best.ttft_recent_abs_err_ms);
    (bound - ttft_objective_ms).max(0.0) / 1e3
}

/// Label of a decision that holds a request with slack at the router.
pub const HOLD: &str = "hold";

/// The fallback label of a decision made by load while the home region's TTFT model
/// is cold (`min_warm_fraction`).
pub const COLD_MODEL: &str = "cold-model";

/// The fallback label of a decision where no candidate fits both objectives.
pub const NO_FIT: &str = "no-fit";

/// Fallback label of a refusal by [`standing_queue`].
pub const STANDING_QUEUE: &str = "standing-queue";

/// A refusal when every candidate has a standing queue: its oldest stream placed by
/// this node has waited `age_factor` × the request's TTFT objective or longer without a
/// first token (`Load::queue_age_s`; `None` with `age_factor` 0 or any candidate short
/// of it). Engines serve their queues first come, first served, so a request placed
/// now waits behind every one of those; in a queue that has stood that long the wait of
/// the next one is about the wait of the oldest (the sojourn signal of CoDel), so a
/// tight request would miss, and taking it deepens the queue for everyone after. It
/// reads what the router measured, not a forecast: a backlog is when the TTFT model is
/// least right (its labels arrive a backlog late) and gated cold. `Retry-After` is the
/// youngest such queue's excess over the objective (at least 1 s, [`NoFit::new`]).
pub fn standing_queue(
    req: &RequestProfile,
    cands: &[Candidate<'_>],
    age_factor: f64,
) -> Option<NoFit> {
    if age_factor <= 0.0 || cands.is_empty() {
        return None;
    }
    let objective_s = req.slo.ttft_ms / 1e3;
    let youngest = cands
        .iter()
        .map(|c| c.load().queue_age_s)
        .fold(f64::INFINITY, f64::min);
    (youngest >= age_factor * objective_s).then(|| {
        NoFit::new(
            format!(
                "every replica has a standing queue: the youngest's oldest stream has waited {:.0} ms for its first token, against a TTFT objective of {:.0} ms",
                youngest * 1e3,
                req.slo.ttft_ms
            ),
            youngest - objective_s,
        )
    })
}

/// Whether a replica has streamed requests queued for prefill (dispatched, no token
/// yet). Streams only: a non-streamed request shows no first token, so it would count
/// as queued for its whole life and hold loose requests to their deadline.
pub fn busy(load: &Load) -> bool {
    load.queued_streams >= 1.0
}

/// Whether a fitting placement leaves the request slack enough to wait: its TTFT bound
/// is at most `share` of the objective. With the lifecycle's deadline (at most
/// `defer_budget` of the objective spent waiting) a held request is still forecast to
/// meet its objective when `share + defer_budget ≤ 1`.
///
/// Why: vLLM serves its waiting queue first come, first served, so a request with
/// seconds of slack dispatched to a replica with a queue lengthens the wait of every
/// tight request that arrives after it. On the real pair with mixed objectives every
/// miss was a 500 ms request (the 5 s ones met at any placement, 2026-12-04 §6):
/// waiting at the router, the loose requests enter an engine only when its queue has
/// drained, and the tight ones find it short.
pub fn holds(e: &Eval, load: &Load, ttft_slo_ms: f64, share: f64) -> bool {
    share > 0.0 && e.tier == 0 && busy(load) && e.ttft_headroom_ms >= (1.0 - share) * ttft_slo_ms
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn pred(ttft: f64, tpot: f64) -> Prediction {
        // A tight, calibrated prediction: bound 10% above the point forecast.
        Prediction {
            ttft_ms: ttft,
            ttft_upper_ms: ttft * 1.1,
            tpot_ms: tpot,
            tpot_upper_ms: tpot * 1.1,
            state: ModelState::Warm,
            ttft_state: ModelState::Warm,
            tpot_state: ModelState::Warm,
            ttft_median_ms: ttft,
            ttft_log_sigma: 0.1f64.ln_1p() / 1.2816,
            tpot_median_ms: tpot,
            tpot_log_sigma: 0.1f64.ln_1p() / 1.2816,
            ..Prediction::default()
        }
    }

    /// `tail_within` as it was before its saturation shortcut: the reference the
    /// shortcut must agree with bit for bit.
    fn tail_within_computed(median: f64, sigma: f64, upper: f64, bound: f64, slo: f64) -> f64 {
        if bound == upper {
            return lognormal_tail(median, sigma, slo);
        }
        let (lu, lb) = ((upper / median).ln(), (bound / median).ln());
        let sigma = if lb > lu && lu > 0.0 && lu.is_finite() && lb.is_finite() {
            sigma * lb / lu
        } else {
            sigma
        };
        lognormal_tail(median, sigma, slo)
    }

    /// Random forecasts (log-uniform over many decades, near-saturated ones on purpose)
    /// and edge values: the shortcut gives the computed tail's exact bits.
    #[test]
    fn the_saturation_shortcut_is_the_computed_tail() {
        use rand::Rng;
        let mut g = rand::rngs::SmallRng::seed_from_u64(11);
        let mut shortcuts = 0usize;
        let log_uniform = |g: &mut rand::rngs::SmallRng, lo: f64, hi: f64| {
            (g.random::<f64>() * (hi.ln() - lo.ln()) + lo.ln()).exp()
        };
        for round in 0..400_000 {
            let median = log_uniform(&mut g, 1e-3, 1e5);
            let sigma = log_uniform(&mut g, 1e-4, 3.0);
            let upper = median * log_uniform(&mut g, 0.5, 20.0);
            let bound = match round % 3 {
                0 => upper,
                1 => upper * log_uniform(&mut g, 1.0, 50.0),
                _ => upper * log_uniform(&mut g, 0.2, 1.0),
            };
            let slo = if round % 5 == 0 {
                // |z| near the saturation point, where the shortcut must step aside.
                let w = if bound > upper {
                    (bound / median).ln() / (upper / median).ln()
                } else {
                    1.0
                };
                let sign = if round % 2 == 0 { 1.0 } else { -1.0 };
                median
                    * (sign
                        * TAIL_SATURATES
                        * sigma
                        * w.max(1.0)
                        * (1.0 + (g.random::<f64>() - 0.5) * 1e-8))
                        .exp()
            } else {
                median * log_uniform(&mut g, 1e-4, 1e4)
            };
            let (a, b) = (
                tail_within(median, sigma, upper, bound, slo),
                tail_within_computed(median, sigma, upper, bound, slo),
            );
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{median} {sigma} {upper} {bound} {slo}"
            );
            shortcuts += saturated_tail(median, sigma, upper, bound, slo).is_some() as usize;
        }
        assert!(shortcuts > 100_000, "the shortcut is taken: {shortcuts}");
        let odd = [
            0.0,
            -1.0,
            1e-310,
            f64::MIN_POSITIVE,
            1.0,
            f64::INFINITY,
            f64::NAN,
            1e300,
        ];
        for m in odd {
            for s in odd {
                for u in odd {
                    for b in odd {
                        for o in odd {
                            let (a, c) = (
                                tail_within(m, s, u, b, o),
                                tail_within_computed(m, s, u, b, o),
                            );
                            assert!(
                                a.to_bits() == c.to_bits() || (a.is_nan() && c.is_nan()),
                                "{m} {s} {u} {b} {o}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_cold_replica_is_tried_only_where_no_prefix_is_thrown_away() {
        assert!(
            cold_try_ok(ModelState::Cold, 0.0, 0.0),
            "nothing cached anywhere"
        );
        assert!(
            cold_try_ok(ModelState::Stale, 0.0, 0.2),
            "a little repeated"
        );
        assert!(
            !cold_try_ok(ModelState::Cold, 0.0, 0.97),
            "a long prefix held elsewhere"
        );
        assert!(!cold_try_ok(ModelState::Cold, 1.0, 0.0), "busy");
        assert!(
            !cold_try_ok(ModelState::Warm, 0.0, 0.0),
            "warm: ranked as predicted"
        );
    }

    /// Among near-equals the busier of two never wins, peers' in-flight requests
    /// counted, and the rest still share the traffic (no herding onto one).
    #[test]
    fn two_choices_avoids_the_busy_and_spreads_over_the_rest() {
        use crate::policy::peers::testkit;
        let rs = testkit::replicas(4);
        let mut cands: Vec<Candidate<'_>> = rs
            .iter()
            .map(|r| testkit::cand(r, 0, testkit::requests(0.0)))
            .collect();
        // Replica 2 is busy through a peer node's placements, not this node's.
        cands[2].peers = testkit::requests(4.0);
        let near = [0, 1, 2, 3];
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut ctx = DecideCtx {
            now_s: 0.0,
            rng: &mut rng,
            top: usize::MAX,
        };
        let mut picks = [0u32; 4];
        for _ in 0..3_000 {
            picks[two_choices(&near, &cands, &mut ctx)] += 1;
        }
        // The busy one is picked only when drawn twice, which the draw excludes.
        assert_eq!(picks[2], 0, "{picks:?}");
        for i in [0, 1, 3] {
            assert!((800..1_200).contains(&picks[i]), "{picks:?}");
        }
        assert_eq!(two_choices(&[3], &cands, &mut ctx), 3);
    }

    /// On equal in-flight counts the replica this node has sent less to lately wins,
    /// whichever is drawn first.
    #[test]
    fn two_choices_breaks_a_tie_toward_the_replica_sent_less_lately() {
        use crate::policy::peers::testkit;
        let rs = testkit::replicas(2);
        let mut cands: Vec<Candidate<'_>> = rs
            .iter()
            .map(|r| testkit::cand(r, 0, testkit::requests(1.0)))
            .collect();
        let mut recent = testkit::requests(0.0);
        recent.prefill_inflow_tps = 500.0;
        cands[0].peers = recent;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let mut ctx = DecideCtx {
            now_s: 0.0,
            rng: &mut rng,
            top: usize::MAX,
        };
        for _ in 0..200 {
            assert_eq!(two_choices(&[0, 1], &cands, &mut ctx), 1);
        }
    }

    /// The design's worked example: objectives 800/50; A 500/65, B 650/35, C 900/25 → B.
    #[test]
    fn worked_example_picks_b() {
        let evals: Vec<Eval> = [pred(500.0, 65.0), pred(650.0, 35.0), pred(900.0, 25.0)]
            .iter()
            .map(|p| evaluate(p, 800.0, 50.0, None))
            .collect();
        assert_eq!(
            evals.iter().map(|e| e.tier).collect::<Vec<_>>(),
            vec![1, 0, 1]
        );
        assert!(!evals[0].tpot_ok && evals[0].ttft_ok);
        assert!(!evals[2].ttft_ok && evals[2].tpot_ok);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        for _ in 0..20 {
            assert_eq!(order(&evals, &mut rng)[0], 1);
        }
    }

    /// A forecast whose recent errors are large is riskier, and the least-bad choice sees
    /// it: the fast replica forecast at 400 ms with 2 s recent errors is more likely to
    /// miss 1.5 s than the slow one forecast at 600 ms with 100 ms errors.
    #[test]
    fn recent_errors_raise_the_violation_probability() {
        let mut fast = pred(400.0, 10.0);
        fast.ttft_recent_abs_err_ms = 2000.0;
        let mut slow = pred(600.0, 20.0);
        slow.ttft_recent_abs_err_ms = 100.0;
        let (ef, es) = (
            evaluate(&fast, 1500.0, 60.0, None),
            evaluate(&slow, 1500.0, 60.0, None),
        );
        assert!(!ef.ttft_ok && es.ttft_ok);
        assert!(
            ef.p_violate > es.p_violate + 0.1,
            "fast {:.3} vs slow {:.3}",
            ef.p_violate,
            es.p_violate
        );
        // Without recent errors the spread is the calibrated one.
        fast.ttft_recent_abs_err_ms = 0.0;
        let (pt, _) = fast.violation_probability(1500.0, 60.0);
        let e = evaluate(&fast, 1500.0, 60.0, None);
        assert!(
            (e.p_violate - (1.0 - (1.0 - pt) * (1.0 - fast.violation_probability(1500.0, 60.0).1)))
                .abs()
                < 1e-12
        );
    }

    /// 150 ms of predicted headroom is not safe when recent errors exceed 200 ms.
    #[test]
    fn recent_error_guards_thin_headroom() {
        let mut p = pred(650.0, 30.0);
        p.ttft_upper_ms = 700.0;
        let e = evaluate(&p, 800.0, 50.0, None);
        assert!(e.ttft_ok && e.tier == 0, "with small recent errors it fits");
        p.ttft_recent_abs_err_ms = 220.0;
        let e = evaluate(&p, 800.0, 50.0, None);
        assert!(!e.ttft_ok, "650 + 220 > 800: not safe");
        assert_eq!(e.tier, 1);
        assert!(e.ttft_headroom_ms < 0.0);
    }

    /// A placement may not push running requests past their own TPOT objectives.
    #[test]
    fn running_requests_tpot_guard() {
        let p = pred(100.0, 40.0);
        assert!(evaluate(&p, 800.0, 100.0, None).tpot_ok);
        let e = evaluate(&p, 800.0, 100.0, Some(30.0));
        assert!(!e.tpot_ok, "a request running there needs ≤ 30 ms");
    }

    /// A refusal says when to come back: the queue the best replica must drain first.
    #[test]
    fn a_refusal_says_when_the_best_replica_could_fit() {
        // TTFT bound 5.5 s against a 1.5 s objective: 4 s of queue to drain.
        let no = NoFit::new(String::new(), retry_after_s(&pred(5000.0, 20.0), 1500.0));
        assert_eq!(no.retry_after_secs(), 4);
        // Only TPOT is missed: nothing to drain on the TTFT side, the minimum.
        let no = NoFit::new(String::new(), retry_after_s(&pred(100.0, 500.0), 1500.0));
        assert_eq!(no.retry_after_secs(), 1);
        // A hopeless queue is capped; a NaN forecast says the minimum.
        let no = NoFit::new(String::new(), retry_after_s(&pred(1e7, 20.0), 1500.0));
        assert_eq!(no.retry_after_secs(), 60);
        assert_eq!(NoFit::new(String::new(), f64::NAN).retry_after_secs(), 1);
    }

    /// When nothing fits, the request goes where it lands least far past its
    /// objectives, not where the collateral of running requests happens to be lowest
    /// (every own violation probability is ~1 there): a fast replica forecast at 3.9 s
    /// beats a slow one at 7.8 s against a 1.5 s objective.
    #[test]
    fn least_bad_goes_by_lateness_not_saturated_violation_probability() {
        let mut evals: Vec<Eval> = [pred(3900.0, 33.0), pred(7800.0, 58.0)]
            .iter()
            .map(|p| evaluate(p, 1500.0, 60.0, None))
            .collect();
        assert!(evals.iter().all(|e| e.tier > 0 && e.p_violate > 0.99));
        // The fast replica's running requests would lose 0.6 of a TPOT objective to it:
        // the interference guard adds that and marks its TPOT missed (tier 2 for both).
        evals[0].p_violate += 0.6;
        evals[0].tpot_ok = false;
        evals[0].tier = 2;
        assert_eq!(evals[1].tier, 2);
        assert!(evals[1].p_violate < evals[0].p_violate);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        for _ in 0..20 {
            assert_eq!(order(&evals, &mut rng)[0], 0);
        }
        assert!(evals[0].lateness < evals[1].lateness);
    }

    /// A placement that would overflow its replica's KV cache misses its TTFT objective
    /// whatever the forecast says, and ranks below one with room; with room nothing
    /// changes.
    #[test]
    fn a_placement_over_the_kv_room_is_judged_late() {
        let mut evals: Vec<Eval> = [pred(100.0, 9.0), pred(150.0, 18.0)]
            .iter()
            .map(|p| evaluate(p, 1500.0, 60.0, None))
            .collect();
        let before = evals[1];
        judge_kv_room(&mut evals[1], 0.0);
        assert_eq!(evals[1], before, "room: unchanged");
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        assert_eq!(order(&evals, &mut rng)[0], 0, "the faster, cheaper one");
        judge_kv_room(&mut evals[0], 0.12);
        assert!(!evals[0].ttft_ok && evals[0].tpot_ok);
        assert_eq!(evals[0].tier, 1);
        assert!((evals[0].kv_overflow - 0.12).abs() < 1e-12);
        for _ in 0..20 {
            assert_eq!(order(&evals, &mut rng)[0], 1);
        }
        // Both over: the one less far over is less late.
        judge_kv_room(&mut evals[1], 0.5);
        assert!(evals[0].lateness < evals[1].lateness);
    }

    /// While the model is cold the fallback ranks by outstanding tokens among the
    /// replicas with KV room: the one with fewer tokens to go but a full cache (the
    /// slow real-vLLM server's misses of 2026-12-03, KV 93-98% full) is passed over and
    /// kept as a retry target.
    #[test]
    fn the_cold_fallback_prefers_a_replica_with_kv_room() {
        use crate::{ledger::Load, policy::peers::testkit};
        use headroom_predictor::Snapshot;
        let rs = testkit::replicas(2);
        let full = Load {
            requests: 10.0,
            decoding_requests: 10.0,
            decode_context_tokens: 8_000.0,
            decode_remaining_tokens: 100.0,
            ..Load::default()
        };
        let roomy = Load {
            requests: 4.0,
            decoding_requests: 4.0,
            decode_context_tokens: 1_000.0,
            decode_remaining_tokens: 3_000.0,
            ..Load::default()
        };
        let mut cands = vec![
            testkit::cand(&rs[0], 0, full),
            testkit::cand(&rs[1], 0, roomy),
        ];
        for c in &mut cands {
            c.kv_capacity_tokens = Some(8_192);
        }
        let req = RequestProfile {
            max_tokens: Some(200),
            expected_output_tokens: 200,
            ..testkit::req(500)
        };
        let decide = |kv_room: bool| {
            let p = SloPolicy::new(
                Arc::new(SharedPredictor::new(Snapshot::empty())),
                SloConfig {
                    kv_room,
                    ..SloConfig::default()
                },
            );
            let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
            let mut ctx = DecideCtx {
                now_s: 0.0,
                rng: &mut rng,
                top: usize::MAX,
            };
            let d = p.decide(&req, &cands, &mut ctx);
            assert_eq!(d.fallback, Some("cold-model"));
            match d.choice {
                Choice::Route(o) => o,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            decide(true),
            vec![1, 0],
            "room first, the full one a retry target"
        );
        assert_eq!(decide(false), vec![0, 1], "token load alone: the full one");
    }

    /// A tenant that refuses rather than serves late is refused once every replica's
    /// oldest waiting stream has waited the shed's multiple of its TTFT objective, cold
    /// model or not; a tenant that takes least-bad is routed, a looser objective is
    /// admitted, and one replica without a standing queue is enough to admit.
    #[test]
    fn standing_queues_refuse_what_would_wait_behind_them() {
        use crate::{ledger::Load, policy::peers::testkit};
        use headroom_predictor::Snapshot;
        let rs = testkit::replicas(2);
        let aged = |s: f64| Load {
            requests: 6.0,
            queued_requests: 3.0,
            queued_streams: 3.0,
            queue_age_s: s,
            ..Load::default()
        };
        let p = SloPolicy::new(
            Arc::new(SharedPredictor::new(Snapshot::empty())),
            SloConfig::default(),
        );
        let decide = |ages: [f64; 2], ttft_ms: f64, fallback: Fallback| {
            let cands: Vec<Candidate<'_>> = rs
                .iter()
                .zip(ages)
                .map(|(r, a)| testkit::cand(r, 0, aged(a)))
                .collect();
            let mut req = testkit::req(400);
            req.slo.ttft_ms = ttft_ms;
            req.fallback = fallback;
            let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
            let mut ctx = DecideCtx {
                now_s: 0.0,
                rng: &mut rng,
                top: usize::MAX,
            };
            p.decide(&req, &cands, &mut ctx)
        };
        let d = decide([0.9, 0.7], 500.0, Fallback::Reject);
        assert_eq!(d.fallback, Some(STANDING_QUEUE));
        match d.choice {
            Choice::Reject(no) => assert!(no.reason.contains("700 ms"), "{}", no.reason),
            other => panic!("{other:?}"),
        }
        for (ages, ttft, fb) in [
            ([0.9, 0.4], 500.0, Fallback::Reject),
            ([0.9, 0.7], 5000.0, Fallback::Reject),
            ([0.9, 0.7], 500.0, Fallback::LeastBad),
        ] {
            let d = decide(ages, ttft, fb);
            assert!(
                matches!(d.choice, Choice::Route(_)),
                "{ages:?} {ttft} {fb:?}"
            );
            assert_eq!(d.fallback, Some("cold-model"));
        }
        let off = SloPolicy::new(
            Arc::new(SharedPredictor::new(Snapshot::empty())),
            SloConfig {
                shed_queue_age: 0.0,
                ..SloConfig::default()
            },
        );
        let cands: Vec<Candidate<'_>> = rs.iter().map(|r| testkit::cand(r, 0, aged(9.0))).collect();
        let mut req = testkit::req(400);
        req.fallback = Fallback::Reject;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut ctx = DecideCtx {
            now_s: 0.0,
            rng: &mut rng,
            top: usize::MAX,
        };
        assert!(
            matches!(off.decide(&req, &cands, &mut ctx).choice, Choice::Route(_)),
            "off by default"
        );
    }

    /// A tenant that rejects is refused only when even the best placement would
    /// likely miss: an objective between the forecast and its bound (no candidate
    /// fits, most would still be on time) goes least-bad; one under the forecast is
    /// refused; `reject_above` = 0 refuses whatever does not fit.
    #[test]
    fn reject_refuses_what_would_likely_miss_not_what_misses_its_bound() {
        use crate::policy::peers::testkit;
        let rs = testkit::replicas(2);
        let queued = Load {
            requests: 2.0,
            queued_requests: 1.0,
            queued_streams: 1.0,
            queued_prefill_tokens: 10_000.0,
            ..Load::default()
        };
        let predictor = warm_with_noise(&rs, 0.3);
        let cands = [
            testkit::cand(&rs[0], 0, queued),
            testkit::cand(&rs[1], 0, queued),
        ];
        let decide = |reject_above: f64, ttft_ms: f64| {
            let cfg = SloConfig {
                reject_above,
                ..SloConfig::default()
            };
            decide_warm(
                &predictor,
                cfg,
                &req_1000(ttft_ms, Fallback::Reject),
                &cands,
            )
        };
        let probe = decide(0.5, 60_000.0);
        assert_eq!(probe.fallback, None, "{probe:?}");
        let point = probe.predictions[0].ttft_ms;
        let bound = probe.predictions[0].ttft_upper_ms;
        assert!(
            bound > point * 1.05,
            "a bound above the point: {point} {bound}"
        );
        let between = (point + bound) / 2.0;
        let d = decide(0.5, between);
        assert_eq!(d.fallback, Some("no-fit"));
        assert!(
            matches!(d.choice, Choice::Route(_)),
            "likely on time: {d:?}"
        );
        assert!(matches!(decide(0.0, between).choice, Choice::Reject(_)));
        assert!(matches!(decide(0.5, point * 0.5).choice, Choice::Reject(_)));
    }

    /// A 1,000-token request with objectives TTFT `ttft_ms` and TPOT 200 ms.
    fn req_1000(ttft_ms: f64, fallback: Fallback) -> RequestProfile {
        RequestProfile {
            prompt_tokens: 1000,
            slo: super::super::Slo {
                ttft_ms,
                tpot_ms: 200.0,
            },
            fallback,
            ..crate::policy::peers::testkit::req(1000)
        }
    }

    /// `cfg`'s decision for `req` over `cands` at 80 s, just after [`warm`]'s labels,
    /// without exploration.
    fn decide_warm(
        predictor: &Arc<SharedPredictor>,
        cfg: SloConfig,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
    ) -> Decision {
        let p = SloPolicy::new(
            predictor.clone(),
            SloConfig {
                explore: 0.0,
                ..cfg
            },
        );
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mut ctx = DecideCtx {
            now_s: 80.0,
            rng: &mut rng,
            top: usize::MAX,
        };
        p.decide(req, cands, &mut ctx)
    }

    /// A predictor whose TTFT and TPOT models are warm for `rs`: TTFT 30 ms plus 0.03 ms
    /// per queued prefill token, TPOT 12 ms.
    fn warm(rs: &[crate::view::PlainReplica]) -> Arc<SharedPredictor> {
        warm_with_noise(rs, 0.0)
    }

    /// As [`warm`], each TTFT label off by up to ±`noise` (a share, alternating).
    fn warm_with_noise(rs: &[crate::view::PlainReplica], noise: f64) -> Arc<SharedPredictor> {
        warm_on(rs, |round, _| {
            let q = (round % 7) as f64 * 2000.0;
            let obs = headroom_predictor::Observation {
                prompt_tokens: 1000.0,
                queued_prefill_tokens: q,
                max_batched_tokens: 8192.0,
                ..Default::default()
            };
            let ttft = (30.0 + q * 0.03) * (1.0 + noise * ((round % 5) as f64 / 2.0 - 1.0));
            (obs, ttft)
        })
    }

    /// A predictor warm for `rs` whose TTFT is prefill alone: 2 ms plus 0.1 ms per
    /// uncached prompt token, times `slow[i]` on replica `i`; TPOT 12 ms everywhere.
    fn prefill_warm(rs: &[crate::view::PlainReplica], slow: &[f64]) -> Arc<SharedPredictor> {
        warm_on(rs, |round, i| {
            let prompt = 100.0 + (round % 9) as f64 * 250.0;
            let cached = ((round % 4) as f64 * 0.25 * prompt / 64.0).floor() * 64.0;
            let obs = headroom_predictor::Observation {
                prompt_tokens: prompt,
                cached_tokens: cached,
                max_batched_tokens: 8192.0,
                ..Default::default()
            };
            (obs, slow[i] * (2.0 + 0.1 * (prompt - cached)))
        })
    }

    /// The snapshot after 80 rounds of labels, one per replica per round: `label(round,
    /// replica index)` gives the observation and its TTFT; TPOT is 12 ms throughout.
    fn warm_on(
        rs: &[crate::view::PlainReplica],
        label: impl Fn(u32, usize) -> (headroom_predictor::Observation, f64),
    ) -> Arc<SharedPredictor> {
        use headroom_predictor::{Learner, PredictorConfig, Sample};
        let mut l = Learner::new(PredictorConfig::default());
        for round in 0..80u32 {
            for (i, r) in rs.iter().enumerate() {
                let (obs, ttft) = label(round, i);
                l.observe(&Sample {
                    key: r.key,
                    obs,
                    at_s: f64::from(round),
                    ttft_ms: Some(ttft),
                    tpot_ms: Some(12.0),
                    output_tokens: 100,
                    censored: false,
                    predicted: None,
                });
            }
        }
        l.tick(80.0);
        Arc::new(SharedPredictor::new(l.snapshot(80.0)))
    }

    /// A shortlist that finds no fit is not the last word: the decision is made again
    /// over every eligible replica, so a tenant that prefers refusal is refused only
    /// when nothing in the fleet fits. Five idle replicas 20× slower than a sixth, busy
    /// one: the shortlist of two keeps two slow ones, and the fast one still fits.
    #[test]
    fn a_shortlist_without_a_fit_decides_again_over_every_replica() {
        use crate::{
            decide::{RouteInputs, Verdict, route},
            ledger::BookingSpec,
            policy::{
                candidates::{CandidateParams, build_shortlisted},
                peers::testkit,
                shortlist::Shortlist,
            },
            prefix::PrefixIndex,
            view::{ModelEntry, ServedModels},
        };
        let mut rs = testkit::replicas(6);
        for r in &mut rs {
            r.routable = true;
            r.models = ServedModels {
                models: vec![ModelEntry {
                    id: "m".into(),
                    parent: None,
                    max_model_len: Some(32_768),
                }],
                known: true,
            };
        }
        // 1,000 uncached tokens: ≈ 2 s on replicas 0-4, ≈ 100 ms on 5.
        let predictor = prefill_warm(&rs, &[20.0, 20.0, 20.0, 20.0, 20.0, 1.0]);
        let _busy = rs[5].ledger.book(
            BookingSpec {
                prompt_tokens: 300,
                cached_tokens: 0,
                expected_output_tokens: 50,
                tpot_slo_ms: None,
                expected_ttft_s: None,
                stream: true,
            },
            79.9,
        );
        let params = CandidateParams {
            block_tokens: 16,
            stale_after_s: 1.0,
        };
        let req = req_1000(500.0, Fallback::Reject);
        let prefix = PrefixIndex::new(64);
        let short = Shortlist {
            size: 2,
            keep: None,
        };
        let (kept, eligible) = build_shortlisted(
            &req,
            &rs,
            &prefix,
            params,
            80.0,
            short,
            &mut rand::rngs::SmallRng::seed_from_u64(1),
        )
        .unwrap();
        assert_eq!(eligible, 6);
        assert!(
            kept.iter().all(|c| c.index != 5),
            "the loaded fast replica is not shortlisted"
        );
        let policy = SloPolicy::new(
            predictor.clone(),
            SloConfig {
                explore: 0.0,
                probe_idle_s: 0.0,
                shortlist: 2,
                ..SloConfig::default()
            },
        );
        let inputs = RouteInputs {
            policy: &policy,
            predictor: &predictor,
            prefix: &prefix,
            replicas: &rs,
            params,
            max_targets: 3,
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let routed = route(&inputs, &req, 80.0, &mut rng).unwrap();
        assert!(matches!(routed.verdict, Verdict::Go), "{routed:?}");
        assert_eq!(routed.targets[0].index, 5);
        assert_eq!(routed.fallback, None);
    }

    /// A prefix miss costs what recomputing it takes there, relative to the TTFT
    /// objective: a chat prompt whose 256-token system prompt sits on a 5× slower
    /// replica goes to the fast one, which recomputes it in ≈ 26 ms (as a share of the
    /// prompt, 0.5 × 256/450, the miss outweighed the speed and the tenants segregated
    /// by where prefixes first landed); a long prompt held on the slow one goes home.
    #[test]
    fn a_prefix_miss_costs_the_time_it_takes_to_recompute_it() {
        use crate::policy::peers::testkit;
        let rs = testkit::replicas(2);
        let predictor = prefill_warm(&rs, &[1.0, 5.0]);
        let chat = |prompt: u32| RequestProfile {
            slo: super::super::Slo {
                ttft_ms: 500.0,
                tpot_ms: 30.0,
            },
            ..testkit::req(prompt)
        };
        let first = |prompt: u32, cached_on_slow: u32| {
            let cands = [
                testkit::cand(&rs[0], 0, Load::default()),
                testkit::cand(&rs[1], cached_on_slow, Load::default()),
            ];
            // No idle probes: both replicas are idle and unused, and a probe is not a
            // ranking.
            let cfg = SloConfig {
                probe_idle_s: 0.0,
                ..SloConfig::default()
            };
            let d = decide_warm(&predictor, cfg, &chat(prompt), &cands);
            assert_eq!(d.fallback, None, "{d:?}");
            match d.choice {
                Choice::Route(o) => o[0],
                c => panic!("{c:?}"),
            }
        };
        assert_eq!(
            first(450, 256),
            0,
            "the fast replica recomputes the system prompt"
        );
        assert_eq!(
            first(2_000, 1_984),
            1,
            "a long prompt held on the slow one goes home"
        );
        assert_eq!(first(450, 0), 0, "nothing held anywhere: the fast one");
    }

    /// With packing on, a request with seconds of slack goes to the slower replica while
    /// its bound there is within the share, once a tight request has been seen, and the
    /// tight ones keep the fast replica; before any tight request, or with packing off,
    /// every request goes to the fast one.
    #[test]
    fn a_loose_request_leaves_the_fast_replica_to_the_tight_ones() {
        use crate::policy::peers::testkit;
        let rs = testkit::replicas(2);
        // 2 + 0.1 ms per uncached token; the second replica 5× slower.
        let predictor = prefill_warm(&rs, &[1.0, 5.0]);
        let request = |ttft_ms: f64, prompt: u32| RequestProfile {
            slo: super::super::Slo {
                ttft_ms,
                tpot_ms: 100.0,
            },
            ..testkit::req(prompt)
        };
        let cands = [
            testkit::cand(&rs[0], 0, Load::default()),
            testkit::cand(&rs[1], 0, Load::default()),
        ];
        let policy = |pack_share: f64| {
            SloPolicy::new(
                predictor.clone(),
                SloConfig {
                    explore: 0.0,
                    probe_idle_s: 0.0,
                    pack_share,
                    ..SloConfig::default()
                },
            )
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mut first = |p: &SloPolicy, req: &RequestProfile, now_s: f64| {
            let mut ctx = DecideCtx {
                now_s,
                rng: &mut rng,
                top: usize::MAX,
            };
            let d = p.decide(req, &cands, &mut ctx);
            assert_eq!(d.fallback, None, "{d:?}");
            match d.choice {
                Choice::Route(o) => o[0],
                c => panic!("{c:?}"),
            }
        };
        let packed = policy(0.5);
        assert_eq!(
            first(&packed, &request(5_000.0, 1_000), 1.0),
            0,
            "nothing tight seen"
        );
        assert_eq!(
            first(&packed, &request(500.0, 450), 2.0),
            0,
            "tight: the fast one"
        );
        // Forecast ≈ 510 ms on the slow one, its bound well within half of 5 s.
        assert_eq!(
            first(&packed, &request(5_000.0, 1_000), 3.0),
            1,
            "loose: the slow one"
        );
        // One the slow one would serve past half its objective stays on the fast one:
        // 8,000 tokens there ≈ 4 s.
        assert_eq!(first(&packed, &request(5_000.0, 8_000), 4.0), 0);
        // Not loose beside 500 ms at the default ratio of 4.
        assert_eq!(first(&packed, &request(1_500.0, 1_000), 5.0), 0);
        let unpacked = policy(0.0);
        assert_eq!(first(&unpacked, &request(500.0, 450), 2.0), 0);
        assert_eq!(first(&unpacked, &request(5_000.0, 1_000), 3.0), 0);
    }

    /// With `pack_by = "load"`, a loose request takes the roomy replica with the fewer
    /// outstanding tokens, fast or slow, where the slowest-hardware rule takes the slow
    /// one whatever its load; a tight request still goes by its forecast.
    #[test]
    fn packing_by_load_takes_the_fewer_outstanding_tokens() {
        use crate::policy::peers::testkit;
        let rs = testkit::replicas(2);
        // 2 + 0.1 ms per uncached token; the second replica 5× slower.
        let predictor = prefill_warm(&rs, &[1.0, 5.0]);
        let request = |ttft_ms: f64| RequestProfile {
            slo: super::super::Slo {
                ttft_ms,
                tpot_ms: 100.0,
            },
            ..testkit::req(1_000)
        };
        let remaining = |t: f64| Load {
            decode_remaining_tokens: t,
            ..Load::default()
        };
        let policy = |pack_by| {
            SloPolicy::new(
                predictor.clone(),
                SloConfig {
                    explore: 0.0,
                    probe_idle_s: 0.0,
                    pack_share: 0.5,
                    pack_by,
                    ..SloConfig::default()
                },
            )
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut first = |p: &SloPolicy, req: &RequestProfile, cands: &[Candidate<'_>], now_s| {
            let mut ctx = DecideCtx {
                now_s,
                rng: &mut rng,
                top: usize::MAX,
            };
            match p.decide(req, cands, &mut ctx).choice {
                Choice::Route(o) => o[0],
                c => panic!("{c:?}"),
            }
        };
        let slow_busier = [
            testkit::cand(&rs[0], 0, remaining(1_000.0)),
            testkit::cand(&rs[1], 0, remaining(3_000.0)),
        ];
        let fast_busier = [
            testkit::cand(&rs[0], 0, remaining(3_000.0)),
            testkit::cand(&rs[1], 0, remaining(1_000.0)),
        ];
        let (by_load, slowest) = (policy(pack::PackBy::Load), policy(pack::PackBy::Slowest));
        for p in [&by_load, &slowest] {
            // A tight request first, so that 5 s is loose beside it; it goes by forecast.
            assert_eq!(first(p, &request(500.0), &fast_busier, 1.0), 0);
        }
        assert_eq!(first(&by_load, &request(5_000.0), &slow_busier, 2.0), 0);
        assert_eq!(first(&by_load, &request(5_000.0), &fast_busier, 3.0), 1);
        assert_eq!(first(&slowest, &request(5_000.0), &slow_busier, 2.0), 1);
        assert_eq!(first(&slowest, &request(5_000.0), &fast_busier, 3.0), 1);
    }

    /// With `hold` on, a request with seconds of slack waits at the router while every
    /// replica it fits on has a queue, goes to one without a queue when there is one, and
    /// a tight request is placed at once whatever the queues.
    #[test]
    fn a_request_with_slack_waits_for_a_replica_without_a_queue() {
        use crate::policy::peers::testkit;
        let rs = testkit::replicas(2);
        let queued = Load {
            requests: 2.0,
            queued_requests: 1.0,
            queued_streams: 1.0,
            queued_prefill_tokens: 1000.0,
            ..Load::default()
        };
        let predictor = warm(&rs);
        let decide = |hold: f64, ttft_ms: f64, loads: [Load; 2]| {
            let cands = [
                testkit::cand(&rs[0], 0, loads[0]),
                testkit::cand(&rs[1], 0, loads[1]),
            ];
            let cfg = SloConfig {
                hold,
                ..SloConfig::default()
            };
            decide_warm(
                &predictor,
                cfg,
                &req_1000(ttft_ms, Fallback::LeastBad),
                &cands,
            )
        };
        let d = decide(0.5, 5_000.0, [queued, queued]);
        assert_eq!(d.fallback, Some(HOLD), "{d:?}");
        assert!(
            matches!(d.choice, Choice::Defer { ref fallback_order, .. } if fallback_order.len() == 2)
        );
        let d = decide(0.5, 5_000.0, [queued, testkit::requests(3.0)]);
        assert_eq!(d.fallback, None);
        assert!(
            matches!(d.choice, Choice::Route(ref o) if o[0] == 1),
            "the replica without a queue: {d:?}"
        );
        // Tight: the TTFT bound is more than half the objective.
        let d = decide(0.5, 100.0, [queued, queued]);
        assert!(matches!(d.choice, Choice::Route(_)), "{d:?}");
        assert_eq!(d.fallback, None);
        // Off: placed at once.
        let d = decide(0.0, 5_000.0, [queued, queued]);
        assert!(matches!(d.choice, Choice::Route(_)), "{d:?}");
    }

    /// A replica nobody has used lately is probed with a request it would serve within
    /// the objectives, though it costs more than the prefix's home, but not with one
    /// that would repeat most of a prefix held elsewhere (the real-vLLM suite's repeats
    /// of a 2,000-token prompt went to the idle slow server that way).
    #[test]
    fn an_idle_replica_is_probed_only_with_what_it_would_not_prefill_again() {
        use crate::{ledger::BookingSpec, policy::peers::testkit};
        let rs = testkit::replicas(2);
        // Replica 0 was used a moment ago, replica 1 never.
        let spec = BookingSpec {
            prompt_tokens: 1000,
            cached_tokens: 0,
            expected_output_tokens: 100,
            tpot_slo_ms: None,
            expected_ttft_s: None,
            stream: true,
        };
        drop(rs[0].ledger.book(spec, 79.9));
        // A model that prices prefill, so that what replica 0 holds makes it cheaper.
        let predictor = prefill_warm(&rs, &[1.0, 1.0]);
        // Tight enough that the 20 ms replica 0 saves is worth having.
        let req = req_1000(300.0, Fallback::LeastBad);
        let first = |cached: u32, probe_idle_s: f64| {
            let cands = [
                testkit::cand(&rs[0], cached, Load::default()),
                testkit::cand(&rs[1], 0, Load::default()),
            ];
            let cfg = SloConfig {
                probe_idle_s,
                ..SloConfig::default()
            };
            match decide_warm(&predictor, cfg, &req, &cands).choice {
                Choice::Route(o) => o[0],
                other => panic!("{other:?}"),
            }
        };
        // A fifth of the prompt cached on replica 0: it is the cheaper placement.
        assert_eq!(first(200, 0.0), 0, "no probes: the cheaper");
        assert_eq!(first(200, 0.5), 1, "the idle replica is probed");
        assert_eq!(first(960, 0.5), 0, "not with a prefix held elsewhere");
    }

    /// Exploration (a uniform pick among the feasible, for unbiased labels) never sends
    /// a request away from a prefix another replica holds: the real-vLLM suite's fourth
    /// repeat of a cached 2,000-token prompt went to the other server that way.
    #[test]
    fn exploration_does_not_repeat_a_prefill_held_elsewhere() {
        use crate::policy::peers::testkit;
        let rs = testkit::replicas(2);
        let predictor = warm(&rs);
        let req = req_1000(5_000.0, Fallback::LeastBad);
        let policy = SloPolicy::new(
            predictor.clone(),
            SloConfig {
                explore: 1.0,
                probe_idle_s: 0.0,
                ..SloConfig::default()
            },
        );
        let picks = |cached: u32| -> [usize; 2] {
            let cands = [
                testkit::cand(&rs[0], cached, Load::default()),
                testkit::cand(&rs[1], 0, Load::default()),
            ];
            let mut n = [0; 2];
            for seed in 0..64 {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
                let mut ctx = DecideCtx {
                    now_s: 80.0,
                    rng: &mut rng,
                    top: usize::MAX,
                };
                match policy.decide(&req, &cands, &mut ctx).choice {
                    Choice::Route(o) => n[o[0]] += 1,
                    other => panic!("{other:?}"),
                }
            }
            n
        };
        assert_eq!(picks(960), [64, 0], "the prefix's home every time");
        let spread = picks(200);
        assert!(spread[1] >= 16, "a fifth cached: explored both {spread:?}");
    }

    /// The TPOT guard (the tightest objective running on a replica) decides whether a
    /// placement fits, not what it costs: a loose request costs the same on a replica
    /// running tight streams as on one that is not, so tenants do not segregate.
    #[test]
    fn the_tpot_guard_judges_fit_and_leaves_the_cost_alone() {
        let p = pred(40.0, 20.0);
        let free = evaluate(&p, 5000.0, 120.0, None);
        let beside_chat = evaluate(&p, 5000.0, 120.0, Some(30.0));
        let past_chat = evaluate(&p, 5000.0, 120.0, Some(20.0));
        assert_eq!(free.cost, beside_chat.cost);
        assert_eq!(free.cost, past_chat.cost);
        assert!(free.tpot_ok && beside_chat.tpot_ok);
        assert!(
            !past_chat.tpot_ok,
            "a bound of 22 ms breaks the running 20 ms streams"
        );
    }

    /// Nothing fits: the least bad is among those with KV room, whatever their tier
    /// (an idle slow replica whose wide TPOT bound says "both missed" against a fast one
    /// whose cache is full), and among all when none has room.
    #[test]
    fn least_bad_is_a_replica_with_kv_room_whatever_its_tier() {
        let mut fast = evaluate(&pred(207.0, 16.7), 1500.0, 60.0, None);
        judge_kv_room(&mut fast, 0.18);
        let mut wide = pred(261.0, 21.7);
        wide.ttft_upper_ms = 2361.0;
        wide.tpot_upper_ms = 70.9;
        let slow = evaluate(&wide, 1500.0, 60.0, None);
        assert_eq!((fast.tier, slow.tier), (1, 2));
        let all = |_: usize| true;
        assert_eq!(least_bad_pool(&[fast, slow], &all), vec![1]);
        let mut slow_full = slow;
        judge_kv_room(&mut slow_full, 0.05);
        assert_eq!(least_bad_pool(&[fast, slow_full], &all), vec![0, 1]);
        assert_eq!(least_bad_pool(&[fast, slow_full], &|i| i == 0), vec![0]);
    }

    #[test]
    fn violation_probability_orders_within_a_tier() {
        let evals: Vec<Eval> = [pred(700.0, 30.0), pred(300.0, 30.0)]
            .iter()
            .map(|p| evaluate(p, 800.0, 50.0, None))
            .collect();
        assert!(evals[1].p_violate < evals[0].p_violate);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        assert_eq!(order(&evals, &mut rng)[0], 1);
    }
}
