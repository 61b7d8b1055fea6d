//! Replica health: active probes plus passive outlier ejection, with backoff.
//!
//! States: `Unknown` until the first success, `Healthy`, `Ejected` after
//! `eject_after_failures` consecutive failures. An ejected replica is re-admitted by
//! the first success after its ejection period; each ejection doubles the next period
//! (up to the max), and a replica healthy for a full max period starts over.

use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::config::HealthConfig;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    Unknown,
    Healthy,
    Ejected,
}

#[derive(Debug, Default)]
pub struct Health {
    state: AtomicU8,
    consecutive_failures: AtomicU32,
    ejected_until_ms: AtomicU64,
    ejections_in_a_row: AtomicU32,
    healthy_since_ms: AtomicU64,
    total_ejections: AtomicU64,
}

const HEALTHY: u8 = 1;
const EJECTED: u8 = 2;

impl Health {
    pub fn state(&self) -> HealthState {
        match self.state.load(Relaxed) {
            HEALTHY => HealthState::Healthy,
            EJECTED => HealthState::Ejected,
            _ => HealthState::Unknown,
        }
    }

    /// Only healthy replicas take traffic (the zero state is `Unknown`).
    pub fn routable(&self) -> bool {
        self.state.load(Relaxed) == HEALTHY
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Relaxed)
    }

    pub fn total_ejections(&self) -> u64 {
        self.total_ejections.load(Relaxed)
    }

    pub fn ejected_until_ms(&self) -> u64 {
        self.ejected_until_ms.load(Relaxed)
    }

    /// A probe, scrape or request succeeded at `now_ms`. Returns true on re-admission.
    pub fn on_success(&self, now_ms: u64, cfg: &HealthConfig) -> bool {
        self.consecutive_failures.store(0, Relaxed);
        match self.state.load(Relaxed) {
            EJECTED if now_ms < self.ejected_until_ms.load(Relaxed) => false,
            HEALTHY => {
                let since = self.healthy_since_ms.load(Relaxed);
                if now_ms.saturating_sub(since) > cfg.backoff_max_ms {
                    self.ejections_in_a_row.store(0, Relaxed);
                }
                false
            }
            prev => {
                self.healthy_since_ms.store(now_ms, Relaxed);
                self.state.store(HEALTHY, Relaxed);
                prev == EJECTED
            }
        }
    }

    /// A probe timed out, a connection failed or a request got a 5xx. Returns true
    /// when this failure ejected the replica.
    pub fn on_failure(&self, now_ms: u64, cfg: &HealthConfig) -> bool {
        let n = self.consecutive_failures.fetch_add(1, Relaxed) + 1;
        // An already ejected replica stays out until its current period ends.
        if n < cfg.eject_after_failures || self.state.load(Relaxed) == EJECTED {
            return false;
        }
        let k = self.ejections_in_a_row.fetch_add(1, Relaxed).min(16);
        let period = cfg
            .backoff_initial_ms
            .saturating_mul(1u64 << k)
            .min(cfg.backoff_max_ms);
        self.ejected_until_ms.store(now_ms + period, Relaxed);
        self.state.store(EJECTED, Relaxed);
        self.total_ejections.fetch_add(1, Relaxed);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> HealthConfig {
        HealthConfig {
            eject_after_failures: 3,
            backoff_initial_ms: 100,
            backoff_max_ms: 1_000,
            ..HealthConfig::default()
        }
    }

    #[test]
    fn ejects_after_consecutive_failures_and_readmits_after_backoff() {
        let h = Health::default();
        let c = cfg();
        assert_eq!(h.state(), HealthState::Unknown);
        h.on_success(0, &c);
        assert!(h.routable());
        assert!(!h.on_failure(10, &c));
        h.on_success(11, &c); // resets the streak
        assert!(!h.on_failure(12, &c));
        assert!(!h.on_failure(13, &c));
        assert!(h.on_failure(14, &c));
        assert_eq!(h.state(), HealthState::Ejected);
        assert!(!h.on_success(50, &c), "too early");
        assert!(!h.routable());
        assert!(h.on_success(120, &c));
        assert!(h.routable());
        // Second ejection doubles the period.
        for t in 130..133 {
            h.on_failure(t, &c);
        }
        assert_eq!(h.ejected_until_ms(), 132 + 200);
        assert_eq!(h.total_ejections(), 2);
    }
}
