//! Replica health: active probes plus passive outlier ejection, with backoff.
//!
//! States: `Unknown` until the first success, `Healthy`, `Ejected` after
//! `eject_after_failures` consecutive failures of one kind. Probes and requests keep
//! separate streaks: a replica whose `/health` answers while every stream it serves
//! breaks must still be ejected, so a probe success never clears request failures
//! (and vice versa). An ejected replica is re-admitted by
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

/// Where a health signal came from; each source keeps its own failure streak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// The active `/health` probe.
    Probe,
    /// A routed request (connect error, 5xx, broken stream, or success).
    Request,
}

#[derive(Debug, Default)]
pub struct Health {
    state: AtomicU8,
    probe_failures: AtomicU32,
    request_failures: AtomicU32,
    ejected_until_ms: AtomicU64,
    ejections_in_a_row: AtomicU32,
    healthy_since_ms: AtomicU64,
    total_ejections: AtomicU64,
    /// `now_ms + 1` at the last ejection (0: never), so operators and the chaos
    /// harness can date an ejection without polling for it.
    last_ejected_ms_plus_one: AtomicU64,
    /// 429s answered: backpressure, counted apart from failures (it never ejects).
    backpressure_total: AtomicU64,
    /// `now_ms + 1` at the last 429 (0: never).
    last_backpressure_ms_plus_one: AtomicU64,
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

    /// The longer of the two failure streaks.
    pub fn consecutive_failures(&self) -> u32 {
        self.probe_failures
            .load(Relaxed)
            .max(self.request_failures.load(Relaxed))
    }

    fn streak(&self, signal: Signal) -> &AtomicU32 {
        match signal {
            Signal::Probe => &self.probe_failures,
            Signal::Request => &self.request_failures,
        }
    }

    pub fn total_ejections(&self) -> u64 {
        self.total_ejections.load(Relaxed)
    }

    pub fn ejected_until_ms(&self) -> u64 {
        self.ejected_until_ms.load(Relaxed)
    }

    /// Seconds since the last ejection at `now_ms`, or None if never ejected.
    pub fn last_ejection_age_s(&self, now_ms: u64) -> Option<f64> {
        match self.last_ejected_ms_plus_one.load(Relaxed) {
            0 => None,
            at => Some(now_ms.saturating_sub(at - 1) as f64 / 1e3),
        }
    }

    /// The replica refused work with 429 at `now_ms`: it is alive and full. Recorded,
    /// never counted toward ejection (ejecting it would pile its load on the others).
    pub fn on_backpressure(&self, now_ms: u64) {
        self.backpressure_total.fetch_add(1, Relaxed);
        self.last_backpressure_ms_plus_one
            .store(now_ms.saturating_add(1), Relaxed);
    }

    pub fn backpressure_total(&self) -> u64 {
        self.backpressure_total.load(Relaxed)
    }

    /// Seconds since the last 429, or None if there was none.
    pub fn last_backpressure_age_s(&self, now_ms: u64) -> Option<f64> {
        match self.last_backpressure_ms_plus_one.load(Relaxed) {
            0 => None,
            at => Some(now_ms.saturating_sub(at - 1) as f64 / 1e3),
        }
    }

    /// A probe or request succeeded at `now_ms`. Returns true on re-admission.
    pub fn on_success(&self, signal: Signal, now_ms: u64, cfg: &HealthConfig) -> bool {
        self.streak(signal).store(0, Relaxed);
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
                // A fresh start: the streaks that ejected it are history.
                self.probe_failures.store(0, Relaxed);
                self.request_failures.store(0, Relaxed);
                self.healthy_since_ms.store(now_ms, Relaxed);
                self.state.store(HEALTHY, Relaxed);
                prev == EJECTED
            }
        }
    }

    /// A probe timed out, a connection failed or a request got a 5xx. Returns true
    /// when this failure ejected the replica.
    pub fn on_failure(&self, signal: Signal, now_ms: u64, cfg: &HealthConfig) -> bool {
        let n = self.streak(signal).fetch_add(1, Relaxed) + 1;
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
        self.last_ejected_ms_plus_one
            .store(now_ms.saturating_add(1), Relaxed);
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
        h.on_success(Signal::Probe, 0, &c);
        assert!(h.routable());
        assert_eq!(h.last_ejection_age_s(5), None);
        assert!(!h.on_failure(Signal::Request, 10, &c));
        h.on_success(Signal::Request, 11, &c); // resets the streak
        assert!(!h.on_failure(Signal::Request, 12, &c));
        assert!(!h.on_failure(Signal::Request, 13, &c));
        assert!(h.on_failure(Signal::Request, 14, &c));
        assert_eq!(h.state(), HealthState::Ejected);
        assert_eq!(h.last_ejection_age_s(1_014), Some(1.0));
        assert!(!h.on_success(Signal::Probe, 50, &c), "too early");
        assert!(!h.routable());
        assert!(h.on_success(Signal::Probe, 120, &c));
        assert!(h.routable());
        // Second ejection doubles the period.
        for t in 130..133 {
            h.on_failure(Signal::Probe, t, &c);
        }
        assert_eq!(h.ejected_until_ms(), 132 + 200);
        assert_eq!(h.total_ejections(), 2);
        assert_eq!(
            h.last_ejection_age_s(132),
            Some(0.0),
            "dated by the latest one"
        );
    }

    #[test]
    fn backpressure_never_ejects() {
        let h = Health::default();
        let c = cfg();
        h.on_success(Signal::Probe, 0, &c);
        for t in 1..100 {
            h.on_backpressure(t);
        }
        assert!(h.routable());
        assert_eq!(h.consecutive_failures(), 0);
        assert_eq!(h.backpressure_total(), 99);
        assert_eq!(h.last_backpressure_age_s(1_099), Some(1.0));
    }

    #[test]
    fn passing_probes_do_not_hide_breaking_requests() {
        // /health answers between broken streams: the request streak still ejects.
        let h = Health::default();
        let c = cfg();
        h.on_success(Signal::Probe, 0, &c);
        assert!(!h.on_failure(Signal::Request, 1, &c));
        h.on_success(Signal::Probe, 2, &c);
        assert!(!h.on_failure(Signal::Request, 3, &c));
        h.on_success(Signal::Probe, 4, &c);
        assert!(h.on_failure(Signal::Request, 5, &c));
        assert!(!h.routable());
        // Re-admitted by a probe after the period, with both streaks cleared.
        assert!(h.on_success(Signal::Probe, 200, &c));
        assert_eq!(h.consecutive_failures(), 0);
        assert!(!h.on_failure(Signal::Request, 201, &c));
        assert!(h.routable());
    }
}
