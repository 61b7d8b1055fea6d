//! Physically shaped basis functions for TTFT and TPOT, built from an [`Observation`].
//!
//! Both models are linear in these features, so each coefficient has a unit (ms per step,
//! ms per 1k tokens, …) and a generic physical prior. Invariant: inputs are sanitised
//! observations, outputs are finite and non-negative (index 0 is the constant 1).
//!
//! Step-time physics (vLLM v1, chunked prefill; see engine-and-traces.md §2.3):
//! `T_step = T0 + c_req·n + t_tok·N + α·Σctx_decode + β·Σ(c·k + c²/2)`. A request waiting
//! behind `Q` uncached tokens with `u` of its own finishes its prefill after
//! `S = ⌈(Q+u)/(B−n_dec)⌉` steps, after waiting out the step in progress (`r`), so
//! TTFT ≈ θ·[1, S, (Q+u), S·n_dec, S·ctx_dec, pairs, wait, r, kv_deficit].
//!
//! `wait` is the admission wait of a capacity-bound replica, in milliseconds (derivation
//! at [`admission_wait_steps`]): decode steps until enough running requests finish to
//! admit the queue ahead and this request, times the replica's measured decode step
//! ([`ReplicaCtx::step_ms`]). Its coefficient is dimensionless (prior 1): on the real
//! vLLM measurements of `../shared/traces/llmservingsim-vllm-measured` this wait is 95%+
//! of TTFT, and the labels that would teach it arrive one (tens-of-seconds) TTFT late,
//! so the structure has to be right before any label does.
//!
//! `kv_deficit` is the same shortfall by the router's own count, `(ctx_dec + Q + u − C)⁺`
//! in thousands of tokens, capped at `C`, with a prior coefficient of 0: learned from
//! labels, never assumed. The wait reads the engine's scraped usage instead, which counts
//! a shared prefix once where the router counts it per request; but a scrape up to a
//! second old misses the placements made since it, and on the real pair at its knee a
//! queue that has just formed waited 2-3× what the wait term said
//! (`bench/results/real-vllm/2026-12-06` §5-§9). Where the two counts disagree, the
//! labels weigh them. Capped at one cache's worth: past that the wait term's steady
//! admission rate already prices the queue (the RTX 4090 replay, 130k tokens queued
//! past 41k of cache: TTFT MAPE 85% uncapped, 51% capped).

use crate::observation::Observation;

/// Number of TTFT features.
pub const TTFT_DIM: usize = 9;
/// Number of TPOT features.
pub const TPOT_DIM: usize = 6;

/// Names and units of the TTFT features (coefficient units in brackets).
pub const TTFT_FEATURE_NAMES: [&str; TTFT_DIM] = [
    "bias [ms]",
    "prefill_steps S [ms/step]",
    "prefill_tokens (Q+u)/1e3 [ms per 1k tokens]",
    "decode_tokens_in_steps S*n_dec/1e3 [ms per 1k tokens]",
    "decode_kv_reads S*ctx_dec/1e6 [ms per 1M token-reads]",
    "attention_pairs (pairs_q + u*k + u^2/2)/1e6 [ms per 1M pairs]",
    "admission_wait steps*step_ms [ms per ms]",
    "step_residual [ms per ms]",
    "kv_deficit_counted (ctx_dec+Q+u-C)+/1e3 [ms per 1k tokens]",
];

/// Short names of the TTFT features, for a forecast split into its terms
/// ([`crate::Snapshot::ttft_terms`]).
pub const TTFT_TERM_KEYS: [&str; TTFT_DIM] = [
    "bias",
    "prefill_steps",
    "prefill_tokens",
    "decode_tokens",
    "decode_kv_reads",
    "attention_pairs",
    "admission_wait",
    "step_residual",
    "kv_deficit",
];

/// Names and units of the TPOT features.
pub const TPOT_FEATURE_NAMES: [&str; TPOT_DIM] = [
    "bias [ms]",
    "batch min(n_dec+n_queued+1, slot cap) [ms per request]",
    "kv_context min(ctx_dec+Q+prompt, capacity)/1e5 [ms per 100k tokens]",
    "prefill_inflow lambda/1e4 [ms per 10k tok/s]",
    "prefill_inflow_sq (lambda/1e4)^2 [ms]",
    "prefill_backlog (Q+u)/1e4 [ms per 10k tokens]",
];

/// Generic physical prior for TTFT, midway between the H100 and A100 Llama-3-8B constants
/// of engine-and-traces.md §2.3. Used for cold predictions and as the ridge target.
pub const GENERIC_TTFT_THETA: [f64; TTFT_DIM] = [5.0, 8.0, 40.0, 20.0, 65.0, 2.2, 1.0, 1.0, 0.0];
/// Which TTFT coefficients are engine speeds (ms per unit of work) that a speed-ratio
/// prior scales; the last two multiply measured milliseconds and stay at 1.
pub const TTFT_SPEED_SCALED: [bool; TTFT_DIM] =
    [true, true, true, true, true, true, false, false, false];
/// Pseudo-samples anchoring each TTFT coefficient at its prior regardless of excitation
/// (`DecayStats::solve_anchored`): the admission wait's coefficient is ms per measured
/// ms, physically 1, and the first labels that touch it are the odd ones at the edge of
/// the bound regime (the RTX 4090 replay: one label with a 0.2 s wait in a 0.8 s TTFT
/// took it to 0.12 before any label from deep in the queue existed). Ten labels whose
/// TTFT is mostly the wait outweigh it 1:1.
pub const TTFT_ANCHOR: [f64; TTFT_DIM] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0];
/// No TPOT coefficient is anchored.
pub const TPOT_ANCHOR: [f64; TPOT_DIM] = [0.0; TPOT_DIM];
/// TPOT's speed ratio scales its per-step floor only. The first TPOT labels of a class
/// mostly measure that floor (they come from whatever load the class first saw), so a
/// ratio fitted on them says "the floor is higher", not "every load term is"; scaling the
/// load terms by it too extrapolated them (RTX PRO 6000 replay: a 30 ms floor read as
/// 3.4× the generic θ, and TPOT at saturation was forecast at 55 ms against 33 ms).
pub const TPOT_SPEED_SCALED: [bool; TPOT_DIM] = [true, false, false, false, false, false];
/// Decode step time assumed while nothing about the replica was measured (ms): a
/// mid-size batch of an 8B model on one current GPU. Only the admission wait uses it.
pub const DEFAULT_STEP_MS: f64 = 25.0;
/// A replica counts as slot-bound when its decoding requests are within this fraction of
/// the most it was ever seen running (its `max_num_seqs`, which the router need not know).
pub const SLOT_BOUND_FRACTION: f64 = 0.95;
/// Peaks below this many running requests are not evidence of a slot cap.
pub const SLOT_MIN_PEAK: f64 = 8.0;

/// What the predictor has measured about one replica, beyond the observation.
#[derive(Clone, Copy, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ReplicaCtx {
    /// Decode step time (ms): the gap between a stream's tokens, or recent TPOT labels.
    pub step_ms: f64,
    /// The replica's slot cap: the most requests seen decoding on it, once its count is
    /// pinned there (0 = unknown or not pinned).
    pub peak_running: f64,
}

impl Default for ReplicaCtx {
    fn default() -> Self {
        Self {
            step_ms: DEFAULT_STEP_MS,
            peak_running: 0.0,
        }
    }
}
/// Generic physical prior for TPOT (same source).
pub const GENERIC_TPOT_THETA: [f64; TPOT_DIM] = [8.0, 0.02, 6.5, 4.0, 1.0, 0.0];

/// Parameters of the feature map that come from configuration, not from data.
#[derive(Clone, Copy, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct FeatureParams {
    /// Token budget used when an observation has `max_batched_tokens == 0`.
    pub default_max_batched_tokens: f64,
    /// Scraped values older than this are ignored (seconds).
    pub metric_fresh_s: f64,
}

/// Quantities shared by both feature maps.
pub struct Derived {
    /// Decoding requests, floored by fresh scraped `running` minus router-known queued ones
    /// (covers traffic that bypasses this router).
    pub n_dec: f64,
    /// Uncached prefill work ahead of and including this request (tokens).
    pub work: f64,
    /// Own uncached prompt tokens.
    pub u: f64,
    /// KV tokens the engine holds ([`kv_used_tokens`]).
    pub kv_used: f64,
}

/// The derived quantities of a sanitised observation.
#[inline(always)]
pub fn derive(o: &Observation, p: &FeatureParams) -> Derived {
    let fresh = o.metric_age_s <= p.metric_fresh_s;
    let mut n_dec = o.decoding_requests;
    if fresh {
        n_dec = n_dec.max(o.scraped_running - o.queued_requests);
    }
    let u = (o.prompt_tokens - o.cached_tokens).max(0.0);
    Derived {
        n_dec,
        work: o.queued_prefill_tokens + u,
        u,
        kv_used: kv_used_tokens(o, fresh),
    }
}

/// TTFT basis functions for a sanitised observation on a replica nothing was measured
/// about ([`ReplicaCtx::default`]).
#[inline]
pub fn ttft_features(o: &Observation, p: &FeatureParams) -> [f64; TTFT_DIM] {
    ttft_features_on(o, p, &ReplicaCtx::default())
}

/// TTFT basis functions with the replica's measured step time and running peak.
#[inline]
pub fn ttft_features_on(o: &Observation, p: &FeatureParams, r: &ReplicaCtx) -> [f64; TTFT_DIM] {
    ttft_from(o, &derive(o, p), p, r)
}

/// Both feature vectors at once, sharing the derived quantities (the hot path).
#[inline(always)]
pub fn all_features(o: &Observation, p: &FeatureParams) -> ([f64; TTFT_DIM], [f64; TPOT_DIM]) {
    all_features_on(o, p, &ReplicaCtx::default())
}

/// [`all_features`] with what was measured about the replica.
#[inline(always)]
pub fn all_features_on(
    o: &Observation,
    p: &FeatureParams,
    r: &ReplicaCtx,
) -> ([f64; TTFT_DIM], [f64; TPOT_DIM]) {
    let d = derive(o, p);
    (ttft_from(o, &d, p, r), tpot_from(o, &d, r))
}

/// [`all_features_on`] and, sharing the derived quantities, the TTFT features had
/// `cached` of the prompt's tokens been cached instead ([`ttft_features_cached`]).
#[inline(always)]
pub fn all_features_and_cached_on(
    o: &Observation,
    p: &FeatureParams,
    r: &ReplicaCtx,
    cached: f64,
) -> ([f64; TTFT_DIM], [f64; TPOT_DIM], [f64; TTFT_DIM]) {
    let d = derive(o, p);
    let xt = ttft_from(o, &d, p, r);
    let xh = ttft_features_cached(o, &d, &xt, cached, p);
    (xt, tpot_from(o, &d, r), xh)
}

#[inline(always)]
fn ttft_from(o: &Observation, d: &Derived, p: &FeatureParams, r: &ReplicaCtx) -> [f64; TTFT_DIM] {
    let wait_ms = admission_wait_steps(o, d, r) * r.step_ms;
    ttft_from_wait(o, d, o.cached_tokens, p, wait_ms)
}

/// The TTFT features of a sanitised `o` (derived `d`, TTFT features `x`) had `cached`
/// of its prompt's tokens been cached instead of `o.cached_tokens` (at most the
/// prompt): what [`ttft_features_on`] gives for that observation, bit for bit, without
/// the terms the cache does not move (the admission wait reads the prompt, not its
/// uncached part). For pricing a prefix miss: the same forecast with the prefix held.
#[inline(always)]
pub fn ttft_features_cached(
    o: &Observation,
    d: &Derived,
    x: &[f64; TTFT_DIM],
    cached: f64,
    p: &FeatureParams,
) -> [f64; TTFT_DIM] {
    let u = (o.prompt_tokens - cached).max(0.0);
    let held = Derived {
        n_dec: d.n_dec,
        work: o.queued_prefill_tokens + u,
        u,
        kv_used: d.kv_used,
    };
    ttft_from_wait(o, &held, cached, p, x[6])
}

/// [`ttft_from`] with the admission wait (ms) given and `k` tokens cached.
#[inline(always)]
fn ttft_from_wait(
    o: &Observation,
    d: &Derived,
    k: f64,
    p: &FeatureParams,
    wait_ms: f64,
) -> [f64; TTFT_DIM] {
    let budget = if o.max_batched_tokens > 0.0 {
        o.max_batched_tokens
    } else {
        p.default_max_batched_tokens
    };
    // Decodes take one token of the budget each; prefill gets the rest (at least one token).
    let per_step = (budget - d.n_dec).max(1.0);
    let steps = ceil_pos(d.work / per_step).max(1.0);
    let pairs = o.queued_attention_pairs + d.u * k + 0.5 * d.u * d.u;
    [
        1.0,
        steps,
        d.work * 1e-3,
        steps * d.n_dec * 1e-3,
        steps * o.decode_context_tokens * 1e-6,
        pairs * 1e-6,
        wait_ms,
        o.step_residual_ms,
        counted_kv_deficit(o, d) * 1e-3,
    ]
}

/// Decode steps until this request is admitted, when the replica is capacity-bound
/// (KV memory or running slots); 0 otherwise. Units: steps (× `step_ms` gives ms).
///
/// **Completions needed, `m`.**
/// - KV-bound (capacity `C` known): vLLM v1 admits a request once its prompt's blocks
///   fit, so the deficit is `D = used + Q + prompt − C` (`used`: [`kv_used_tokens`]).
///   In steady state a completion frees `p̄ + ō` tokens while the running requests grow
///   by `ō` between completions, so each admits ≈ one prompt: `m = D/p̄`, with
///   `p̄ = (Q + prompt)/(n_queued + 1)`.
/// - Slot-bound (`n_dec ≥ 0.95·cap`, `cap = ReplicaCtx::peak_running`: the most requests
///   seen decoding once the count is held there, the engine's `max_num_seqs` seen rather
///   than configured): every queued request ahead and this one needs a slot,
///   `m = n_queued + 1`.
///
/// **When the m-th completion comes.** The router knows the running requests' context
/// `ctx_dec = Σ(p + g)` and remaining output `Σ(o − g)`; with their prompts ≈ `p̄` the mean
/// generated is `ḡ = ctx_dec/n − p̄` and the mean remaining `R̄ = Σ(o − g)/n`. Ages spread
/// evenly over `[0, 2s]`, `s = min(ḡ, R̄)`, put the remaining lengths evenly over
/// `[R̄ − s, R̄ + s]`, so the m-th of the n running requests finishes after
/// `R̄ − s + 2s·m/n` steps (m ≤ n). A mixed population (`s = R̄`) gives `2R̄·m/n`, the
/// familiar "uniform remaining" drain; a batch admitted together in a burst (`ḡ ≪ R̄`)
/// frees nothing for `R̄ − ḡ` steps — on the measured RTX PRO 6000 run, 128 slots filled
/// within 12 s, the 13th request in the queue waited 7.5 s, not the 2.5 s the uniform
/// drain says. Beyond the first generation (m > n) completions come at the steady rate of
/// queued requests with output `ō` (this request's expectation): every `ō·h/C` steps for
/// KV (`C` full of requests holding `h = p̄ + ō/2` for `ō` steps; on the measured RTX 4090
/// run 18.6 steps, 0.56 s at its 30 ms steps, the admission rate it shows) and every
/// `ō/n` steps for slots. The larger wait of the two bounds applies.
#[inline(always)]
pub fn admission_wait_steps(o: &Observation, d: &Derived, r: &ReplicaCtx) -> f64 {
    let n = d.n_dec;
    if n <= 0.0 {
        return 0.0;
    }
    let p_mean = (o.queued_prefill_tokens + o.prompt_tokens) / (o.queued_requests + 1.0);
    let out = o.expected_output_tokens.max(1.0);
    let r_mean = o.decode_remaining_tokens / n;
    let g_mean = (o.decode_context_tokens / n - p_mean).max(0.0);
    let spread = g_mean.min(r_mean);
    // Steps until the m-th completion, with `per` steps between completions after the
    // first generation.
    // Below one completion the deficit is within the router's error on it (a streamed
    // count is not the engine's block count): the expected wait is m times the first
    // completion's, not all of it (on the RTX 4090 run a 200-token deficit would have
    // said 9 s where the engine admitted at once).
    let completion = |m: f64, per: f64| {
        if m <= 1.0 {
            m * (r_mean - spread + 2.0 * spread / n)
        } else if m <= n {
            r_mean - spread + 2.0 * spread * m / n
        } else {
            r_mean + spread + (m - n) * per
        }
    };
    let mut steps: f64 = 0.0;
    let cap = o.kv_capacity_tokens;
    if cap > 0.0 && p_mean > 0.0 {
        let deficit = d.kv_used + o.queued_prefill_tokens + o.prompt_tokens - cap;
        if deficit > 0.0 {
            let per = out * (p_mean + 0.5 * out) / cap;
            steps = completion(deficit / p_mean, per);
        }
    }
    if r.peak_running >= SLOT_MIN_PEAK && n >= SLOT_BOUND_FRACTION * r.peak_running {
        steps = steps.max(completion(o.queued_requests + 1.0, out / n));
    }
    steps.max(0.0)
}

/// The KV deficit by the router's own count (tokens): `(ctx_dec + Q + u − C)⁺`, at most
/// `C` (module docs); 0 while the capacity is unknown.
#[inline(always)]
fn counted_kv_deficit(o: &Observation, d: &Derived) -> f64 {
    if o.kv_capacity_tokens > 0.0 {
        (o.decode_context_tokens + d.work - o.kv_capacity_tokens).clamp(0.0, o.kv_capacity_tokens)
    } else {
        0.0
    }
}

/// KV tokens the engine holds: its own fresh usage where it reports one, else the
/// router's running context.
///
/// The running context `Σ(p + g)` counts a prefix shared by n running requests n times;
/// the engine holds its blocks once. On the pinned real-vLLM pair (8,192 KV tokens, ten
/// requests sharing a 256-token system prompt) it read 8.4–9.9k tokens against a scraped
/// 7.5–8.2k, so the wait said "full" whenever ten ran: of the labels with a forecast
/// wait of 50–100 steps the median TTFT was 150 ms (`rate32-seed6-slo.jsonl`). From the
/// scrape, the labels with no wait have a median of 82 ms, and the waits rise with it.
#[inline(always)]
fn kv_used_tokens(o: &Observation, fresh: bool) -> f64 {
    if fresh && o.kv_usage > 0.0 {
        o.kv_usage * o.kv_capacity_tokens
    } else {
        o.decode_context_tokens
    }
}

/// Steps between admissions when the replica is capacity-bound (the steady turnover of
/// [`admission_wait_steps`]), `None` when it is not.
#[inline(always)]
fn admission_interval_steps(o: &Observation, d: &Derived, r: &ReplicaCtx) -> Option<f64> {
    let n = d.n_dec;
    if n <= 0.0 || o.queued_requests < 1.0 {
        return None;
    }
    let out = o.expected_output_tokens.max(1.0);
    let mut per: Option<f64> = None;
    let cap = o.kv_capacity_tokens;
    if cap > 0.0 && d.kv_used + o.queued_prefill_tokens + o.prompt_tokens > cap {
        let p_mean = (o.queued_prefill_tokens + o.prompt_tokens) / (o.queued_requests + 1.0);
        per = Some(out * (p_mean + 0.5 * out) / cap);
    }
    if r.peak_running >= SLOT_MIN_PEAK && n >= SLOT_BOUND_FRACTION * r.peak_running {
        let slots = out / n;
        per = Some(per.map_or(slots, |p| p.max(slots)));
    }
    per.filter(|p| *p > 0.0)
}

/// TPOT basis functions for a sanitised observation on a replica nothing was measured
/// about.
#[inline]
pub fn tpot_features(o: &Observation, p: &FeatureParams) -> [f64; TPOT_DIM] {
    tpot_from(o, &derive(o, p), &ReplicaCtx::default())
}

/// TPOT basis functions with what was measured about the replica.
#[inline]
pub fn tpot_features_on(o: &Observation, p: &FeatureParams, r: &ReplicaCtx) -> [f64; TPOT_DIM] {
    tpot_from(o, &derive(o, p), r)
}

/// The batch and the KV context a request will decode with are what the engine can hold:
/// the queue joins the running requests only up to the KV capacity `C` (when known) and
/// the slot cap (when seen). Uncapped, the queue of an overloaded replica — 170k tokens
/// behind 41k of KV in the RTX 4090 replay — read as a batch 5× larger than any the
/// engine runs, and TPOT was forecast at twice its measured 30 ms.
#[inline(always)]
fn tpot_from(o: &Observation, d: &Derived, r: &ReplicaCtx) -> [f64; TPOT_DIM] {
    // A capacity-bound engine prefills only what it admits, one prompt per completion,
    // whatever the router dispatches to its queue (8k tok/s dispatched against ~1.5k
    // admitted in the RTX 4090 replay).
    let mut inflow = o.prefill_inflow_tps;
    if let Some(steps_per_admission) = admission_interval_steps(o, d, r)
        && r.step_ms > 0.0
    {
        let p_mean = (o.queued_prefill_tokens + o.prompt_tokens) / (o.queued_requests + 1.0);
        inflow = inflow.min(p_mean * 1e3 / (steps_per_admission * r.step_ms));
    }
    let lam = inflow * 1e-4;
    let mut batch = d.n_dec + o.queued_requests + 1.0;
    let mut kv = o.decode_context_tokens + o.queued_prefill_tokens + o.prompt_tokens;
    if o.kv_capacity_tokens > 0.0 {
        kv = kv.min(o.kv_capacity_tokens);
    }
    if r.peak_running >= SLOT_MIN_PEAK {
        batch = batch.min(r.peak_running);
        if d.n_dec >= SLOT_BOUND_FRACTION * r.peak_running {
            kv = kv.min(o.decode_context_tokens + o.prompt_tokens);
        }
    }
    [1.0, batch, kv * 1e-5, lam, lam * lam, d.work * 1e-4]
}

/// ⌈x⌉ for 0 ≤ x < 2⁶³ without a libm call (baseline x86-64 has no SSE4.1 `roundsd`).
#[inline(always)]
fn ceil_pos(x: f64) -> f64 {
    let t = x as i64 as f64;
    if t < x { t + 1.0 } else { t }
}

#[inline(always)]
pub(crate) fn dot<const D: usize>(a: &[f64; D], b: &[f64; D]) -> f64 {
    let mut s = 0.0;
    for i in 0..D {
        s += a[i] * b[i];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: FeatureParams = FeatureParams {
        default_max_batched_tokens: 2048.0,
        metric_fresh_s: 5.0,
    };

    #[test]
    fn steps_follow_the_token_budget_left_after_decodes() {
        let o = Observation {
            prompt_tokens: 1000.0,
            queued_prefill_tokens: 3000.0,
            decoding_requests: 48.0,
            max_batched_tokens: 2048.0,
            ..Default::default()
        };
        let x = ttft_features(&o, &P);
        assert_eq!(x[0], 1.0);
        assert_eq!(x[1], 2.0, "4000 tokens at 2000 per step is 2 steps");
        assert!((x[2] - 4.0).abs() < 1e-12);
        assert!((x[3] - 2.0 * 48.0 / 1e3).abs() < 1e-12);
        assert!((x[5] - 0.5 * 1000.0 * 1000.0 / 1e6).abs() < 1e-12);
        assert_eq!(x[6], 0.0, "no capacity known, no drain term");
    }

    #[test]
    fn admission_wait_appears_only_when_the_replica_is_kv_bound() {
        let mut o = Observation {
            prompt_tokens: 4000.0,
            decoding_requests: 10.0,
            decode_context_tokens: 90_000.0,
            decode_remaining_tokens: 2_000.0,
            kv_capacity_tokens: 100_000.0,
            ..Default::default()
        };
        assert_eq!(ttft_features(&o, &P)[6], 0.0);
        o.queued_prefill_tokens = 15_000.0; // 109k > 100k
        o.queued_requests = 4.0;
        let wait = ttft_features(&o, &P)[6];
        // 9k deficit over a mean prompt of 19k/5 = 3.8k: 2.37 completions, within the
        // first generation of 10. The running requests have generated 9k − 3.8k = 5.2k
        // on average, more than the 200 they have left: a mixed population, remaining
        // spread over [0, 400], so the m-th completes after 400·m/10 steps.
        let steps = 400.0 * (9_000.0 / 3_800.0) / 10.0;
        assert!((wait - steps * DEFAULT_STEP_MS).abs() < 1e-9, "{wait}");
        let r = ReplicaCtx {
            step_ms: 40.0,
            peak_running: 0.0,
        };
        let measured = ttft_features_on(&o, &P, &r)[6];
        assert!((measured - steps * 40.0).abs() < 1e-9, "{measured}");
    }

    #[test]
    fn the_counted_kv_deficit_is_the_routers_overflow_capped_at_one_cache() {
        let mut o = Observation {
            prompt_tokens: 600.0,
            cached_tokens: 100.0,
            queued_prefill_tokens: 1_500.0,
            queued_requests: 2.0,
            decoding_requests: 9.0,
            decode_context_tokens: 7_000.0,
            kv_capacity_tokens: 8_192.0,
            // The scrape says there is room: the wait term reads it, this one does not.
            kv_usage: 0.5,
            metric_age_s: 0.5,
            ..Default::default()
        };
        let x = ttft_features(&o, &P);
        assert_eq!(x[6], 0.0, "no wait by the scrape's count");
        // 7,000 running + 1,500 queued + 500 own uncached − 8,192 = 808 tokens.
        assert!((x[8] - 0.808).abs() < 1e-12, "{}", x[8]);
        o.queued_prefill_tokens = 90_000.0;
        assert_eq!(ttft_features(&o, &P)[8], 8.192, "at most one cache's worth");
        o.kv_capacity_tokens = 0.0;
        assert_eq!(
            ttft_features(&o, &P)[8],
            0.0,
            "unknown capacity, no deficit"
        );
    }

    #[test]
    fn a_replica_at_its_running_peak_makes_the_queue_wait_for_slots() {
        let o = Observation {
            prompt_tokens: 800.0,
            expected_output_tokens: 600.0,
            queued_requests: 9.0,
            queued_prefill_tokens: 7_200.0,
            decoding_requests: 128.0,
            decode_context_tokens: 128.0 * 1_200.0,
            decode_remaining_tokens: 128.0 * 250.0,
            ..Default::default()
        };
        let below = ReplicaCtx {
            step_ms: 30.0,
            peak_running: 200.0,
        };
        assert_eq!(ttft_features_on(&o, &P, &below)[6], 0.0, "slots are free");
        let at = ReplicaCtx {
            step_ms: 30.0,
            peak_running: 128.0,
        };
        // 10 completions needed. The running requests are mid-life (400 generated, 250
        // left): remaining spread over [0, 500], the 10th of 128 after 500·10/128 steps.
        let want = 500.0 * 10.0 / 128.0 * 30.0;
        let got = ttft_features_on(&o, &P, &at)[6];
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        // The same slots filled by one burst (50 generated each, 250 left): nothing
        // finishes for 200 steps, then the 10th after 200 + 100·10/128.
        let burst = Observation {
            decode_context_tokens: 128.0 * 850.0,
            ..o
        };
        let want = (200.0 + 100.0 * 10.0 / 128.0) * 30.0;
        let got = ttft_features_on(&burst, &P, &at)[6];
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        // Past the first generation, at the steady rate of one per ō/n = 600/128 steps.
        let deep = Observation {
            queued_requests: 199.0,
            queued_prefill_tokens: 199.0 * 800.0,
            ..o
        };
        let want = (500.0 + (200.0 - 128.0) * 600.0 / 128.0) * 30.0;
        let got = ttft_features_on(&deep, &P, &at)[6];
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }

    #[test]
    fn ceil_matches_std_on_the_feature_range() {
        for x in [0.0, 0.2, 1.0, 1.5, 2.0, 1e6 + 0.5, 1e12] {
            assert_eq!(ceil_pos(x), x.ceil(), "{x}");
        }
    }

    #[test]
    fn stale_scrapes_are_ignored() {
        let mut o = Observation {
            scraped_running: 40.0,
            decoding_requests: 5.0,
            metric_age_s: 1.0,
            ..Default::default()
        };
        assert_eq!(tpot_features(&o, &P)[1], 41.0);
        o.metric_age_s = 60.0;
        assert_eq!(tpot_features(&o, &P)[1], 6.0);
    }
}
