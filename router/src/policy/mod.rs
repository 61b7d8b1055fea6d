//! The policy core: pure and synchronous, so the fleet simulator runs the very code
//! the binary runs, in virtual time.
//!
//! A policy sees the request's profile and the eligible candidates (already filtered
//! for model, context, health and readiness, with their load and prefix match) and
//! ranks them. The first is the choice; the rest are where retries go.

pub mod baselines;
pub mod candidates;
pub mod features;
pub mod peers;
pub mod rank;
pub mod slo;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{
    config::Fallback,
    fleet::{Replica, Scraped},
    ledger::Load,
};

pub use candidates::{CandidateError, build_candidates};

/// The policies a node can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    Slo,
    RoundRobin,
    LeastRequest,
    TokenLoad,
    PrefixAffinity,
}

impl PolicyName {
    pub const ALL: [PolicyName; 5] = [
        PolicyName::Slo,
        PolicyName::RoundRobin,
        PolicyName::LeastRequest,
        PolicyName::TokenLoad,
        PolicyName::PrefixAffinity,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::Slo => "slo",
            PolicyName::RoundRobin => "round-robin",
            PolicyName::LeastRequest => "least-request",
            PolicyName::TokenLoad => "token-load",
            PolicyName::PrefixAffinity => "prefix-affinity",
        }
    }
}

impl std::str::FromStr for PolicyName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        PolicyName::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = PolicyName::ALL.iter().map(|p| p.as_str()).collect();
                format!(
                    "unknown policy `{s}` (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Builds one of the node's policies; `predictor` feeds those that predict.
pub fn build(
    name: PolicyName,
    predictor: Arc<headroom_predictor::SharedPredictor>,
    slo: slo::SloConfig,
) -> Box<dyn Policy> {
    build_with(name, predictor, slo, baselines::PrefixAffinity::default())
}

/// [`build`] with the prefix-affinity baseline's settings.
pub fn build_with(
    name: PolicyName,
    predictor: Arc<headroom_predictor::SharedPredictor>,
    slo: slo::SloConfig,
    prefix_affinity: baselines::PrefixAffinity,
) -> Box<dyn Policy> {
    match name {
        PolicyName::RoundRobin => Box::new(baselines::RoundRobin::default()),
        PolicyName::LeastRequest => Box::new(baselines::LeastRequest),
        PolicyName::TokenLoad => Box::new(baselines::TokenLoad),
        PolicyName::PrefixAffinity => Box::new(prefix_affinity),
        PolicyName::Slo => Box::new(slo::SloPolicy::new(predictor, slo)),
    }
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
}

/// One eligible replica as the policy sees it.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub replica: &'a Replica,
    /// Estimated prefix-cache hit for this request here (tokens).
    pub cached_tokens: u32,
    /// This node's in-flight work there (exact).
    pub own: Load,
    /// Peers' in-flight work there (gossiped) and its age.
    pub peers: Load,
    pub peers_age_s: f64,
    /// Last scraped engine state, if fresh enough to use.
    pub scraped: Option<Arc<Scraped>>,
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
    Reject(String),
    /// Nothing fits now; ask again after `retry_after_s` (within the deadline), and
    /// past the deadline go to `fallback_order` (least bad first).
    Defer {
        retry_after_s: f64,
        reason: String,
        fallback_order: Vec<usize>,
    },
}

/// The prediction behind a choice, for headers, metrics and learning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Forecast {
    pub ttft_ms: f64,
    pub ttft_upper_ms: f64,
    pub tpot_ms: f64,
    pub tpot_upper_ms: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub choice: Choice,
    /// Per candidate (same indices), when the policy predicts.
    pub forecasts: Vec<Option<Forecast>>,
    /// Set when the policy fell back (cold model, nothing fits, …).
    pub fallback: Option<&'static str>,
}

impl Decision {
    pub fn route(order: Vec<usize>) -> Self {
        Self {
            choice: Choice::Route(order),
            forecasts: Vec::new(),
            fallback: None,
        }
    }
}

/// Per-decision context: the time axis and a random source (seeded in simulation).
pub struct DecideCtx<'r> {
    pub now_s: f64,
    pub rng: &'r mut dyn rand::RngCore,
}

/// A routing policy.
pub trait Policy: Send + Sync {
    fn name(&self) -> &'static str;
    /// Ranks `cands` (never empty) for `req`.
    fn decide(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision;
}
