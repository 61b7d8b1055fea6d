//! Token load paced by each replica's measured speed: the `slo` policy's fallback while
//! its TTFT models are cold.
//!
//! Cost of placing request `r` on candidate `i`, in milliseconds of the replica's work:
//!
//! ```text
//! cost_i = (outstanding_i + (prompt_r − cached_i) + expected_output_r) · step_i
//! ```
//!
//! `outstanding_i` is `Load::outstanding_tokens` (queued prefill plus decode still
//! expected, this node's and peers'), the same token count `token-load` ranks by, so
//! the cost stays prefix-aware (a cached prefix is not counted) and load-aware. `step_i`
//! (ms per token) is the replica's decode step with nothing else running, the TPOT
//! model's forecast at zero load: on a heterogeneous fleet a token costs a slow replica
//! more time than a fast one, which plain token load ignores (it balances tokens, so a
//! replica 2× slower gets the same work and twice the latency).
//!
//! Invariant: the pace is used only when every candidate's TPOT model is warm — TPOT
//! labels (the engine's own mean inter-token latency on vLLM) are far less noisy than
//! TTFT's, so they warm long before TTFT does — and is finite and positive; otherwise
//! every step is 1 and the ranking is exactly `token-load`'s.

use headroom_predictor::{ModelState, Snapshot};

use super::{Candidate, DecideCtx, Decision, Policy, RequestProfile, baselines, features, rank};

/// The paced fallback over one snapshot.
pub struct PacedTokenLoad<'a> {
    pub snapshot: &'a Snapshot,
}

impl PacedTokenLoad<'_> {
    /// Each candidate's step (ms per token), or `None` when any is not known warm.
    pub fn steps(&self, req: &RequestProfile, cands: &[Candidate<'_>]) -> Option<Vec<f64>> {
        cands
            .iter()
            .map(|c| {
                let mut alone = features::observation(req, c);
                alone.queued_prefill_tokens = 0.0;
                alone.queued_requests = 0.0;
                alone.queued_attention_pairs = 0.0;
                alone.decoding_requests = 0.0;
                alone.decode_context_tokens = 0.0;
                alone.decode_remaining_tokens = 0.0;
                alone.prefill_inflow_tps = 0.0;
                alone.scraped_waiting = 0.0;
                alone.scraped_running = 0.0;
                alone.kv_usage = 0.0;
                let p = self.snapshot.predict(features::key(c), &alone);
                (p.tpot_state == ModelState::Warm && p.tpot_ms.is_finite() && p.tpot_ms > 0.0)
                    .then_some(p.tpot_ms)
            })
            .collect()
    }
}

impl Policy for PacedTokenLoad<'_> {
    fn name(&self) -> &'static str {
        "paced-token-load"
    }
    fn decide(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision {
        let steps = self.steps(req, cands);
        let costs: Vec<f64> = cands
            .iter()
            .enumerate()
            .map(|(i, c)| {
                baselines::tokens_with(req, c) * steps.as_ref().map_or(1.0, |s| s[i])
            })
            .collect();
        Decision::route(rank::by_cost(&costs, ctx.rng))
    }
}
