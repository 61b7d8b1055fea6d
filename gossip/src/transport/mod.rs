//! The QUIC transport under chitchat: one quinn endpoint per node, mutual TLS, one
//! uni-stream per gossip message, datagrams for the fast path.
//!
//! Invariants:
//! - Nothing here blocks the chitchat loop: `Socket::send` frames the message and hands it
//!   to a per-peer bounded queue (`try_send`; full ⇒ dropped and counted).
//! - One connection per peer address is cached (inbound or outbound, whichever exists) and
//!   re-established lazily by that peer's link task; failed dials back off.
//! - A cached connection that has heard nothing back (no UDP datagram at all, so not even
//!   an ACK) for `silent_after` since a send went out is closed and redialled: after a
//!   partition heals, QUIC's doubled loss timer would keep an old connection asleep for
//!   about as long as the partition lasted.
//! - A peer is served only after mTLS succeeded; its identity is its certificate's node id.
//!   A gossip frame's claimed sender address must stay fixed per connection, must not
//!   belong to another live member, and (Syn/SynAck) must appear in the sender's own
//!   digest under the certificate's node id. Violations count as `rejected_peers`.
//! - Every task is tracked and stops on the shared cancellation token.

pub(crate) mod frame;
pub(crate) mod socket;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use chitchat::{ChitchatMessage, Deserializable};
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::debug;

use crate::events::{EventHub, MeshEvent};
use crate::fault::FaultInjector;
use crate::stats::Counters;
use crate::tls::{SEED_SERVER_NAME, peer_node_id};
use crate::wire;
use frame::Channel;

/// Largest datagram payload the mesh will send: quinn's guaranteed minimum
/// (1 200-byte initial MTU − 38 bytes of QUIC overhead).
pub const MAX_DATAGRAM_PAYLOAD: usize = 1162;
/// A link task with nothing to send for this long exits (re-created on demand).
const LINK_IDLE: Duration = Duration::from_secs(60);

pub(crate) enum Outgoing {
    Frame(Bytes),
    Datagram(Bytes),
}

/// A queued message and when it was queued (stale ones are dropped, not sent late).
struct Queued(Outgoing, Instant);

/// Address → node id of live members, one map per cluster, refreshed by the observers.
pub(crate) type KnownPeers = ArcSwap<HashMap<SocketAddr, Arc<str>>>;

pub(crate) struct TransportSettings {
    /// Stream write and inbound handshake timeout.
    pub connect_timeout: Duration,
    /// One outgoing dial's timeout.
    pub dial_timeout: Duration,
    /// Back-off after a failed dial.
    pub retry_after: Duration,
    /// Sent and heard nothing back for this long: the connection is replaced.
    pub silent_after: Duration,
    /// Messages queued longer than this are dropped: the next gossip round carries
    /// fresher state than a late one would.
    pub stale_after: Duration,
    pub send_queue: usize,
    pub inbound_queue: usize,
    pub max_value_bytes: usize,
    /// Compress gossip frames (`frame.rs`); receivers accept both forms.
    pub compress: bool,
}

pub(crate) struct Transport {
    pub endpoint: quinn::Endpoint,
    pub advertise: SocketAddr,
    pub counters: Arc<Counters>,
    pub hub: Arc<EventHub>,
    pub known: [Arc<KnownPeers>; 2],
    pub fault: Option<FaultInjector>,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    settings: TransportSettings,
    inbound: [mpsc::Sender<(SocketAddr, ChitchatMessage)>; 2],
    links: Mutex<HashMap<SocketAddr, mpsc::Sender<Queued>>>,
    conns: Mutex<HashMap<SocketAddr, quinn::Connection>>,
    live_conns: Mutex<HashMap<usize, quinn::Connection>>,
    backoff: Mutex<HashMap<SocketAddr, Instant>>,
    /// Per open connection (by stable id): what it last heard, for [`Self::gone_silent`].
    hearing: Mutex<HashMap<usize, Hearing>>,
    /// Woken whenever an inbound connection becomes a peer's reply path, so a dial in
    /// progress to that peer can use it instead of waiting out its timeout.
    inbound_bound: tokio::sync::Notify,
}

/// What a connection's serving task knows about its peer.
struct PeerCtx {
    node_id: Arc<str>,
    /// The advertise address this connection speaks for, fixed by its first frame (or
    /// by the dial).
    bound_addr: Mutex<Option<SocketAddr>>,
}

/// What one connection last heard from its peer.
struct Hearing {
    /// UDP datagrams received on it so far (quinn's count: data, ACKs, pings).
    rx: u64,
    /// The first send since `rx` last grew, if any.
    unanswered_since: Option<Instant>,
}

/// Streams read concurrently per connection.
const STREAMS_PER_CONN: usize = 32;

impl Transport {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        endpoint: quinn::Endpoint,
        advertise: SocketAddr,
        counters: Arc<Counters>,
        hub: Arc<EventHub>,
        fault: Option<FaultInjector>,
        cancel: CancellationToken,
        tracker: TaskTracker,
        settings: TransportSettings,
    ) -> (
        Arc<Self>,
        [mpsc::Receiver<(SocketAddr, ChitchatMessage)>; 2],
    ) {
        let (tx0, rx0) = mpsc::channel(settings.inbound_queue);
        let (tx1, rx1) = mpsc::channel(settings.inbound_queue);
        let t = Arc::new(Self {
            endpoint,
            advertise,
            counters,
            hub,
            known: [Arc::default(), Arc::default()],
            fault,
            cancel,
            tracker,
            settings,
            inbound: [tx0, tx1],
            links: Mutex::new(HashMap::new()),
            conns: Mutex::new(HashMap::new()),
            live_conns: Mutex::new(HashMap::new()),
            backoff: Mutex::new(HashMap::new()),
            hearing: Mutex::new(HashMap::new()),
            inbound_bound: tokio::sync::Notify::new(),
        });
        (t, [rx0, rx1])
    }

    fn blocked(&self, peer: SocketAddr) -> bool {
        let b = self
            .fault
            .as_ref()
            .is_some_and(|f| f.blocked(self.advertise, peer));
        if b {
            Counters::add(&self.counters.fault_dropped, 1);
        }
        b
    }

    fn known_id(&self, addr: &SocketAddr) -> Option<Arc<str>> {
        self.known.iter().find_map(|k| k.load().get(addr).cloned())
    }

    /// Queues `msg` for `to` without waiting. Drops (and counts) if the peer's queue is full.
    pub fn enqueue(self: &Arc<Self>, to: SocketAddr, msg: Outgoing) {
        if self.blocked(to) || self.cancel.is_cancelled() {
            return;
        }
        let mut links = self.links.lock();
        let mut msg = Queued(msg, Instant::now());
        for _ in 0..2 {
            let tx = links
                .entry(to)
                .or_insert_with(|| self.spawn_link(to))
                .clone();
            match tx.try_send(msg) {
                Ok(()) => return,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    Counters::add(&self.counters.dropped_messages, 1);
                    return;
                }
                Err(mpsc::error::TrySendError::Closed(m)) => {
                    // The link went idle and exited: start a fresh one.
                    links.remove(&to);
                    msg = m;
                }
            }
        }
        Counters::add(&self.counters.dropped_messages, 1);
    }

    fn spawn_link(self: &Arc<Self>, to: SocketAddr) -> mpsc::Sender<Queued> {
        let (tx, mut rx) = mpsc::channel::<Queued>(self.settings.send_queue);
        let t = self.clone();
        self.tracker.spawn(async move {
            loop {
                let next = tokio::select! {
                    _ = t.cancel.cancelled() => break,
                    n = tokio::time::timeout(LINK_IDLE, rx.recv()) => n,
                };
                let msg = match next {
                    Ok(Some(Queued(m, at))) if at.elapsed() <= t.settings.stale_after => m,
                    Ok(Some(_)) => {
                        Counters::add(&t.counters.dropped_messages, 1);
                        continue;
                    }
                    Ok(None) | Err(_) => break,
                };
                t.deliver(to, msg).await;
            }
        });
        tx
    }

    async fn deliver(self: &Arc<Self>, to: SocketAddr, msg: Outgoing) {
        let Some(conn) = self.connection(to).await else {
            Counters::add(&self.counters.dropped_messages, 1);
            return;
        };
        match msg {
            Outgoing::Frame(bytes) => {
                let len = bytes.len() as u64;
                let send = async {
                    let mut s = conn.open_uni().await.ok()?;
                    s.write_all(&bytes).await.ok()?;
                    s.finish().ok()
                };
                match tokio::time::timeout(self.settings.connect_timeout, send).await {
                    Ok(Some(())) => {
                        Counters::add(&self.counters.messages_sent, 1);
                        Counters::add(&self.counters.bytes_sent, len);
                    }
                    _ => {
                        Counters::add(&self.counters.dropped_messages, 1);
                        self.forget(to, &conn);
                    }
                }
            }
            Outgoing::Datagram(bytes) => {
                let len = bytes.len() as u64;
                match conn.send_datagram(bytes) {
                    Ok(()) => {
                        Counters::add(&self.counters.datagrams_sent, 1);
                        Counters::add(&self.counters.datagram_bytes_sent, len);
                    }
                    Err(e) => {
                        debug!(peer = %to, error = %e, "datagram not sent");
                        Counters::add(&self.counters.dropped_messages, 1);
                    }
                }
            }
        }
    }

    fn forget(&self, addr: SocketAddr, conn: &quinn::Connection) {
        let mut conns = self.conns.lock();
        if conns
            .get(&addr)
            .is_some_and(|c| c.stable_id() == conn.stable_id())
        {
            conns.remove(&addr);
        }
    }

    /// The cached connection to `to`, or a new one (dialled with the member's node id as
    /// TLS server name when known). `None` while backing off after a failed dial.
    async fn connection(self: &Arc<Self>, to: SocketAddr) -> Option<quinn::Connection> {
        if let Some(c) = self.cached(to) {
            if !self.gone_silent(&c) {
                return Some(c);
            }
            debug!(peer = %to, "connection silent: redialling");
            Counters::add(&self.counters.silent_connections, 1);
            c.close(3u32.into(), b"silent");
            self.forget(to, &c);
        }
        if self
            .backoff
            .lock()
            .get(&to)
            .is_some_and(|until| Instant::now() < *until)
        {
            return None;
        }
        let expected = self.known_id(&to);
        let name = expected.as_deref().unwrap_or(SEED_SERVER_NAME).to_string();
        let attempt = async {
            let connecting = self
                .endpoint
                .connect(to, &name)
                .map_err(|e| e.to_string())?;
            connecting.await.map_err(|e| {
                if is_tls_rejection(&e) {
                    Counters::add(&self.counters.rejected_peers, 1);
                }
                e.to_string()
            })
        };
        // A restarted peer dials us while our dial to it may hang (its old process is
        // gone): whichever connection is ready first carries the message.
        let inbound = async {
            loop {
                let woken = self.inbound_bound.notified();
                if let Some(c) = self.cached(to) {
                    return c;
                }
                woken.await;
            }
        };
        let res = tokio::select! {
            r = tokio::time::timeout(self.settings.dial_timeout, attempt) => r,
            c = inbound => return Some(c),
        };
        let conn = match res {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return self.dial_failed(to, &e),
            Err(_) => return self.dial_failed(to, "timed out"),
        };
        let Some(peer) = peer_node_id(&conn) else {
            conn.close(1u32.into(), b"no identity");
            Counters::add(&self.counters.rejected_peers, 1);
            return self.dial_failed(to, "peer certificate names no node");
        };
        if expected.as_deref().is_some_and(|e| e != peer) {
            // rustls already checked the name; this guards the seed path too.
            conn.close(1u32.into(), b"identity mismatch");
            Counters::add(&self.counters.rejected_peers, 1);
            return self.dial_failed(to, "identity mismatch");
        }
        self.backoff.lock().remove(&to);
        Counters::add(&self.counters.connects, 1);
        self.conns.lock().insert(to, conn.clone());
        self.serve(
            conn.clone(),
            PeerCtx {
                node_id: peer.into(),
                bound_addr: Mutex::new(Some(to)),
            },
        );
        Some(conn)
    }

    /// Called before each send on `c`: whether `c` has heard nothing back for
    /// `silent_after` since a send went out. Every send elicits an ACK within the peer's
    /// ACK delay (25 ms) plus an RTT, so silence that long means a black-holed path, not
    /// an idle peer; a connection with nothing sent is never judged.
    fn gone_silent(&self, c: &quinn::Connection) -> bool {
        let rx = c.stats().udp_rx.datagrams;
        let now = Instant::now();
        let mut hearing = self.hearing.lock();
        // Checked under the lock `serve` takes to drop the entry of a closed connection.
        if c.close_reason().is_some() {
            return false;
        }
        let h = hearing.entry(c.stable_id()).or_insert(Hearing {
            rx,
            unanswered_since: None,
        });
        if h.rx != rx {
            h.rx = rx;
            h.unanswered_since = None;
        }
        let since = *h.unanswered_since.get_or_insert(now);
        now.duration_since(since) > self.settings.silent_after
    }

    /// The open cached connection to `to`, if any.
    fn cached(&self, to: SocketAddr) -> Option<quinn::Connection> {
        self.conns
            .lock()
            .get(&to)
            .filter(|c| c.close_reason().is_none())
            .cloned()
    }

    fn dial_failed(&self, to: SocketAddr, why: &str) -> Option<quinn::Connection> {
        debug!(peer = %to, why, "dial failed");
        Counters::add(&self.counters.connect_failures, 1);
        self.backoff
            .lock()
            .insert(to, Instant::now() + self.settings.retry_after);
        None
    }

    /// Accepts inbound connections until cancelled.
    pub fn spawn_accept_loop(self: &Arc<Self>) {
        let t = self.clone();
        self.tracker.spawn(async move {
            loop {
                let incoming = tokio::select! {
                    _ = t.cancel.cancelled() => break,
                    i = t.endpoint.accept() => match i { Some(i) => i, None => break },
                };
                let t2 = t.clone();
                t.tracker.spawn(async move {
                    let hs = tokio::time::timeout(t2.settings.connect_timeout, incoming).await;
                    let conn = match hs {
                        Ok(Ok(c)) => c,
                        Ok(Err(e)) => {
                            if is_tls_rejection(&e) {
                                Counters::add(&t2.counters.rejected_peers, 1);
                            }
                            debug!(error = %e, "inbound handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                    let Some(peer) = peer_node_id(&conn) else {
                        Counters::add(&t2.counters.rejected_peers, 1);
                        conn.close(1u32.into(), b"no identity");
                        return;
                    };
                    Counters::add(&t2.counters.connects, 1);
                    t2.serve(
                        conn,
                        PeerCtx {
                            node_id: peer.into(),
                            bound_addr: Mutex::new(None),
                        },
                    );
                });
            }
        });
    }

    /// Serves one connection: reads gossip frames and datagrams until it closes. Each
    /// stream is read by its own task (at most `STREAMS_PER_CONN` at once), so one slow
    /// stream never holds up the others or the datagrams.
    fn serve(self: &Arc<Self>, conn: quinn::Connection, ctx: PeerCtx) {
        let t = self.clone();
        self.live_conns
            .lock()
            .insert(conn.stable_id(), conn.clone());
        let ctx = Arc::new(ctx);
        let permits = Arc::new(tokio::sync::Semaphore::new(STREAMS_PER_CONN));
        self.tracker.spawn(async move {
            loop {
                tokio::select! {
                    _ = t.cancel.cancelled() => break,
                    s = conn.accept_uni() => match s {
                        Ok(recv) => {
                            let Ok(permit) = permits.clone().acquire_owned().await else { break };
                            let (t2, conn2, ctx2) = (t.clone(), conn.clone(), ctx.clone());
                            t.tracker.spawn(async move {
                                t2.read_frame(&conn2, &ctx2, recv).await;
                                drop(permit);
                            });
                        }
                        Err(_) => break,
                    },
                    d = conn.read_datagram() => match d {
                        Ok(bytes) => t.on_datagram(&conn, &ctx, &bytes),
                        Err(_) => break,
                    },
                }
            }
            let s = conn.stats();
            Counters::add(&t.counters.udp_bytes_sent_closed, s.udp_tx.bytes);
            Counters::add(&t.counters.udp_bytes_received_closed, s.udp_rx.bytes);
            t.live_conns.lock().remove(&conn.stable_id());
            t.hearing.lock().remove(&conn.stable_id());
            if let Some(a) = *ctx.bound_addr.lock() {
                t.forget(a, &conn);
            }
        });
    }

    async fn read_frame(
        &self,
        conn: &quinn::Connection,
        ctx: &PeerCtx,
        mut recv: quinn::RecvStream,
    ) {
        let limit = frame::HEADER_LEN + frame::MAX_PAYLOAD;
        let read = tokio::select! {
            _ = self.cancel.cancelled() => return,
            r = tokio::time::timeout(self.settings.connect_timeout, recv.read_to_end(limit)) => r,
        };
        match read {
            Ok(Ok(bytes)) => {
                if !self.on_frame(conn, ctx, &bytes) {
                    conn.close(2u32.into(), b"identity violation");
                }
            }
            _ => Counters::add(&self.counters.rejected_frames, 1),
        }
    }

    /// Handles one gossip frame. Returns false if the peer broke an identity rule.
    fn on_frame(&self, conn: &quinn::Connection, ctx: &PeerCtx, bytes: &[u8]) -> bool {
        let Some(f) = frame::parse(bytes) else {
            Counters::add(&self.counters.rejected_frames, 1);
            return true;
        };
        if self.blocked(f.sender) {
            return true;
        }
        // The claimed address is fixed per connection and must not be another member's.
        let bound = *ctx.bound_addr.lock();
        if bound.is_some_and(|a| a != f.sender)
            || self.known_id(&f.sender).is_some_and(|id| id != ctx.node_id)
        {
            Counters::add(&self.counters.rejected_peers, 1);
            return false;
        }
        let Some(payload) = f.payload() else {
            Counters::add(&self.counters.rejected_frames, 1);
            return true;
        };
        if let Some(ids) = frame::digest_ids(&payload)
            && !ids
                .iter()
                .any(|id| *id.node_id == *ctx.node_id && id.gossip_advertise_addr == f.sender)
        {
            Counters::add(&self.counters.rejected_peers, 1);
            return false;
        }
        let msg = match ChitchatMessage::deserialize(&mut &payload[..]) {
            Ok(m) => m,
            Err(_) => {
                Counters::add(&self.counters.rejected_frames, 1);
                return true;
            }
        };
        if bound.is_none() {
            *ctx.bound_addr.lock() = Some(f.sender);
            // Replies go on the peer's newest connection. A cached one may be a ghost: a
            // restarted peer (same address, new process) cannot reset our old connection
            // (its reset key is new), so that one would swallow replies until it idles
            // out. Replacing without closing cannot churn: neither side redials.
            self.conns.lock().insert(f.sender, conn.clone());
            self.inbound_bound.notify_waiters();
        }
        Counters::add(&self.counters.messages_received, 1);
        Counters::add(&self.counters.bytes_received, bytes.len() as u64);
        if self.inbound[f.channel.index()]
            .try_send((f.sender, msg))
            .is_err()
        {
            Counters::add(&self.counters.dropped_messages, 1);
        }
        true
    }

    fn on_datagram(&self, conn: &quinn::Connection, ctx: &PeerCtx, bytes: &Bytes) {
        let from = ctx
            .bound_addr
            .lock()
            .unwrap_or_else(|| conn.remote_address());
        if self.blocked(from) {
            return;
        }
        Counters::add(&self.counters.datagrams_received, 1);
        Counters::add(&self.counters.datagram_bytes_received, bytes.len() as u64);
        let cap = self.settings.max_value_bytes.min(MAX_DATAGRAM_PAYLOAD);
        match wire::decode(bytes.clone(), cap) {
            Ok(d) => self.hub.emit(MeshEvent::Datagram {
                node: ctx.node_id.clone(),
                value: d.value,
                age: self.hub.skew.datagram_age(
                    &ctx.node_id,
                    d.published_at_ms,
                    crate::clock::now_ms(),
                    Instant::now(),
                ),
            }),
            Err(r) => self.counters.reject(r),
        }
    }

    /// UDP bytes (sent, received) of currently open connections.
    pub fn live_udp_bytes(&self) -> (u64, u64) {
        self.live_conns.lock().values().fold((0, 0), |(tx, rx), c| {
            let s = c.stats();
            (tx + s.udp_tx.bytes, rx + s.udp_rx.bytes)
        })
    }

    /// Frames a chitchat message for `to` on `channel` and queues it.
    pub fn send_message(self: &Arc<Self>, channel: Channel, to: SocketAddr, msg: &ChitchatMessage) {
        use chitchat::Serializable;
        let len = msg.serialized_len();
        if len > frame::MAX_PAYLOAD {
            Counters::add(&self.counters.dropped_messages, 1);
            return;
        }
        let mut payload = Vec::with_capacity(len);
        msg.serialize(&mut payload);
        let Some(buf) = frame::encode(channel, self.advertise, &payload, self.settings.compress)
        else {
            Counters::add(&self.counters.dropped_messages, 1);
            return;
        };
        self.enqueue(to, Outgoing::Frame(Bytes::from(buf)));
    }
}

/// Whether a handshake failed because TLS refused a certificate (ours or theirs).
fn is_tls_rejection(e: &quinn::ConnectionError) -> bool {
    let crypto = |code: quinn::TransportErrorCode| (0x100..0x200).contains(&u64::from(code));
    match e {
        quinn::ConnectionError::TransportError(t) => crypto(t.code),
        quinn::ConnectionError::ConnectionClosed(c) => crypto(c.error_code),
        _ => false,
    }
}
