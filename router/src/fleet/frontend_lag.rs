//! How slowly a replica's HTTP front end answers: the last `/metrics` response time, or
//! how long the scrape in flight has waited if that is longer.
//!
//! A real engine's API server (vLLM's, SGLang's) parses, tokenizes and streams for every
//! request, between the router and the engine; when it is backlogged every request
//! waits there, and no engine metric shows it. A scrape goes through the same server,
//! so its wait is a probe of that backlog. Invariant: `lag_ms` is finite and ≥ 0; 0
//! means nothing measured (a replica scraped by a peer node, or never scraped).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Written by the replica's scrape task, read by the request path (two atomics).
#[derive(Debug, Default)]
pub struct FrontendLag {
    /// The last completed scrape's response time (ms, f64 bits).
    last_ms: AtomicU64,
    /// When the scrape in flight was sent (seconds on the node clock, f64 bits);
    /// 0 when none is.
    inflight_since_s: AtomicU64,
}

impl FrontendLag {
    /// A scrape leaves at `now_s`.
    pub fn begin(&self, now_s: f64) {
        self.inflight_since_s.store(now_s.to_bits(), Relaxed);
    }

    /// The scrape sent at `sent_s` ended (answered, failed or timed out) at `now_s`.
    pub fn end(&self, sent_s: f64, now_s: f64) {
        let ms = ((now_s - sent_s) * 1e3).max(0.0);
        if ms.is_finite() {
            self.last_ms.store(ms.to_bits(), Relaxed);
        }
        self.inflight_since_s.store(0, Relaxed);
    }

    /// The front end's lag as known at `now_s` (ms).
    pub fn lag_ms(&self, now_s: f64) -> f64 {
        let last = f64::from_bits(self.last_ms.load(Relaxed));
        let since = f64::from_bits(self.inflight_since_s.load(Relaxed));
        let waiting = if since > 0.0 {
            (now_s - since) * 1e3
        } else {
            0.0
        };
        let lag = last.max(waiting);
        if lag.is_finite() { lag.max(0.0) } else { 0.0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_the_last_response_time_or_the_wait_in_flight() {
        let f = FrontendLag::default();
        assert_eq!(f.lag_ms(10.0), 0.0, "nothing measured");
        f.begin(10.0);
        f.end(10.0, 10.04);
        assert!((f.lag_ms(11.0) - 40.0).abs() < 1e-6);
        // A scrape in flight for 0.3 s says the front end is at least that slow now.
        f.begin(12.0);
        assert!((f.lag_ms(12.3) - 300.0).abs() < 1e-6);
        assert!(
            (f.lag_ms(12.01) - 40.0).abs() < 1e-6,
            "shorter waits do not hide the last"
        );
        f.end(12.0, 12.5);
        assert!((f.lag_ms(20.0) - 500.0).abs() < 1e-6);
    }
}
