//! Range checks for every number in the configuration, run at start (and on reload).
//!
//! A value that would panic a worker later (`Duration::from_secs_f64(-1)`), make every
//! request fail (`max_body_bytes = 0`) or silently disable a mechanism (`explore = 5`)
//! stops the node here, with the field's TOML path and the accepted range. Every
//! problem is reported at once, so one edit fixes a file.

use std::collections::HashSet;

use super::RouterConfig;

/// Longest timeout or period accepted anywhere (one day): beyond it is a typo.
pub const MAX_MS: u64 = 86_400_000;
/// Largest objective (ms) a tenant may declare, as for SLO headers (one hour).
pub const MAX_SLO_MS: f64 = 3_600_000.0;
/// Largest request body the router will buffer (1 GiB).
pub const MAX_BODY_BYTES: usize = 1 << 30;
/// Most decision records held (≈ 4 KB each over 8 replicas: 4 GB at most).
pub const MAX_DECISION_RECORDS: usize = 1 << 20;
/// Most extra attempts per request.
pub const MAX_RETRIES: u32 = 16;

/// Largest per-minute rate (requests or tokens) a tenant may declare.
pub const MAX_PER_MINUTE: f64 = 1e12;
/// Most requests a node's admission gate may hold waiting.
pub const MAX_QUEUED: usize = 1 << 20;

/// Collects problems as `field: message`.
#[derive(Default)]
struct Problems(Vec<String>);

impl Problems {
    fn push(&mut self, field: &str, msg: impl std::fmt::Display) {
        self.0.push(format!("`{field}` {msg}"));
    }

    /// A duration or period in ms: `1..=MAX_MS`.
    fn ms(&mut self, field: &str, v: u64) {
        if v == 0 || v > MAX_MS {
            self.push(field, format!("= {v} must be in 1..={MAX_MS} ms"));
        }
    }

    /// A float in `[lo, hi]`, finite.
    fn range(&mut self, field: &str, v: f64, lo: f64, hi: f64) {
        if !(v.is_finite() && v >= lo && v <= hi) {
            self.push(
                field,
                format!("= {v} must be a finite number in [{lo}, {hi}]"),
            );
        }
    }

    /// A finite float ≥ `lo`.
    fn at_least(&mut self, field: &str, v: f64, lo: f64) {
        if !(v.is_finite() && v >= lo) {
            self.push(field, format!("= {v} must be a finite number >= {lo}"));
        }
    }

    /// A finite float > 0.
    fn positive(&mut self, field: &str, v: f64) {
        if !(v.is_finite() && v > 0.0) {
            self.push(field, format!("= {v} must be a finite number > 0"));
        }
    }

    fn nonzero(&mut self, field: &str, v: u64) {
        if v == 0 {
            self.push(field, "must be > 0");
        }
    }
}

/// Every range problem of `cfg`, joined; `Ok` when there is none.
pub fn check(cfg: &RouterConfig) -> Result<(), String> {
    let mut p = Problems::default();
    replicas(cfg, &mut p);
    fleet(cfg, &mut p);
    proxy(cfg, &mut p);
    policies(cfg, &mut p);
    tenants(cfg, &mut p);
    admission(cfg, &mut p);
    mesh(cfg, &mut p);
    tracing(cfg, &mut p);
    regions(cfg, &mut p);
    super::edge::validate(&cfg.edge, cfg, &mut |f, m| p.push(f, m));
    if p.0.is_empty() {
        Ok(())
    } else {
        Err(p.0.join("; "))
    }
}

fn replicas(cfg: &RouterConfig, p: &mut Problems) {
    let mut seen = HashSet::new();
    for (i, r) in cfg.replicas.iter().enumerate() {
        let shown = super::url::redact_url(&r.url);
        if !seen.insert(r.url.trim_end_matches('/')) {
            p.push(
                &format!("replicas[{i}].url"),
                format!("`{shown}` is listed twice"),
            );
        }
        if r.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
            p.push(&format!("replicas[{i}].name"), "must not be empty");
        }
        if r.max_batched_tokens == Some(0) {
            p.push(&format!("replicas[{i}].max_batched_tokens"), "must be > 0");
        }
        if let Some(e) = &r.kv_events
            && e != "discover"
            && !is_zmq_tcp(e)
        {
            p.push(
                &format!("replicas[{i}].kv_events"),
                format!("= `{e}` must be `tcp://HOST:PORT` or `discover`"),
            );
        }
        if let Some(e) = &r.kv_replay
            && !is_zmq_tcp(e)
        {
            p.push(
                &format!("replicas[{i}].kv_replay"),
                format!("= `{e}` must be `tcp://HOST:PORT`"),
            );
        }
        if r.kv_events.is_none() && (r.kv_replay.is_some() || r.kv_topic.is_some()) {
            p.push(
                &format!("replicas[{i}].kv_replay"),
                "and kv_topic need kv_events",
            );
        }
        if r.kv_block_size.is_some_and(|b| b == 0 || b > 65_536) {
            p.push(
                &format!("replicas[{i}].kv_block_size"),
                "must be in 1..=65536",
            );
        }
    }
    if let Some(d) = &cfg.discovery {
        if d.name.trim().is_empty() || !d.name.contains(':') {
            p.push("discovery.name", "must be `host:port`");
        }
        if !(100..=MAX_MS).contains(&d.interval_ms) {
            p.push(
                "discovery.interval_ms",
                format!("= {} must be in 100..={MAX_MS}", d.interval_ms),
            );
        }
    }
    let mut models = HashSet::new();
    for (i, m) in cfg.models.iter().enumerate() {
        if m.name.trim().is_empty() {
            p.push(&format!("models[{i}].name"), "must not be empty");
        } else if !models.insert(m.name.as_str()) {
            p.push(
                &format!("models[{i}].name"),
                format!("`{}` is listed twice", m.name),
            );
        }
    }
}

fn fleet(cfg: &RouterConfig, p: &mut Problems) {
    let s = &cfg.scrape;
    p.ms("scrape.interval_ms", s.interval_ms);
    p.range("scrape.max_duty", s.max_duty, 0.0, 0.5);
    p.ms("scrape.timeout_ms", s.timeout_ms);
    p.ms("scrape.stale_after_ms", s.stale_after_ms);
    p.ms("scrape.models_interval_ms", s.models_interval_ms);
    if s.stale_after_ms < s.interval_ms {
        p.push(
            "scrape.stale_after_ms",
            format!(
                "= {} is shorter than scrape.interval_ms = {}: every scrape would be stale",
                s.stale_after_ms, s.interval_ms
            ),
        );
    }
    let h = &cfg.health;
    p.ms("health.probe_interval_ms", h.probe_interval_ms);
    p.ms("health.probe_timeout_ms", h.probe_timeout_ms);
    p.nonzero("health.eject_after_failures", h.eject_after_failures.into());
    p.ms("health.backoff_initial_ms", h.backoff_initial_ms);
    p.ms("health.backoff_max_ms", h.backoff_max_ms);
    if h.backoff_max_ms < h.backoff_initial_ms {
        p.push(
            "health.backoff_max_ms",
            "must be >= health.backoff_initial_ms",
        );
    }
    let x = &cfg.prefix;
    if x.block_tokens == 0 || x.block_tokens > 65_536 {
        p.push(
            "prefix.block_tokens",
            format!("= {} must be in 1..=65536", x.block_tokens),
        );
    }
    p.nonzero("prefix.max_entries", x.max_entries as u64);
    p.nonzero(
        "prefix.max_blocks_per_request",
        x.max_blocks_per_request as u64,
    );
    p.ms("predictor_publish_ms", cfg.predictor_publish_ms);
    let k = &cfg.kv_events;
    p.nonzero("kv_events.max_blocks", k.max_blocks as u64);
    p.ms("kv_events.silence_timeout_ms", k.silence_timeout_ms);
    p.ms("kv_events.replay_timeout_ms", k.replay_timeout_ms);
    p.ms("kv_events.check_interval_ms", k.check_interval_ms);
    if cfg.decision_records > MAX_DECISION_RECORDS {
        p.push(
            "decision_records",
            format!(
                "= {} must be in 0..={MAX_DECISION_RECORDS}",
                cfg.decision_records
            ),
        );
    }
    if cfg.request_log.is_some() && cfg.decision_records == 0 {
        p.push(
            "request_log",
            "is written from decision records: set `decision_records` > 0",
        );
    }
}

/// Most spans a node may hold for export (≈ 1 KB each: 1 GB at most).
pub const MAX_QUEUED_SPANS: usize = 1 << 20;

fn tracing(cfg: &RouterConfig, p: &mut Problems) {
    let t = &cfg.tracing;
    if let Some(e) = &t.otlp_endpoint
        && let Err(why) = super::url::traces_url(e)
    {
        p.push("tracing.otlp_endpoint", why);
    }
    if t.service_name.trim().is_empty() {
        p.push("tracing.service_name", "must not be empty");
    }
    p.range("tracing.sample_ratio", t.sample_ratio, 0.0, 1.0);
    if t.max_queued_spans == 0 || t.max_queued_spans > MAX_QUEUED_SPANS {
        p.push(
            "tracing.max_queued_spans",
            format!("= {} must be in 1..={MAX_QUEUED_SPANS}", t.max_queued_spans),
        );
    }
    p.ms("tracing.export_interval_ms", t.export_interval_ms);
    p.ms("tracing.export_timeout_ms", t.export_timeout_ms);
}

/// `tcp://HOST:PORT` with a numeric port (what a ZMQ SUB can connect to; `*` is
/// vLLM's bind-everywhere, not an address).
fn is_zmq_tcp(e: &str) -> bool {
    e.strip_prefix("tcp://")
        .and_then(|hp| hp.rsplit_once(':'))
        .is_some_and(|(h, port)| {
            !h.is_empty() && h != "*" && port.parse::<u16>().is_ok_and(|p| p > 0)
        })
}

fn proxy(cfg: &RouterConfig, p: &mut Problems) {
    let x = &cfg.proxy;
    if x.max_body_bytes == 0 || x.max_body_bytes > MAX_BODY_BYTES {
        p.push(
            "proxy.max_body_bytes",
            format!("= {} must be in 1..={MAX_BODY_BYTES}", x.max_body_bytes),
        );
    }
    if x.retries > MAX_RETRIES {
        p.push(
            "proxy.retries",
            format!("= {} must be in 0..={MAX_RETRIES}", x.retries),
        );
    }
    if x.failover_attempts > MAX_RETRIES {
        p.push(
            "proxy.failover_attempts",
            format!("= {} must be in 0..={MAX_RETRIES}", x.failover_attempts),
        );
    }
    p.ms("proxy.connect_timeout_ms", x.connect_timeout_ms);
    p.ms("proxy.first_byte_timeout_ms", x.first_byte_timeout_ms);
    p.ms("proxy.idle_timeout_ms", x.idle_timeout_ms);
    if x.retry_backoff_ms > 60_000 {
        p.push(
            "proxy.retry_backoff_ms",
            format!("= {} must be in 0..=60000", x.retry_backoff_ms),
        );
    }
}

/// `[pd]`: a transfer model that cannot produce a NaN or a negative time.
fn pd(cfg: &RouterConfig, p: &mut Problems) {
    let d = &cfg.pd;
    p.range("pd.kv_bytes_per_token", d.kv_bytes_per_token, 1.0, 1e9);
    p.range("pd.link_gbytes_per_s", d.link_gbytes_per_s, 1e-3, 1e6);
    p.range("pd.link_latency_ms", d.link_latency_ms, 0.0, 60_000.0);
    p.range("pd.link_learning_rate", d.link_learning_rate, 1e-3, 1.0);
}

fn policies(cfg: &RouterConfig, p: &mut Problems) {
    pd(cfg, p);
    let s = &cfg.slo;
    p.range("slo.near_equal", s.near_equal, 0.0, 1.0);
    p.range("slo.cost_tolerance", s.cost_tolerance, 0.0, 100.0);
    p.range("slo.hysteresis", s.hysteresis, 0.0, 1.0);
    p.at_least("slo.cache_weight", s.cache_weight, 0.0);
    p.range("slo.explore", s.explore, 0.0, 1.0);
    p.range("slo.min_warm_fraction", s.min_warm_fraction, 0.0, 1.0);
    p.ms("slo.defer_poll_ms", s.defer_poll_ms);
    p.range("slo.defer_budget", s.defer_budget, 0.0, 1.0);
    p.at_least("slo.probe_idle_s", s.probe_idle_s, 0.0);
    p.range("slo.hold", s.hold, 0.0, 1.0);
    p.range("slo.shed_queue_age", s.shed_queue_age, 0.0, 100.0);
    p.range("slo.reject_above", s.reject_above, 0.0, 1.0);
    p.range("slo.pack_share", s.pack_share, 0.0, 1.0);
    p.range("slo.pack_ratio", s.pack_ratio, 1.0, 1e6);
    if s.probe_idle_s > MAX_MS as f64 / 1e3 {
        p.push("slo.probe_idle_s", "must be at most one day");
    }
    let a = &cfg.prefix_affinity;
    p.range(
        "prefix_affinity.affinity_threshold",
        a.affinity_threshold,
        0.0,
        1.0,
    );
    p.positive("prefix_affinity.peak_prefill_tps", a.peak_prefill_tps);
    p.at_least(
        "prefix_affinity.max_ttft_penalty_ms",
        a.max_ttft_penalty_ms,
        0.0,
    );
    p.at_least(
        "prefix_affinity.max_request_excess",
        a.max_request_excess,
        0.0,
    );
}

fn tenants(cfg: &RouterConfig, p: &mut Problems) {
    let mut names = HashSet::new();
    let mut keys = HashSet::new();
    for (i, t) in cfg.tenants.iter().enumerate() {
        let f = |k: &str| format!("tenants[{i}].{k}");
        if t.name.trim().is_empty() {
            p.push(&f("name"), "must not be empty");
        } else if !names.insert(t.name.as_str()) {
            p.push(&f("name"), format!("`{}` is listed twice", t.name));
        }
        for (k, v) in [
            ("slo_ttft_ms", t.slo_ttft_ms),
            ("slo_tpot_ms", t.slo_tpot_ms),
            ("min_ttft_ms", t.min_ttft_ms),
            ("min_tpot_ms", t.min_tpot_ms),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= MAX_SLO_MS) {
                p.push(&f(k), format!("= {v} must be in (0, {MAX_SLO_MS}] ms"));
            }
        }
        // A weight of 0 or NaN would starve the tenant or poison everyone's share.
        p.range(&f("weight"), t.weight, 1e-3, 1e6);
        p.range(&f("rpm"), t.rpm, 0.0, MAX_PER_MINUTE);
        p.range(&f("tpm"), t.tpm, 0.0, MAX_PER_MINUTE);
        if t.min_ttft_ms > t.slo_ttft_ms {
            p.push(&f("min_ttft_ms"), "must be <= slo_ttft_ms");
        }
        if t.min_tpot_ms > t.slo_tpot_ms {
            p.push(&f("min_tpot_ms"), "must be <= slo_tpot_ms");
        }
        for k in &t.api_keys {
            if k.trim().is_empty() || k.trim() != k || k.chars().any(char::is_control) {
                p.push(
                    &f("api_keys"),
                    "holds an empty key or one with spaces or control characters",
                );
            } else if !keys.insert(k.as_str()) {
                // Never echo a secret: name the tenant only.
                p.push(
                    &f("api_keys"),
                    "holds a key already given to another tenant",
                );
            }
        }
    }
}

fn admission(cfg: &RouterConfig, p: &mut Problems) {
    let a = &cfg.admission;
    p.ms("admission.max_wait_ms", a.max_wait_ms);
    p.ms("admission.poll_ms", a.poll_ms);
    if a.poll_ms > a.max_wait_ms {
        p.push("admission.poll_ms", "must be <= admission.max_wait_ms");
    }
    if a.max_queued > MAX_QUEUED {
        p.push(
            "admission.max_queued",
            format!("= {} must be in 0..={MAX_QUEUED}", a.max_queued),
        );
    }
    if a.per_replica_in_flight > 1 << 20 {
        p.push(
            "admission.per_replica_in_flight",
            format!("= {} must be in 0..=1048576", a.per_replica_in_flight),
        );
    }
}

fn mesh(cfg: &RouterConfig, p: &mut Problems) {
    let m = &cfg.mesh;
    p.ms("mesh.gossip_interval_ms", m.gossip_interval_ms);
    p.ms("mesh.inflight_interval_ms", m.inflight_interval_ms);
    p.ms("mesh.heartbeat_ms", m.heartbeat_ms);
    p.ms("mesh.peer_ttl_ms", m.peer_ttl_ms);
    p.ms("mesh.prefix_interval_ms", m.prefix_interval_ms);
    p.ms("mesh.predictor_interval_ms", m.predictor_interval_ms);
    if m.peer_ttl_ms < m.heartbeat_ms {
        p.push(
            "mesh.peer_ttl_ms",
            "must be >= mesh.heartbeat_ms (else every peer report expires before the next)",
        );
    }
    p.nonzero("mesh.scrape_owners", m.scrape_owners as u64);
    p.ms("mesh.scrape_publish_ms", m.scrape_publish_ms);
    // Published once a period and judged by publication age, a scrape must reach peers
    // well before it turns stale there.
    if m.listen.is_some() && m.scrape_publish_ms.saturating_mul(2) > cfg.scrape.stale_after_ms {
        p.push(
            "mesh.scrape_publish_ms",
            format!(
                "= {} must be at most half of scrape.stale_after_ms = {} (peers would see the shared scrapes stale)",
                m.scrape_publish_ms, cfg.scrape.stale_after_ms
            ),
        );
    }
    if m.region.trim().is_empty() {
        p.push("mesh.region", "must not be empty");
    }
    if m.cluster_id.trim().is_empty() {
        p.push("mesh.cluster_id", "must not be empty");
    }
    if m.listen.is_some() && m.tls_dir.is_none() {
        p.push(
            "mesh.tls_dir",
            "must be set when mesh.listen is (see `headroom certs`)",
        );
    }
}

fn regions(cfg: &RouterConfig, p: &mut Problems) {
    let r = &cfg.regions;
    if let Err(e) = r.check() {
        p.push("regions.rtt_ms", e);
    }
    p.range("regions.default_rtt_ms", r.default_rtt_ms, 0.0, 10_000.0);
    p.ms("regions.summary_ttl_ms", r.summary_ttl_ms);
    p.ms("regions.summary_interval_ms", r.summary_interval_ms);
    if r.summary_ttl_ms < r.summary_interval_ms {
        p.push(
            "regions.summary_ttl_ms",
            "must be >= regions.summary_interval_ms (else every summary expires before the next)",
        );
    }
    for (i, rc) in cfg.replicas.iter().enumerate() {
        if rc.region.as_deref().is_some_and(|n| n.trim().is_empty()) {
            p.push(&format!("replicas[{i}].region"), "must not be empty");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_tables_are_checked() {
        let mut cfg = RouterConfig::default();
        cfg.regions.rtt_ms.insert("eu-1/us-1".into(), 50.0);
        assert!(check(&cfg).is_ok());
        cfg.regions.rtt_ms.insert("us-1/eu-1".into(), 60.0);
        cfg.regions.default_rtt_ms = -1.0;
        cfg.regions.summary_ttl_ms = 10;
        let e = check(&cfg).unwrap_err();
        assert!(e.contains("`regions.rtt_ms`") && e.contains("twice"), "{e}");
        assert!(e.contains("`regions.default_rtt_ms`"), "{e}");
        assert!(e.contains("`regions.summary_ttl_ms`"), "{e}");
    }

    fn problems(edit: impl FnOnce(&mut RouterConfig)) -> String {
        let mut c = RouterConfig::default();
        edit(&mut c);
        check(&c).err().unwrap_or_default()
    }

    #[test]
    fn defaults_pass() {
        assert_eq!(check(&RouterConfig::default()), Ok(()));
    }

    #[test]
    fn every_problem_is_reported_with_its_field() {
        let e = problems(|c| {
            c.slo.defer_budget = -1.0;
            c.slo.explore = 5.0;
            c.slo.shed_queue_age = f64::NAN;
            c.proxy.first_byte_timeout_ms = 0;
        });
        assert!(e.contains("`slo.defer_budget` = -1"), "{e}");
        assert!(e.contains("`slo.explore` = 5"), "{e}");
        assert!(e.contains("slo.shed_queue_age"), "{e}");
        assert!(e.contains("`proxy.first_byte_timeout_ms` = 0"), "{e}");
        let e = problems(|c| {
            c.pd.link_gbytes_per_s = 0.0;
            c.pd.kv_bytes_per_token = f64::NAN;
        });
        assert!(e.contains("`pd.link_gbytes_per_s` = 0"), "{e}");
        assert!(e.contains("`pd.kv_bytes_per_token` = NaN"), "{e}");
    }

    #[test]
    fn tracing_settings_are_checked() {
        let mut c = RouterConfig::default();
        c.tracing.otlp_endpoint = Some("https://collector:4318".into());
        c.tracing.sample_ratio = 1.5;
        c.tracing.max_queued_spans = 0;
        let e = check(&c).unwrap_err();
        for f in [
            "tracing.otlp_endpoint",
            "tracing.sample_ratio",
            "tracing.max_queued_spans",
        ] {
            assert!(e.contains(f), "{f} missing from: {e}");
        }
        c.tracing = Default::default();
        c.tracing.otlp_endpoint = Some("http://127.0.0.1:4318".into());
        check(&c).unwrap();
    }

    #[test]
    fn admission_numbers_are_range_checked() {
        let e = problems(|c| {
            c.tenants = vec![crate::config::TenantConfig {
                weight: 0.0,
                rpm: f64::NAN,
                tpm: -5.0,
                ..crate::config::TenantConfig::default_tenant()
            }];
            c.admission.max_wait_ms = 0;
            c.admission.poll_ms = 10;
            c.admission.max_queued = usize::MAX;
        });
        for want in [
            "`tenants[0].weight` = 0",
            "`tenants[0].rpm` = NaN",
            "`tenants[0].tpm` = -5",
            "`admission.max_wait_ms` = 0",
            "`admission.poll_ms` must be <=",
            "`admission.max_queued`",
        ] {
            assert!(e.contains(want), "{want} not in {e}");
        }
        // Weights and limits as a user writes them pass.
        let ok = problems(|c| {
            c.tenants = vec![crate::config::TenantConfig {
                weight: 3.0,
                rpm: 600.0,
                tpm: 1e6,
                max_concurrency: 8,
                ..crate::config::TenantConfig::default_tenant()
            }];
            c.admission.per_replica_in_flight = 16;
        });
        assert_eq!(ok, "");
    }

    #[test]
    fn kv_event_sources_must_be_connectable() {
        let with = |events: Option<&str>, replay: Option<&str>| {
            problems(|c| {
                c.replicas.push(crate::config::ReplicaConfig {
                    url: "http://10.0.0.1:8000".into(),
                    kv_events: events.map(str::to_string),
                    kv_replay: replay.map(str::to_string),
                    ..Default::default()
                });
                c.kv_events.max_blocks = 0;
            })
        };
        let ok = with(Some("tcp://10.0.0.1:5557"), Some("tcp://10.0.0.1:5558"));
        assert!(!ok.contains("replicas[0]"), "{ok}");
        assert!(ok.contains("`kv_events.max_blocks`"), "{ok}");
        assert!(!with(Some("discover"), None).contains("replicas[0]"));
        let bad = with(Some("tcp://*:5557"), None);
        assert!(bad.contains("`replicas[0].kv_events`"), "{bad}");
        let bad = with(Some("zmq://h:1"), Some("h:2"));
        assert!(bad.contains("`replicas[0].kv_replay`"), "{bad}");
        assert!(with(None, Some("tcp://h:1")).contains("need kv_events"));
    }
}
