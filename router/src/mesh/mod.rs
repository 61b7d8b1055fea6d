//! This node in the mesh: what it shares with its peers and how it folds their state
//! into its own view.
//!
//! Shared, each with a TTL so a dead node's state expires:
//! - in-flight placements per replica: QUIC datagrams with the entries that changed
//!   (and every heartbeat the busy ones), and the reliable gossip key `inflight` with
//!   the busy and recently emptied ones (`outbox.rs`);
//! - scraped replica state: each replica is scraped by `scrape_owners` nodes chosen
//!   by rendezvous hashing over the region's live members, so scrape load stays flat as
//!   nodes are added; its first owner shares it as `scrape/<replica>` at most once per
//!   `scrape_publish_ms` (`scrapes.rs`);
//! - prefix-index deltas per replica (`prefix/<replica>`, bounded);
//! - the precise (KV-event) index of each replica this node follows: deltas and
//!   snapshots (`kv/<replica>/…`, `kv.rs`), mirrored by every other node;
//! - predictor sufficient statistics (`pred/0`, cross-region), merged by the trainer
//!   (from another region without per-replica corrections);
//! - region summaries (`summary/<region>`, cross-region; `regions.rs`);
//! - membership and liveness from chitchat's failure detector.
//!
//! The values are this crate's schema (`schema.rs`: types, kinds, versions, codec); the
//! gossip crate carries them as opaque versioned values. A value this node cannot read
//! (unknown kind or version, malformed, invalid) is ignored and counted
//! (`headroom_mesh_values_refused_total{reason}`).
//!
//! Nothing here is on the request path except `note_prefix`, a non-blocking send (the
//! outcome sink's, at a placement's first byte). The runtime holds this node's fleet,
//! KV feeds and trainer ([`Local`]) and the scrape ownership the fleet consults
//! ([`ScrapeShares`]); the outcome sink holds the runtime, never the reverse.

pub mod duplicate;
mod kv;
mod outbox;
mod owners;
mod peers;
pub mod regions;
pub mod schema;
mod scrapes;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};

use anyhow::Context;
use headroom_gossip::{Mesh, MeshConfig, MeshEvent, Scope, TlsIdentity, Value, keys};
use headroom_predictor::FederationSlot;
use parking_lot::Mutex;
use prometheus::IntCounterVec;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

pub use owners::Owners;
pub use peers::PeerTable;
pub use scrapes::{ScrapeInbox, ScrapeShares};

use schema::{InflightVector, NodeInfo, PredictorSlot, PrefixDelta, ReplicaScrape, WireValue};

use crate::{
    clock,
    fleet::{Fleet, Replica, Scraped, kv_feed::KvFeeds},
    prefix::Cursor,
    trainer::Trainer,
};

pub use crate::config::mesh::MeshSettings;

/// Loads per datagram (each ≈ 40 bytes; a datagram carries ≈ 1.1 KB).
const LOADS_PER_DATAGRAM: usize = 24;
/// Blocks of one request's chain shared with peers (its head is what matches).
const PREFIX_BLOCKS_PER_REQUEST: usize = 128;

/// This node's parts that the mesh shares and folds its peers' state into, handed over
/// when it joins: the fleet (with the config, the metrics and the prefix index), the
/// KV-event feeds and the trainer. Never the request path or the outcome sink, which
/// hold the runtime.
pub struct Local {
    pub fleet: Arc<Fleet>,
    pub kv: Arc<KvFeeds>,
    pub trainer: Arc<Trainer>,
}

pub struct MeshRuntime {
    /// Taken out at shutdown (the gossip handle shuts down by value).
    mesh_slot: arc_swap::ArcSwapOption<Mesh>,
    node_id: String,
    addr: std::net::SocketAddr,
    local: Local,
    settings: MeshSettings,
    peers: Mutex<PeerTable>,
    /// Scrape ownership (shared with the fleet, which consults it).
    scrapes: Arc<ScrapeShares>,
    /// Replica key → when a peer's scrape of it last arrived (`now_s` axis).
    heard_scrapes: Mutex<HashMap<u64, f64>>,
    prefix_tx: crossbeam_channel::Sender<(u64, Vec<u64>)>,
    prefix_rx: crossbeam_channel::Receiver<(u64, Vec<u64>)>,
    seq: AtomicU64,
    pub published: AtomicU64,
    pub ingested: AtomicU64,
    /// KV deltas and snapshot parts published (first sends, not the mesh's refreshes),
    /// and their bytes in chitchat.
    kv_values: AtomicU64,
    kv_bytes: AtomicU64,
    cancel: CancellationToken,
    tracker: TaskTracker,
    duplicates: duplicate::DuplicateWatch,
    regions: regions::Regions,
    /// Peers' values this node ignored, by [`schema::Refused`] reason.
    refused: IntCounterVec,
}

fn scrape_to_wire(r: &Replica, s: &Scraped) -> ReplicaScrape {
    let age_ms = ((clock::now_s() - s.at_s).max(0.0) * 1e3) as u64;
    let at_ms = clock::unix_ms().saturating_sub(age_ms);
    ReplicaScrape::of(r.key, &r.url, r.health.routable(), s, at_ms)
}

/// Encodes and publishes `v` in the region; its size in chitchat.
async fn publish(mesh: &Mesh, key: &str, v: &WireValue) -> anyhow::Result<usize> {
    Ok(mesh.publish(key, &schema::encode(v)?).await?)
}

/// Encodes and publishes `v` on the cross-region cluster.
async fn publish_global(mesh: &Mesh, key: &str, v: &WireValue) -> anyhow::Result<()> {
    Ok(mesh.publish_global(key, &schema::encode(v)?).await?)
}

impl MeshRuntime {
    /// Joins the mesh and starts sharing. The node's id names its certificate.
    /// `scrapes`: the ownership the fleet consults, and its queue of scrapes to share.
    pub async fn start(
        local: Local,
        (scrapes, inbox): (Arc<ScrapeShares>, ScrapeInbox),
        cancel: CancellationToken,
    ) -> anyhow::Result<Arc<MeshRuntime>> {
        let node_cfg = local.fleet.cfg.clone();
        let s = node_cfg.mesh.clone();
        let listen = s.listen.context("mesh.listen is not set")?;
        let node_id = node_cfg.node_id();
        let dir = s
            .tls_dir
            .clone()
            .context("the mesh needs --gossip-tls-dir (see `headroom certs`)")?;
        let tls = TlsIdentity::load(&dir, &node_id)
            .with_context(|| format!("loading TLS identity `{node_id}` from {}", dir.display()))?;
        let mut cfg = MeshConfig::new(node_id.clone(), s.region.clone(), listen, tls)
            .with_gossip_interval(Duration::from_millis(s.gossip_interval_ms.max(10)));
        cfg.cluster_id = s.cluster_id.clone();
        cfg.advertise_addr = s.advertise;
        cfg.seeds = s.peers.clone();
        cfg.cross_region.remote_seeds = s.remote_region_peers.clone();
        cfg.value_ttl = Duration::from_millis(s.peer_ttl_ms.max(1_000) * 3);
        cfg.max_value_bytes = 32 * 1024;
        cfg.compress_frames = s.compress;
        cfg.kinds = schema::policies();
        let mesh = Mesh::start(cfg).await.context("starting the mesh")?;
        let duplicates = duplicate::DuplicateWatch::new(local.fleet.metrics.registry());
        if s.duplicate_check_ms > 0 && !(s.peers.is_empty() && s.remote_region_peers.is_empty()) {
            let window = Duration::from_millis(s.duplicate_check_ms);
            let settle = Duration::from_millis(s.gossip_interval_ms.max(10) * 4);
            if let Some(t) =
                duplicate::check_at_start(&mesh, &node_id, mesh.addr(), window, settle).await
            {
                tracing::error!(node = %node_id, twin_addr = %t.addr, "node id already live in the mesh: refusing to join");
                mesh.shutdown().await;
                anyhow::bail!(
                    "node id `{node_id}` is already live in the mesh (gossip address {}, generation {}): refusing to start a second node with the same id",
                    t.addr,
                    t.generation
                );
            }
        }
        let (prefix_tx, prefix_rx) = crossbeam_channel::bounded(4096);
        let refused = IntCounterVec::new(
            prometheus::Opts::new(
                "headroom_mesh_values_refused_total",
                "Peers' mesh values ignored: unknown kind or schema version, malformed, invalid",
            ),
            &["reason"],
        )
        .context("mesh refusal counter")?;
        let _ = local
            .fleet
            .metrics
            .registry()
            .register(Box::new(refused.clone()));
        let rt = Arc::new(MeshRuntime {
            scrapes,
            heard_scrapes: Mutex::new(HashMap::new()),
            addr: mesh.addr(),
            mesh_slot: arc_swap::ArcSwapOption::from_pointee(mesh),
            node_id: node_id.clone(),
            local,
            settings: s,
            peers: Mutex::new(PeerTable::default()),
            prefix_tx,
            prefix_rx,
            seq: AtomicU64::new(0),
            published: AtomicU64::new(0),
            ingested: AtomicU64::new(0),
            kv_values: AtomicU64::new(0),
            kv_bytes: AtomicU64::new(0),
            cancel,
            tracker: TaskTracker::new(),
            duplicates,
            regions: regions::Regions::default(),
            refused,
        });
        let info = WireValue::NodeInfo(NodeInfo {
            region: rt.settings.region.clone(),
            http_addr: node_cfg.listen.to_string(),
            started_at_ms: clock::unix_ms(),
            version: env!("CARGO_PKG_VERSION").into(),
        });
        publish(
            &*rt.mesh().context("mesh closed")?,
            &keys::node_info(),
            &info,
        )
        .await
        .context("publishing node info")?;
        rt.tracker.spawn(rt.clone().ingest_loop());
        rt.tracker.spawn(rt.clone().inflight_loop());
        rt.tracker.spawn(rt.clone().housekeeping_loop());
        rt.tracker.spawn(rt.clone().scrape_loop(inbox));
        rt.tracker.spawn(rt.clone().prefix_loop());
        rt.tracker.spawn(rt.clone().kv_loop());
        rt.tracker.spawn(rt.clone().predictor_loop());
        rt.tracker.spawn(rt.clone().summary_loop());
        tracing::info!(node = %node_id, addr = %rt.addr, region = %rt.settings.region, "joined the mesh");
        Ok(rt)
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The gossip handle, until shutdown.
    fn mesh(&self) -> Option<Arc<Mesh>> {
        self.mesh_slot.load_full()
    }

    /// Records that this node sent `blocks` to a replica (non-blocking; dropped if full).
    pub fn note_prefix(&self, replica: u64, blocks: &[u64]) {
        if blocks.is_empty() {
            return;
        }
        let head = blocks[..blocks.len().min(PREFIX_BLOCKS_PER_REQUEST)].to_vec();
        let _ = self.prefix_tx.try_send((replica, head));
    }

    /// Leaves the mesh: every task stops, then the gossip endpoint closes.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        let Some(mut m) = self.mesh_slot.swap(None) else {
            return;
        };
        // A debug read may briefly hold the handle; wait it out.
        for _ in 0..50 {
            match Arc::try_unwrap(m) {
                Ok(mesh) => return mesh.shutdown().await,
                Err(back) => m = back,
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tracing::warn!("gossip handle still in use at shutdown; it closes when dropped");
    }

    fn replicas_by_key(&self) -> HashMap<u64, Arc<Replica>> {
        self.local
            .fleet
            .replicas()
            .iter()
            .map(|r| (r.key, r.clone()))
            .collect()
    }

    async fn tick(&self, every: Duration) -> bool {
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = tokio::time::sleep(every) => true,
        }
    }

    /// Publishes this node's in-flight placements (`outbox.rs` says what and when):
    /// datagrams with what changed, and every heartbeat what is busy; the gossip key
    /// when its content changed, at most every heartbeat/2.
    async fn inflight_loop(self: Arc<Self>) {
        let every = Duration::from_millis(self.settings.inflight_interval_ms.max(5));
        let heartbeat = self.settings.heartbeat_ms as f64 / 1e3;
        let keep_zero = self.settings.peer_ttl_ms as f64 / 1e3;
        let mut outbox = outbox::Outbox::default();
        let mut last_gossip: Option<(f64, Vec<schema::ReplicaLoad>)> = None;
        while self.tick(every).await {
            let now = clock::now_s();
            let loads: Vec<schema::ReplicaLoad> = self
                .local
                .fleet
                .replicas()
                .iter()
                .map(|r| peers::to_wire(r.key, &r.ledger.load(now)))
                .collect();
            let Some(mesh) = self.mesh() else { return };
            let at_ms = clock::unix_ms();
            let mut sent = false;
            if self.settings.datagrams {
                let news = outbox.datagram(&loads, now, heartbeat);
                if !news.is_empty() {
                    let seq = self.seq.fetch_add(1, Relaxed) + 1;
                    for chunk in news.chunks(LOADS_PER_DATAGRAM) {
                        let v = WireValue::Inflight(InflightVector {
                            seq,
                            at_ms,
                            loads: chunk.to_vec(),
                        });
                        let sent = schema::encode(&v)
                            .map_err(anyhow::Error::from)
                            .and_then(|v| Ok(mesh.broadcast_datagram(&v)?));
                        if let Err(e) = sent {
                            tracing::debug!("in-flight datagram not sent: {e}");
                        }
                    }
                    sent = true;
                }
            }
            let snapshot = outbox.snapshot(&loads, now, keep_zero);
            let (due, changed) = match &last_gossip {
                None => (true, true),
                Some((t, prev)) => (
                    now - t >= heartbeat / 2.0,
                    prev.len() != snapshot.len()
                        || prev
                            .iter()
                            .zip(&snapshot)
                            .any(|(a, b)| a.replica != b.replica || outbox::material(b, a)),
                ),
            };
            // Without datagrams the gossip copy is the only path: refresh it every
            // heartbeat so peers' copies never reach their TTL.
            let refresh = !self.settings.datagrams
                && !snapshot.is_empty()
                && last_gossip
                    .as_ref()
                    .is_some_and(|(t, _)| now - t >= heartbeat);
            if (due && changed) || refresh {
                let seq = self.seq.fetch_add(1, Relaxed) + 1;
                let v = WireValue::Inflight(InflightVector {
                    seq,
                    at_ms,
                    loads: snapshot.clone(),
                });
                if let Err(e) = publish(&mesh, &keys::inflight(), &v).await {
                    tracing::debug!("in-flight vector not published: {e}");
                }
                last_gossip = Some((now, snapshot));
                sent = true;
            }
            if sent {
                self.published.fetch_add(1, Relaxed);
            }
        }
    }

    /// Expires stale peer reports and recomputes scrape ownership.
    async fn housekeeping_loop(self: Arc<Self>) {
        let every = Duration::from_millis(250);
        let ttl = self.settings.peer_ttl_ms as f64 / 1e3;
        while self.tick(every).await {
            let now = clock::now_s();
            {
                let mut p = self.peers.lock();
                p.expire(now, ttl);
                p.publish(&self.local.fleet.replicas(), now);
            }
            let Some(mesh) = self.mesh() else { return };
            let all = mesh.members().await;
            let own_generation = all.iter().find(|m| m.is_self).map_or(0, |m| m.generation);
            self.regions.note_members(&all);
            self.duplicates
                .check(&all, self.node_id(), self.addr, own_generation);
            let members: Vec<String> = all
                .into_iter()
                .filter(|m| m.live && m.scope == Scope::Region)
                .map(|m| m.node_id.to_string())
                .collect();
            let next = Owners::new(self.node_id(), members, self.settings.scrape_owners);
            if next.members != self.scrapes.owners.load().members {
                tracing::info!(members = next.members.len(), "scrape ownership recomputed");
                self.scrapes.owners.store(Arc::new(next));
            }
        }
    }

    /// Publishes scrapes this node made as an owner, as `scrapes.rs` admits them.
    async fn scrape_loop(self: Arc<Self>, ScrapeInbox(mut rx): ScrapeInbox) {
        // Scrapes made before the mesh joined are not shared (peers hear the next).
        while rx.try_recv().is_ok() {}
        let period = self.settings.scrape_publish_ms as f64 / 1e3;
        let mut gate = scrapes::ScrapeGate::default();
        let mut sweep_s = clock::now_s();
        loop {
            let got = tokio::select! {
                _ = self.cancel.cancelled() => return,
                g = rx.recv() => g,
            };
            let Some((r, s)) = got else { return };
            let now = clock::now_s();
            let w = scrape_to_wire(&r, &s);
            let first = self.scrapes.owners.load().first(r.key);
            let heard = self.heard_scrapes.lock().get(&r.key).copied();
            if !gate.admit(&w, first, heard, now, period) {
                continue;
            }
            if now - sweep_s > 60.0 {
                let live = self.replicas_by_key();
                gate.retain(|k| live.contains_key(&k));
                self.heard_scrapes
                    .lock()
                    .retain(|k, _| live.contains_key(k));
                sweep_s = now;
            }
            let Some(mesh) = self.mesh() else { return };
            if let Err(e) = publish(&mesh, &keys::scrape(r.key), &WireValue::Scrape(w)).await {
                tracing::debug!("scrape not published: {e}");
            }
        }
    }

    /// Publishes recent prefix chains per replica (newest first, bounded).
    async fn prefix_loop(self: Arc<Self>) {
        let every = Duration::from_millis(self.settings.prefix_interval_ms.max(10));
        while self.tick(every).await {
            let mut per: HashMap<u64, Vec<Vec<u64>>> = HashMap::new();
            while let Ok((k, chain)) = self.prefix_rx.try_recv() {
                per.entry(k).or_default().push(chain);
            }
            for (k, chains) in per {
                let mut hashes = Vec::new();
                for c in chains.iter().rev() {
                    let room = schema::PREFIX_DELTA_CAP - hashes.len();
                    hashes.extend_from_slice(&c[..c.len().min(room)]);
                    if hashes.len() >= schema::PREFIX_DELTA_CAP {
                        break;
                    }
                }
                let v = WireValue::Prefix(PrefixDelta { replica: k, hashes });
                let Some(mesh) = self.mesh() else { return };
                if let Err(e) = publish(&mesh, &keys::prefix(k), &v).await {
                    tracing::debug!("prefix delta not published: {e}");
                }
            }
        }
    }

    /// Shares the predictor's statistics across nodes and regions.
    async fn predictor_loop(self: Arc<Self>) {
        let every = Duration::from_millis(self.settings.predictor_interval_ms.max(100));
        while self.tick(every).await {
            let trainer = self.local.trainer.clone();
            let Ok(Some(slot)) = tokio::task::spawn_blocking(move || trainer.export_slot()).await
            else {
                continue;
            };
            let blocks = slot.to_blocks();
            if blocks.len() > schema::MAX_STAT_BLOCKS {
                tracing::debug!(blocks = blocks.len(), "predictor slot too large to share");
                continue;
            }
            let v = WireValue::Predictor(PredictorSlot { blocks });
            let Some(mesh) = self.mesh() else { return };
            if let Err(e) = publish_global(&mesh, &keys::predictor(0), &v).await {
                tracing::debug!("predictor slot not published: {e}");
            }
        }
    }

    /// Folds peers' values into this node's view.
    async fn ingest_loop(self: Arc<Self>) {
        let Some(mut rx) = self.mesh().map(|m| m.subscribe()) else {
            return;
        };
        loop {
            let ev = tokio::select! {
                _ = self.cancel.cancelled() => return,
                e = rx.recv() => e,
            };
            let Some(ev) = ev else { return };
            self.ingested.fetch_add(1, Relaxed);
            self.ingest(ev);
        }
    }

    /// A peer's value as this node's schema reads it; `None` (counted) when it cannot.
    fn decode(&self, node: &str, v: &Value) -> Option<WireValue> {
        match schema::decode(v) {
            Ok(w) => Some(w),
            Err(r) => {
                self.refused.with_label_values(&[r.as_str()]).inc();
                tracing::debug!(peer = %node, kind = v.kind, version = v.version, reason = r.as_str(), "mesh value ignored");
                None
            }
        }
    }

    fn ingest(&self, ev: MeshEvent) {
        let now = clock::now_s();
        match ev {
            MeshEvent::Datagram { node, value, age } => {
                if let Some(WireValue::Inflight(v)) = self.decode(&node, &value) {
                    self.ingest_inflight(&node, &v, age, now);
                }
            }
            MeshEvent::Value {
                node, value, age, ..
            } => {
                if let Some(v) = self.decode(&node, &value) {
                    self.ingest_value(&node, v, age, now);
                }
            }
            MeshEvent::ValueRemoved { node, key, .. } if key == keys::inflight() => {
                let mut p = self.peers.lock();
                if p.remove(&node) {
                    p.publish(&self.local.fleet.replicas(), now);
                }
            }
            MeshEvent::MemberLeft { node, scope } => {
                if scope == Scope::Region {
                    let mut p = self.peers.lock();
                    if p.remove(&node) {
                        p.publish(&self.local.fleet.replicas(), now);
                    }
                    drop(p);
                    self.local.kv.mesh_member_left(&node);
                }
                self.local.trainer.forget_peer(&node);
            }
            _ => {}
        }
    }

    fn ingest_inflight(&self, node: &Arc<str>, v: &InflightVector, age: Duration, now: f64) {
        let mut p = self.peers.lock();
        if p.update(node, v, now, age.as_secs_f64()) {
            p.publish(&self.local.fleet.replicas(), now);
        }
    }

    fn ingest_value(&self, node: &Arc<str>, value: WireValue, age: Duration, now: f64) {
        match value {
            WireValue::Inflight(v) => self.ingest_inflight(node, &v, age, now),
            WireValue::Scrape(w) => {
                self.heard_scrapes.lock().insert(w.replica, now);
                if let Some(r) = self.replicas_by_key().get(&w.replica) {
                    let prev = r.scraped.load();
                    let s = w.to_scraped(now - age.as_secs_f64(), prev.as_ref());
                    if prev.as_ref().is_none_or(|p| s.at_s > p.at_s) {
                        self.local.fleet.note_scrape(r, prev.as_ref(), &s, "peer");
                        r.scraped.store(Some(s));
                    }
                }
            }
            WireValue::Prefix(d) => {
                if let Some(r) = self.replicas_by_key().get(&d.replica) {
                    let idx = &self.local.fleet.prefix;
                    let cursor = Cursor {
                        replica: r.id,
                        seq: r.prefix_cursor.load(Relaxed),
                        capacity: r.kv_capacity_tokens().map_or(u64::MAX, |t| {
                            (t / self.local.fleet.cfg.prefix.block_tokens.max(1) as u64).max(1)
                        }),
                    };
                    let mut matched = [0u32];
                    idx.match_lengths(&d.hashes, &[cursor], &mut matched);
                    idx.record(&r.prefix_cursor, r.id, &d.hashes, matched[0] as usize);
                }
            }
            v @ (WireValue::KvDelta(_) | WireValue::KvSnapshot(_)) => self.ingest_kv(node, v),
            WireValue::Predictor(slot) => {
                // A peer not known to be in this region shares its classes only.
                let home = self.regions.in_region(node, &self.settings.region);
                match FederationSlot::from_blocks(node, &slot.blocks) {
                    Ok(s) if home => self.local.trainer.merge_peer(s),
                    Ok(s) => self
                        .local
                        .trainer
                        .merge_peer(headroom_core::region::cross_region_slot(s)),
                    Err(e) => tracing::debug!(peer = %node, "predictor slot refused: {e}"),
                }
            }
            WireValue::Summary(s) => self.ingest_summary(node, &s, age),
            WireValue::NodeInfo(_) => {}
        }
    }

    /// `/debug/cluster`.
    pub async fn cluster_json(&self) -> serde_json::Value {
        let now = clock::now_s();
        let peers: HashMap<String, (usize, f64)> = self
            .peers
            .lock()
            .peers()
            .into_iter()
            .map(|(p, n, at)| (p.to_string(), (n, now - at)))
            .collect();
        let Some(mesh) = self.mesh() else {
            return serde_json::json!({ "node_id": self.node_id(), "members": [], "closed": true });
        };
        let members: Vec<serde_json::Value> = mesh
            .members()
            .await
            .into_iter()
            .map(|m| {
                let inflight = peers.get(m.node_id.as_ref());
                serde_json::json!({
                    "node_id": m.node_id.as_ref(),
                    "live": m.live,
                    "self": m.is_self,
                    "scope": if m.scope == Scope::Region { "region" } else { "global" },
                    "region": m.region,
                    "addr": m.addr.to_string(),
                    "age_s": m.last_seen_age.as_secs_f64(),
                    "keys": m.keys,
                    "inflight_replicas": inflight.map(|x| x.0),
                    "inflight_age_s": inflight.map(|x| x.1),
                    "clock_skew_ms": if m.is_self { None } else { mesh.clock_skew_ms(&m.node_id) },
                })
            })
            .collect();
        let owners = self.scrapes.owners.load();
        let st = mesh.stats();
        serde_json::json!({
            "node_id": self.node_id(),
            "region": self.settings.region,
            "gossip_addr": self.addr.to_string(),
            "members": members,
            "scrape_owners": { "k": owners.k, "members": owners.members },
            "published_vectors": self.published.load(Relaxed),
            "ingested_events": self.ingested.load(Relaxed),
            "duplicate_node_ids": self.duplicates.total(),
            "kv_values_published": self.kv_values.load(Relaxed),
            "kv_bytes_published": self.kv_bytes.load(Relaxed),
            "refused_values": schema::Refused::ALL
                .iter()
                .map(|r| (r.as_str(), self.refused.with_label_values(&[r.as_str()]).get()))
                .collect::<HashMap<_, _>>(),
            "gossip_bytes_sent": st.bytes_sent,
            "gossip_bytes_received": st.bytes_received,
            "regions": self.regions.json(now, self.local.fleet.cfg.regions.summary_ttl_ms as f64 / 1e3),
            "stats": format!("{st:?}"),
        })
    }
}
