//! A simulated router node: its own view of every replica (ledger, scraped state,
//! peers' loads), its own prefix index, policy, predictor, learner and deferral count
//! — the routing core's types, as a `headroom serve` process holds them, driven in
//! virtual time.

use std::sync::Arc;

use headroom_core::{
    ledger::Load, lifecycle::Deferrals, output::OutputEstimator, policy::Policy,
    prefix::PrefixIndex, view::PlainReplica,
};
use headroom_predictor::{Learner, SharedPredictor};
use rand_chacha::ChaCha8Rng;

pub struct SimNode {
    pub id: u32,
    pub name: String,
    /// The node's region (`SimConfig::node_region`).
    pub region: String,
    pub views: Vec<PlainReplica>,
    pub prefix: PrefixIndex,
    pub policy: Box<dyn Policy>,
    pub predictor: Arc<SharedPredictor>,
    pub learner: Learner,
    pub outputs: OutputEstimator,
    pub deferrals: Arc<Deferrals>,
    /// The node's admission gate (tenants' rates, shares and queue).
    pub gate: Arc<headroom_core::admission::Gate>,
    pub rng: ChaCha8Rng,
    /// Labels learned since the last published snapshot.
    pub dirty: bool,
    /// The P→D links' transfer times, as this node has measured them.
    pub links: headroom_core::pd::Links,
}

/// A router-side view of simulated replica `i`, as configuration would describe it:
/// routable from the start (simulated replicas never fail health checks).
pub fn replica_view(
    i: usize,
    profile: &headroom_engine::Profile,
    model: &str,
    role: headroom_core::view::Role,
) -> PlainReplica {
    let name = format!("r{i}-{}", profile.name);
    let mut r = PlainReplica::new(
        i as u32,
        &name,
        &profile.name,
        model,
        Some(profile.max_model_len),
    );
    r.max_batched_tokens = Some(profile.max_num_batched_tokens);
    r.role = role;
    r
}

impl SimNode {
    /// This node's own in-flight load on every replica at `now_s`.
    pub fn own_loads(&self, now_s: f64) -> Vec<Load> {
        self.views.iter().map(|v| v.ledger.load(now_s)).collect()
    }
}
