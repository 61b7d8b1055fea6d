//! The mesh handle: starts the QUIC endpoint, the regional and cross-region chitchat
//! clusters, the observers, the refresher and the seed resolver; publishes this node's
//! values; shuts everything down.
//!
//! Invariants: chitchat's mutex is only taken for short, non-blocking sections (a `set`,
//! a `delete`, the observer's copy-out); `members()` and `stats()` never take it. Every
//! task is tracked and stops on `shutdown`.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use chitchat::{ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, ListenerHandle};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::warn;

use crate::clock::now_ms;
use crate::config::{FailureDetection, MeshConfig};
use crate::error::MeshError;
use crate::events::{EventHub, MemberInfo, MeshEvent, Scope};
use crate::keys::{REGION_KEY, validate_key};
use crate::observer::{Observer, ObserverShared};
use crate::seeds::{DnsResolver, SeedResolver, Seeds};
use crate::stats::{Counters, MeshStats};
use crate::tls::transport_config;
use crate::transport::frame::Channel;
use crate::transport::socket::QuicTransport;
use crate::transport::{MAX_DATAGRAM_PAYLOAD, Outgoing, Transport, TransportSettings};
use crate::wire::{self, KindPolicies, Value};

/// One chitchat cluster this node belongs to.
struct Cluster {
    handle: ChitchatHandle,
    observer: Arc<ObserverShared>,
    _listener: ListenerHandle,
    value_ttl: Duration,
    /// This node's values in the cluster: key → (value, last set), for refreshes.
    local: Mutex<HashMap<String, (Value, Instant)>>,
}

/// A running mesh node. Cheap to share behind an `Arc`; call [`Mesh::shutdown`] to stop.
pub struct Mesh {
    node_id: Arc<str>,
    region: String,
    advertise: SocketAddr,
    regional: Arc<Cluster>,
    global: Option<Arc<Cluster>>,
    transport: Arc<Transport>,
    hub: Arc<EventHub>,
    counters: Arc<Counters>,
    max_value_bytes: usize,
    kinds: KindPolicies,
    event_buffer: usize,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("node_id", &self.node_id)
            .field("region", &self.region)
            .field("addr", &self.advertise)
            .finish_non_exhaustive()
    }
}

fn detector(f: &FailureDetection) -> FailureDetectorConfig {
    FailureDetectorConfig::new(
        f.phi_threshold,
        1000,
        f.max_interval,
        f.initial_interval,
        f.dead_node_grace_period,
    )
}

impl Mesh {
    /// Binds the QUIC endpoint and joins the region's cluster (and the cross-region one).
    pub async fn start(cfg: MeshConfig) -> Result<Mesh, MeshError> {
        cfg.validate()?;
        let qt = transport_config(cfg.idle_timeout, cfg.keep_alive, cfg.handshake_rtt);
        let server = cfg.tls.server_config(qt.clone())?;
        let client = cfg.tls.client_config(qt)?;
        let bind_err = |source| MeshError::Bind {
            addr: cfg.listen_addr,
            source,
        };
        // The stateless-reset key comes from the node's private key, so a node restarted
        // on the same address resets its peers' connections to its previous process at
        // once; with a random key they would linger, swallowing replies, until idle.
        let reset_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &cfg.tls.reset_secret());
        let socket = std::net::UdpSocket::bind(cfg.listen_addr).map_err(bind_err)?;
        let mut endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::new(Arc::new(reset_key)),
            Some(server),
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(bind_err)?;
        endpoint.set_default_client_config(client);
        let bound = endpoint.local_addr().map_err(|source| MeshError::Bind {
            addr: cfg.listen_addr,
            source,
        })?;
        let advertise = cfg.advertise_addr.unwrap_or(bound);
        if advertise.ip().is_unspecified() || advertise.port() == 0 {
            endpoint.close(0u32.into(), b"");
            return Err(MeshError::Config(format!(
                "advertise address {advertise} is not reachable; set advertise_addr"
            )));
        }

        let counters = Arc::new(Counters::default());
        let hub = Arc::new(EventHub::new(counters.clone()));
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let (transport, [rx_regional, rx_global]) = Transport::new(
            endpoint,
            advertise,
            counters.clone(),
            hub.clone(),
            cfg.fault.clone(),
            cancel.clone(),
            tracker.clone(),
            TransportSettings {
                connect_timeout: cfg.connect_timeout,
                dial_timeout: cfg.dial_timeout,
                retry_after: cfg.dial_timeout / 4,
                silent_after: cfg.silent_after,
                stale_after: cfg.gossip_interval * 5,
                send_queue: cfg.send_queue,
                inbound_queue: 1024,
                max_value_bytes: cfg.max_value_bytes,
                compress: cfg.compress_frames,
            },
        );
        transport.spawn_accept_loop();

        let resolver: Arc<dyn SeedResolver> = cfg
            .resolver
            .clone()
            .unwrap_or_else(|| Arc::new(DnsResolver));
        let regional_seeds = Seeds::parse(&cfg.seeds);
        let mut global_seed_list = cfg.cross_region.remote_seeds.clone();
        global_seed_list.extend(cfg.seeds.iter().cloned());
        let global_seeds = Seeds::parse(&global_seed_list);

        // Restarts must get a larger generation: wall-clock ms at start.
        let generation = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let id = ChitchatId::new(cfg.node_id.clone(), generation, advertise);

        let start_cluster = |scope: Scope| {
            let (channel, cluster_id, interval, failure, ttl, seeds) = match scope {
                Scope::Region => (
                    Channel::Regional,
                    format!("{}/{}", cfg.cluster_id, cfg.region),
                    cfg.gossip_interval,
                    &cfg.failure,
                    cfg.value_ttl,
                    &regional_seeds,
                ),
                Scope::Global => (
                    Channel::Global,
                    format!("{}/global", cfg.cluster_id),
                    cfg.cross_region.gossip_interval,
                    &cfg.cross_region.failure,
                    cfg.cross_region.value_ttl,
                    &global_seeds,
                ),
            };
            (
                channel,
                cluster_id,
                interval,
                detector(failure),
                ttl,
                seeds.clone(),
            )
        };

        let mut clusters = Vec::new();
        let mut rxs = vec![(Scope::Region, rx_regional)];
        if cfg.cross_region.enabled {
            rxs.push((Scope::Global, rx_global));
        }
        for (scope, rx) in rxs {
            let (channel, cluster_id, interval, fd, ttl, seeds) = start_cluster(scope);
            let initial = seeds.resolve(&resolver, cfg.connect_timeout).await;
            let chitchat_cfg = ChitchatConfig {
                chitchat_id: id.clone(),
                cluster_id,
                gossip_interval: interval,
                listen_addr: advertise,
                seed_nodes: initial
                    .iter()
                    .filter(|a| **a != advertise)
                    .map(|a| a.to_string())
                    .collect(),
                failure_detector_config: fd,
                marked_for_deletion_grace_period: ttl,
                catchup_callback: None,
                extra_liveness_predicate: None,
            };
            let qtr = QuicTransport::new(transport.clone(), channel, rx);
            let handle = chitchat::spawn_chitchat(
                chitchat_cfg,
                vec![(REGION_KEY.to_string(), cfg.region.clone())],
                &qtr,
            )
            .await
            .map_err(|e| MeshError::Start(e.to_string()))?;
            let shared = ObserverShared::new();
            let chitchat = handle.chitchat();
            let notify_target = shared.clone();
            // Runs under chitchat's lock: only a wake-up, no work.
            let listener = chitchat
                .lock()
                .await
                .subscribe_event("", move |_| notify_target.notify.notify_one());
            let observer = Observer::new(
                scope,
                chitchat,
                shared.clone(),
                hub.clone(),
                counters.clone(),
                transport.known[channel.index()].clone(),
                cfg.max_value_bytes,
                interval,
                cancel.clone(),
            );
            tracker.spawn(observer.run());
            let cluster = Arc::new(Cluster {
                handle,
                observer: shared,
                _listener: listener,
                value_ttl: ttl,
                local: Mutex::new(HashMap::new()),
            });
            spawn_refresher(
                &tracker,
                &cancel,
                cluster.clone(),
                cfg.max_value_bytes,
                cfg.kinds,
            );
            if !seeds.names.is_empty() {
                spawn_seed_refresh(
                    &tracker,
                    &cancel,
                    cluster.clone(),
                    seeds,
                    resolver.clone(),
                    cfg.dns_refresh_interval,
                    advertise,
                    cfg.connect_timeout,
                );
            }
            clusters.push(cluster);
        }
        let global = if clusters.len() > 1 {
            clusters.pop()
        } else {
            None
        };
        let Some(regional) = clusters.pop() else {
            return Err(MeshError::Start("regional cluster missing".into()));
        };

        Ok(Mesh {
            node_id: cfg.node_id.into(),
            region: cfg.region,
            advertise,
            regional,
            global,
            transport,
            hub,
            counters,
            max_value_bytes: cfg.max_value_bytes,
            kinds: cfg.kinds,
            event_buffer: cfg.event_buffer,
            cancel,
            tracker,
        })
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn region(&self) -> &str {
        &self.region
    }

    /// The address peers reach this node at.
    pub fn addr(&self) -> SocketAddr {
        self.advertise
    }

    /// Publishes this node's `key` in its region. The mesh keeps it alive (refreshes)
    /// until [`Mesh::remove`] or shutdown, unless its kind is a measurement
    /// ([`crate::KindPolicy::measurement`]), which expires at the TTL unless published
    /// again. Returns the value's size in chitchat (base64 text bytes), for callers that
    /// account their bandwidth.
    pub async fn publish(&self, key: &str, value: &Value) -> Result<usize, MeshError> {
        set_value(&self.regional, key, value, self.max_value_bytes).await
    }

    /// Publishes a value on the cross-region cluster; only kinds whose policy says
    /// [`crate::KindPolicy::crosses_regions`].
    pub async fn publish_global(&self, key: &str, value: &Value) -> Result<(), MeshError> {
        if !self.kinds.get(value.kind).crosses_regions {
            return Err(MeshError::NotGlobal(value.kind));
        }
        let g = self.global.as_ref().ok_or(MeshError::CrossRegionDisabled)?;
        set_value(g, key, value, self.max_value_bytes)
            .await
            .map(|_| ())
    }

    /// Deletes this node's regional `key` (peers get `ValueRemoved`).
    pub async fn remove(&self, key: &str) {
        remove_value(&self.regional, key).await;
    }

    /// Deletes this node's cross-region `key`.
    pub async fn remove_global(&self, key: &str) {
        if let Some(g) = &self.global {
            remove_value(g, key).await;
        }
    }

    /// Test hook: writes `text` verbatim as a chitchat value, bypassing encoding, to
    /// exercise peers' validation of corrupt values.
    #[doc(hidden)]
    pub async fn publish_raw_for_test(&self, key: &str, text: &str) {
        self.regional
            .handle
            .with_chitchat(|c| c.self_node_state().set_with_ttl(key, text))
            .await;
    }

    /// Sends `value` as one QUIC datagram to every live regional member. Unreliable,
    /// unordered, never retransmitted: for small latest-wins vectors. Returns the number
    /// of peers it was queued for.
    pub fn broadcast_datagram(&self, value: &Value) -> Result<usize, MeshError> {
        let bytes = self.encode_datagram(value)?;
        Ok(self.send_datagram_bytes(bytes))
    }

    fn encode_datagram(&self, value: &Value) -> Result<Bytes, MeshError> {
        let max = self.max_datagram_payload();
        let bytes = wire::encode(value, now_ms(), usize::MAX)?;
        if bytes.len() > max {
            return Err(MeshError::DatagramTooLarge {
                size: bytes.len(),
                max,
            });
        }
        Ok(Bytes::from(bytes))
    }

    fn send_datagram_bytes(&self, bytes: Bytes) -> usize {
        let members = self.regional.observer.members.load();
        let mut n = 0;
        for m in members.iter().filter(|m| m.info.live) {
            self.transport
                .enqueue(m.info.addr, Outgoing::Datagram(bytes.clone()));
            n += 1;
        }
        n
    }

    /// Test hook: broadcasts arbitrary bytes as datagrams.
    #[doc(hidden)]
    pub fn broadcast_raw_datagram_for_test(&self, bytes: &[u8]) -> usize {
        self.send_datagram_bytes(Bytes::copy_from_slice(bytes))
    }

    /// Largest encoded value [`Mesh::broadcast_datagram`] accepts.
    pub fn max_datagram_payload(&self) -> usize {
        MAX_DATAGRAM_PAYLOAD.min(self.max_value_bytes)
    }

    /// A bounded event stream. The current view (live members and their values) is
    /// replayed first, then changes follow. Events that do not fit are dropped and counted.
    pub fn subscribe(&self) -> mpsc::Receiver<MeshEvent> {
        let (tx, rx) = mpsc::channel(self.event_buffer);
        self.hub.add(tx.clone());
        for c in self.clusters() {
            c.observer.replays.lock().push(tx.clone());
            c.observer.notify.notify_one();
        }
        rx
    }

    /// Members of this region, then members of other regions seen on the cross-region
    /// cluster, as of the last observer pass (at most one gossip interval old). This node
    /// is included first. No lock on gossip state is taken.
    pub async fn members(&self) -> Vec<MemberInfo> {
        let now = Instant::now();
        let mut out = vec![MemberInfo {
            node_id: self.node_id.clone(),
            scope: Scope::Region,
            region: Some(self.region.clone()),
            live: true,
            last_seen_age: Duration::ZERO,
            keys: {
                let mut k: Vec<String> = self.regional.local.lock().keys().cloned().collect();
                k.sort();
                k
            },
            addr: self.advertise,
            generation: self.regional.handle.chitchat_id().generation_id,
            is_self: true,
        }];
        let mut seen: HashSet<Arc<str>> = HashSet::new();
        for c in self.clusters() {
            for m in c.observer.members.load().iter() {
                if m.info.scope == Scope::Global
                    && m.info.region.as_deref() == Some(self.region.as_str())
                {
                    continue;
                }
                if m.info.scope == Scope::Global && seen.contains(&m.info.node_id) {
                    continue;
                }
                seen.insert(m.info.node_id.clone());
                let mut info = m.info.clone();
                info.last_seen_age = now.saturating_duration_since(m.last_seen);
                out.push(info);
            }
        }
        out
    }

    /// This node's estimate of `node`'s wall-clock skew (ms; > 0: its clock is behind
    /// ours), from its datagrams; None before the first.
    pub fn clock_skew_ms(&self, node: &str) -> Option<i64> {
        self.hub.skew.estimate_ms(node)
    }

    /// Counters since start.
    pub fn stats(&self) -> MeshStats {
        self.counters.snapshot(self.transport.live_udp_bytes())
    }

    fn clusters(&self) -> impl Iterator<Item = &Arc<Cluster>> {
        std::iter::once(&self.regional).chain(self.global.iter())
    }

    /// Stops gossip, closes every connection and waits for every task to end.
    pub async fn shutdown(self) {
        // Closing the endpoint first aborts pending dials, so no task waits on a timeout.
        self.cancel.cancel();
        self.transport.endpoint.close(0u32.into(), b"shutdown");
        self.tracker.close();
        self.tracker.wait().await;
        // Our tasks are gone, so each cluster has a single owner left.
        for c in [Some(self.regional), self.global].into_iter().flatten() {
            match Arc::try_unwrap(c) {
                Ok(c) => {
                    if let Err(e) = c.handle.shutdown().await {
                        warn!(error = %e, "chitchat stopped with an error");
                    }
                }
                Err(c) => {
                    let _ = c.handle.initiate_shutdown();
                }
            }
        }
        let _ =
            tokio::time::timeout(Duration::from_secs(1), self.transport.endpoint.wait_idle()).await;
    }
}

async fn set_value(c: &Cluster, key: &str, value: &Value, cap: usize) -> Result<usize, MeshError> {
    validate_key(key)?;
    let text = wire::encode_text(value, now_ms(), cap)?;
    let len = text.len();
    c.handle
        .with_chitchat(|cc| cc.self_node_state().set_with_ttl(key, &text))
        .await;
    c.local
        .lock()
        .insert(key.to_string(), (value.clone(), Instant::now()));
    Ok(len)
}

async fn remove_value(c: &Cluster, key: &str) {
    if c.local.lock().remove(key).is_some() {
        c.handle
            .with_chitchat(|cc| cc.self_node_state().delete(key))
            .await;
    }
}

/// Re-sets this node's values before their TTL runs out (a fresh timestamp makes the
/// value differ, so chitchat bumps its version and peers restart their TTL clock);
/// measurements ([`crate::KindPolicy::measurement`]) excepted: they expire at the TTL.
fn spawn_refresher(
    tracker: &TaskTracker,
    cancel: &CancellationToken,
    c: Arc<Cluster>,
    cap: usize,
    kinds: KindPolicies,
) {
    let cancel = cancel.clone();
    tracker.spawn(async move {
        let every = c.value_ttl / 6;
        let stale_after = c.value_ttl / 3;
        let mut tick = tokio::time::interval(every);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            let due: Vec<(String, String)> = {
                let mut local = c.local.lock();
                // Measurements are not kept alive: re-stamped, an old scrape would look
                // new. Their publisher sends them again while they are news.
                local
                    .iter_mut()
                    .filter(|(_, (v, _))| !kinds.get(v.kind).measurement)
                    .filter(|(_, (_, at))| now.duration_since(*at) >= stale_after)
                    .filter_map(|(k, (v, at))| {
                        *at = now;
                        wire::encode_text(v, now_ms(), cap)
                            .ok()
                            .map(|t| (k.clone(), t))
                    })
                    .collect()
            };
            if !due.is_empty() {
                c.handle
                    .with_chitchat(|cc| {
                        let me = cc.self_node_state();
                        for (k, t) in &due {
                            me.set_with_ttl(k, t);
                        }
                    })
                    .await;
            }
        }
    });
}

/// Re-resolves hostname seeds and gossips with every resolved address that is not a live
/// member yet.
#[allow(clippy::too_many_arguments)]
fn spawn_seed_refresh(
    tracker: &TaskTracker,
    cancel: &CancellationToken,
    c: Arc<Cluster>,
    seeds: Seeds,
    resolver: Arc<dyn SeedResolver>,
    every: Duration,
    advertise: SocketAddr,
    timeout: Duration,
) {
    let cancel = cancel.clone();
    tracker.spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tick.tick() => {}
            }
            let addrs = tokio::select! {
                _ = cancel.cancelled() => break,
                a = seeds.resolve(&resolver, timeout) => a,
            };
            let live: HashSet<SocketAddr> = c
                .observer
                .members
                .load()
                .iter()
                .filter(|m| m.info.live)
                .map(|m| m.info.addr)
                .collect();
            for a in addrs {
                if a != advertise && !live.contains(&a) {
                    let _ = c.handle.gossip(a);
                }
            }
        }
    });
}
