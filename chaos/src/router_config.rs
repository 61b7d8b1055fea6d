//! The router settings chaos runs use, written as a `headroom serve --config` file.
//!
//! Production defaults wait a minute for a first byte; scenarios run in seconds, so
//! the health, proxy and scrape timings are tightened here (and printed in every
//! report, so a bound is always read against the timings that produced it).

use serde::Serialize;

/// Health, proxy and scrape timings of every router node in a scenario (ms).
#[derive(Clone, Debug, Serialize)]
pub struct RouterTimings {
    pub probe_interval_ms: u64,
    pub probe_timeout_ms: u64,
    pub eject_after_failures: u32,
    pub backoff_initial_ms: u64,
    pub backoff_max_ms: u64,
    pub connect_timeout_ms: u64,
    pub first_byte_timeout_ms: u64,
    pub idle_timeout_ms: u64,
    pub retries: u32,
    /// Continuations a stream cut mid-way may get (0: mid-stream failover off).
    pub failover_attempts: u32,
    pub scrape_interval_ms: u64,
    pub scrape_timeout_ms: u64,
    pub stale_after_ms: u64,
    /// `scrape.max_duty`: the share of a replica's time its scrapes may take (0: the
    /// configured period always, pacing off).
    pub scrape_max_duty: f64,
    /// `admission.per_replica_in_flight` (0: the capacity gate off, the default) and
    /// `admission.max_wait_ms` (written only with the gate on).
    pub admission_per_replica: u32,
    pub admission_max_wait_ms: u64,
    /// `mesh.gossip_interval_ms` (chitchat's round; its digest costs ≈ 45 B per member
    /// per message, so large meshes gossip less often) and `mesh.scrape_publish_ms`
    /// (at most half of `stale_after_ms`).
    pub gossip_interval_ms: u64,
    pub scrape_publish_ms: u64,
    /// More TOML appended to every node's config (e.g. a `[slo]` table), for A/B runs
    /// of a setting; empty by default.
    pub extra_toml: String,
}

impl Default for RouterTimings {
    fn default() -> Self {
        RouterTimings {
            probe_interval_ms: 100,
            probe_timeout_ms: 300,
            eject_after_failures: 3,
            backoff_initial_ms: 500,
            backoff_max_ms: 4_000,
            connect_timeout_ms: 500,
            first_byte_timeout_ms: 3_000,
            idle_timeout_ms: 2_000,
            retries: 2,
            failover_attempts: 2,
            scrape_interval_ms: 100,
            scrape_timeout_ms: 300,
            stale_after_ms: 1_000,
            scrape_max_duty: 0.01,
            admission_per_replica: 0,
            admission_max_wait_ms: 5_000,
            gossip_interval_ms: 100,
            scrape_publish_ms: 500,
            extra_toml: String::new(),
        }
    }
}

impl RouterTimings {
    /// The TOML text of a config file with these timings (listen address, replicas
    /// and mesh come from flags).
    pub fn toml(&self) -> String {
        let mut t = format!(
            "[health]\nprobe_interval_ms = {}\nprobe_timeout_ms = {}\neject_after_failures = {}\n\
             backoff_initial_ms = {}\nbackoff_max_ms = {}\n\n\
             [proxy]\nconnect_timeout_ms = {}\nfirst_byte_timeout_ms = {}\nidle_timeout_ms = {}\n\
             retries = {}\nfailover_attempts = {}\n\n\
             [scrape]\ninterval_ms = {}\ntimeout_ms = {}\nstale_after_ms = {}\nmax_duty = {:?}\n",
            self.probe_interval_ms,
            self.probe_timeout_ms,
            self.eject_after_failures,
            self.backoff_initial_ms,
            self.backoff_max_ms,
            self.connect_timeout_ms,
            self.first_byte_timeout_ms,
            self.idle_timeout_ms,
            self.retries,
            self.failover_attempts,
            self.scrape_interval_ms,
            self.scrape_timeout_ms,
            self.stale_after_ms,
            self.scrape_max_duty,
        );
        t.push_str(&format!(
            "\n[mesh]\ngossip_interval_ms = {}\nscrape_publish_ms = {}\n",
            self.gossip_interval_ms, self.scrape_publish_ms
        ));
        if self.admission_per_replica > 0 {
            t.push_str(&format!(
                "\n[admission]\nper_replica_in_flight = {}\nmax_wait_ms = {}\n",
                self.admission_per_replica, self.admission_max_wait_ms
            ));
        }
        if !self.extra_toml.is_empty() {
            t.push('\n');
            t.push_str(&self.extra_toml);
            t.push('\n');
        }
        t
    }

    /// Worst-case time for probes to eject a replica whose `/health` fails or hangs.
    pub fn ejection_bound_s(&self) -> f64 {
        let per_probe = (self.probe_interval_ms + self.probe_timeout_ms) as f64 / 1e3;
        per_probe * f64::from(self.eject_after_failures) * 1.1 + 1.0
    }

    /// Worst-case time from recovery to re-admission (longest backoff plus a probe).
    pub fn readmission_bound_s(&self) -> f64 {
        (self.backoff_max_ms + self.probe_interval_ms + self.probe_timeout_ms) as f64 / 1e3 + 1.0
    }
}
