//! The hot-path handle: readers `load()` the current snapshot without locking; the trainer
//! `store()`s a new one. Old snapshots are freed when their last reader drops them.

use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use crate::snapshot::Snapshot;

pub struct SharedPredictor(ArcSwap<Snapshot>);

impl SharedPredictor {
    pub fn new(snapshot: Snapshot) -> Self {
        Self(ArcSwap::from_pointee(snapshot))
    }

    /// The current snapshot, for the duration of one routing decision.
    #[inline]
    pub fn load(&self) -> Guard<Arc<Snapshot>> {
        self.0.load()
    }

    /// An owned handle to the current snapshot (for holding across awaits).
    pub fn load_full(&self) -> Arc<Snapshot> {
        self.0.load_full()
    }

    /// Publish a new snapshot (trainer side).
    pub fn store(&self, snapshot: Snapshot) {
        self.0.store(Arc::new(snapshot));
    }
}

impl Default for SharedPredictor {
    fn default() -> Self {
        Self::new(Snapshot::empty())
    }
}

impl std::fmt::Debug for SharedPredictor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPredictor")
            .field("created_at_s", &self.0.load().created_at_s())
            .finish()
    }
}
