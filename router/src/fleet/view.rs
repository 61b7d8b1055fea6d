//! The fleet: the current replica list (an `ArcSwap` snapshot) and its background
//! tasks. Adding or removing a replica swaps the list; readers never block.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering::Relaxed},
    },
};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{Replica, Scraped, tasks};
use crate::{
    config::{ReplicaConfig, RouterConfig},
    metrics::Metrics,
    prefix::PrefixIndex,
    upstream::HttpClient,
};

/// Where a replica came from (DNS-discovered replicas are removed when the name stops
/// resolving to them; static ones stay).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Static,
    Dns,
}

pub struct Fleet {
    replicas: ArcSwap<Vec<Arc<Replica>>>,
    origins: Mutex<HashMap<u32, (Origin, CancellationToken)>>,
    next_id: AtomicU32,
    pub cfg: Arc<RouterConfig>,
    pub client: HttpClient,
    pub metrics: Arc<Metrics>,
    pub prefix: Arc<PrefixIndex>,
    cancel: CancellationToken,
    tracker: TaskTracker,
    /// Scraping shared with the mesh's other nodes, where this node joins one.
    share: Option<Arc<dyn tasks::ScrapeShare>>,
}

impl Fleet {
    pub fn new(
        cfg: Arc<RouterConfig>,
        client: HttpClient,
        metrics: Arc<Metrics>,
        prefix: Arc<PrefixIndex>,
        share: Option<Arc<dyn tasks::ScrapeShare>>,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            replicas: ArcSwap::from_pointee(Vec::new()),
            origins: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(0),
            cfg,
            client,
            metrics,
            prefix,
            cancel,
            tracker: TaskTracker::new(),
            share,
        })
    }

    /// The current replica list.
    pub fn replicas(&self) -> Arc<Vec<Arc<Replica>>> {
        self.replicas.load_full()
    }

    /// Adds a replica and starts its scrape/probe/models tasks.
    pub fn add(
        self: &Arc<Self>,
        rc: &ReplicaConfig,
        origin: Origin,
    ) -> Result<Arc<Replica>, String> {
        let id = self.next_id.fetch_add(1, Relaxed);
        let replica = Arc::new(Replica::new(
            id,
            rc,
            &self.cfg.mesh.region,
            &self.cfg.regions,
        )?);
        if self.replicas().iter().any(|r| r.url == replica.url) {
            return Err(format!("replica {} is already in the fleet", replica.url));
        }
        let token = self.cancel.child_token();
        self.origins.lock().insert(id, (origin, token.clone()));
        self.replicas.rcu(|list| {
            let mut next = (**list).clone();
            next.push(replica.clone());
            next
        });
        tasks::spawn_replica_tasks(self.clone(), replica.clone(), token, &self.tracker);
        tracing::info!(replica = %replica.name, url = %replica.url, class = %replica.class, "replica added");
        Ok(replica)
    }

    /// Takes a new scrape of `r`: if the engine restarted since `prev` (its counters
    /// went back), its prefix cache is empty, so the prefix index forgets what was
    /// placed there. Returns whether it restarted.
    pub fn note_scrape(
        &self,
        r: &Replica,
        prev: Option<&Scraped>,
        s: &Scraped,
        source: &str,
    ) -> bool {
        let restarted = prev.is_some_and(|p| s.restarted_since(p));
        if restarted {
            self.prefix.forget(r.id);
            self.metrics.replica_restart(&r.name);
            if let Some(p) = prev {
                tracing::warn!(
                    replica = %r.name,
                    source,
                    age_ms = format!("{:.0} -> {:.0}", (crate::clock::now_s() - p.at_s) * 1e3, (crate::clock::now_s() - s.at_s) * 1e3),
                    prefix_queries = format!("{} -> {}", p.prefix_queries, s.prefix_queries),
                    prefix_hits = format!("{} -> {}", p.prefix_hits, s.prefix_hits),
                    preemptions = format!("{} -> {}", p.preemptions, s.preemptions),
                    "engine restarted (its counters went back): its prefix cache is empty, forgotten here"
                );
            }
        }
        restarted
    }

    /// Removes a replica; its tasks stop and the prefix index forgets it.
    pub fn remove(&self, id: u32) {
        if let Some((_, token)) = self.origins.lock().remove(&id) {
            token.cancel();
        }
        self.replicas.rcu(|list| {
            list.iter()
                .filter(|r| r.id != id)
                .cloned()
                .collect::<Vec<_>>()
        });
        self.prefix.forget(id);
    }

    /// Replicas of a given origin, by URL.
    pub fn urls_of(&self, origin: Origin) -> HashMap<String, u32> {
        let origins = self.origins.lock();
        self.replicas()
            .iter()
            .filter(|r| origins.get(&r.id).map(|(o, _)| *o) == Some(origin))
            .map(|r| (r.url.clone(), r.id))
            .collect()
    }

    /// The scrape sharing in force, if any.
    pub fn share(&self) -> Option<Arc<dyn tasks::ScrapeShare>> {
        self.share.clone()
    }

    /// Runs a background task until the fleet shuts down (it gets a child of the
    /// fleet's token and is awaited by [`Fleet::shutdown`]).
    pub fn spawn_task<F>(&self, make: impl FnOnce(CancellationToken) -> F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.tracker.spawn(make(self.cancel.child_token()));
    }

    /// Starts DNS discovery if configured.
    pub fn start_discovery(self: &Arc<Self>) {
        if let Some(d) = self.cfg.discovery.clone() {
            let fleet = self.clone();
            let token = self.cancel.child_token();
            self.tracker.spawn(tasks::dns_loop(fleet, d, token));
        }
    }

    /// Stops every background task and waits for them.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}
