//! The routing core's view of a fleet replica: [`ReplicaView`] over the fleet's
//! lock-free cells (served models, health, last scrape, peers' load, ledger).
//!
//! Invariant: each read is one atomic snapshot of its cell; a decision may see one
//! cell a moment newer than another, never a torn value. Cost per candidate: a version
//! load and this thread's memo (served models, [`crate::fleet::models`]) and two seqlock
//! copies (last scrape, peers' load: plain loads, retried only while a writer is
//! mid-store).

use std::sync::{Arc, atomic::AtomicU64};

use headroom_core::{
    ledger::Ledger,
    scraped::Scraped,
    view::{PeerLoad, ReplicaView, Role, Serving},
};
use headroom_predictor::ReplicaKey;

use crate::fleet::Replica;

impl ReplicaView for Replica {
    fn id(&self) -> u32 {
        self.id
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn predictor_key(&self) -> ReplicaKey {
        ReplicaKey::new(self.key, self.class_key)
    }
    fn max_batched_tokens(&self) -> Option<u32> {
        self.max_batched_tokens
    }
    fn serving(&self, model: &str) -> Serving {
        self.models.serving(self.id, model)
    }
    fn routable(&self) -> bool {
        self.health.routable() && !self.region_dark.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn scraped(&self) -> Option<Scraped> {
        self.scraped.load()
    }
    fn peer_load(&self) -> PeerLoad {
        self.peer_load.load()
    }
    fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }
    fn prefix_cursor(&self) -> &AtomicU64 {
        &self.prefix_cursor
    }
    fn remote_rtt_ms(&self) -> Option<f64> {
        self.remote_rtt_ms
    }
    fn role(&self) -> Role {
        self.role
    }
    fn light(&self) -> headroom_core::view::LightRead {
        crate::fleet::cells::light(&self.scraped, &self.peer_load)
    }
}
