//! Counters of sanitised and rejected inputs, shared by a learner and its snapshots.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub sanitized_predictions: AtomicU64,
    pub sanitized_samples: AtomicU64,
    pub rejected_labels: AtomicU64,
    pub rejected_slots: AtomicU64,
}

/// A point-in-time copy of the counters, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CounterValues {
    /// predict() calls whose observation had NaN/inf/negative/inconsistent fields.
    pub sanitized_predictions: u64,
    /// Samples whose observation had to be sanitised.
    pub sanitized_samples: u64,
    /// Labels ignored: non-finite or non-positive latency, bad timestamp, TPOT with < 2 tokens.
    pub rejected_labels: u64,
    /// Federation slots refused by validation.
    pub rejected_slots: u64,
}

impl Counters {
    pub fn values(&self) -> CounterValues {
        CounterValues {
            sanitized_predictions: self.sanitized_predictions.load(Ordering::Relaxed),
            sanitized_samples: self.sanitized_samples.load(Ordering::Relaxed),
            rejected_labels: self.rejected_labels.load(Ordering::Relaxed),
            rejected_slots: self.rejected_slots.load(Ordering::Relaxed),
        }
    }

    #[inline]
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}
