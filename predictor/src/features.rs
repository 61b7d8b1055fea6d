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
//! TTFT ≈ θ·[1, S, (Q+u), S·n_dec, S·ctx_dec, pairs, drain, r].

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
    "kv_drain_steps [ms/step]",
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
pub const GENERIC_TTFT_THETA: [f64; TTFT_DIM] = [5.0, 8.0, 40.0, 20.0, 65.0, 2.2, 12.0, 1.0];
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
struct Derived {
    /// Decoding requests, floored by fresh scraped `running` minus router-known queued ones
    /// (covers traffic that bypasses this router).
    n_dec: f64,
    /// Uncached prefill work ahead of and including this request (tokens).
    work: f64,
    /// Own uncached prompt tokens.
    u: f64,
}

#[inline(always)]
fn derive(o: &Observation, p: &FeatureParams) -> Derived {
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

/// TTFT basis functions for a sanitised observation.
#[inline]
pub fn ttft_features(o: &Observation, p: &FeatureParams) -> [f64; TTFT_DIM] {
    ttft_from(o, &derive(o, p), p)
}

/// Both feature vectors at once, sharing the derived quantities (the hot path).
#[inline(always)]
pub fn all_features(o: &Observation, p: &FeatureParams) -> ([f64; TTFT_DIM], [f64; TPOT_DIM]) {
    let d = derive(o, p);
    (ttft_from(o, &d, p), tpot_from(o, &d))
}

#[inline(always)]
fn ttft_from(o: &Observation, d: &Derived, p: &FeatureParams) -> [f64; TTFT_DIM] {
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
        kv_drain_steps(o, d, p),
        o.step_residual_ms,
    ]
}

/// Decode steps until enough KV frees to admit the queued work and this request, when the
/// replica is KV-bound; 0 otherwise or when capacity is unknown.
///
/// Admission needs room for the queued prompts plus this prompt and half its expected
/// output (reference §7.1). Running requests free their context as they finish; with
/// remaining lengths spread evenly over [0, 2·mean], freeing a fraction f of the running
/// context takes ≈ f·2·mean_remaining steps.
#[inline(always)]
fn kv_drain_steps(o: &Observation, d: &Derived, p: &FeatureParams) -> f64 {
    let cap = o.kv_capacity_tokens;
    if cap <= 0.0 || d.n_dec <= 0.0 || o.decode_context_tokens <= 0.0 {
        return 0.0;
    }
    let mut used = o.decode_context_tokens;
    if o.metric_age_s <= p.metric_fresh_s {
        used = used.max(o.kv_usage * cap);
    }
    let need = used + o.queued_prefill_tokens + o.prompt_tokens + 0.5 * o.expected_output_tokens;
    let deficit = need - cap;
    if deficit <= 0.0 {
        return 0.0;
    }
    let frac = (deficit / o.decode_context_tokens).min(1.0);
    frac * 2.0 * o.decode_remaining_tokens / d.n_dec
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
    fn kv_drain_appears_only_when_the_replica_is_kv_bound() {
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
        let drain = ttft_features(&o, &P)[6];
        assert!(
            (drain - (9_000.0 / 90_000.0) * 2.0 * 200.0).abs() < 1e-9,
            "{drain}"
        );
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
