//! Test support: an in-process mock replica with scriptable behaviour, and an
//! in-process router node on an ephemeral loopback port.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]
#![allow(dead_code)]

pub mod kv_engine;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use futures_util::{StreamExt, stream};
use headroom::{
    config::{ReplicaConfig, RouterConfig},
    node::Node,
    policy::PolicyName,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// What the mock does with completion requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    Normal,
    /// 500 before any byte.
    Fail500,
    /// Two content chunks, then the connection breaks.
    DieMidStream,
    /// Accepts and never answers.
    Stall,
    /// Streams every chunk 150 ms after the last.
    Trickle,
    /// Two content chunks, then silence with the connection open.
    SilentMidStream,
}

pub struct Mock {
    pub addr: SocketAddr,
    pub behaviour: Arc<AtomicU32>,
    pub hits: Arc<AtomicUsize>,
    pub health_ok: Arc<AtomicU32>,
    /// How long `/metrics` takes to answer (ms): a busy engine's event loop.
    pub metrics_delay_ms: Arc<AtomicU64>,
    /// The engine's prefix-cache query counter in `/metrics` (set it lower to play a
    /// restarted engine).
    pub prefix_queries: Arc<AtomicU64>,
    /// The `traceparent` header of the last completion request.
    pub traceparent: Arc<std::sync::Mutex<Option<String>>>,
    /// The body of the last completion request.
    pub last_body: Arc<std::sync::Mutex<Option<Bytes>>>,
    cancel: CancellationToken,
}

impl Mock {
    pub fn set(&self, b: Behaviour) {
        self.behaviour.store(b as u32, SeqCst);
    }
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[derive(Clone)]
struct MockState {
    model: String,
    behaviour: Arc<AtomicU32>,
    hits: Arc<AtomicUsize>,
    health_ok: Arc<AtomicU32>,
    metrics_delay_ms: Arc<AtomicU64>,
    prefix_queries: Arc<AtomicU64>,
    traceparent: Arc<std::sync::Mutex<Option<String>>>,
    last_body: Arc<std::sync::Mutex<Option<Bytes>>>,
}

fn behaviour(s: &MockState) -> Behaviour {
    match s.behaviour.load(SeqCst) {
        1 => Behaviour::Fail500,
        2 => Behaviour::DieMidStream,
        3 => Behaviour::Stall,
        4 => Behaviour::Trickle,
        5 => Behaviour::SilentMidStream,
        _ => Behaviour::Normal,
    }
}

/// The SSE body a vLLM-like server would send for `n` tokens.
pub fn sse_events(chat: bool, n: usize, include_usage: bool) -> Vec<String> {
    let usage_null = if include_usage { ",\"usage\":null" } else { "" };
    let mut ev = Vec::new();
    for i in 0..n {
        let choice = if chat {
            if i == 0 {
                format!(
                    "{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"t{i}\"}},\"logprobs\":null,\"finish_reason\":null}}"
                )
            } else {
                format!(
                    "{{\"index\":0,\"delta\":{{\"content\":\" t{i}\"}},\"logprobs\":null,\"finish_reason\":{}}}",
                    if i + 1 == n { "\"length\"" } else { "null" }
                )
            }
        } else {
            format!(
                "{{\"index\":0,\"text\":\" t{i}\",\"logprobs\":null,\"finish_reason\":{}}}",
                if i + 1 == n { "\"length\"" } else { "null" }
            )
        };
        let obj = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        ev.push(format!("data: {{\"id\":\"x\",\"object\":\"{obj}\",\"created\":1,\"model\":\"m\",\"choices\":[{choice}]{usage_null}}}\n\n"));
    }
    if include_usage {
        let obj = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        ev.push(format!("data: {{\"id\":\"x\",\"object\":\"{obj}\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"total_tokens\":{},\"completion_tokens\":{n}}}}}\n\n", n + 3));
    }
    ev.push("data: [DONE]\n\n".to_string());
    ev
}

async fn complete(
    State(s): State<MockState>,
    chat: bool,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    s.hits.fetch_add(1, SeqCst);
    if let Ok(mut t) = s.traceparent.lock() {
        *t = headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
    }
    if let Ok(mut b) = s.last_body.lock() {
        *b = Some(body.clone());
    }
    let v: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => return (StatusCode::BAD_REQUEST, "bad json").into_response(),
    };
    if v["model"] != s.model.as_str() {
        return (StatusCode::NOT_FOUND, Json(json!({"error":{"message":"no such model","type":"NotFoundError","param":null,"code":404}}))).into_response();
    }
    let n = v["max_tokens"].as_u64().unwrap_or(4) as usize;
    let stream_on = v["stream"].as_bool().unwrap_or(false);
    let usage = v["stream_options"]["include_usage"]
        .as_bool()
        .unwrap_or(false);
    match behaviour(&s) {
        Behaviour::Fail500 => {
            return (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}))).into_response();
        }
        Behaviour::Stall => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        _ => {}
    }
    if !stream_on {
        let body = if chat {
            json!({"id":"x","object":"chat.completion","created":1,"model":s.model,"choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":n,"total_tokens":n+3}})
        } else {
            json!({"id":"x","object":"text_completion","created":1,"model":s.model,"choices":[{"index":0,"text":"hello","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":n,"total_tokens":n+3}})
        };
        return Json(body).into_response();
    }
    let mut items: Vec<Result<Bytes, std::io::Error>> = sse_events(chat, n, usage)
        .into_iter()
        .map(|e| Ok(Bytes::from(e)))
        .collect();
    let b = behaviour(&s);
    if b == Behaviour::DieMidStream {
        items.truncate(2);
        items.push(Err(std::io::Error::other("replica died")));
    }
    let silent = b == Behaviour::SilentMidStream;
    if silent {
        items.truncate(2);
    }
    let gap = Duration::from_millis(if b == Behaviour::Trickle { 150 } else { 2 });
    let s = stream::iter(items)
        .then(move |x| async move {
            tokio::time::sleep(gap).await;
            x
        })
        .chain(stream::once(async move {
            if silent {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            Ok(Bytes::new())
        }));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(s))
        .unwrap()
}

/// Starts a mock replica serving `model` on an ephemeral loopback port.
pub async fn mock(model: &str) -> Mock {
    let behaviour = Arc::new(AtomicU32::new(0));
    let hits = Arc::new(AtomicUsize::new(0));
    let health_ok = Arc::new(AtomicU32::new(1));
    let metrics_delay_ms = Arc::new(AtomicU64::new(0));
    let prefix_queries = Arc::new(AtomicU64::new(0));
    let traceparent = Arc::new(std::sync::Mutex::new(None));
    let last_body = Arc::new(std::sync::Mutex::new(None));
    let st = MockState {
        model: model.into(),
        behaviour: behaviour.clone(),
        hits: hits.clone(),
        health_ok: health_ok.clone(),
        metrics_delay_ms: metrics_delay_ms.clone(),
        prefix_queries: prefix_queries.clone(),
        traceparent: traceparent.clone(),
        last_body: last_body.clone(),
    };
    let app = Router::new()
        .route("/v1/completions", post(|s: State<MockState>, h: axum::http::HeaderMap, b: Bytes| complete(s, false, h, b)))
        .route("/v1/chat/completions", post(|s: State<MockState>, h: axum::http::HeaderMap, b: Bytes| complete(s, true, h, b)))
        .route(
            "/v1/models",
            get(|State(s): State<MockState>| async move {
                Json(json!({"object":"list","data":[{"id":s.model,"object":"model","max_model_len":4096}]}))
            }),
        )
        .route(
            "/health",
            get(|State(s): State<MockState>| async move {
                if s.health_ok.load(SeqCst) == 1 { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }
            }),
        )
        .route(
            "/metrics",
            get(|State(s): State<MockState>| async move {
                let delay = s.metrics_delay_ms.load(SeqCst);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                format!(
                    "vllm:num_requests_running{{engine=\"0\"}} 0\nvllm:num_requests_waiting{{engine=\"0\"}} 0\nvllm:kv_cache_usage_perc{{engine=\"0\"}} 0.1\nvllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"1000\"}} 1\nvllm:prefix_cache_queries_total{{engine=\"0\"}} {}\n",
                    s.prefix_queries.load(SeqCst)
                )
            }),
        )
        .with_state(st);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { c.cancelled().await })
            .await
            .ok();
    });
    Mock {
        addr,
        behaviour,
        hits,
        health_ok,
        metrics_delay_ms,
        prefix_queries,
        traceparent,
        last_body,
        cancel,
    }
}

pub struct TestRouter {
    pub addr: SocketAddr,
    pub node: Node,
    cancel: CancellationToken,
}

impl TestRouter {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// GET `/metrics` as text.
    pub async fn metrics_text(&self) -> String {
        self.get_text("/metrics").await
    }

    /// GET `path` as text.
    pub async fn get_text(&self, path: &str) -> String {
        client()
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// GET `path` and parse the JSON answer.
    pub async fn get_json(&self, path: &str) -> Value {
        client()
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

impl Drop for TestRouter {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// A router in front of `replicas`, with fast health settings, ready when returned.
pub async fn router(
    replicas: &[String],
    policy: PolicyName,
    tweak: impl FnOnce(&mut RouterConfig),
) -> TestRouter {
    let mut cfg = RouterConfig {
        policy,
        listen: "127.0.0.1:0".parse().unwrap(),
        ..RouterConfig::default()
    };
    cfg.health.probe_interval_ms = 50;
    cfg.health.probe_timeout_ms = 200;
    cfg.health.backoff_initial_ms = 300;
    cfg.scrape.interval_ms = 50;
    cfg.proxy.first_byte_timeout_ms = 2_000;
    cfg.proxy.idle_timeout_ms = 2_000;
    for r in replicas {
        cfg.replicas.push(ReplicaConfig {
            url: r.clone(),
            name: None,
            class: None,
            region: None,
            max_batched_tokens: None,
            ..Default::default()
        });
    }
    tweak(&mut cfg);
    let cancel = CancellationToken::new();
    let listener = tokio::net::TcpListener::bind(cfg.listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::start(cfg, cancel.child_token()).await.unwrap();
    let n = node.path.clone();
    let c = cancel.clone();
    tokio::spawn(async move { headroom::server::serve(n, listener, c).await.ok() });
    // Ready: every replica healthy and its models known.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let all = node.path.fleet.replicas();
        if all
            .iter()
            .all(|r| r.health.routable() && r.models.load().known)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "router never became ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    TestRouter { addr, node, cancel }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// A child process killed and reaped on drop (a test never leaves one behind).
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free loopback TCP port.
pub fn free_tcp() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A free loopback UDP port.
pub fn free_udp() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}
