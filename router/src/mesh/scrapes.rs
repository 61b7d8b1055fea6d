//! Which of this node's scrapes it publishes to the mesh, and when.
//!
//! Every node must receive every published scrape, so the mesh's cost of scraped state
//! is `replicas × publications per replica per second × ~200 B` per node, whatever the
//! node count. Scraping every 100 ms with two owners each publishing every scrape
//! made that `replicas × 20 × 200 B`: 1 MB/s per node at 256 replicas. Peers route on
//! their in-flight ledger (every placement in the mesh, by datagram); a scrape tells
//! them the engine's own view (KV use, its queue), which moves slower. So:
//! - only a replica's first owner publishes; another owner publishes only while no peer
//!   has published that replica for two periods (the first owner died or is cut off);
//! - at most once per `period`, or once per `period / 4` when the value changed
//!   materially (a running or waiting count by more than `max(1, 20 %)`, KV use by
//!   more than 5 points, the engine's geometry, a preemption), at once when the
//!   replica's health flipped.
//!
//! Peers judge a scrape's age from its publication, so `period` plus propagation must
//! stay under `scrape.stale_after_ms` (validated at start).

use std::{collections::HashMap, sync::Arc};

use super::schema::ReplicaScrape;
use arc_swap::ArcSwap;
use tokio::sync::mpsc;

use super::Owners;
use crate::fleet::{Replica, Scraped, tasks::ScrapeShare};

/// A scrape this node made, on its way to the runtime's publisher.
type Made = (Arc<Replica>, Arc<Scraped>);

/// The mesh's part in scraping, made before the fleet (which asks it before every
/// scrape) so that the fleet never holds the runtime: which replicas this node owns
/// (rendezvous over the region's live members, recomputed by the runtime; this node
/// alone until it has joined), and the scrapes it made, queued for the runtime.
pub struct ScrapeShares {
    pub(super) owners: ArcSwap<Owners>,
    tx: mpsc::Sender<Made>,
}

/// The receiving end of [`ScrapeShares`]' queue, handed to the runtime when it joins.
pub struct ScrapeInbox(pub(super) mpsc::Receiver<Made>);

impl ScrapeShares {
    pub fn new(node_id: &str, owners_per_replica: usize) -> (Arc<Self>, ScrapeInbox) {
        let (tx, rx) = mpsc::channel(1024);
        let me = Self {
            owners: ArcSwap::from_pointee(Owners::new(node_id, vec![], owners_per_replica)),
            tx,
        };
        (Arc::new(me), ScrapeInbox(rx))
    }
}

impl ScrapeShare for ScrapeShares {
    fn should_scrape(&self, replica: &Replica) -> bool {
        self.owners.load().owns(replica.key)
    }
    fn scraped(&self, replica: &Arc<Replica>, s: &Arc<Scraped>) {
        let _ = self.tx.try_send((replica.clone(), s.clone()));
    }
}

/// This node's publications per replica.
#[derive(Debug, Default)]
pub struct ScrapeGate {
    last: HashMap<u64, (f64, ReplicaScrape)>,
}

fn count_moved(a: u32, b: u32) -> bool {
    let d = a.abs_diff(b);
    d > 1 && f64::from(d) > 0.2 * f64::from(a.max(b))
}

/// Whether `now` tells a peer something `before` did not.
pub fn material(now: &ReplicaScrape, before: &ReplicaScrape) -> bool {
    count_moved(now.running, before.running)
        || count_moved(now.waiting, before.waiting)
        || match (now.kv_usage, before.kv_usage) {
            (Some(a), Some(b)) => (a - b).abs() > 0.05,
            (a, b) => a.is_some() != b.is_some(),
        }
        || (now.num_gpu_blocks, now.block_size) != (before.num_gpu_blocks, before.block_size)
        || now.preemptions != before.preemptions
}

impl ScrapeGate {
    /// Whether to publish `s` now. `first_owner`: this node ranks first among the
    /// replica's owners; `heard_s`: when a peer's scrape of it last arrived.
    pub fn admit(
        &mut self,
        s: &ReplicaScrape,
        first_owner: bool,
        heard_s: Option<f64>,
        now_s: f64,
        period_s: f64,
    ) -> bool {
        let covered = heard_s.is_some_and(|t| now_s - t < 2.0 * period_s);
        if !first_owner && covered {
            return false;
        }
        let go = match self.last.get(&s.replica) {
            None => true,
            Some((t, prev)) => {
                let since = now_s - t;
                prev.healthy != s.healthy
                    || since >= period_s
                    || (since >= period_s / 4.0 && material(s, prev))
            }
        };
        if go {
            self.last.insert(s.replica, (now_s, s.clone()));
        }
        go
    }

    /// Forgets replicas no longer in the fleet.
    pub fn retain(&mut self, keep: impl Fn(u64) -> bool) {
        self.last.retain(|k, _| keep(*k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(running: u32, kv: f64, healthy: bool) -> ReplicaScrape {
        ReplicaScrape {
            replica: 7,
            url: String::new(),
            engine: 0,
            running,
            waiting: 0,
            kv_usage: Some(kv),
            num_gpu_blocks: Some(1000),
            block_size: Some(16),
            prefix_hits: 0,
            prefix_queries: 0,
            preemptions: 0,
            scraped_at_ms: 0,
            healthy,
        }
    }

    #[test]
    fn the_first_owner_publishes_once_a_period_unless_something_moved() {
        let mut g = ScrapeGate::default();
        let p = 1.0;
        assert!(g.admit(&scrape(10, 0.5, true), true, None, 0.0, p));
        // Scrapes every 100 ms that barely move: nothing until the period is up.
        for i in 1..10 {
            let t = f64::from(i) * 0.1;
            assert!(!g.admit(&scrape(11, 0.52, true), true, None, t, p), "{t}");
        }
        assert!(g.admit(&scrape(11, 0.52, true), true, None, 1.0, p));
        // A material change waits a quarter period, no more.
        assert!(!g.admit(&scrape(20, 0.52, true), true, None, 1.1, p));
        assert!(g.admit(&scrape(20, 0.52, true), true, None, 1.25, p));
        // A health flip goes out at once.
        assert!(g.admit(&scrape(20, 0.52, false), true, None, 1.3, p));
    }

    #[test]
    fn another_owner_publishes_only_while_the_first_is_silent() {
        let mut g = ScrapeGate::default();
        let p = 1.0;
        assert!(!g.admit(&scrape(1, 0.1, true), false, Some(0.0), 0.5, p));
        assert!(!g.admit(&scrape(1, 0.1, true), false, Some(0.0), 1.9, p));
        assert!(g.admit(&scrape(1, 0.1, true), false, Some(0.0), 2.1, p));
        // Never heard from anyone: publish.
        let mut g = ScrapeGate::default();
        assert!(g.admit(&scrape(1, 0.1, true), false, None, 0.0, p));
    }
}
