//! One routing decision, independent of I/O: candidates → policy → ranked targets
//! with the model inputs and prediction of each. The proxy and the fleet simulator
//! both call [`route`], so the simulator exercises the binary's decision code.

use std::{sync::Arc, time::Instant};

use headroom_predictor::{
    ModelState, Observation, Prediction, ReplicaKey, Sample, SharedPredictor,
};

use crate::{
    fleet::Replica,
    ledger::{Booking, BookingSpec},
    policy::{
        CandidateError, Choice, DecideCtx, Policy, RequestProfile, build_candidates,
        candidates::CandidateParams, features,
    },
    prefix::PrefixIndex,
};

/// The placement's model inputs and the prediction issued for it.
#[derive(Clone, Copy, Debug)]
pub struct Learn {
    pub key: ReplicaKey,
    pub obs: Observation,
    pub prediction: Prediction,
}

/// One ranked target.
#[derive(Clone, Debug)]
pub struct RoutedTarget {
    /// Index into the replica slice given to [`route`].
    pub index: usize,
    pub cached_tokens: u32,
    pub learn: Learn,
}

#[derive(Clone, Debug)]
pub enum Verdict {
    /// Try these in order (the first is the choice).
    Go,
    /// Nothing fits now: ask again after this many seconds; `targets` is the
    /// least-bad order for when the deadline passes.
    Defer(f64),
    /// Refuse, saying why.
    Reject(String),
}

#[derive(Clone, Debug)]
pub struct Routed {
    pub verdict: Verdict,
    pub targets: Vec<RoutedTarget>,
    pub fallback: Option<&'static str>,
    /// Time the whole decision took: candidates (prefix match, loads), the policy and
    /// the ranked targets' predictions.
    pub decision_ns: u64,
}

/// Everything one decision reads.
pub struct RouteInputs<'a> {
    pub policy: &'a dyn Policy,
    pub predictor: &'a SharedPredictor,
    pub prefix: &'a PrefixIndex,
    pub replicas: &'a [Arc<Replica>],
    pub params: CandidateParams,
    /// How many ranked targets to keep (1 + retries).
    pub max_targets: usize,
}

/// Decides where `profile` goes at `now_s`.
pub fn route(
    inp: &RouteInputs<'_>,
    profile: &RequestProfile,
    now_s: f64,
    rng: &mut dyn rand::RngCore,
) -> Result<Routed, CandidateError> {
    let started = Instant::now();
    let cands = build_candidates(profile, inp.replicas, inp.prefix, inp.params, now_s)?;
    let decision = inp
        .policy
        .decide(profile, &cands, &mut DecideCtx { now_s, rng });
    let snap = inp.predictor.load();
    let targets = |order: &[usize]| -> Vec<RoutedTarget> {
        order
            .iter()
            .filter(|&&i| i < cands.len())
            .take(inp.max_targets.max(1))
            .map(|&i| {
                let c = &cands[i];
                let key = features::key(c);
                let obs = features::observation(profile, c);
                RoutedTarget {
                    index: inp
                        .replicas
                        .iter()
                        .position(|r| r.id == c.replica.id)
                        .expect("candidates come from this replica slice"),
                    cached_tokens: c.cached_tokens,
                    learn: Learn {
                        key,
                        obs,
                        prediction: snap.predict(key, &obs),
                    },
                }
            })
            .collect()
    };
    let (verdict, targets) = match &decision.choice {
        Choice::Route(order) => (Verdict::Go, targets(order)),
        Choice::Defer {
            retry_after_s,
            fallback_order,
            ..
        } => (Verdict::Defer(*retry_after_s), targets(fallback_order)),
        Choice::Reject(reason) => (Verdict::Reject(reason.clone()), Vec::new()),
    };
    Ok(Routed {
        verdict,
        targets,
        fallback: decision.fallback,
        decision_ns: started.elapsed().as_nanos() as u64,
    })
}

/// Books a placement on `replica` (released when the booking drops). A warm TTFT
/// forecast in `learn` paces the ledger's estimate of prefill progress.
pub fn book(
    replica: &Replica,
    profile: &RequestProfile,
    cached_tokens: u32,
    learn: &Learn,
    now_s: f64,
) -> Booking {
    let p = &learn.prediction;
    replica.ledger.book(
        BookingSpec {
            prompt_tokens: profile.prompt_tokens,
            cached_tokens,
            expected_output_tokens: profile.expected_output_tokens,
            tpot_slo_ms: Some(profile.slo.tpot_ms),
            expected_ttft_s: (p.ttft_state == ModelState::Warm).then_some(p.ttft_ms / 1e3),
        },
        now_s,
    )
}

/// Records in the prefix index that `replica` accepted the request.
pub fn remember_prefix(
    prefix: &PrefixIndex,
    replica: &Replica,
    profile: &RequestProfile,
    cached_tokens: u32,
    block_tokens: u32,
) {
    let matched = (cached_tokens / block_tokens.max(1)) as usize;
    prefix.record(&replica.prefix_cursor, replica.id, &profile.blocks, matched);
}

/// The training sample for a finished request (`None` when nothing was measured).
pub fn sample(
    learn: &Learn,
    at_s: f64,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    output_tokens: u32,
    censored: bool,
) -> Option<Sample> {
    if ttft_ms.is_none() && tpot_ms.is_none() {
        return None;
    }
    Some(Sample {
        key: learn.key,
        obs: learn.obs,
        at_s,
        ttft_ms,
        tpot_ms,
        output_tokens,
        censored,
        predicted: Some(learn.prediction),
    })
}
