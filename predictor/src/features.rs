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
//! TTFT ≈ θ·[1, S, (Q+u), S·n_dec, S·ctx_dec, pairs, wait, r].
//!
//! `wait` is the admission wait of a capacity-bound replica, in milliseconds (derivation
//! at [`admission_wait_steps`]): decode steps until enough running requests finish to
//! admit the queue ahead and this request, times the replica's measured decode step
//! ([`ReplicaCtx::step_ms`]). Its coefficient is dimensionless (prior 1): on the real
//! vLLM measurements of `../shared/traces/llmservingsim-vllm-measured` this wait is 95%+
//! of TTFT, and the labels that would teach it arrive one (tens-of-seconds) TTFT late,
//! so the structure has to be right before any label does.

use crate::observation::Observation;

/// Number of TTFT features.
pub const TTFT_DIM: usize = 8;
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
];

/// Names and units of the TPOT features.
pub const TPOT_FEATURE_NAMES: [&str; TPOT_DIM] = [
    "bias [ms]",
    "batch n_dec+n_queued+1 [ms per request]",
    "kv_context (ctx_dec+Q+prompt)/1e5 [ms per 100k tokens]",
    "prefill_inflow lambda/1e4 [ms per 10k tok/s]",
    "prefill_inflow_sq (lambda/1e4)^2 [ms]",
    "prefill_backlog (Q+u)/1e4 [ms per 10k tokens]",
];

/// Generic physical prior for TTFT, midway between the H100 and A100 Llama-3-8B constants
/// of engine-and-traces.md §2.3. Used for cold predictions and as the ridge target.
pub const GENERIC_TTFT_THETA: [f64; TTFT_DIM] = [5.0, 8.0, 40.0, 20.0, 65.0, 2.2, 1.0, 1.0];
/// Which TTFT coefficients are engine speeds (ms per unit of work) that a speed-ratio
/// prior scales; the last two multiply measured milliseconds and stay at 1.
pub const TTFT_SPEED_SCALED: [bool; TTFT_DIM] = [true, true, true, true, true, true, false, false];
/// Every TPOT coefficient is an engine speed.
pub const TPOT_SPEED_SCALED: [bool; TPOT_DIM] = [true; TPOT_DIM];
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
    (ttft_from(o, &d, p, r), tpot_from(o, &d))
}

#[inline(always)]
fn ttft_from(o: &Observation, d: &Derived, p: &FeatureParams, r: &ReplicaCtx) -> [f64; TTFT_DIM] {
    let budget = if o.max_batched_tokens > 0.0 {
        o.max_batched_tokens
    } else {
        p.default_max_batched_tokens
    };
    // Decodes take one token of the budget each; prefill gets the rest (at least one token).
    let per_step = (budget - d.n_dec).max(1.0);
    let steps = ceil_pos(d.work / per_step).max(1.0);
    let k = o.cached_tokens;
    let pairs = o.queued_attention_pairs + d.u * k + 0.5 * d.u * d.u;
    [
        1.0,
        steps,
        d.work * 1e-3,
        steps * d.n_dec * 1e-3,
        steps * o.decode_context_tokens * 1e-6,
        pairs * 1e-6,
        admission_wait_steps(o, d, p, r) * r.step_ms,
        o.step_residual_ms,
    ]
}

/// Decode steps until this request is admitted, when the replica is capacity-bound
/// (KV memory or running slots); 0 otherwise.
///
/// Completions needed, `m`:
/// - KV-bound (capacity known): admission needs room for the queued prompts, this prompt
///   and half its expected output (reference §7.1), `need = used + Q + prompt + ½·out`;
///   the deficit `need − C` frees as running requests finish, each freeing its context,
///   ≈ `ctx_dec/n_dec` tokens, so `m = (need − C)/(ctx_dec/n_dec)`.
/// - Slot-bound (`n_dec ≥ 0.95·peak`, peak ≥ 8, where `peak` is the most requests seen
///   decoding once the count is pinned there — the engine's `max_num_seqs`, seen rather
///   than configured): every queued request ahead and this one needs a slot,
///   `m = queued_requests + 1`.
///
/// In steady state `n_dec` requests finish every `ō` steps (ō = mean output length of a
/// running request), so `m` completions take `m·ō/n_dec` steps. `ō = max(2·R̄, own
/// expected output)`, `R̄ = decode_remaining/n_dec`: remaining lengths are spread over
/// `[0, ō]`, so `2·R̄ ≈ ō` once admissions have mixed; right after a burst every running
/// request is near its end and `2·R̄` alone under-states the turnover of the ones
/// admitted next. Units: steps (× `step_ms` gives ms). On the measured RTX 4090 trace
/// this predicts the admission rate 0.56 s/request it shows (41,408 KV tokens, ~37
/// running, ō ≈ 650, 25–30 ms steps).
#[inline(always)]
pub fn admission_wait_steps(
    o: &Observation,
    d: &Derived,
    p: &FeatureParams,
    r: &ReplicaCtx,
) -> f64 {
    if d.n_dec <= 0.0 {
        return 0.0;
    }
    let mut m: f64 = 0.0;
    let cap = o.kv_capacity_tokens;
    if cap > 0.0 && o.decode_context_tokens > 0.0 {
        let mut used = o.decode_context_tokens;
        if o.metric_age_s <= p.metric_fresh_s {
            used = used.max(o.kv_usage * cap);
        }
        let need =
            used + o.queued_prefill_tokens + o.prompt_tokens + 0.5 * o.expected_output_tokens;
        let deficit = need - cap;
        if deficit > 0.0 {
            m = deficit * d.n_dec / o.decode_context_tokens;
        }
    }
    if r.peak_running >= SLOT_MIN_PEAK && d.n_dec >= SLOT_BOUND_FRACTION * r.peak_running {
        m = m.max(o.queued_requests + 1.0);
    }
    if m <= 0.0 {
        return 0.0;
    }
    let mean_out = (2.0 * o.decode_remaining_tokens / d.n_dec).max(o.expected_output_tokens);
    m * mean_out / d.n_dec
}

/// TPOT basis functions for a sanitised observation.
#[inline]
pub fn tpot_features(o: &Observation, p: &FeatureParams) -> [f64; TPOT_DIM] {
    tpot_from(o, &derive(o, p))
}

#[inline(always)]
fn tpot_from(o: &Observation, d: &Derived) -> [f64; TPOT_DIM] {
    let lam = o.prefill_inflow_tps * 1e-4;
    [
        1.0,
        d.n_dec + o.queued_requests + 1.0,
        (o.decode_context_tokens + o.queued_prefill_tokens + o.prompt_tokens) * 1e-5,
        lam,
        lam * lam,
        d.work * 1e-4,
    ]
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
        o.queued_prefill_tokens = 15_000.0; // need 109k > 100k
        let wait = ttft_features(&o, &P)[6];
        // 9k deficit over 9k per finishing request: 1 completion; 10 running finish
        // every ō = 2·200 steps, so one completes every 40 steps.
        let steps = 1.0 * 400.0 / 10.0;
        assert!((wait - steps * DEFAULT_STEP_MS).abs() < 1e-9, "{wait}");
        let r = ReplicaCtx {
            step_ms: 40.0,
            peak_running: 0.0,
        };
        let measured = ttft_features_on(&o, &P, &r)[6];
        assert!((measured - steps * 40.0).abs() < 1e-9, "{measured}");
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
        // 10 completions at 128 per ō = max(500, 600) steps.
        let want = 10.0 * 600.0 / 128.0 * 30.0;
        let got = ttft_features_on(&o, &P, &at)[6];
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
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
