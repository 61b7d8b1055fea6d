//! What one decision knew about every candidate, for the operator's decision record
//! (`GET /debug/decisions/{id}` in the router).
//!
//! Built only when the host asks ([`crate::decide::route_explained`]): the plain
//! [`crate::decide::route`] allocates nothing for it. Cost when asked: one `Vec` of
//! `n` notes (n = eligible candidates), each a few hundred bytes of copied numbers,
//! no predictions beyond those the policy already made, except for policies that do
//! not predict, where one snapshot load and `n` predictions are added; plus the TTFT
//! feature map of the choice and the runner-up, split into terms (two more).

use headroom_predictor::Prediction;
use headroom_predictor::features::TTFT_DIM;

use crate::{ledger::Load, policy::slo::Eval};

/// One eligible candidate as the policy saw it.
#[derive(Clone, Debug)]
pub struct CandidateNote {
    /// Index into the replica slice given to the decision.
    pub index: usize,
    pub cached_tokens: u32,
    /// This node's in-flight work there and its peers' (gossiped).
    pub own: Load,
    pub peers: Load,
    pub peers_age_s: f64,
    /// Age of the scrape the decision used; `None` when it was too old to use.
    pub scraped_age_s: Option<f64>,
    /// KV-cache use from that scrape (0–1), where the engine reports it.
    pub kv_usage: Option<f64>,
    /// That scrape's running and waiting requests (waiting counts the preempted, which
    /// the engine puts back at the front of its queue) and preemptions per second.
    pub engine_queue: Option<EngineQueue>,
    pub prediction: Prediction,
    /// The TTFT point forecast split into its terms (ms, engine-side: no round trip;
    /// [`headroom_predictor::Snapshot::ttft_terms`]), for the choice and the runner-up
    /// only: what an operator reads to see which part of a forecast was off.
    pub ttft_terms: Option<[f64; TTFT_DIM]>,
    /// The `slo` policy's judgement (tier, violation probability, cost); `None` for
    /// policies that do not evaluate objectives, and while the `slo` policy is cold.
    pub eval: Option<Eval>,
    /// Position in the policy's ranking (0 = the choice); `None` when not ranked.
    pub rank: Option<usize>,
}

/// The engine's own queue as last scraped.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineQueue {
    pub running: f64,
    pub waiting: f64,
    pub preemption_rate: f64,
}

/// Every candidate the policy evaluated in one decision, in candidate order.
#[derive(Clone, Debug, Default)]
pub struct Explanation {
    pub candidates: Vec<CandidateNote>,
    /// Eligible candidates before the policy's shortlist
    /// ([`crate::policy::shortlist`]): more than `candidates.len()` when it dropped some.
    pub eligible: usize,
}
