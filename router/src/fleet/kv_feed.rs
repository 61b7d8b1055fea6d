//! Following the engines' KV-cache events (issue 16): per replica with `kv_events`
//! that this node owns, a `headroom-kv-events` subscriber writing into one shared
//! block index; per request, each followed replica's exact cached-token count.
//!
//! Invariants:
//! - One subscriber per followed replica, started by the one manager task
//!   ([`KvFeeds::start`]) when the replica is in the fleet, this node owns it (the
//!   scrape's rendezvous ownership; every node without a mesh), its publisher is
//!   known (configured or discovered from `GET /kv_event_sources`) and its block size
//!   is known (configured or scraped); stopped when any of those ends. The manager
//!   ends on the fleet's cancellation and stops every subscriber, awaiting each.
//! - A replica's slot in the index (`ReplicaId`, at most 128 per node) is freed and
//!   its bits cleared when its subscriber stops, so nothing a stopped feed knew lingers.
//! - A count is given only for a replica whose feed is `precise` (exact: the engine
//!   will report it as `cached_tokens`) or `recovering` (a lower bound); an
//!   `approximate` feed gives none, so the prefix index's estimate stands for it.
//! - With a mesh ([`share`]): this node's feeds are shared with its peers as numbered
//!   deltas and snapshots, and a replica another node follows is mirrored into this
//!   node's index from theirs, with the mirror's own state (`precise` only while in
//!   step with an owner that is); a local feed replaces a mirror of the same replica.
//!   Slots are shared by local feeds and mirrors. Lock order: `feeds` → `remote` →
//!   `share` → the index.
//! - Cost per request: the prompt's chain once per distinct (block size, adapter)
//!   among followed replicas (xxh3 over 4 bytes per token: 129 µs at 128k tokens),
//!   one `longest_prefix` walk under the index's read lock shared by every replica
//!   (≤ 312 µs at 128k fully cached, 81 ns when the match ends early; see
//!   `kv-events/README.md`), then O(followed replicas).

mod share;

pub use share::{MeshKv, ShareOut};

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};

use headroom_kv_events::{
    FeedState, FeedStatus, ReplicaId, SharedIndex, SubscriberConfig, SubscriberHandle,
    chain::{prompt_chain, salt_for_adapter},
    discovery::parse_sources,
    engine_cached_tokens,
    mirror::Mirror,
    shared_index, spawn_subscriber,
};
use parking_lot::{Mutex, RwLock};
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{Fleet, Replica};
use crate::{
    clock,
    config::{KvEventsConfig, ReplicaConfig},
    policy::ExactCached,
    upstream,
};

/// Where a replica's events come from, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSource {
    /// `tcp://HOST:PORT`, or `None` to discover it from the engine.
    pub endpoint: Option<String>,
    pub replay: Option<String>,
    pub topic: String,
    pub block_size: Option<u32>,
}

impl KvSource {
    /// The source a replica config asks for, if any.
    pub fn of(rc: &ReplicaConfig) -> Option<Self> {
        let e = rc.kv_events.as_deref()?;
        Some(KvSource {
            endpoint: (e != "discover").then(|| e.to_string()),
            replay: rc.kv_replay.clone(),
            topic: rc.kv_topic.clone().unwrap_or_default(),
            block_size: rc.kv_block_size,
        })
    }
}

/// Discovery is retried at most this often per replica.
const DISCOVER_EVERY: Duration = Duration::from_secs(2);
const DISCOVER_TIMEOUT: Duration = Duration::from_secs(2);
const SOURCES_MAX_BYTES: usize = 64 * 1024;

/// A running subscriber as the request path sees it.
struct Follow {
    /// The replica's mesh key.
    key: u64,
    slot: ReplicaId,
    block_size: u32,
    endpoint: String,
    replay: Option<String>,
    handle: SubscriberHandle,
    token: CancellationToken,
}

/// Why a replica with `kv_events` is not followed right now (for `/debug`).
#[derive(Clone, Debug)]
struct Waiting {
    reason: String,
    last_discovery: Option<Instant>,
    discovered: Option<(String, Option<String>, String)>,
}

struct FeedMetrics {
    state: IntGaugeVec,
    blocks: IntGaugeVec,
    incidents: IntCounterVec,
    index_blocks: IntGauge,
}

impl FeedMetrics {
    fn new(r: &Registry) -> Self {
        let state = IntGaugeVec::new(
            Opts::new(
                "headroom_kv_feed_state",
                "1 for the state of each replica's KV-event feed (precise, recovering, approximate).",
            ),
            &["replica", "state"],
        )
        .expect("valid");
        let blocks = IntGaugeVec::new(
            Opts::new(
                "headroom_kv_feed_blocks",
                "Blocks the index holds for a replica, from its KV events.",
            ),
            &["replica"],
        )
        .expect("valid");
        let incidents = IntCounterVec::new(
            Opts::new(
                "headroom_kv_feed_incidents_total",
                "KV-event feed incidents: gap, restart, replay, replay_failure, resync, undecodable.",
            ),
            &["replica", "kind"],
        )
        .expect("valid");
        let index_blocks = IntGauge::new(
            "headroom_kv_index_blocks",
            "Blocks in the precise (KV-event) index across every followed replica.",
        )
        .expect("valid");
        for c in [
            Box::new(state.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(blocks.clone()),
            Box::new(incidents.clone()),
            Box::new(index_blocks.clone()),
        ] {
            if let Err(e) = r.register(c) {
                tracing::error!("metric registration failed: {e}");
            }
        }
        FeedMetrics {
            state,
            blocks,
            incidents,
            index_blocks,
        }
    }
}

/// See the module docs.
pub struct KvFeeds {
    cfg: KvEventsConfig,
    index: SharedIndex,
    active: AtomicBool,
    feeds: RwLock<HashMap<u32, Arc<Follow>>>,
    waiting: Mutex<HashMap<u32, Waiting>>,
    /// Replicas another node follows, mirrored from the mesh.
    remote: RwLock<HashMap<u32, Mirror>>,
    /// Set once the mesh shares this node's feeds.
    share: Mutex<Option<share::ShareState>>,
    /// Last counters exported per replica (metrics take deltas).
    exported: Mutex<HashMap<u32, [u64; 6]>>,
    metrics: FeedMetrics,
}

impl KvFeeds {
    pub fn new(cfg: &KvEventsConfig, replicas: &[ReplicaConfig], registry: &Registry) -> Arc<Self> {
        Arc::new(KvFeeds {
            cfg: cfg.clone(),
            index: shared_index(cfg.max_blocks),
            active: AtomicBool::new(replicas.iter().any(|r| r.kv_events.is_some())),
            feeds: RwLock::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            remote: RwLock::new(HashMap::new()),
            share: Mutex::new(None),
            exported: Mutex::new(HashMap::new()),
            metrics: FeedMetrics::new(registry),
        })
    }

    /// Whether any replica is configured with KV events (prompts keep their ids).
    pub fn active(&self) -> bool {
        self.active.load(Relaxed)
    }

    /// Starts the manager task on the fleet's task tracker.
    pub fn start(self: &Arc<Self>, fleet: &Arc<Fleet>) {
        if !self.active() {
            return;
        }
        let (me, f) = (self.clone(), fleet.clone());
        fleet.spawn_task(move |token| async move { me.manage(f, token).await });
    }

    /// Each followed replica's cached tokens for a prompt of `ids` for `model`.
    pub fn exact_cached(
        &self,
        model: &str,
        ids: &[u32],
        replicas: &[Arc<Replica>],
    ) -> Vec<ExactCached> {
        let feeds = self.feeds.read();
        let remote = self.remote.read();
        if feeds.is_empty() && remote.is_empty() {
            return Vec::new();
        }
        let now = clock::now_s();
        let prompt_tokens = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        // (block size, salt) → that chain's per-replica match.
        let mut matches: Vec<((u32, u64), headroom_kv_events::PrefixMatch)> = Vec::new();
        let mut out = Vec::new();
        for r in replicas {
            let (slot, block_size, state) = if let Some(f) = feeds.get(&r.id) {
                (f.slot, f.block_size, f.handle.status().state)
            } else if let Some(m) = remote.get(&r.id) {
                (m.slot(), m.block_size(), m.state(now))
            } else {
                continue;
            };
            let complete = match state {
                FeedState::Precise => true,
                FeedState::Recovering => false,
                FeedState::Approximate => continue,
            };
            // vLLM tags an adapter's blocks with its name, the model a request names.
            let models = r.models.load();
            let Some(entry) = models.get(model) else {
                continue;
            };
            let salt = salt_for_adapter(entry.parent.as_ref().map(|_| model));
            let key = (block_size, salt);
            let i = match matches.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    let chain = prompt_chain(ids, block_size as usize, salt);
                    matches.push((key, self.index.read().longest_prefix(&chain)));
                    matches.len() - 1
                }
            };
            let blocks = matches[i].1.blocks_for(slot);
            out.push(ExactCached {
                replica: r.id,
                tokens: engine_cached_tokens(blocks, prompt_tokens, block_size),
                complete,
            });
        }
        out
    }

    /// A request went to `replica` with `cached` tokens expected from its cache: if the
    /// prompt has full blocks beyond them, the engine must publish them soon.
    /// `dispatched`: when the request left for the engine (events since then count).
    pub fn sent(&self, replica: u32, prompt_tokens: u32, cached: u32, dispatched: Instant) {
        if let Some(f) = self.feeds.read().get(&replica)
            && prompt_tokens / f.block_size * f.block_size > cached
        {
            f.handle.expect_events_since(dispatched);
        }
    }

    /// The feed state of `replica` (`None`: not followed).
    pub fn state(&self, replica: u32) -> Option<FeedState> {
        if let Some(f) = self.feeds.read().get(&replica) {
            return Some(f.handle.status().state);
        }
        self.remote
            .read()
            .get(&replica)
            .map(|m| m.state(clock::now_s()))
    }

    /// `/debug/replicas` view of one replica's feed (`null` without `kv_events`).
    pub fn debug(&self, r: &Replica) -> Value {
        if r.kv.is_none() {
            return Value::Null;
        }
        if let Some(f) = self.feeds.read().get(&r.id) {
            let s = f.handle.status();
            let sock = f.handle.socket_counters();
            let c = s.counters;
            let shared = self.share.lock().as_ref().and_then(|sh| sh.stream_of(r.id));
            return json!({
                "mesh_epoch": shared.map(|x| x.0), "mesh_seq": shared.map(|x| x.1),
                "mesh_covers_next_seq": shared.and_then(|x| x.2),
                "state": s.state.as_str(), "endpoint": f.endpoint, "replay_endpoint": f.replay,
                "block_size": f.block_size, "blocks": s.blocks, "next_seq": s.next_seq,
                "batches_applied": c.batches_applied, "duplicates": c.duplicates, "gaps": c.gaps,
                "restarts": c.restarts, "replays": c.replays, "replay_failures": c.replay_failures,
                "resyncs": c.resyncs, "undecodable": c.undecodable,
                "orphaned_blocks": s.apply.orphaned_blocks, "ignored_events": s.apply.ignored_events,
                "connects": sock.connects, "disconnects": sock.disconnects,
                "malformed_frames": sock.malformed_frames, "source": "events",
            });
        }
        if let Some(m) = self.remote.read().get(&r.id) {
            return share::mirror_debug(m, clock::now_s());
        }
        let reason = self
            .waiting
            .lock()
            .get(&r.id)
            .map_or_else(|| "starting".to_string(), |w| w.reason.clone());
        json!({ "state": FeedState::Approximate.as_str(), "waiting": reason })
    }

    /// `/debug/replicas` view of the index.
    pub fn index_debug(&self) -> Value {
        let idx = self.index.read();
        let s = idx.stats();
        json!({
            "blocks": idx.len(), "cap": idx.cap(), "heap_bytes": idx.heap_bytes(),
            "inserts": s.inserts, "removes": s.removes, "evictions": s.evictions,
        })
    }

    async fn manage(self: Arc<Self>, fleet: Arc<Fleet>, token: CancellationToken) {
        let period = Duration::from_millis(self.cfg.check_interval_ms.max(1));
        loop {
            self.check(&fleet, &token).await;
            self.export(&fleet);
            tokio::select! {
                _ = token.cancelled() => break,
                _ = tokio::time::sleep(period) => {}
            }
        }
        let ids: Vec<u32> = self.feeds.read().keys().copied().collect();
        for id in ids {
            self.stop(id).await;
        }
    }

    /// Starts and stops subscribers to match the fleet, ownership and discovery.
    async fn check(&self, fleet: &Arc<Fleet>, token: &CancellationToken) {
        let replicas = fleet.replicas();
        let share = fleet.share();
        let running: Vec<u32> = self.feeds.read().keys().copied().collect();
        for id in running {
            let keep = replicas
                .iter()
                .find(|r| r.id == id)
                .is_some_and(|r| share.as_ref().is_none_or(|s| s.should_scrape(r)));
            if !keep {
                self.stop(id).await;
            }
        }
        for r in replicas.iter() {
            let Some(src) = &r.kv else { continue };
            if self.feeds.read().contains_key(&r.id) {
                continue;
            }
            if share.as_ref().is_some_and(|s| !s.should_scrape(r)) {
                self.wait(r.id, "another node owns this replica");
                continue;
            }
            let Some(block_size) = src
                .block_size
                .or_else(|| r.scraped.load().and_then(|s| s.block_size))
                .filter(|b| *b > 0)
            else {
                self.wait(r.id, "block size not known yet (kv_block_size or a scrape)");
                continue;
            };
            let Some((endpoint, replay, topic)) = self.endpoint_of(fleet, r, src).await else {
                continue;
            };
            self.begin(r, block_size, endpoint, replay, topic, token);
        }
        let ids: Vec<u32> = replicas.iter().map(|r| r.id).collect();
        self.waiting.lock().retain(|id, _| ids.contains(id));
        let gone: Vec<ReplicaId> = {
            let mut remote = self.remote.write();
            let gone = remote
                .iter()
                .filter(|(id, _)| !ids.contains(id))
                .map(|(_, m)| m.slot())
                .collect();
            remote.retain(|id, _| ids.contains(id));
            gone
        };
        for slot in gone {
            self.index.write().remove_replica(slot);
        }
    }

    fn wait(&self, id: u32, reason: &str) {
        let mut w = self.waiting.lock();
        let e = w.entry(id).or_insert_with(|| Waiting {
            reason: String::new(),
            last_discovery: None,
            discovered: None,
        });
        e.reason = reason.to_string();
    }

    /// The publisher to connect to: configured, or discovered (retried every
    /// [`DISCOVER_EVERY`]).
    async fn endpoint_of(
        &self,
        fleet: &Fleet,
        r: &Replica,
        src: &KvSource,
    ) -> Option<(String, Option<String>, String)> {
        if let Some(e) = &src.endpoint {
            return Some((e.clone(), src.replay.clone(), src.topic.clone()));
        }
        {
            let w = self.waiting.lock();
            if let Some(w) = w.get(&r.id) {
                if let Some(d) = &w.discovered {
                    return Some(d.clone());
                }
                if w.last_discovery
                    .is_some_and(|t| t.elapsed() < DISCOVER_EVERY)
                {
                    return None;
                }
            }
        }
        let host = r
            .base
            .host()
            .unwrap_or("127.0.0.1")
            .trim_matches(['[', ']']);
        let got = upstream::get(
            &fleet.client,
            &r.base,
            "/kv_event_sources",
            DISCOVER_TIMEOUT,
            SOURCES_MAX_BYTES,
        )
        .await;
        let found = match got {
            Ok((s, body)) if s.is_success() => {
                match parse_sources(&String::from_utf8_lossy(&body), host) {
                    Ok(list) => list.into_iter().next().map_or_else(
                        || Err("the engine publishes no ZMQ KV events".to_string()),
                        |s| Ok((s.endpoint, s.replay_endpoint, s.topic)),
                    ),
                    Err(e) => Err(format!("unreadable /kv_event_sources: {e}")),
                }
            }
            Ok((s, _)) => Err(format!("/kv_event_sources answered {s}")),
            Err(e) => Err(format!("/kv_event_sources: {e}")),
        };
        let mut w = self.waiting.lock();
        let e = w.entry(r.id).or_insert_with(|| Waiting {
            reason: String::new(),
            last_discovery: None,
            discovered: None,
        });
        e.last_discovery = Some(Instant::now());
        match found {
            Ok(d) => {
                e.discovered = Some(d.clone());
                Some(d)
            }
            Err(why) => {
                e.reason = format!("discovery: {why}");
                None
            }
        }
    }

    fn begin(
        &self,
        r: &Replica,
        block_size: u32,
        endpoint: String,
        replay: Option<String>,
        topic: String,
        token: &CancellationToken,
    ) {
        let mut feeds = self.feeds.write();
        let mut remote = self.remote.write();
        // Our own feed replaces a mirror of this replica (and takes its slot back).
        if let Some(m) = remote.remove(&r.id) {
            self.index.write().remove_replica(m.slot());
        }
        let slot = free_slot(&feeds, &remote);
        drop(remote);
        let Some(slot) = slot else {
            drop(feeds);
            self.wait(r.id, "this node already follows 128 replicas");
            return;
        };
        let mut sc = SubscriberConfig::new(slot, endpoint.clone(), block_size);
        sc.replay_endpoint = replay.clone();
        sc.topic = topic;
        sc.max_blocks = r.kv_capacity_tokens().map_or(sc.max_blocks, |t| {
            (t / u64::from(block_size)).max(1) as usize * 2
        });
        sc.silence_timeout = Duration::from_millis(self.cfg.silence_timeout_ms);
        sc.replay_timeout = Duration::from_millis(self.cfg.replay_timeout_ms);
        if self.share.lock().is_some() {
            self.index.write().set_logged(slot, true);
        }
        let child = token.child_token();
        let handle = spawn_subscriber(sc, self.index.clone(), child.clone());
        tracing::info!(replica = %r.name, %endpoint, block_size, "following KV events");
        feeds.insert(
            r.id,
            Arc::new(Follow {
                key: r.key,
                slot,
                block_size,
                endpoint,
                replay,
                handle,
                token: child,
            }),
        );
        self.waiting.lock().remove(&r.id);
    }

    async fn stop(&self, id: u32) {
        let Some(f) = self.feeds.write().remove(&id) else {
            return;
        };
        f.token.cancel();
        let slot = f.slot;
        // A request may hold the feed a moment longer; the cancelled task ends anyway.
        if let Ok(f) = Arc::try_unwrap(f) {
            f.handle.shutdown().await;
        }
        let mut ix = self.index.write();
        ix.set_logged(slot, false);
        ix.remove_replica(slot);
        drop(ix);
        self.exported.lock().remove(&id);
        tracing::info!(replica = id, "stopped following KV events");
    }

    /// Refreshes the gauges and counters: every check interval, and at each scrape of
    /// `/metrics`, so a scrape never reads a state older than the feed's own (the
    /// manager's loop may be awaiting a discovery when the state changes).
    pub fn export(&self, fleet: &Fleet) {
        let m = &self.metrics;
        m.index_blocks.set(self.index.read().len() as i64);
        let feeds = self.feeds.read();
        let remote = self.remote.read();
        let now = clock::now_s();
        let mut exported = self.exported.lock();
        for r in fleet.replicas().iter().filter(|r| r.kv.is_some()) {
            let status: Option<FeedStatus> = feeds.get(&r.id).map(|f| f.handle.status());
            let state = status.map_or_else(
                || {
                    remote
                        .get(&r.id)
                        .map_or(FeedState::Approximate, |m| m.state(now))
                },
                |s| s.state,
            );
            for s in [
                FeedState::Precise,
                FeedState::Recovering,
                FeedState::Approximate,
            ] {
                m.state
                    .with_label_values(&[&r.name, s.as_str()])
                    .set(i64::from(s == state));
            }
            let Some(s) = status else {
                m.blocks.with_label_values(&[&r.name]).set(0);
                continue;
            };
            m.blocks.with_label_values(&[&r.name]).set(s.blocks as i64);
            let c = s.counters;
            let now = [
                c.gaps,
                c.restarts,
                c.replays,
                c.replay_failures,
                c.resyncs,
                c.undecodable,
            ];
            let last = exported.entry(r.id).or_insert([0; 6]);
            for (i, kind) in [
                "gap",
                "restart",
                "replay",
                "replay_failure",
                "resync",
                "undecodable",
            ]
            .iter()
            .enumerate()
            {
                let d = now[i].saturating_sub(last[i]);
                if d > 0 {
                    m.incidents.with_label_values(&[&*r.name, kind]).inc_by(d);
                }
            }
            *last = now;
        }
    }
}

/// A slot neither a local feed nor a mirror uses.
fn free_slot(
    feeds: &HashMap<u32, Arc<Follow>>,
    remote: &HashMap<u32, Mirror>,
) -> Option<ReplicaId> {
    let used: Vec<ReplicaId> = feeds
        .values()
        .map(|f| f.slot)
        .chain(remote.values().map(Mirror::slot))
        .collect();
    (0..headroom_kv_events::MAX_REPLICAS)
        .filter_map(ReplicaId::new)
        .find(|s| !used.contains(s))
}
