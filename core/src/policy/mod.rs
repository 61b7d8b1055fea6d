//! The policy core: pure and synchronous, so the fleet simulator runs the very code
//! the binary runs, in virtual time.
//!
//! A policy sees the request's profile and the eligible candidates (already filtered
//! for model, context, health and readiness, with their load and prefix match) and
//! ranks them. The first is the choice; the rest are where retries go.

pub mod baselines;
pub mod candidates;
pub mod features;
pub mod kv_room;
pub mod pack;
pub mod peers;
pub mod rank;
pub mod registry;
pub mod shortlist;
pub mod slo;

use headroom_predictor::Prediction;
use serde::{Deserialize, Serialize};

use crate::{ledger::Load, scraped::Scraped, view::ReplicaView};

pub use candidates::{CandidateError, build_candidates};
pub use registry::{PolicyName, PolicySettings, build};

/// How a request that fits nowhere is handled.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Fallback {
    /// Send it where the expected violation is smallest.
    #[default]
    LeastBad,
    /// Wait (bounded) for capacity within the TTFT deadline, then least-bad or reject.
    Defer,
    /// Fast 429 that says why.
    Reject,
}

/// A request's objectives (milliseconds).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Slo {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
}

/// What routing knows about a request.
#[derive(Clone, Debug)]
pub struct RequestProfile {
    pub model: String,
    pub prompt_tokens: u32,
    /// Chained prefix-block hashes (router blocks).
    pub blocks: Vec<u64>,
    pub max_tokens: Option<u32>,
    pub expected_output_tokens: u32,
    pub slo: Slo,
    pub priority: i32,
    pub fallback: Fallback,
    pub stream: bool,
    /// Cached-token counts the host knows from the engines' own KV events, per
    /// replica; they replace the prefix index's estimate for those replicas.
    pub exact_cached: Vec<ExactCached>,
}

/// One replica's cached tokens for a prompt, from its KV events (whole engine blocks,
/// never the prompt's last token: what the engine will report as `cached_tokens`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExactCached {
    /// The replica's [`crate::view::ReplicaView::id`].
    pub replica: u32,
    pub tokens: u32,
    /// The replica's events are complete (`precise`); otherwise (`recovering`, the
    /// index holds a subset) the count is a lower bound and the larger of it and the
    /// prefix index's estimate is used.
    pub complete: bool,
}

/// One eligible replica as the policy sees it.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub replica: &'a dyn ReplicaView,
    /// Index of the replica in the slice the candidates were built from.
    pub index: usize,
    /// Estimated prefix-cache hit for this request here (tokens).
    pub cached_tokens: u32,
    /// This node's in-flight work there (exact).
    pub own: Load,
    /// Peers' in-flight work there (gossiped) and its age.
    pub peers: Load,
    pub peers_age_s: f64,
    /// Last scraped engine state, if fresh enough to use.
    pub scraped: Option<Scraped>,
    pub scraped_age_s: f64,
    /// KV capacity in tokens from the last scrape, however old (it does not drift).
    pub kv_capacity_tokens: Option<u64>,
}

impl Candidate<'_> {
    /// All known in-flight work: own plus peers'.
    pub fn load(&self) -> Load {
        self.own.plus(&self.peers)
    }
}

/// What a policy decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// Candidate indices: the choice first, then retry targets.
    Route(Vec<usize>),
    /// Nothing fits and the tenant prefers a fast refusal.
    Reject(NoFit),
    /// Nothing fits now; ask again after `retry_after_s` (within the deadline), and
    /// past the deadline go to `fallback_order` (least bad first).
    Defer {
        retry_after_s: f64,
        reason: String,
        fallback_order: Vec<usize>,
    },
}

/// A refusal because no replica can meet the request's objectives now: the fleet's
/// condition, not the tenant's (the router answers 503 with `Retry-After`).
#[derive(Clone, Debug, PartialEq)]
pub struct NoFit {
    pub reason: String,
    /// Seconds until a retry may fit (the policy's estimate; at least 1 s).
    pub retry_after_s: f64,
}

impl NoFit {
    /// Shortest `Retry-After` (s): a no-fit is measured in queue drain, not instants.
    pub const MIN_RETRY_S: f64 = 1.0;
    /// Longest (s): past this the estimate says nothing useful.
    pub const MAX_RETRY_S: f64 = 60.0;

    /// A refusal whose retry time is `retry_after_s`, clamped to the range above
    /// (a NaN says the minimum).
    pub fn new(reason: String, retry_after_s: f64) -> Self {
        let r = if retry_after_s.is_nan() {
            Self::MIN_RETRY_S
        } else {
            retry_after_s.clamp(Self::MIN_RETRY_S, Self::MAX_RETRY_S)
        };
        Self {
            reason,
            retry_after_s: r,
        }
    }

    /// Whole seconds for the header, rounded up.
    pub fn retry_after_secs(&self) -> u64 {
        self.retry_after_s.ceil() as u64
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub choice: Choice,
    /// Per candidate (same indices), the prediction the policy decided on; empty when
    /// the policy does not predict. What headers show and the placement learns against.
    pub predictions: Vec<Prediction>,
    /// Per candidate (same indices), how the policy judged it against the objectives;
    /// empty when the policy does not evaluate them. Read only by explanations.
    pub evals: Vec<slo::Eval>,
    /// Set when the policy fell back (cold model, nothing fits, …).
    pub fallback: Option<&'static str>,
}

impl Decision {
    pub fn route(order: Vec<usize>) -> Self {
        Self {
            choice: Choice::Route(order),
            predictions: Vec::new(),
            evals: Vec::new(),
            fallback: None,
        }
    }
}

/// Per-decision context: the time axis and a random source (seeded in simulation).
pub struct DecideCtx<'r> {
    pub now_s: f64,
    pub rng: &'r mut dyn rand::RngCore,
    /// How many of the order the caller reads (the choice and its retry targets): past
    /// them a policy may leave its order unsorted. `usize::MAX` reads all of it.
    pub top: usize,
}

/// A routing policy.
pub trait Policy: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether the policy weighs remote candidates itself (their round trip and the
    /// local-first rule, [`crate::region`]); others are handed only local candidates
    /// while there is one.
    fn regional(&self) -> bool {
        false
    }
    /// How many of a large fleet's candidates the policy evaluates ([`shortlist`]);
    /// `None`: all of them.
    fn shortlist(&self) -> Option<shortlist::Shortlist> {
        None
    }
    /// Ranks `cands` (never empty) for `req`.
    fn decide(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision;
}
