//! Scrape pacing: how long to wait before this node reads one replica's `/metrics` again.
//!
//! A scrape is not free for the engine. vLLM 0.32 renders about 57 KB of exposition
//! text in its API-server process; on a CPU server that costs 6.2 ms of the core the
//! engine shares (measured: 100 scrapes = 64 scheduler ticks), so the old fixed 100 ms
//! period took ~6% of that core, and on a GPU server it stalls the API server's event
//! loop, which also streams every token. The peers' routers scrape nothing or pace it.
//!
//! The scrape's wall time `w` (request sent → body read, seconds) bounds what answering
//! it cost the server from above: it spent at most that long on it. Pacing keeps the
//! share of the replica's time spent answering this node's scrapes under `max_duty`:
//!
//! ```text
//!   wait = clamp(w̄ / max_duty, interval_ms, max(interval_ms, stale_after_ms / 2))
//! ```
//!
//! with `w̄` an EWMA (α = 0.3) of `w`, so one slow answer does not halve the rate. The
//! lower bound is the configured period; the upper keeps pacing alone from ever making
//! a replica's values stale (`stale_after_ms`). `max_duty = 0` turns pacing off.
//! A busy engine answers slower, so it is scraped less often while it is busy: the
//! router's own ledger of in-flight work carries the load between scrapes.

use std::time::Duration;

use crate::config::ScrapeConfig;

/// Weight of the newest wall time in the running mean.
const ALPHA: f64 = 0.3;

/// One replica's scrape period, adapted to what its scrapes cost.
#[derive(Clone, Debug)]
pub struct ScrapePacer {
    floor_s: f64,
    cap_s: f64,
    max_duty: f64,
    wall_s: Option<f64>,
}

impl ScrapePacer {
    pub fn new(cfg: &ScrapeConfig) -> Self {
        let floor_s = cfg.interval_ms as f64 / 1e3;
        Self {
            floor_s,
            cap_s: floor_s.max(cfg.stale_after_ms as f64 / 2e3),
            max_duty: cfg.max_duty,
            wall_s: None,
        }
    }

    /// Records how long a scrape took, success or not (a timeout cost the server too).
    pub fn observe(&mut self, wall: Duration) {
        let w = wall.as_secs_f64();
        self.wall_s = Some(match self.wall_s {
            Some(m) => m + ALPHA * (w - m),
            None => w,
        });
    }

    /// The wait before the next scrape.
    pub fn next_wait(&self) -> Duration {
        let paced = match self.wall_s {
            Some(w) if self.max_duty > 0.0 => w / self.max_duty,
            _ => 0.0,
        };
        Duration::from_secs_f64(paced.clamp(self.floor_s, self.cap_s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(interval_ms: u64, stale_after_ms: u64, max_duty: f64) -> ScrapeConfig {
        ScrapeConfig {
            interval_ms,
            stale_after_ms,
            max_duty,
            ..ScrapeConfig::default()
        }
    }

    fn ms(d: Duration) -> u128 {
        d.as_millis()
    }

    #[test]
    fn cheap_scrapes_keep_the_configured_period() {
        let mut p = ScrapePacer::new(&cfg(100, 2_000, 0.01));
        assert_eq!(ms(p.next_wait()), 100, "before any scrape");
        p.observe(Duration::from_micros(300)); // an emulator: 0.3 ms → 30 ms paced
        assert_eq!(ms(p.next_wait()), 100);
    }

    #[test]
    fn costly_scrapes_are_spaced_to_the_duty_and_never_past_half_the_staleness() {
        let mut p = ScrapePacer::new(&cfg(100, 2_000, 0.01));
        p.observe(Duration::from_millis(6)); // CPU vLLM: 6 ms → 600 ms
        assert_eq!(ms(p.next_wait()), 600);
        for _ in 0..20 {
            p.observe(Duration::from_millis(40)); // a busy engine answering late
        }
        assert_eq!(ms(p.next_wait()), 1_000, "capped at stale_after_ms / 2");
    }

    #[test]
    fn one_slow_answer_moves_the_period_by_a_fraction() {
        let mut p = ScrapePacer::new(&cfg(100, 10_000, 0.01));
        p.observe(Duration::from_millis(5));
        p.observe(Duration::from_millis(25));
        // 5 + 0.3 × 20 = 11 ms → 1.1 s, not 2.5 s.
        assert_eq!(ms(p.next_wait()), 1_100);
    }

    #[test]
    fn zero_duty_turns_pacing_off() {
        let mut p = ScrapePacer::new(&cfg(250, 2_000, 0.0));
        p.observe(Duration::from_millis(50));
        assert_eq!(ms(p.next_wait()), 250);
    }

    #[test]
    fn a_period_above_half_the_staleness_is_kept() {
        let mut p = ScrapePacer::new(&cfg(1_500, 2_000, 0.01));
        p.observe(Duration::from_millis(50));
        assert_eq!(ms(p.next_wait()), 1_500);
    }
}
