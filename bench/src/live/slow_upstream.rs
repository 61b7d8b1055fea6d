//! A slow streaming OpenAI upstream, for holding many streams open through a proxy
//! (`headroom-bench streams`): every `POST /v1/completions` (or chat) is answered with
//! `tokens` SSE completion chunks, the first at once and the next ones `interval`
//! apart, then the usage chunk (when the request asked for `include_usage`) and
//! `data: [DONE]`; a stream therefore lives about `(tokens − 1) × interval`.
//!
//! When the request asks for `continuous_usage_stats` (the router does, to count
//! tokens), every chunk carries a cumulative usage object as vLLM's do, so the router
//! does the same work it does in front of vLLM (reading and cutting those objects).
//! `GET /health`, `/metrics` and `/v1/models` answer as the fixed upstream's do
//! ([`super::fixed_upstream::FixedBodies`]): an idle, healthy vLLM.
//!
//! Cost per stream: one timer and the pre-built chunks shared by every stream; each
//! chunk is one `Bytes` clone and one write. It runs as its own process
//! (`headroom-bench slow-upstream`), so its CPU and descriptors are not the router's
//! nor the load generator's.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Either, Full, Limited};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use super::fixed_upstream::{
    FixedBodies, MAX_BODY, UNREADABLE_BODY, WORDS, accept_loop, side_route, vllm_chunk,
    vllm_usage_chunk,
};

/// What every stream sends, built once.
#[derive(Debug)]
pub struct SlowChunks {
    /// Token chunk `i` with `"usage":null`.
    plain: Vec<Bytes>,
    /// Token chunk `i` with cumulative usage (`continuous_usage_stats`).
    counted: Vec<Bytes>,
    /// The final usage chunk.
    usage: Bytes,
    done: Bytes,
    pub interval: Duration,
    models: Bytes,
    metrics: Bytes,
}

impl SlowChunks {
    /// Chunks for `model`: `tokens` token events (at least one), `interval` apart.
    pub fn new(model: &str, tokens: u32, prompt_tokens: u32, interval: Duration) -> Self {
        let tokens = tokens.max(1);
        let chunk = |i: u32, usage: Option<(u32, u32)>| {
            let text = WORDS[i as usize % WORDS.len()];
            let json = vllm_chunk(
                "cmpl-slow00000000000000000",
                model,
                text,
                i + 1 == tokens,
                usage,
            );
            Bytes::from(format!("data: {json}\n\n"))
        };
        let plain = (0..tokens).map(|i| chunk(i, None)).collect();
        let counted = (0..tokens)
            .map(|i| chunk(i, Some((prompt_tokens, i + 1))))
            .collect();
        let usage = vllm_usage_chunk("cmpl-slow00000000000000000", model, prompt_tokens, tokens);
        // The idle-vLLM answers of the other routes are the fixed upstream's.
        let fixed = FixedBodies::new(model, 1, prompt_tokens);
        SlowChunks {
            plain,
            counted,
            usage: Bytes::from(format!("data: {usage}\n\n")),
            done: Bytes::from_static(b"data: [DONE]\n\n"),
            interval,
            models: fixed.models,
            metrics: fixed.metrics,
        }
    }

    pub fn tokens(&self) -> u32 {
        self.plain.len() as u32
    }
}

/// One stream's body: token chunks on a fixed-rate schedule (no drift), then the tail.
pub struct SlowBody {
    chunks: Arc<SlowChunks>,
    per_chunk_usage: bool,
    final_usage: bool,
    /// Next token chunk to send.
    next: usize,
    /// 0: tokens; 1: usage (if asked); 2: done; 3: finished.
    tail: u8,
    sleep: Pin<Box<Sleep>>,
}

impl SlowBody {
    pub fn new(chunks: Arc<SlowChunks>, per_chunk_usage: bool, final_usage: bool) -> Self {
        let first_wait = Instant::now() + chunks.interval;
        SlowBody {
            chunks,
            per_chunk_usage,
            final_usage,
            next: 0,
            tail: 0,
            sleep: Box::pin(tokio::time::sleep_until(first_wait)),
        }
    }
}

impl Body for SlowBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let n = this.chunks.plain.len();
        if this.next < n {
            // The first token goes at once; each later one waits for its slot.
            if this.next > 0 {
                if this.sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let at = this.sleep.deadline() + this.chunks.interval;
                this.sleep.as_mut().reset(at);
            }
            let i = this.next;
            this.next += 1;
            let c = if this.per_chunk_usage {
                &this.chunks.counted[i]
            } else {
                &this.chunks.plain[i]
            };
            return Poll::Ready(Some(Ok(Frame::data(c.clone()))));
        }
        loop {
            let out = match this.tail {
                0 => this.final_usage.then(|| this.chunks.usage.clone()),
                1 => Some(this.chunks.done.clone()),
                _ => return Poll::Ready(None),
            };
            this.tail += 1;
            if let Some(b) = out {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.tail >= 2
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// Whether `hay` contains `needle` (request bodies are small: a plain scan).
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

type Reply = Response<Either<Full<Bytes>, SlowBody>>;

fn reply(status: StatusCode, ctype: &'static str, body: Bytes) -> Reply {
    let mut r = Response::new(Either::Left(Full::new(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, http::HeaderValue::from_static(ctype));
    r
}

async fn handle(req: Request<Incoming>, chunks: Arc<SlowChunks>) -> Result<Reply, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    Ok(match (method, path.as_str()) {
        (Method::POST, "/v1/completions" | "/v1/chat/completions") => {
            match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(b) => {
                    let b = b.to_bytes();
                    // The router writes these flags without spaces; other clients that
                    // format differently get plain chunks and the final usage.
                    let per_chunk = contains(&b, b"\"continuous_usage_stats\":true");
                    let final_usage = per_chunk || contains(&b, b"\"include_usage\":true");
                    let mut r =
                        Response::new(Either::Right(SlowBody::new(chunks, per_chunk, final_usage)));
                    let h = r.headers_mut();
                    h.insert(
                        header::CONTENT_TYPE,
                        http::HeaderValue::from_static("text/event-stream"),
                    );
                    h.insert(
                        header::CACHE_CONTROL,
                        http::HeaderValue::from_static("no-cache"),
                    );
                    r
                }
                Err(_) => reply(
                    StatusCode::BAD_REQUEST,
                    "application/json",
                    Bytes::from_static(UNREADABLE_BODY),
                ),
            }
        }
        (m, p) => {
            let (status, ctype, body) = side_route(&m, p, &chunks.models, &chunks.metrics);
            reply(status, ctype, body)
        }
    })
}

/// Serves slow streams on `listener` until `cancel`.
pub async fn serve_slow(listener: TcpListener, chunks: Arc<SlowChunks>, cancel: CancellationToken) {
    accept_loop(listener, cancel, |tcp| {
        let c = chunks.clone();
        async move {
            let svc = service_fn(move |req| handle(req, c.clone()));
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        }
    })
    .await;
}

/// The `headroom-bench slow-upstream` process: binds `addrs`, prints
/// `slow-upstream listening on http://A http://B …` on stdout, serves until killed, or
/// until its parent process is gone (a load generator that died without stopping it).
pub async fn run_process(addrs: &[SocketAddr], chunks: SlowChunks) -> std::io::Result<()> {
    let chunks = Arc::new(chunks);
    let mut listeners = Vec::new();
    for a in addrs {
        listeners.push(TcpListener::bind(a).await?);
    }
    let bound = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| format!("http://{a}")))
        .collect::<std::io::Result<Vec<_>>>()?;
    println!("slow-upstream listening on {}", bound.join(" "));
    let cancel = CancellationToken::new();
    let mut set = JoinSet::new();
    for l in listeners {
        set.spawn(serve_slow(l, chunks.clone(), cancel.clone()));
    }
    let parent = std::os::unix::process::parent_id();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if std::os::unix::process::parent_id() != parent {
            break;
        }
    }
    cancel.cancel();
    while set.join_next().await.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::sse::{SseScanner, StreamTally};

    /// Collects a body's frames with their (virtual) arrival times.
    async fn frames(mut b: SlowBody) -> Vec<(Duration, Bytes)> {
        let t0 = Instant::now();
        let mut out = Vec::new();
        while let Some(f) = b.frame().await {
            let f = f.expect("infallible");
            if let Ok(d) = f.into_data() {
                out.push((t0.elapsed(), d));
            }
        }
        out
    }

    #[tokio::test]
    async fn tokens_are_spaced_and_the_stream_reads_complete() {
        let c = Arc::new(SlowChunks::new("m", 5, 100, Duration::from_millis(20)));
        for (per_chunk, final_usage) in [(false, true), (true, true), (false, false)] {
            let got = frames(SlowBody::new(c.clone(), per_chunk, final_usage)).await;
            assert_eq!(got.len(), 5 + usize::from(final_usage) + 1);
            // Fixed-rate slots: token i never before i × interval (timers only fire late).
            for (i, (at, _)) in got.iter().take(5).enumerate() {
                assert!(at.as_millis() >= 20 * i as u128, "token {i} at {at:?}");
            }
            assert!(got[0].0 < Duration::from_millis(20), "first token waited");
            let mut s = SseScanner::default();
            let mut t = StreamTally::default();
            let now = std::time::Instant::now();
            for (_, d) in &got {
                s.feed(d, |e| t.event(e, now));
            }
            assert_eq!(t.content_events, 5);
            assert!(t.done && t.error.is_none() && t.malformed == 0);
            assert_eq!(
                t.usage.map(|u| u.completion_tokens),
                final_usage.then_some(5)
            );
            let text = got
                .iter()
                .map(|(_, d)| String::from_utf8_lossy(d).into_owned())
                .collect::<String>();
            let first_count = ["\"completion_tokens\":1,", "\"completion_tokens\":1}"]
                .iter()
                .any(|p| text.contains(p));
            assert_eq!(first_count, per_chunk);
        }
    }

    #[test]
    fn flags_are_found_in_request_bodies() {
        let body = br#"{"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#;
        assert!(contains(body, b"\"continuous_usage_stats\":true"));
        assert!(!contains(b"{}", b"\"include_usage\":true"));
    }
}
