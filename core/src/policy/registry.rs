//! The one catalogue of policies: every policy a node or the simulator can run, by
//! the name operators type (`headroom serve --policy <name>`, `policy = "<name>"`,
//! `headroom-bench sim --policies <names>`), and how each is built.
//!
//! Invariants: every name parses back to its policy and the built policy reports that
//! name; a name is never reused for another policy.

use std::sync::Arc;

use headroom_predictor::SharedPredictor;
use serde::{Deserialize, Serialize};

use super::{
    Policy,
    baselines::{self, PrefixAffinity},
    peers::{DynamoKv, LlmdPredicted, LlmdPredictedConfig, LlmdWeighted, SglangCacheAware},
    slo::{SloConfig, SloPolicy},
};

/// Every policy there is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    Slo,
    RoundRobin,
    LeastRequest,
    TokenLoad,
    PrefixAffinity,
    /// llm-d's default scorer weights (the peer reference policies follow).
    LlmdWeighted,
    SglangCacheAware,
    DynamoKv,
    LlmdPredicted,
}

impl PolicyName {
    pub const ALL: [PolicyName; 9] = [
        PolicyName::Slo,
        PolicyName::RoundRobin,
        PolicyName::LeastRequest,
        PolicyName::TokenLoad,
        PolicyName::PrefixAffinity,
        PolicyName::LlmdWeighted,
        PolicyName::SglangCacheAware,
        PolicyName::DynamoKv,
        PolicyName::LlmdPredicted,
    ];

    /// The peer routers' policies re-built on our inputs (`policy::peers`).
    pub const PEERS: [PolicyName; 4] = [
        PolicyName::LlmdWeighted,
        PolicyName::SglangCacheAware,
        PolicyName::DynamoKv,
        PolicyName::LlmdPredicted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::Slo => "slo",
            PolicyName::RoundRobin => "round-robin",
            PolicyName::LeastRequest => "least-request",
            PolicyName::TokenLoad => "token-load",
            PolicyName::PrefixAffinity => "prefix-affinity",
            PolicyName::LlmdWeighted => "llmd-weighted",
            PolicyName::SglangCacheAware => "sglang-cache-aware",
            PolicyName::DynamoKv => "dynamo-kv",
            PolicyName::LlmdPredicted => "llmd-predicted",
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

/// The knobs of the policies that have any.
#[derive(Clone, Debug, Default)]
pub struct PolicySettings {
    pub slo: SloConfig,
    pub prefix_affinity: PrefixAffinity,
    pub llmd_predicted: LlmdPredictedConfig,
}

/// Builds policy `name`; `predictor` feeds those that predict (`slo`,
/// `llmd-predicted`), so every policy of a node reads one snapshot handle.
pub fn build(
    name: PolicyName,
    predictor: Arc<SharedPredictor>,
    settings: &PolicySettings,
) -> Box<dyn Policy> {
    match name {
        PolicyName::Slo => Box::new(SloPolicy::new(predictor, settings.slo.clone())),
        PolicyName::RoundRobin => Box::new(baselines::RoundRobin::default()),
        PolicyName::LeastRequest => Box::new(baselines::LeastRequest),
        PolicyName::TokenLoad => Box::new(baselines::TokenLoad),
        PolicyName::PrefixAffinity => Box::new(settings.prefix_affinity.clone()),
        PolicyName::LlmdWeighted => Box::new(LlmdWeighted::default()),
        PolicyName::SglangCacheAware => Box::new(SglangCacheAware::default()),
        PolicyName::DynamoKv => Box::new(DynamoKv::default()),
        PolicyName::LlmdPredicted => Box::new(LlmdPredicted::new(
            predictor,
            settings.llmd_predicted.clone(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_round_trips_and_builds_itself() {
        let predictor = Arc::new(SharedPredictor::default());
        for p in PolicyName::ALL {
            assert_eq!(p.as_str().parse::<PolicyName>(), Ok(p));
            let built = build(p, predictor.clone(), &PolicySettings::default());
            assert_eq!(built.name(), p.as_str());
        }
        let err = "llm-d".parse::<PolicyName>().unwrap_err();
        assert!(err.contains("dynamo-kv") && err.contains("slo"), "{err}");
    }
}
