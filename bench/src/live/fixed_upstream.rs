//! A fixed-response OpenAI upstream for measuring proxies: it answers every
//! completion request with the same pre-built SSE body in one write, so its cost per
//! request is tiny and constant and the proxy in front of it dominates what is
//! measured (the appendix of `reference/peer-routers.md` used nginx for this).
//!
//! Routes: `POST /v1/completions` and `POST /v1/chat/completions` (the body is read
//! and discarded; the answer is always the stream below), `GET /v1/models`,
//! `GET /health`, `GET /metrics` (idle vLLM gauges, so a router scraping it sees a
//! healthy, empty vLLM). The stream: `tokens` completion chunks in vLLM's shape, a
//! usage chunk, `data: [DONE]` — what a `"stream": true, "stream_options":
//! {"include_usage": true}` request to vLLM returns, so proxies that inspect usage see
//! it and nothing needs rewriting.
//!
//! Shutdown: the accept loop ends when the token is cancelled; connection tasks live in
//! a `JoinSet` that is aborted with it.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Largest request body read (also the slow upstream's).
pub(crate) const MAX_BODY: usize = 1 << 20;

/// What a body that cannot be read is answered with, in vLLM's error shape.
pub(crate) const UNREADABLE_BODY: &[u8] =
    br#"{"error":{"message":"unreadable body","type":"BadRequestError","param":null,"code":400}}"#;

/// What the upstream answers.
#[derive(Clone, Debug)]
pub struct FixedBodies {
    pub stream: Bytes,
    pub models: Bytes,
    pub metrics: Bytes,
}

/// Filler words of the fixed and slow streams (one per token event).
pub(crate) const WORDS: [&str; 8] = [
    " the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog",
];

/// One completion chunk's JSON as real vLLM writes it (0.32: members and their
/// order as in `scripts/vllm/fixtures/completion-stream-usage.sse`), the last with
/// `finish_reason` `"length"`; `usage` (prompt, completion tokens so far) adds the
/// per-chunk usage of `continuous_usage_stats` after the choices. Byte-exact, so a
/// proxy that reads chunks meets the layout it meets in production.
pub(crate) fn vllm_chunk(
    id: &str,
    model: &str,
    text: &str,
    last: bool,
    usage: Option<(u32, u32)>,
) -> String {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let finish = if last { "\"length\"" } else { "null" };
    let usage = usage.map_or(String::new(), |(p, c)| {
        format!(
            ",\"usage\":{{\"prompt_tokens\":{p},\"total_tokens\":{},\"completion_tokens\":{c}}}",
            p + c
        )
    });
    format!(
        "{{\"id\":{},\"object\":\"text_completion\",\"created\":1700000000,\"model\":{},\"choices\":[{{\"index\":0,\"text\":{},\"logprobs\":null,\"finish_reason\":{finish},\"stop_reason\":null,\"prompt_token_ids\":null,\"token_ids\":null}}]{usage}}}",
        q(id),
        q(model),
        q(text)
    )
}

/// The final usage chunk's JSON as real vLLM writes it (with
/// `--enable-prompt-tokens-details`, nothing cached).
pub(crate) fn vllm_usage_chunk(id: &str, model: &str, prompt: u32, completion: u32) -> String {
    let q = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "{{\"id\":{},\"object\":\"text_completion\",\"created\":1700000000,\"model\":{},\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{completion},\"prompt_tokens_details\":{{\"cached_tokens\":0}}}}}}",
        q(id),
        q(model),
        prompt + completion
    )
}

impl FixedBodies {
    /// Bodies for `model` with `tokens` token events and a `prompt_tokens` usage count.
    pub fn new(model: &str, tokens: u32, prompt_tokens: u32) -> Self {
        let mut s = String::new();
        for i in 0..tokens {
            let text = WORDS[i as usize % WORDS.len()];
            s.push_str("data: ");
            s.push_str(&vllm_chunk(
                "cmpl-fixed0000000000000000",
                model,
                text,
                i + 1 == tokens,
                None,
            ));
            s.push_str("\n\n");
        }
        s.push_str("data: ");
        s.push_str(&vllm_usage_chunk(
            "cmpl-fixed0000000000000000",
            model,
            prompt_tokens,
            tokens,
        ));
        s.push_str("\n\ndata: [DONE]\n\n");
        let models = serde_json::json!({"object": "list", "data": [{
            "id": model, "object": "model", "created": 1_700_000_000u64, "owned_by": "vllm",
            "root": model, "parent": null, "max_model_len": 131_072,
        }]});
        let labels = format!("engine=\"0\",model_name=\"{model}\"");
        let metrics = format!(
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{labels}}} 0.0\n\
             # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{labels}}} 0.0\n\
             # TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{labels}}} 0.0\n\
             # TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"27500\"}} 1.0\n"
        );
        FixedBodies {
            stream: Bytes::from(s),
            models: Bytes::from(models.to_string()),
            metrics: Bytes::from(metrics),
        }
    }
}

fn reply(status: StatusCode, ctype: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    if let Ok(v) = http::HeaderValue::from_str(ctype) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

async fn handle(
    req: Request<Incoming>,
    bodies: &FixedBodies,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    Ok(match (method, path.as_str()) {
        (Method::POST, "/v1/completions" | "/v1/chat/completions") => {
            match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(_) => {
                    let mut r = reply(StatusCode::OK, "text/event-stream", bodies.stream.clone());
                    r.headers_mut().insert(
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
            let (status, ctype, body) = side_route(&m, p, &bodies.models, &bodies.metrics);
            reply(status, ctype, body)
        }
    })
}

/// Everything but the completion routes, as an idle vLLM answers it: its model list,
/// `/health`, its `/metrics`, else 404. Shared with the slow upstream.
pub(crate) fn side_route(
    method: &Method,
    path: &str,
    models: &Bytes,
    metrics: &Bytes,
) -> (StatusCode, &'static str, Bytes) {
    match (method, path) {
        (&Method::GET, "/v1/models") => (StatusCode::OK, "application/json", models.clone()),
        (&Method::GET, "/health") => (StatusCode::OK, "text/plain", Bytes::new()),
        (&Method::GET, "/metrics") => {
            (StatusCode::OK, "text/plain; version=0.0.4", metrics.clone())
        }
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"not found"),
        ),
    }
}

/// Accepts connections on `listener` until `cancel`, running `serve` on each (its
/// HTTP/1.1 connection) in a task that is aborted and joined at the end. An accept
/// error (out of descriptors) backs off 20 ms rather than spinning.
pub(crate) async fn accept_loop<F, Fut>(
    listener: TcpListener,
    cancel: CancellationToken,
    mut serve: F,
) where
    F: FnMut(tokio::net::TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut conns = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => break,
            a = listener.accept() => a,
        };
        while conns.try_join_next().is_some() {}
        let (tcp, _) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // The proxy in front sees a refused or slow connect and reports it.
                tracing::warn!("upstream accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        conns.spawn(serve(tcp));
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
}

/// Serves `bodies` on `listener` until `cancel`.
pub async fn serve_fixed(listener: TcpListener, bodies: FixedBodies, cancel: CancellationToken) {
    let bodies = std::sync::Arc::new(bodies);
    accept_loop(listener, cancel, |tcp| {
        let b = bodies.clone();
        async move {
            let svc = service_fn(move |req| {
                let b = b.clone();
                async move { handle(req, &b).await }
            });
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        }
    })
    .await;
}

/// A fixed upstream on its own OS thread (a one-thread tokio runtime), so it neither
/// shares a scheduler with the load generator nor needs a binary of its own. Stops
/// and joins on drop.
#[derive(Debug)]
pub struct FixedServer {
    pub addrs: Vec<SocketAddr>,
    cancel: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FixedServer {
    /// Binds `addrs` (port 0 = any) and starts serving `bodies` on all of them.
    pub fn start(addrs: &[SocketAddr], bodies: FixedBodies) -> std::io::Result<FixedServer> {
        let mut std_listeners = Vec::new();
        for a in addrs {
            let l = std::net::TcpListener::bind(a)?;
            l.set_nonblocking(true)?;
            std_listeners.push(l);
        }
        let bound = std_listeners
            .iter()
            .map(|l| l.local_addr())
            .collect::<std::io::Result<Vec<_>>>()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let thread = std::thread::Builder::new()
            .name("fixed-upstream".into())
            .spawn(move || {
                rt.block_on(async move {
                    let mut set = JoinSet::new();
                    for l in std_listeners {
                        match TcpListener::from_std(l) {
                            Ok(l) => {
                                set.spawn(serve_fixed(l, bodies.clone(), stop.clone()));
                            }
                            Err(e) => tracing::warn!("fixed upstream listener: {e}"),
                        }
                    }
                    while set.join_next().await.is_some() {}
                });
            })?;
        Ok(FixedServer {
            addrs: bound,
            cancel,
            thread: Some(thread),
        })
    }
}

impl Drop for FixedServer {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::sse::{SseScanner, StreamTally};

    #[test]
    fn fixed_stream_reads_as_a_complete_vllm_stream() {
        let b = FixedBodies::new("m", 20, 400);
        let mut s = SseScanner::default();
        let mut t = StreamTally::default();
        let now = std::time::Instant::now();
        s.feed(&b.stream, |e| t.event(e, now));
        assert_eq!(t.content_events, 20);
        assert!(t.done && t.error.is_none() && t.malformed == 0);
        assert_eq!(t.output_tokens(), 20);
        assert_eq!(t.usage.map(|u| u.prompt_tokens), Some(400));
        let len = b.stream.len();
        assert!((4000..6000).contains(&len), "stream is {len} bytes");
        // vLLM's own bytes (members and order of `scripts/vllm/fixtures`), not a
        // re-serialisation: proxies that read chunks meet what production sends.
        let first = br#"data: {"id":"cmpl-fixed0000000000000000","object":"text_completion","created":1700000000,"model":"m","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}

"#;
        assert!(b.stream.starts_with(first));
        let counted = vllm_chunk("c", "m", "x", true, Some((7, 3)));
        assert!(counted.ends_with(r#""finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":{"prompt_tokens":7,"total_tokens":10,"completion_tokens":3}}"#));
    }
}
