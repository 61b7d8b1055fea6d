//! The accept loop: a connection cap, first-request and idle deadlines, optional TLS,
//! graceful drain. hyper does the HTTP (its own header-read timeout and read-buffer
//! cap); this loop only decides which connections it gets and for how long.
//!
//! Invariants: at most `max_connections` connection tasks exist (a semaphore permit is
//! taken before the task is spawned and held until it ends; past the cap a connection
//! is closed unread); a connection that has not produced its first request head within
//! `header_read_timeout` (TLS handshake included) is closed; every task ends when the
//! connection does, and on cancel each connection is asked to finish its in-flight
//! requests and close, and `serve` returns once all of them have.

use std::{
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
    /// Connections closed by the edge: `cap` (over max_connections), `header_timeout`
    /// (no first request head in time), `tls` (handshake failed).
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

trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// Shared by every listener of one node.
#[derive(Clone)]
pub struct Edge {
    pub cfg: EdgeConfig,
    /// One permit per open connection, across the node's listeners.
    pub slots: Arc<Semaphore>,
    pub metrics: EdgeMetrics,
}

impl Edge {
    pub fn new(cfg: &EdgeConfig, registry: &Registry) -> Self {
        Self {
            cfg: cfg.clone(),
            slots: Arc::new(Semaphore::new(cfg.max_connections)),
            metrics: EdgeMetrics::new(registry),
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
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                self.metrics.closed.with_label_values(&["cap"]).inc();
                drop(tcp);
                continue;
            };
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
            };
            tracker.spawn(async move {
                let _permit = permit;
                conn.run(tcp).await;
            });
        }
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
}

/// Decrements the open-connection gauge however the task ends.
struct OpenGuard(IntGauge);
impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Conn {
    async fn run(self, tcp: tokio::net::TcpStream) {
        self.metrics.open.inc();
        let _open = OpenGuard(self.metrics.open.clone());
        let deadline = tokio::time::Instant::now() + self.first_head;
        let io: Box<dyn Io> = match &self.tls {
            None => Box::new(tcp),
            Some(acc) => match tokio::time::timeout_at(deadline, acc.accept(tcp)).await {
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
            hyper::service::service_fn(move |mut req: Request<Incoming>| {
                served.store(true, Relaxed);
                req.extensions_mut().insert(Peer(peer));
                app.clone().oneshot(req.map(Body::new))
            })
        };
        let mut conn = pin!(self.builder.serve_connection(TokioIo::new(io), svc));
        // Phase 1: the first request head must arrive before the deadline.
        tokio::select! {
            r = conn.as_mut() => return log_end(r, self.peer),
            _ = tokio::time::sleep_until(deadline) => {}
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

fn log_end(r: Result<(), Box<dyn std::error::Error + Send + Sync>>, peer: SocketAddr) {
    if let Err(e) = r {
        tracing::debug!(%peer, "connection ended: {e}");
    }
}
