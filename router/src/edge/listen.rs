//! The accept loop: a connection cap, first-request and idle deadlines, optional TLS,
//! graceful drain. hyper does the HTTP (its own header-read timeout and read-buffer
//! cap); this loop only decides which connections it gets and for how long.
//!
//! Invariants: at most `max_connections` connection tasks exist (a semaphore permit is
//! taken before the task is spawned and held until it ends). At the cap, the oldest
//! connection that has not yet sent a request head is closed to make room, so clients
//! that send their request at once (`/health` probes, normal clients) get in however
//! many idle or trickling connections an attacker holds; only when every connection
//! has sent a request is a newcomer closed unread. A connection that has not produced
//! its first request head within
//! `header_read_timeout` (TLS handshake included) is closed; every task ends when the
//! connection does, and on cancel each connection is asked to finish its in-flight
//! requests and close, and `serve` returns once all of them have.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    pin::pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering::Relaxed},
    },
    time::Duration,
};

use axum::{Router, body::Body};
use hyper::{Request, body::Incoming};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::Semaphore,
};
use tokio_rustls::TlsAcceptor;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::ServiceExt;

use super::EdgeConfig;

/// The client's socket address, as a request extension.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub SocketAddr);

/// Connection metrics of the edge (registered once per node).
#[derive(Clone)]
pub struct EdgeMetrics {
    pub open: IntGauge,
    /// Connections closed by the edge: `evicted` (the oldest without a request, to make
    /// room at max_connections), `cap` (full of connections that all sent requests),
    /// `header_timeout` (no first request head in time), `tls` (handshake failed).
    pub closed: IntCounterVec,
}

impl EdgeMetrics {
    pub fn new(registry: &Registry) -> Self {
        let open = IntGauge::new(
            "headroom_edge_open_connections",
            "Client and admin connections open now.",
        )
        .expect("static gauge options are valid");
        let closed = IntCounterVec::new(
            Opts::new(
                "headroom_edge_connections_closed_total",
                "Connections the edge closed: over the cap, no request head in time, TLS failure.",
            ),
            &["reason"],
        )
        .expect("static counter options are valid");
        // A second node in one process (tests) registers again: keep the first.
        let _ = registry.register(Box::new(open.clone()));
        let _ = registry.register(Box::new(closed.clone()));
        Self { open, closed }
    }
}

/// Connections that have not sent a request head yet, oldest first: the ones closed
/// to make room at the cap. Ids are removed lazily from the order queue.
#[derive(Default)]
struct Waiting {
    next: u64,
    live: HashMap<u64, CancellationToken>,
    order: VecDeque<u64>,
}

impl Waiting {
    fn add(&mut self) -> (u64, CancellationToken) {
        self.next += 1;
        let t = CancellationToken::new();
        self.live.insert(self.next, t.clone());
        self.order.push_back(self.next);
        // Keep the queue within a constant factor of the live set.
        if self.order.len() > 2 * self.live.len() + 64 {
            let live = &self.live;
            self.order.retain(|id| live.contains_key(id));
        }
        (self.next, t)
    }

    fn remove(&mut self, id: u64) {
        self.live.remove(&id);
    }

    /// Cancels the oldest waiting connection; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        while let Some(id) = self.order.pop_front() {
            if let Some(t) = self.live.remove(&id) {
                t.cancel();
                return true;
            }
        }
        false
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// Shared by every listener of one node.
#[derive(Clone)]
pub struct Edge {
    pub cfg: EdgeConfig,
    /// One permit per open connection, across the node's listeners.
    pub slots: Arc<Semaphore>,
    pub metrics: EdgeMetrics,
    waiting: Arc<Mutex<Waiting>>,
}

impl Edge {
    pub fn new(cfg: &EdgeConfig, registry: &Registry) -> Self {
        let needed = open_files_needed(cfg.max_connections);
        if let Some(limit) = open_files_limit()
            && limit < needed
        {
            tracing::warn!(
                limit,
                needed,
                max_connections = cfg.max_connections,
                "the open-files limit is below 2 × edge.max_connections + 128 (a client \
                 socket and an upstream socket per request in flight): accepts and upstream \
                 connects may fail with EMFILE before the cap applies; raise LimitNOFILE / \
                 ulimit -n or lower the cap"
            );
        }
        Self {
            cfg: cfg.clone(),
            slots: Arc::new(Semaphore::new(cfg.max_connections)),
            metrics: EdgeMetrics::new(registry),
            waiting: Arc::default(),
        }
    }

    fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut b = auto::Builder::new(TokioExecutor::new());
        b.http1()
            .timer(TokioTimer::new())
            // hyper starts this when it waits for a head: on a kept-alive connection
            // that is right after the previous response, so it is also the idle limit.
            .header_read_timeout(self.cfg.idle_timeout())
            .max_buf_size(self.cfg.max_header_bytes);
        b.http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(self.cfg.idle_timeout() / 2))
            .keep_alive_timeout(Duration::from_secs(20))
            .max_header_list_size(self.cfg.max_header_bytes as u32)
            .max_concurrent_streams(256);
        b
    }

    /// Serves `app` on `listener` until `cancel`, then drains.
    pub async fn serve(
        &self,
        listener: TcpListener,
        app: Router,
        tls: Option<TlsAcceptor>,
        cancel: CancellationToken,
    ) -> std::io::Result<()> {
        let builder = Arc::new(self.builder());
        let tracker = TaskTracker::new();
        loop {
            let accepted = tokio::select! {
                _ = cancel.cancelled() => break,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    // Out of descriptors and the like: back off instead of spinning;
                    // the cap below keeps this rare.
                    tracing::warn!("accept error: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let permit = match self.slots.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                // Full: close the oldest connection still without a request, and take
                // its permit once its task has ended (promptly: it only drops).
                Err(_) if self.waiting.lock().evict_oldest() => {
                    self.metrics.closed.with_label_values(&["evicted"]).inc();
                    tokio::time::timeout(
                        Duration::from_millis(250),
                        self.slots.clone().acquire_owned(),
                    )
                    .await
                    .ok()
                    .and_then(Result::ok)
                }
                Err(_) => None,
            };
            let Some(permit) = permit else {
                self.metrics.closed.with_label_values(&["cap"]).inc();
                drop(tcp);
                continue;
            };
            let (wait_id, evict) = self.waiting.lock().add();
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("set_nodelay failed: {e}");
            }
            let conn = Conn {
                builder: builder.clone(),
                app: app.clone(),
                tls: tls.clone(),
                peer,
                first_head: self.cfg.header_read_timeout(),
                metrics: self.metrics.clone(),
                cancel: cancel.clone(),
                waiting: self.waiting.clone(),
                wait_id,
                evict,
            };
            tracker.spawn(async move {
                let _permit = permit;
                conn.run(tcp).await;
            });
        }
        // Close the listening socket before draining: new connections are refused at
        // once (a client moves to the next address) instead of waiting in a backlog
        // nobody accepts from.
        drop(listener);
        tracker.close();
        tracker.wait().await;
        Ok(())
    }
}

struct Conn {
    builder: Arc<auto::Builder<TokioExecutor>>,
    app: Router,
    tls: Option<TlsAcceptor>,
    peer: SocketAddr,
    first_head: Duration,
    metrics: EdgeMetrics,
    cancel: CancellationToken,
    waiting: Arc<Mutex<Waiting>>,
    wait_id: u64,
    /// Cancelled when this connection is evicted to make room (before its first head).
    evict: CancellationToken,
}

/// Decrements the open-connection gauge however the task ends.
struct OpenGuard(IntGauge, Arc<Mutex<Waiting>>, u64);
impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.dec();
        self.1.lock().remove(self.2);
    }
}

impl Conn {
    async fn run(self, tcp: tokio::net::TcpStream) {
        self.metrics.open.inc();
        let _open = OpenGuard(
            self.metrics.open.clone(),
            self.waiting.clone(),
            self.wait_id,
        );
        let deadline = tokio::time::Instant::now() + self.first_head;
        let io: Box<dyn Io> = match &self.tls {
            None => Box::new(tcp),
            Some(acc) => match tokio::select! {
                r = tokio::time::timeout_at(deadline, acc.accept(tcp)) => r,
                _ = self.evict.cancelled() => return,
            } {
                Ok(Ok(s)) => Box::new(s),
                Ok(Err(e)) => {
                    tracing::debug!(peer = %self.peer, "TLS handshake failed: {e}");
                    self.metrics.closed.with_label_values(&["tls"]).inc();
                    return;
                }
                Err(_) => {
                    self.metrics
                        .closed
                        .with_label_values(&["header_timeout"])
                        .inc();
                    return;
                }
            },
        };
        let served = Arc::new(AtomicBool::new(false));
        let svc = {
            let served = served.clone();
            let app = self.app.clone();
            let peer = self.peer;
            let (waiting, id) = (self.waiting.clone(), self.wait_id);
            hyper::service::service_fn(move |mut req: Request<Incoming>| {
                if !served.swap(true, Relaxed) {
                    waiting.lock().remove(id); // a real client: never evicted
                }
                req.extensions_mut().insert(Peer(peer));
                app.clone().oneshot(req.map(Body::new))
            })
        };
        let mut conn = pin!(self.builder.serve_connection(TokioIo::new(io), svc));
        // Phase 1: the first request head must arrive before the deadline.
        tokio::select! {
            r = conn.as_mut() => return log_end(r, self.peer),
            _ = tokio::time::sleep_until(deadline) => {}
            _ = self.evict.cancelled() => {
                if !served.load(Relaxed) {
                    return; // closed to make room for a newcomer
                }
                // Raced with its first request: carry on as a served connection.
            }
            _ = self.cancel.cancelled() => {
                conn.as_mut().graceful_shutdown();
                return log_end(conn.await, self.peer);
            }
        }
        if !served.load(Relaxed) {
            self.metrics
                .closed
                .with_label_values(&["header_timeout"])
                .inc();
            return; // dropping the connection closes it
        }
        // Phase 2: hyper's own timers (idle/header) govern the rest.
        tokio::select! {
            r = conn.as_mut() => log_end(r, self.peer),
            _ = self.cancel.cancelled() => {
                conn.as_mut().graceful_shutdown();
                log_end(conn.await, self.peer);
            }
        }
    }
}

/// Descriptors a node needs to hold `max_connections` client connections that each
/// carry a request: the client socket, the upstream socket the request is proxied on
/// (HTTP/1.1 to engines: one per request in flight), and a margin for listeners,
/// scrapes, probes, the runtime and logs. HTTP/2 clients can carry up to 256 requests
/// per connection, so for them this is a floor, not a bound.
fn open_files_needed(max_connections: usize) -> u64 {
    2 * max_connections as u64 + 128
}

/// The soft `Max open files` of this process (Linux), if readable.
fn open_files_limit() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

fn log_end(r: Result<(), Box<dyn std::error::Error + Send + Sync>>, peer: SocketAddr) {
    if let Err(e) = r {
        tracing::debug!(%peer, "connection ended: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_files_needed_counts_the_upstream_socket_of_each_connection() {
        // 10,000 streaming clients hold 10,000 client and 10,000 upstream sockets: a
        // limit of 20,000 ran out at ~9,990 streams (`headroom-bench streams`), so it
        // must warn; the default cap fits the systemd unit's LimitNOFILE=65536.
        assert_eq!(open_files_needed(10_000), 20_128);
        assert!(open_files_needed(10_000) > 20_000);
        assert!(open_files_needed(EdgeConfig::default().max_connections) <= 65_536);
    }
}
