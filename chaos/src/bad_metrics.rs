//! A replica with a broken `/metrics`: an in-process reverse proxy in front of a real
//! emulator that passes every request through untouched except `GET /metrics`, which
//! answers with garbage once [`BadUpstream::garbage`] is set (before that it passes
//! through too). The kind of garbage rotates per scrape through [`GARBAGE_KINDS`] so
//! one run covers all of them.
//!
//! Invariants: completions are streamed through byte for byte (the proxy never buffers
//! a body); the server stops when its token is cancelled and [`BadUpstream::stop`]
//! waits for it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ChaosError;

/// What the broken `/metrics` serves, in rotation.
pub const GARBAGE_KINDS: [&str; 7] = [
    "nan-negative-out-of-range",
    "absurd-finite",
    "zero-cache-config",
    "malformed-lines",
    "binary-junk",
    "html",
    "oversized",
];

/// Body of one garbage scrape of kind `i % GARBAGE_KINDS.len()`.
pub fn garbage(i: u64) -> Vec<u8> {
    match (i % GARBAGE_KINDS.len() as u64) as usize {
        // Values the parser must reject and count.
        0 => b"vllm:num_requests_running{engine=\"0\"} NaN\n\
               vllm:num_requests_waiting{engine=\"0\"} -7\n\
               vllm:kv_cache_usage_perc{engine=\"0\"} 7.5\n\
               vllm:num_preemptions_total{engine=\"0\"} -Inf\n"
            .to_vec(),
        // Finite but absurd: a router must not turn them into NaN or a crash.
        1 => b"vllm:num_requests_running{engine=\"0\"} 1e300\n\
               vllm:num_requests_waiting{engine=\"0\"} 1.7976931348623157e308\n\
               vllm:kv_cache_usage_perc{engine=\"0\"} 1e-320\n\
               vllm:prefix_cache_queries_total{engine=\"0\"} 1e308\n\
               vllm:prefix_cache_hits_total{engine=\"0\"} 1e308\n"
            .to_vec(),
        2 => b"vllm:cache_config_info{block_size=\"0\",num_gpu_blocks=\"0\"} 1\n\
               vllm:num_requests_running{engine=\"0\"} 0\n\
               vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n"
            .to_vec(),
        3 => b"vllm:num_requests_running{engine=\"0\" 3\n\
               vllm:num_requests_waiting{engine=0} 1\n\
               vllm:kv_cache_usage_perc{engine=\"0\"}\n\
               vllm:num_requests_running{engine=\"0\"} 2 3 4 5\n\
               {}{}{} 1\n\
               vllm:num_requests_waiting{engine=\"\\\"} 1\n"
            .to_vec(),
        4 => {
            let mut v = b"vllm:num_requests_running{engine=\"0\"} \xff\xfe\x00\x01\n".to_vec();
            v.extend((0u32..4096).map(|k| (k.wrapping_mul(2_654_435_761) >> 13) as u8));
            v
        }
        5 => b"<html><body><h1>502 Bad Gateway</h1></body></html>\n".to_vec(),
        // Bigger than the router's 4 MiB scrape limit.
        _ => {
            let line = b"vllm:num_requests_waiting{engine=\"0\"} 1\n";
            line.iter()
                .copied()
                .cycle()
                .take(5 << 20)
                .collect::<Vec<u8>>()
        }
    }
}

type ProxyClient = Client<HttpConnector, Body>;

#[derive(Clone)]
struct ProxyState {
    upstream: SocketAddr,
    client: ProxyClient,
    scrapes: Arc<AtomicU64>,
    garbage: Arc<AtomicBool>,
}

/// A running bad upstream.
pub struct BadUpstream {
    pub addr: SocketAddr,
    /// Scrapes answered with garbage so far.
    pub scrapes: Arc<AtomicU64>,
    /// Serve garbage on `/metrics` (else pass it through).
    pub garbage: Arc<AtomicBool>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl BadUpstream {
    /// Starts a proxy on an ephemeral loopback port in front of `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<BadUpstream, ChaosError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| ChaosError::io("binding the bad upstream", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ChaosError::io("bad upstream address", e))?;
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        let scrapes = Arc::new(AtomicU64::new(0));
        let garbage = Arc::new(AtomicBool::new(false));
        let state = ProxyState {
            upstream,
            client: Client::builder(TokioExecutor::new()).build(conn),
            scrapes: scrapes.clone(),
            garbage: garbage.clone(),
        };
        let app = Router::new()
            .route("/metrics", get(bad_metrics))
            .fallback(pass_through)
            .with_state(state);
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
        });
        Ok(BadUpstream {
            addr,
            scrapes,
            garbage,
            cancel,
            task: Some(task),
        })
    }

    /// Stops serving and waits (bounded) for the server task.
    pub async fn stop(&mut self) {
        self.cancel.cancel();
        if let Some(t) = self.task.take() {
            // Open client streams hold graceful shutdown; abort after a grace period.
            let abort = t.abort_handle();
            if tokio::time::timeout(Duration::from_secs(2), t)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
    }
}

impl Drop for BadUpstream {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn bad_metrics(State(s): State<ProxyState>, req: Request) -> Response {
    if !s.garbage.load(Ordering::Relaxed) {
        return pass_through(State(s), req).await;
    }
    let i = s.scrapes.fetch_add(1, Ordering::Relaxed);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        garbage(i),
    )
        .into_response()
}

async fn pass_through(State(s): State<ProxyState>, req: Request) -> Response {
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let uri: Uri = match format!("http://{}{path}", s.upstream).parse() {
        Ok(u) => u,
        Err(_) => return (StatusCode::BAD_REQUEST, "bad path").into_response(),
    };
    parts.uri = uri;
    parts.headers.remove(axum::http::header::HOST);
    match s.client.request(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            Response::from_parts(parts, Body::new(body))
        }
        // As a dead replica would look: the router sees a 502 before any byte.
        Err(e) => (StatusCode::BAD_GATEWAY, format!("upstream: {e}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_produced_and_oversized_exceeds_the_scrape_limit() {
        let bodies: Vec<Vec<u8>> = (0..GARBAGE_KINDS.len() as u64).map(garbage).collect();
        assert!(bodies.iter().all(|b| !b.is_empty()));
        assert!(bodies[6].len() > 4 << 20);
        assert!(std::str::from_utf8(&bodies[4]).is_err());
        assert_eq!(garbage(GARBAGE_KINDS.len() as u64), bodies[0]);
    }
}
