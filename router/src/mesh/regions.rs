//! Regions across the mesh: every node publishes its region's summary
//! (`summary/<region>`, a `RegionSummary`, on the cross-region cluster every
//! `regions.summary_interval_ms`) and folds other regions' summaries into a
//! [`RegionBook`].
//!
//! Used for: a remote region whose fresh summary says none of its replicas is healthy
//! is *dark* — its replicas are not routable here (`Replica::region_dark`) without
//! waiting for this node's own probes across the distance to fail three times; when a
//! summary says they are back (or the summaries stop and age out past
//! `regions.summary_ttl_ms`), this node's own health checks decide again. Also: which
//! region each peer is in, so that predictor statistics from another region merge
//! without its per-replica corrections (`headroom_core::region::cross_region_slot`).
//!
//! Cost: one summary per node per interval (≈ 60 bytes + the region name), and one
//! pass over the fleet per interval and per received summary.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering::Relaxed},
    },
    time::Duration,
};

use headroom_core::region::{RegionBook, RegionReport};
use headroom_gossip::{MemberInfo, Scope, keys};
use parking_lot::Mutex;

use super::{
    MeshRuntime, publish_global,
    schema::{RegionSummary, WireValue},
};
use crate::{clock, fleet::Replica};

/// What this node knows of regions.
#[derive(Default)]
pub struct Regions {
    book: Mutex<RegionBook>,
    /// Peer node id → its region (from the membership, both clusters).
    node_regions: Mutex<HashMap<String, String>>,
    /// Live router nodes of this region, this one included.
    routers: AtomicU32,
}

impl Regions {
    /// Learns the members' regions and counts this region's live routers.
    pub fn note_members(&self, all: &[MemberInfo]) {
        let mut m = self.node_regions.lock();
        for info in all {
            if let Some(r) = &info.region {
                m.insert(info.node_id.to_string(), r.clone());
            }
        }
        let live_here = all
            .iter()
            .filter(|i| i.live && i.scope == Scope::Region)
            .count()
            .max(1);
        drop(m);
        self.routers.store(live_here as u32, Relaxed);
    }

    /// Whether `node` is known to be in `region`.
    pub fn in_region(&self, node: &str, region: &str) -> bool {
        self.node_regions.lock().get(node).map(String::as_str) == Some(region)
    }

    /// Folds a received summary in (its sender is in the summary's region).
    pub fn note_summary(&self, node: &str, s: &RegionSummary, age: Duration, now_s: f64) {
        self.node_regions
            .lock()
            .insert(node.to_string(), s.region.clone());
        self.book.lock().note(RegionReport {
            region: s.region.clone(),
            routers: s.routers,
            replicas: s.replicas,
            healthy_replicas: s.healthy_replicas,
            free_kv_fraction: f64::from(s.free_kv_fraction),
            in_flight: f64::from(s.in_flight),
            at_s: now_s - age.as_secs_f64(),
        });
    }

    /// Marks each remote replica dark or not from the book at `now_s`; returns how many
    /// changed.
    pub fn apply(
        &self,
        replicas: &[Arc<Replica>],
        own_region: &str,
        now_s: f64,
        ttl_s: f64,
    ) -> usize {
        let book = self.book.lock();
        let mut changed = 0;
        for r in replicas {
            let dark = r.region != own_region && book.dark(&r.region, now_s, ttl_s);
            if r.region_dark.swap(dark, Relaxed) != dark {
                changed += 1;
                tracing::info!(replica = %r.name, region = %r.region, dark, "region summary");
            }
        }
        changed
    }

    /// `/debug/cluster`'s `regions`: each region's latest report, its age and whether
    /// it counts as dark.
    pub fn json(&self, now_s: f64, ttl_s: f64) -> serde_json::Value {
        let book = self.book.lock();
        book.reports()
            .map(|r| {
                serde_json::json!({
                    "region": r.region,
                    "routers": r.routers,
                    "replicas": r.replicas,
                    "healthy_replicas": r.healthy_replicas,
                    "free_kv_fraction": r.free_kv_fraction,
                    "in_flight": r.in_flight,
                    "age_s": now_s - r.at_s,
                    "fresh": book.fresh(&r.region, now_s, ttl_s).is_some(),
                    "dark": book.dark(&r.region, now_s, ttl_s),
                })
            })
            .collect()
    }
}

/// This node's summary of its own region's replicas at `now_s`.
pub fn summarize(
    replicas: &[Arc<Replica>],
    region: &str,
    routers: u32,
    stale_after_s: f64,
    now_s: f64,
) -> RegionSummary {
    let here: Vec<&Arc<Replica>> = replicas.iter().filter(|r| r.region == region).collect();
    let healthy: Vec<&&Arc<Replica>> = here.iter().filter(|r| r.health.routable()).collect();
    let free: Vec<f64> = healthy
        .iter()
        .filter_map(|r| {
            let s = r.scraped.load()?;
            (now_s - s.at_s <= stale_after_s).then_some(1.0 - s.kv_usage?.clamp(0.0, 1.0))
        })
        .collect();
    let in_flight: f64 = here
        .iter()
        .map(|r| r.ledger.load(now_s).requests + r.peer_load.load().load.requests)
        .sum();
    RegionSummary {
        region: region.to_string(),
        routers,
        replicas: here.len() as u32,
        healthy_replicas: healthy.len() as u32,
        free_kv_fraction: if free.is_empty() {
            0.0
        } else {
            (free.iter().sum::<f64>() / free.len() as f64) as f32
        },
        in_flight: in_flight as f32,
        at_ms: clock::unix_ms(),
    }
}

impl MeshRuntime {
    /// Publishes this region's summary and re-applies the book (summaries age out).
    pub(super) async fn summary_loop(self: Arc<Self>) {
        let rc = self.local.fleet.cfg.regions.clone();
        let every = Duration::from_millis(rc.summary_interval_ms.max(100));
        let ttl_s = rc.summary_ttl_ms as f64 / 1e3;
        let stale_s = self.local.fleet.cfg.scrape.stale_after_ms as f64 / 1e3;
        while self.tick(every).await {
            let now = clock::now_s();
            let replicas = self.local.fleet.replicas();
            let own = &self.settings.region;
            let s = summarize(
                &replicas,
                own,
                self.regions.routers.load(Relaxed),
                stale_s,
                now,
            );
            self.regions.apply(&replicas, own, now, ttl_s);
            let Some(mesh) = self.mesh() else { return };
            if let Err(e) = publish_global(&mesh, &keys::summary(own), &WireValue::Summary(s)).await
            {
                tracing::debug!("region summary not published: {e}");
            }
        }
    }

    /// Folds one received summary in and applies it at once.
    pub(super) fn ingest_summary(&self, node: &str, s: &RegionSummary, age: Duration) {
        let now = clock::now_s();
        self.regions.note_summary(node, s, age, now);
        let ttl_s = self.local.fleet.cfg.regions.summary_ttl_ms as f64 / 1e3;
        self.regions.apply(
            &self.local.fleet.replicas(),
            &self.settings.region,
            now,
            ttl_s,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ReplicaConfig;

    fn replica(id: u32, port: u16, region: &str) -> Arc<Replica> {
        Arc::new(
            Replica::new(
                id,
                &ReplicaConfig {
                    url: format!("http://127.0.0.1:{port}"),
                    region: Some(region.into()),
                    ..Default::default()
                },
                "eu-1",
                &Default::default(),
            )
            .unwrap(),
        )
    }

    fn ok(r: &Replica) {
        use crate::fleet::health::Signal;
        r.health
            .on_success(Signal::Probe, 0, &crate::config::HealthConfig::default());
    }

    fn summary(region: &str, healthy: u32) -> RegionSummary {
        RegionSummary {
            region: region.into(),
            routers: 1,
            replicas: 2,
            healthy_replicas: healthy,
            free_kv_fraction: 0.5,
            in_flight: 0.0,
            at_ms: 0,
        }
    }

    #[test]
    fn a_dark_remote_region_is_unroutable_until_it_returns_or_ages_out() {
        use headroom_core::view::ReplicaView;
        let rs = vec![replica(0, 9001, "eu-1"), replica(1, 9002, "us-1")];
        for r in &rs {
            ok(r);
        }
        assert!(rs[1].remote_rtt_ms().is_some() && rs[0].remote_rtt_ms().is_none());
        let g = Regions::default();
        g.note_summary("us-node", &summary("us-1", 0), Duration::ZERO, 10.0);
        assert!(g.in_region("us-node", "us-1"));
        assert_eq!(g.apply(&rs, "eu-1", 10.0, 5.0), 1);
        assert!(
            rs[0].routable(),
            "the own region is never darkened by a summary"
        );
        assert!(!rs[1].routable(), "us-1 said it has no healthy replica");
        // Its own summary of eu-1 going dark does not darken eu-1 here.
        g.note_summary("x", &summary("eu-1", 0), Duration::ZERO, 10.0);
        g.apply(&rs, "eu-1", 10.0, 5.0);
        assert!(rs[0].routable());
        // Back: a later summary with healthy replicas.
        g.note_summary("us-node", &summary("us-1", 2), Duration::ZERO, 11.0);
        assert_eq!(g.apply(&rs, "eu-1", 11.0, 5.0), 1);
        assert!(rs[1].routable());
        // Dark again, then silence: after the TTL this node's own probes decide.
        g.note_summary("us-node", &summary("us-1", 0), Duration::ZERO, 12.0);
        g.apply(&rs, "eu-1", 12.0, 5.0);
        assert!(!rs[1].routable());
        g.apply(&rs, "eu-1", 17.5, 5.0);
        assert!(rs[1].routable());
    }

    #[test]
    fn the_summary_counts_its_own_regions_replicas() {
        let rs = vec![
            replica(0, 9001, "eu-1"),
            replica(1, 9002, "eu-1"),
            replica(2, 9003, "us-1"),
        ];
        ok(&rs[0]);
        let s = summarize(&rs, "eu-1", 3, 2.0, 0.0);
        assert_eq!((s.region.as_str(), s.routers), ("eu-1", 3));
        assert_eq!((s.replicas, s.healthy_replicas), (2, 1));
    }
}
