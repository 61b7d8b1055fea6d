//! From what the router sees to the predictor's [`Observation`]: the one place the
//! policy's view of a placement is turned into model inputs, used both when deciding
//! and when learning (so training and serving see identical features).

use headroom_predictor::{Observation, ReplicaKey};

use super::{Candidate, Load, RequestProfile};

/// Predictor key of a candidate.
pub fn key(c: &Candidate<'_>) -> ReplicaKey {
    c.replica.predictor_key()
}

/// The observation for placing `req` on `c`, excluding `req` itself from the load.
pub fn observation(req: &RequestProfile, c: &Candidate<'_>) -> Observation {
    observation_with(req, c, &c.load())
}

/// As [`observation`], with the candidate's total load already summed. Inlined: the
/// decision's per-candidate forecast reads the 150-byte observation straight back.
#[inline(always)]
pub fn observation_with(req: &RequestProfile, c: &Candidate<'_>, load: &Load) -> Observation {
    let s = c.scraped.as_ref();
    Observation {
        prompt_tokens: req.prompt_tokens as f64,
        cached_tokens: c.cached_tokens.min(req.prompt_tokens) as f64,
        expected_output_tokens: req.expected_output_tokens as f64,
        queued_prefill_tokens: load.queued_prefill_tokens,
        queued_requests: load.queued_requests,
        queued_attention_pairs: load.queued_attention_pairs,
        decoding_requests: load.decoding_requests,
        decode_context_tokens: load.decode_context_tokens,
        decode_remaining_tokens: load.decode_remaining_tokens,
        prefill_inflow_tps: load.prefill_inflow_tps,
        kv_usage: s.and_then(|s| s.kv_usage).unwrap_or(0.0),
        kv_capacity_tokens: c.kv_capacity_tokens.unwrap_or(0) as f64,
        scraped_waiting: s.map_or(0.0, |s| s.waiting),
        scraped_running: s.map_or(0.0, |s| s.running),
        preemption_rate: s.map_or(0.0, |s| s.preemption_rate),
        metric_age_s: if c.scraped_age_s.is_finite() {
            c.scraped_age_s
        } else {
            0.0
        },
        max_batched_tokens: c.replica.max_batched_tokens().unwrap_or(0) as f64,
        step_residual_ms: load.step_residual_s * 1e3,
    }
}

/// The observation for `req` on `c` had `c` nothing else to do and `cached` of the
/// prompt's tokens cached: what its hardware alone makes of the request, for comparing
/// replicas' speed apart from their queues and caches.
pub fn idle_observation(req: &RequestProfile, c: &Candidate<'_>, cached: u32) -> Observation {
    Observation {
        prompt_tokens: req.prompt_tokens as f64,
        cached_tokens: cached.min(req.prompt_tokens) as f64,
        expected_output_tokens: req.expected_output_tokens as f64,
        kv_capacity_tokens: c.kv_capacity_tokens.unwrap_or(0) as f64,
        max_batched_tokens: c.replica.max_batched_tokens().unwrap_or(0) as f64,
        ..Observation::default()
    }
}
