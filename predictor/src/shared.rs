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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Learner, Observation, PredictorConfig, ReplicaKey, Sample};

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn handles_cross_threads_and_store_replaces_the_snapshot() {
        assert_send_sync::<SharedPredictor>();
        assert_send_sync::<Snapshot>();
        assert_send::<Learner>();
        let shared = SharedPredictor::default();
        assert_eq!(shared.load().created_at_s(), 0.0);
        // Unix-epoch times work as well as a virtual axis starting at 0.
        let mut l = Learner::new(PredictorConfig::default());
        let t0 = 1.7e9;
        for i in 0..50 {
            l.observe(&Sample {
                key: ReplicaKey::new(1, 0),
                obs: Observation {
                    prompt_tokens: 100.0 * f64::from(i + 1),
                    ..Default::default()
                },
                at_s: t0 + f64::from(i),
                ttft_ms: Some(20.0 + 0.05 * 100.0 * f64::from(i + 1)),
                ..Default::default()
            });
        }
        shared.store(l.snapshot(t0 + 50.0));
        let s = shared.load_full();
        assert_eq!(s.created_at_s(), t0 + 50.0);
        let p = s.predict(
            ReplicaKey::new(1, 0),
            &Observation {
                prompt_tokens: 3000.0,
                ..Default::default()
            },
        );
        assert!((p.ttft_ms / 170.0 - 1.0).abs() < 0.1, "{}", p.ttft_ms);
    }
}
