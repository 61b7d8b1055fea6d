//! One streaming request, timed as the client sees it.
//!
//! Times are taken when bytes reach this process: `sent` just before the request is
//! handed to the connection, the first and last *content* events as their chunks
//! arrive ([`super::sse`]), `end` when the body is exhausted. Routing information is
//! read from response headers: `x-headroom-replica`, `x-headroom-predicted-*`,
//! `x-headroom-fallback`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::sse::{SseScanner, StreamTally};

/// Pooled HTTP/1.1 client over plain TCP (loopback targets; no TLS).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Most bytes of an error body kept for the message.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// A client with TCP_NODELAY and keep-alive; idle connections are reused.
pub fn http_client() -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(Duration::from_secs(5)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(conn)
}

/// The router's forecast for this request, from response headers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Predicted {
    pub ttft_ms: Option<f64>,
    pub ttft_upper_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub tpot_upper_ms: Option<f64>,
}

/// What happened to one request.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub sent: Instant,
    pub end: Instant,
    /// HTTP status (None when no response arrived).
    pub status: Option<u16>,
    pub replica: Option<String>,
    pub predicted: Predicted,
    pub fallback: Option<String>,
    pub tally: StreamTally,
    /// Why the request failed: transport, status, in-stream error, timeout, truncation.
    pub error: Option<String>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }
}

fn header_str(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn header_f64(h: &HeaderMap, name: &str) -> Option<f64> {
    header_str(h, name)
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite())
}

/// Reads routing headers into `out`.
fn read_headers(h: &HeaderMap, out: &mut Outcome) {
    out.replica = header_str(h, headroom::REPLICA_HEADER);
    out.fallback = header_str(h, "x-headroom-fallback");
    out.predicted = Predicted {
        ttft_ms: header_f64(h, "x-headroom-predicted-ttft-ms"),
        ttft_upper_ms: header_f64(h, "x-headroom-predicted-ttft-upper-ms"),
        tpot_ms: header_f64(h, "x-headroom-predicted-tpot-ms"),
        tpot_upper_ms: header_f64(h, "x-headroom-predicted-tpot-upper-ms"),
    };
}

/// `message` of an OpenAI error body, or the body's start.
fn error_message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.get("error")
                .and_then(|e| e.get("message"))
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned())
}

/// POSTs `body` to `uri` with `headers`, streams the answer and times it; gives up
/// after `timeout` (recorded as an error, never a panic). `on_placed` is called once
/// with the serving replica's name as soon as a successful response's headers arrive.
pub async fn send_streaming(
    client: &HttpClient,
    uri: &Uri,
    body: Bytes,
    headers: &[(&'static str, HeaderValue)],
    timeout: Duration,
    on_placed: impl FnOnce(Option<&str>),
) -> Outcome {
    let sent = Instant::now();
    let mut out = Outcome {
        sent,
        end: sent,
        status: None,
        replica: None,
        predicted: Predicted::default(),
        fallback: None,
        tally: StreamTally::default(),
        error: None,
    };
    let run = exchange(client, uri, body, headers, &mut out, on_placed);
    if tokio::time::timeout(timeout, run).await.is_err() {
        out.error = Some(format!("timed out after {:.1} s", timeout.as_secs_f64()));
    }
    out.end = Instant::now();
    out
}

async fn exchange(
    client: &HttpClient,
    uri: &Uri,
    body: Bytes,
    headers: &[(&'static str, HeaderValue)],
    out: &mut Outcome,
    on_placed: impl FnOnce(Option<&str>),
) {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(uri.clone())
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "text/event-stream");
    for (k, v) in headers {
        req = req.header(*k, v.clone());
    }
    let req = match req.body(Full::new(body)) {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("cannot build request: {e}"));
            return;
        }
    };
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(format!("transport: {e}"));
            return;
        }
    };
    let status = resp.status();
    out.status = Some(status.as_u16());
    read_headers(resp.headers(), out);
    let mut body = resp.into_body();
    if !status.is_success() {
        let mut buf = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => {
                    if let Some(d) = f.data_ref() {
                        let room = MAX_ERROR_BODY.saturating_sub(buf.len());
                        buf.extend_from_slice(&d[..d.len().min(room)]);
                    }
                }
                Err(_) => break,
            }
        }
        out.error = Some(format!("HTTP {}: {}", status.as_u16(), error_message(&buf)));
        return;
    }
    on_placed(out.replica.as_deref());
    let mut scanner = SseScanner::default();
    let tally = &mut out.tally;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    let at = Instant::now();
                    scanner.feed(d, |ev| tally.event(ev, at));
                }
            }
            Err(e) => {
                out.error = Some(format!("stream broke: {e}"));
                return;
            }
        }
    }
    let at = Instant::now();
    scanner.finish(|ev| tally.event(ev, at));
    out.error = if let Some(e) = &tally.error {
        Some(format!("in-stream error: {e}"))
    } else if !tally.done {
        Some("stream ended without [DONE]".into())
    } else {
        None
    };
}
