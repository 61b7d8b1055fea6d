//! One routing decision, independent of I/O: candidates → policy → ranked targets
//! with the model inputs and prediction of each. The proxy and the fleet simulator
//! both call [`route`] (through [`crate::lifecycle`]), so the simulator exercises the
//! binary's decision code.
//!
//! Invariant: a target's prediction is the one its policy decided on when the policy
//! predicts (`Decision::predictions`); only for policies that do not predict is it
//! computed here, from one snapshot load per decision. Headers, metrics and the
//! learned sample therefore carry the forecast the choice was made with.

use std::time::Instant;

use headroom_predictor::{Observation, Prediction, ReplicaKey, SharedPredictor};

use crate::{
    explain::{CandidateNote, EngineQueue, Explanation},
    policy::{
        CandidateError, Choice, DecideCtx, Fallback, NoFit, Policy, RequestProfile,
        build_candidates,
        candidates::{CandidateParams, build_shortlisted},
        features, slo,
    },
    prefix::PrefixIndex,
    region,
    view::ReplicaView,
};

/// The placement's model inputs and the prediction issued for it.
#[derive(Clone, Copy, Debug)]
pub struct Learn {
    pub key: ReplicaKey,
    pub obs: Observation,
    /// Client-side: the TTFT includes `rtt_ms`.
    pub prediction: Prediction,
    /// Round trip to the replica's region (ms; 0 in region): what the learned TTFT
    /// label and prediction lose to become engine-side ([`crate::region`]).
    pub rtt_ms: f64,
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
    /// Refuse, saying why and when to retry.
    Reject(NoFit),
}

#[derive(Clone, Debug)]
pub struct Routed {
    pub verdict: Verdict,
    pub targets: Vec<RoutedTarget>,
    pub fallback: Option<&'static str>,
    /// Time the whole decision took: candidates (prefix match, loads), the policy and
    /// the ranked targets' predictions (the explanation excluded).
    pub decision_ns: u64,
    /// Every candidate as the policy saw it; only from [`route_explained`].
    pub explain: Option<Box<Explanation>>,
}

/// Everything one decision reads.
pub struct RouteInputs<'a, R> {
    pub policy: &'a dyn Policy,
    pub predictor: &'a SharedPredictor,
    pub prefix: &'a PrefixIndex,
    pub replicas: &'a [R],
    pub params: CandidateParams,
    /// How many ranked targets to keep (1 + retries).
    pub max_targets: usize,
}

/// Decides where `profile` goes at `now_s`.
pub fn route<R: ReplicaView>(
    inp: &RouteInputs<'_, R>,
    profile: &RequestProfile,
    now_s: f64,
    rng: &mut dyn rand::RngCore,
) -> Result<Routed, CandidateError> {
    route_inner(inp, profile, now_s, rng, false)
}

/// [`route`], plus every candidate's loads, prediction, evaluation and rank in
/// `Routed::explain`. The same decision: the rng is drawn from identically.
pub fn route_explained<R: ReplicaView>(
    inp: &RouteInputs<'_, R>,
    profile: &RequestProfile,
    now_s: f64,
    rng: &mut dyn rand::RngCore,
) -> Result<Routed, CandidateError> {
    route_inner(inp, profile, now_s, rng, true)
}

fn route_inner<R: ReplicaView>(
    inp: &RouteInputs<'_, R>,
    profile: &RequestProfile,
    now_s: f64,
    rng: &mut dyn rand::RngCore,
    explain: bool,
) -> Result<Routed, CandidateError> {
    let started = Instant::now();
    let (mut cands, eligible) = match inp.policy.shortlist() {
        Some(s) => build_shortlisted(profile, inp.replicas, inp.prefix, inp.params, now_s, s, rng)?,
        None => {
            let c = build_candidates(profile, inp.replicas, inp.prefix, inp.params, now_s)?;
            let n = c.len();
            (c, n)
        }
    };
    // Only the targets are read, unless every candidate's rank is explained.
    let top = if explain {
        usize::MAX
    } else {
        inp.max_targets.max(1)
    };
    let mut ctx = DecideCtx { now_s, rng, top };
    let decide = |cands: &[_], ctx: &mut DecideCtx<'_>| {
        if inp.policy.regional() {
            inp.policy.decide(profile, cands, ctx)
        } else {
            region::local_first(inp.policy, profile, cands, ctx)
        }
    };
    let mut decision = decide(&cands, &mut ctx);
    // A shortlist that found no fit, or a standing queue on every replica it kept, says
    // nothing of the replicas it dropped. For a tenant that is refused or deferred then,
    // decide again over all of them, so that a refusal or a wait is not the shortlist's
    // artefact where a warm forecast elsewhere fits. (In the simulator at 64 replicas,
    // shortlists of 8/16/32 found no fit for 34/15/3% of requests where the full
    // evaluation found none for 2%.) Not for least-bad tenants: the least-bad pick among
    // the shortlist met as many objectives as the full evaluation, and re-deciding all
    // of them made things worse (at 64 replicas, 80 req/s, seed 1: 92.8% against
    // 97.6%, load-routed decisions 5.7% -> 49%; at 256 replicas, 360 req/s: 77.8/83.5%
    // against 88.7/91.5%): a large fleet nearly always has a cold replica (one rarely
    // placed on goes stale), and a decision over all of it then goes by load. Where
    // the re-decision goes by load, the shortlist's decision stands.
    if cands.len() < eligible
        && profile.fallback != Fallback::LeastBad
        && matches!(decision.fallback, Some(slo::NO_FIT | slo::STANDING_QUEUE))
    {
        let all = build_candidates(profile, inp.replicas, inp.prefix, inp.params, now_s)?;
        let again = decide(&all, &mut ctx);
        if again.fallback != Some(slo::COLD_MODEL) {
            cands = all;
            decision = again;
        }
    }
    // Loaded only if some target lacks the policy's own prediction.
    let mut snap = None;
    let mut targets = |order: &[usize]| -> Vec<RoutedTarget> {
        order
            .iter()
            .filter(|&&i| i < cands.len())
            .take(inp.max_targets.max(1))
            .map(|&i| {
                let c = &cands[i];
                let key = features::key(c);
                let obs = features::observation(profile, c);
                let rtt_ms = region::rtt_of(c);
                let prediction = match decision.predictions.get(i).copied() {
                    Some(p) => p,
                    None => region::with_rtt(
                        snap.get_or_insert_with(|| inp.predictor.load())
                            .predict(key, &obs),
                        rtt_ms,
                    ),
                };
                RoutedTarget {
                    index: c.index,
                    cached_tokens: c.cached_tokens,
                    learn: Learn {
                        key,
                        obs,
                        prediction,
                        rtt_ms,
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
        Choice::Reject(no) => (Verdict::Reject(no.clone()), Vec::new()),
    };
    let decision_ns = started.elapsed().as_nanos() as u64;
    let explain = explain.then(|| {
        let order: &[usize] = match &decision.choice {
            Choice::Route(o) => o,
            Choice::Defer { fallback_order, .. } => fallback_order,
            Choice::Reject(_) => &[],
        };
        let mut rank = vec![None; cands.len()];
        for (pos, &i) in order.iter().enumerate() {
            if let Some(r) = rank.get_mut(i) {
                *r = Some(pos);
            }
        }
        let candidates = cands
            .iter()
            .enumerate()
            .map(|(i, c)| CandidateNote {
                index: c.index,
                cached_tokens: c.cached_tokens,
                own: c.own,
                peers: c.peers,
                peers_age_s: c.peers_age_s,
                scraped_age_s: c.scraped.as_ref().map(|_| c.scraped_age_s),
                kv_usage: c.scraped.as_ref().and_then(|s| s.kv_usage),
                engine_queue: c.scraped.as_ref().map(|s| EngineQueue {
                    running: s.running,
                    waiting: s.waiting,
                    preemption_rate: s.preemption_rate,
                }),
                prediction: match decision.predictions.get(i).copied() {
                    Some(p) => p,
                    None => region::with_rtt(
                        snap.get_or_insert_with(|| inp.predictor.load())
                            .predict(features::key(c), &features::observation(profile, c)),
                        region::rtt_of(c),
                    ),
                },
                ttft_terms: rank[i].filter(|&r| r <= 1).map(|_| {
                    snap.get_or_insert_with(|| inp.predictor.load())
                        .ttft_terms(features::key(c), &features::observation(profile, c))
                }),
                eval: decision.evals.get(i).copied(),
                rank: rank[i],
            })
            .collect();
        Box::new(Explanation {
            candidates,
            eligible,
        })
    });
    Ok(Routed {
        verdict,
        targets,
        fallback: decision.fallback,
        decision_ns,
        explain,
    })
}
