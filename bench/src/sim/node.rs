//! A simulated router node: its own view of every replica (ledger, scraped state,
//! peers' loads), its own prefix index, policy, predictor and learner — the same
//! types a `headroom serve` process holds, driven in virtual time.

use std::sync::Arc;

use headroom::{
    config::ReplicaConfig,
    fleet::{ModelEntry, Replica, ServedModels},
    ledger::Load,
    node::OutputEstimator,
    policy::Policy,
    prefix::PrefixIndex,
};
use headroom_predictor::{Learner, SharedPredictor};
use rand_chacha::ChaCha8Rng;

pub struct SimNode {
    pub id: u32,
    pub name: String,
    pub views: Vec<Arc<Replica>>,
    pub prefix: PrefixIndex,
    pub policy: Box<dyn Policy>,
    pub predictor: Arc<SharedPredictor>,
    pub learner: Learner,
    pub outputs: OutputEstimator,
    pub rng: ChaCha8Rng,
    /// Labels learned since the last published snapshot.
    pub dirty: bool,
}

/// A router-side view of simulated replica `i`, as configuration would describe it.
pub fn replica_view(
    i: usize,
    profile: &crate::engine::Profile,
    model: &str,
) -> Result<Replica, String> {
    let rc = ReplicaConfig {
        url: format!("http://sim-replica-{i}:8000"),
        name: Some(format!("r{i}-{}", profile.name)),
        class: Some(profile.name.clone()),
        region: None,
        max_batched_tokens: Some(profile.max_num_batched_tokens),
    };
    let r = Replica::new(i as u32, &rc)?;
    r.models.store(Arc::new(ServedModels {
        models: vec![ModelEntry {
            id: model.to_string(),
            parent: None,
            max_model_len: Some(profile.max_model_len),
        }],
        known: true,
    }));
    // Simulated replicas never fail health checks.
    r.health
        .on_success(headroom::fleet::Signal::Probe, 0, &Default::default());
    Ok(r)
}

impl SimNode {
    /// This node's own in-flight load on every replica at `now_s`.
    pub fn own_loads(&self, now_s: f64) -> Vec<Load> {
        self.views.iter().map(|v| v.ledger.load(now_s)).collect()
    }
}
