//! The router following an engine's KV events, over real ZMQ and HTTP on loopback:
//! a mock engine (an LRU prefix cache of 16-token blocks) publishes vLLM-framed
//! `BlockStored` / `BlockRemoved` batches through `headroom-kv-events`' publisher
//! (the emulator's), found by the router through `GET /kv_event_sources`.
//!
//! What a user relies on: the router's `x-headroom-cached-tokens` equals the engine's
//! own `usage.prompt_tokens_details.cached_tokens` for every request while the feed
//! is `precise` (shared prefixes, repeats, evictions); dropped events are noticed
//! (silence → `approximate`) and repaired by replay (`precise` again, counts equal);
//! a publisher that goes away makes the replica `approximate` (the prefix index's
//! estimate is used), and an engine restart (empty cache, sequence from 0) is
//! followed again, exactly, within a bounded time. Every wait is bounded.

mod common;

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    body::Bytes,
    extract::State,
    routing::{get, post},
};
use headroom::policy::PolicyName;
use headroom_kv_events::{
    chain::prompt_chain,
    engine_cached_tokens,
    publisher::{Publisher, PublisherConfig},
    wire::{BlockRemoved, BlockStored, EventBatch, ExternalHash, KvEvent},
};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const BS: u32 = 16;
/// Blocks the mock engine caches: the workload below overflows it.
const CAPACITY: usize = 24;

struct Engine {
    /// Cached block hashes, least recently used first.
    lru: VecDeque<u64>,
    publisher: Option<Publisher>,
    /// Batches handed to the current publisher (its next seq).
    published: u64,
}

#[derive(Clone)]
struct Mock {
    engine: Arc<Mutex<Engine>>,
    ev_port: u16,
    replay_port: u16,
}

impl Mock {
    /// Serves one prompt: what the engine reports cached, then the blocks it stores.
    fn serve(&self, ids: &[u32]) -> u32 {
        let chain = prompt_chain(ids, BS as usize, 0);
        let mut e = self.engine.lock();
        let hits = chain.iter().take_while(|h| e.lru.contains(h)).count() as u32;
        let cached = engine_cached_tokens(hits, ids.len() as u32, BS);
        let mut events = Vec::new();
        for (i, h) in chain.iter().enumerate() {
            if let Some(p) = e.lru.iter().position(|x| x == h) {
                e.lru.remove(p);
                e.lru.push_back(*h);
                continue;
            }
            if e.lru.len() >= CAPACITY
                && let Some(old) = e.lru.pop_front()
            {
                events.push(KvEvent::Removed(BlockRemoved {
                    block_hashes: vec![ExternalHash::Int(old)],
                    medium: Some("GPU".into()),
                    group_idx: None,
                }));
            }
            e.lru.push_back(*h);
            events.push(KvEvent::Stored(BlockStored {
                block_hashes: vec![ExternalHash::Int(*h)],
                parent_block_hash: (i > 0).then(|| ExternalHash::Int(chain[i - 1])),
                token_ids: ids[i * BS as usize..(i + 1) * BS as usize].to_vec(),
                block_size: BS,
                medium: Some("GPU".into()),
                ..Default::default()
            }));
        }
        if !events.is_empty() {
            let batch = EventBatch {
                ts: 0.0,
                events,
                data_parallel_rank: Some(0),
                unknown_events: 0,
            };
            if let Some(p) = &e.publisher {
                assert!(p.try_publish(batch), "publisher queue full");
            }
            e.published += 1;
        }
        cached
    }

    /// The engine (re)starts: an empty cache, a publisher counting from 0.
    async fn start_publisher(&self) {
        let mut cfg = PublisherConfig::new(format!("tcp://127.0.0.1:{}", self.ev_port));
        cfg.replay_endpoint = Some(format!("tcp://127.0.0.1:{}", self.replay_port));
        cfg.topic = "kv-events".into();
        let p = Publisher::start(cfg, CancellationToken::new())
            .await
            .expect("publisher binds");
        let mut e = self.engine.lock();
        e.lru.clear();
        e.publisher = Some(p);
        e.published = 0;
    }

    /// The engine process dies: its publisher goes away, its cache is lost.
    async fn crash(&self) {
        let p = {
            let mut e = self.engine.lock();
            e.lru.clear();
            e.publisher.take()
        };
        if let Some(p) = p {
            p.shutdown().await;
        }
    }

    fn skip_live(&self, n: u64) {
        if let Some(p) = &self.engine.lock().publisher {
            p.skip_live(n);
        }
    }

    fn published(&self) -> u64 {
        self.engine.lock().published
    }
}

async fn completions(State(m): State<Mock>, body: Bytes) -> Json<Value> {
    let v: Value = serde_json::from_slice(&body).expect("json");
    let ids: Vec<u32> = v["prompt"]
        .as_array()
        .expect("token ids")
        .iter()
        .map(|t| t.as_u64().expect("id") as u32)
        .collect();
    let cached = m.serve(&ids);
    let n = ids.len() as u32;
    Json(json!({
        "id": "x", "object": "text_completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
        "usage": {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    }))
}

async fn start_mock() -> (String, Mock, CancellationToken) {
    let mock = Mock {
        engine: Arc::new(Mutex::new(Engine {
            lru: VecDeque::new(),
            publisher: None,
            published: 0,
        })),
        ev_port: common::free_tcp().port(),
        replay_port: common::free_tcp().port(),
    };
    mock.start_publisher().await;
    let sources = json!({"0": {"enable_kv_cache_events": true, "publisher": "zmq",
        "endpoint": format!("tcp://*:{}", mock.ev_port),
        "replay_endpoint": format!("tcp://*:{}", mock.replay_port),
        "buffer_steps": 10000, "topic": "kv-events"}});
    let app = Router::new()
        .route("/v1/completions", post(completions))
        .route(
            "/v1/models",
            get(|| async {
                Json(json!({"object":"list","data":[{"id":"m","object":"model","max_model_len":4096}]}))
            }),
        )
        .route("/health", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|| async {
                format!("vllm:num_requests_running{{engine=\"0\"}} 0\nvllm:num_requests_waiting{{engine=\"0\"}} 0\nvllm:kv_cache_usage_perc{{engine=\"0\"}} 0.1\nvllm:cache_config_info{{block_size=\"{BS}\",num_gpu_blocks=\"{CAPACITY}\"}} 1\n")
            }),
        )
        .route(
            "/kv_event_sources",
            get(move || {
                let s = sources.clone();
                async move { Json(s) }
            }),
        )
        .with_state(mock.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { c.cancelled().await })
            .await
            .ok();
    });
    (url, mock, cancel)
}

/// Shared prefixes (3 × 5 blocks), unique suffixes, repeats.
fn prompt(prefix: u32, suffix: u32, len: u32) -> Vec<u32> {
    (0..len)
        .map(|i| {
            if i < 80 {
                1000 * (prefix + 1) + i
            } else {
                100_000 + 1000 * suffix + i
            }
        })
        .collect()
}

struct Answer {
    engine: u32,
    router: u32,
    source: String,
}

async fn send(router: &common::TestRouter, ids: &[u32]) -> Answer {
    let resp = common::client()
        .post(router.url("/v1/completions"))
        .json(&json!({"model": "m", "prompt": ids, "max_tokens": 1}))
        .send()
        .await
        .expect("router answers");
    assert_eq!(resp.status(), 200);
    let h = |k: &str| {
        resp.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no {k} header"))
    };
    let router_count: u32 = h("x-headroom-cached-tokens").parse().expect("number");
    let source = h("x-headroom-cached-tokens-source");
    let v: Value = resp.json().await.expect("json");
    Answer {
        engine: v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("engine count") as u32,
        router: router_count,
        source,
    }
}

async fn feed(router: &common::TestRouter) -> Value {
    let v = router.get_json("/debug/replicas").await;
    v["replicas"][0]["kv_events"].clone()
}

async fn until(
    router: &common::TestRouter,
    what: &str,
    limit: Duration,
    f: impl Fn(&Value) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        let s = feed(router).await;
        if f(&s) {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}: {s}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the router applied every batch the engine published.
async fn synced(router: &common::TestRouter, mock: &Mock) {
    let want = mock.published();
    until(
        router,
        "the feed to catch up",
        Duration::from_secs(5),
        |s| s["state"] == "precise" && s["next_seq"].as_u64().unwrap_or(0) >= want,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_tokens_equal_the_engine_through_loss_and_restart() {
    let (url, mock, _stop) = start_mock().await;
    let r = common::router(&[], PolicyName::LeastRequest, |c| {
        c.replicas.push(headroom::config::ReplicaConfig {
            url: url.clone(),
            kv_events: Some("discover".into()),
            ..Default::default()
        });
        c.kv_events.silence_timeout_ms = 400;
        c.kv_events.check_interval_ms = 50;
    })
    .await;
    let t = until(&r, "precise at start", Duration::from_secs(10), |s| {
        s["state"] == "precise"
    })
    .await;
    eprintln!("precise {} ms after the router was ready", t.as_millis());
    let s = feed(&r).await;
    assert_eq!(
        s["block_size"], BS,
        "block size read from the engine's metrics"
    );
    assert_eq!(
        s["endpoint"],
        format!("tcp://127.0.0.1:{}", mock.ev_port),
        "endpoint discovered from /kv_event_sources, wildcard host resolved"
    );

    // 1. Precise: shared prefixes, repeats and evictions (24-block cache).
    let mut nonzero = 0;
    let mut seen = Vec::new();
    for i in 0..18u32 {
        let ids = prompt(i % 3, i / 2, 100 + 13 * (i % 5));
        let a = send(&r, &ids).await;
        assert_eq!(a.source, "precise", "request {i}");
        assert_eq!(
            a.router, a.engine,
            "request {i}: router vs engine cached tokens"
        );
        nonzero += u32::from(a.engine > 0);
        seen.push(a.engine);
        synced(&r, &mock).await;
    }
    assert!(nonzero >= 8, "the workload reuses prefixes: {seen:?}");
    let s = feed(&r).await;
    assert!(s["blocks"].as_u64().unwrap() <= CAPACITY as u64);

    // 2. Dropped events: two batches never arrive live. The first request's silence
    // marks the replica approximate; the next live batch shows the gap, the replay
    // fills it, and the counts are exact again.
    mock.skip_live(2);
    send(&r, &prompt(7, 70, 120)).await;
    until(&r, "silence → approximate", Duration::from_secs(3), |s| {
        s["state"] == "approximate"
    })
    .await;
    let a = send(&r, &prompt(8, 80, 120)).await;
    assert_eq!(a.source, "approximate");
    send(&r, &prompt(9, 90, 120)).await;
    synced(&r, &mock).await;
    let s = feed(&r).await;
    assert!(s["gaps"].as_u64().unwrap() >= 1, "{s}");
    for (p, q) in [(7, 70), (8, 80), (9, 90), (0, 1)] {
        let a = send(&r, &prompt(p, q, 120)).await;
        assert_eq!(a.source, "precise");
        assert_eq!(a.router, a.engine, "after the replay: prompt {p}/{q}");
        synced(&r, &mock).await;
    }

    // 3. The engine dies: the feed goes approximate, routing continues on the
    // estimate (the engine is still answering HTTP here: only its events stopped).
    mock.crash().await;
    until(
        &r,
        "disconnect → approximate",
        Duration::from_secs(3),
        |s| s["state"] == "approximate",
    )
    .await;
    let a = send(&r, &prompt(0, 1, 120)).await;
    assert_eq!(a.source, "approximate");
    assert_eq!(a.engine, 0, "the crashed engine lost its cache");

    // 4. It comes back on the same ports with an empty cache and sequence from 0:
    // the index drops what it knew and is exact again.
    let restarted = Instant::now();
    mock.start_publisher().await;
    until(
        &r,
        "precise after the restart",
        Duration::from_secs(10),
        |s| s["state"] == "precise" && s["blocks"] == 0,
    )
    .await;
    eprintln!(
        "precise again {} ms after the publisher restarted",
        restarted.elapsed().as_millis()
    );
    for i in 0..6u32 {
        let a = send(&r, &prompt(i % 2, 200 + i, 110)).await;
        assert_eq!(a.source, "precise");
        assert_eq!(a.router, a.engine, "after the restart: request {i}");
        synced(&r, &mock).await;
    }
    let m = common::client()
        .get(r.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.lines().any(|l| l.starts_with("headroom_kv_feed_state{")
            && l.contains("state=\"precise\"")
            && l.ends_with(" 1")),
        "{m}"
    );
    assert!(m.contains("headroom_kv_feed_incidents_total{"), "{m}");
}
