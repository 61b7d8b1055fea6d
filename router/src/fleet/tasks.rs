//! Background work per replica: scrape `/metrics`, probe `/health`, read
//! `/v1/models`; and DNS discovery. Every loop ends when its token is cancelled.

use std::{collections::HashSet, sync::Arc, time::Duration};

use rand::Rng;
use serde_json::Value;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{
    Fleet, ModelEntry, Replica, ServedModels, Signal, pacing::ScrapePacer, parse_metrics,
    view::Origin,
};
use crate::{clock, config::DnsDiscovery, config::ReplicaConfig, upstream};

const METRICS_MAX_BYTES: usize = 4 << 20;
const MODELS_MAX_BYTES: usize = 1 << 20;

/// How scraping is shared with other router nodes (the mesh implements it).
pub trait ScrapeShare: Send + Sync {
    /// Whether this node should scrape `replica` now (it is one of its owners).
    fn should_scrape(&self, replica: &Replica) -> bool;
    /// A scrape this node made, for its peers.
    fn scraped(&self, replica: &Arc<Replica>, s: &Arc<super::Scraped>);
}

pub fn spawn_replica_tasks(
    fleet: Arc<Fleet>,
    replica: Arc<Replica>,
    token: CancellationToken,
    tracker: &TaskTracker,
) {
    tracker.spawn(scrape_loop(fleet.clone(), replica.clone(), token.clone()));
    tracker.spawn(probe_loop(fleet.clone(), replica.clone(), token.clone()));
    tracker.spawn(models_loop(fleet, replica, token));
}

/// Sleeps `period` with ±10% jitter (so nodes and replicas do not tick in phase);
/// false when cancelled.
async fn pause(period: Duration, token: &CancellationToken) -> bool {
    let jitter = rand::rng().random_range(0.9..1.1);
    tokio::select! {
        _ = token.cancelled() => false,
        _ = tokio::time::sleep(period.mul_f64(jitter)) => true,
    }
}

async fn scrape_loop(fleet: Arc<Fleet>, r: Arc<Replica>, token: CancellationToken) {
    let cfg = &fleet.cfg.scrape;
    let period = Duration::from_millis(cfg.interval_ms);
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let mut pacer = ScrapePacer::new(cfg);
    loop {
        let share = fleet.share();
        if share.as_ref().is_some_and(|s| !s.should_scrape(&r)) {
            // Another node owns this replica's scrape; its result arrives by gossip.
            if !pause(period, &token).await {
                return;
            }
            continue;
        }
        // Stamped when the request leaves: a busy engine can take seconds to answer, and
        // the state it reports is no older than this, so ages are never understated.
        let now = clock::now_s();
        let sent = std::time::Instant::now();
        let result = upstream::get(
            &fleet.client,
            &r.base,
            "/metrics",
            timeout,
            METRICS_MAX_BYTES,
        )
        .await;
        pacer.observe(sent.elapsed());
        match result {
            Ok((status, body)) if status.is_success() => {
                let text = String::from_utf8_lossy(&body);
                let prev = r.scraped.load();
                match parse_metrics(&text, prev.as_ref(), now) {
                    Ok(s) => {
                        fleet.note_scrape(&r, prev.as_ref(), &s, "own");
                        if s.rejected_values > 0 {
                            fleet
                                .metrics
                                .scrape_rejected_values(&r.name, s.rejected_values);
                        }
                        r.scraped.store(Some(s));
                        let s = Arc::new(s);
                        if let Some(share) = &share {
                            share.scraped(&r, &s);
                        }
                    }
                    Err(e) => {
                        fleet.metrics.scrape_error(&r.name, "parse");
                        tracing::debug!(replica = %r.name, "unreadable metrics: {e}");
                    }
                }
            }
            Ok((status, _)) => {
                fleet.metrics.scrape_error(&r.name, "status");
                tracing::debug!(replica = %r.name, %status, "metrics endpoint answered non-2xx");
            }
            Err(e) => {
                fleet.metrics.scrape_error(&r.name, "fetch");
                tracing::debug!(replica = %r.name, "scrape failed: {e}");
            }
        }
        let wait = pacer.next_wait();
        fleet.metrics.set_scrape_period(&r.name, wait);
        if !pause(wait, &token).await {
            return;
        }
    }
}

async fn probe_loop(fleet: Arc<Fleet>, r: Arc<Replica>, token: CancellationToken) {
    let cfg = &fleet.cfg.health;
    let period = Duration::from_millis(cfg.probe_interval_ms);
    let timeout = Duration::from_millis(cfg.probe_timeout_ms);
    loop {
        let got = upstream::get(&fleet.client, &r.base, "/health", timeout, 4096).await;
        let ok = matches!(got, Ok((s, _)) if s.is_success());
        let now = clock::now_ms();
        if let Err(upstream::FetchError::LocalExhausted(e)) = &got {
            // Out of descriptors here: the probe never reached the replica.
            tracing::debug!(replica = %r.name, "health probe not sent: {e}");
        } else if ok {
            if r.health.on_success(Signal::Probe, now, cfg) {
                tracing::info!(replica = %r.name, "replica re-admitted");
            }
        } else if r.health.on_failure(Signal::Probe, now, cfg) {
            fleet.metrics.ejection(&r.name);
            tracing::warn!(replica = %r.name, "replica ejected: health probes failing");
        }
        fleet.metrics.set_health(&r.name, r.health.routable());
        if !pause(period, &token).await {
            return;
        }
    }
}

/// Parses `/v1/models` (OpenAI list; vLLM adds `parent` and `max_model_len`).
pub fn parse_models(body: &[u8]) -> Result<Vec<ModelEntry>, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let data = v
        .get("data")
        .and_then(Value::as_array)
        .ok_or("no `data` list")?;
    Ok(data
        .iter()
        .filter_map(|m| {
            Some(ModelEntry {
                id: m.get("id")?.as_str()?.to_string(),
                parent: m.get("parent").and_then(Value::as_str).map(str::to_string),
                max_model_len: m
                    .get("max_model_len")
                    .and_then(Value::as_u64)
                    .and_then(|n| u32::try_from(n).ok()),
            })
        })
        .collect())
}

async fn models_loop(fleet: Arc<Fleet>, r: Arc<Replica>, token: CancellationToken) {
    let slow = Duration::from_millis(fleet.cfg.scrape.models_interval_ms);
    let fast = Duration::from_millis(fleet.cfg.health.probe_interval_ms.min(250));
    let timeout = Duration::from_millis(fleet.cfg.health.probe_timeout_ms);
    loop {
        let got = upstream::get(
            &fleet.client,
            &r.base,
            "/v1/models",
            timeout,
            MODELS_MAX_BYTES,
        )
        .await;
        let known = match got {
            Ok((s, body)) if s.is_success() => match parse_models(&body) {
                Ok(models) => {
                    r.models.store(Arc::new(ServedModels {
                        models,
                        known: true,
                    }));
                    true
                }
                Err(e) => {
                    tracing::debug!(replica = %r.name, "unreadable /v1/models: {e}");
                    false
                }
            },
            _ => false,
        };
        // Poll quickly until the replica has told us what it serves.
        let period = if known || r.models.load().known {
            slow
        } else {
            fast
        };
        if !pause(period, &token).await {
            return;
        }
    }
}

pub async fn dns_loop(fleet: Arc<Fleet>, d: DnsDiscovery, token: CancellationToken) {
    let period = Duration::from_millis(d.interval_ms.max(100));
    loop {
        match tokio::net::lookup_host(d.name.as_str()).await {
            Ok(addrs) => {
                let want: HashSet<String> = addrs.map(|a| format!("http://{a}")).collect();
                let have = fleet.urls_of(Origin::Dns);
                for url in want.iter().filter(|u| !have.contains_key(*u)) {
                    let rc = ReplicaConfig {
                        url: url.clone(),
                        name: None,
                        class: d.class.clone(),
                        region: d.region.clone(),
                        role: d.role,
                        max_batched_tokens: None,
                        ..Default::default()
                    };
                    if let Err(e) = fleet.add(&rc, Origin::Dns) {
                        tracing::warn!("DNS replica {url}: {e}");
                    }
                }
                for (url, id) in have {
                    if !want.contains(&url) {
                        tracing::info!(%url, "replica left DNS");
                        fleet.remove(id);
                    }
                }
            }
            Err(e) => tracing::warn!(name = %d.name, "DNS lookup failed: {e}"),
        }
        if !pause(period, &token).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn models_list() {
        let m = super::parse_models(
            br#"{"object":"list","data":[{"id":"base","max_model_len":4096},{"id":"lora1","parent":"base"},{"bad":1}]}"#,
        )
        .unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].max_model_len, Some(4096));
        assert_eq!(m[1].parent.as_deref(), Some("base"));
        assert!(super::parse_models(b"[]").is_err());
    }
}
