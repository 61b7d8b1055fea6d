//! A mock engine for KV-event tests: an LRU prefix cache of 16-token blocks that
//! answers completions of token-id prompts with vLLM's usage (`cached_tokens`) and
//! publishes vLLM-framed `BlockStored` / `BlockRemoved` batches through
//! `headroom-kv-events`' publisher (the emulator's), found through
//! `GET /kv_event_sources`.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::{collections::VecDeque, sync::Arc};

use axum::{
    Json, Router,
    body::Bytes,
    extract::State,
    routing::{get, post},
};
use headroom_kv_events::{
    chain::prompt_chain,
    engine_cached_tokens,
    publisher::{Publisher, PublisherConfig},
    wire::{BlockRemoved, BlockStored, EventBatch, ExternalHash, KvEvent},
};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub const BS: u32 = 16;
/// Blocks the mock engine caches: the workload below overflows it.
pub const CAPACITY: usize = 24;

pub struct Engine {
    /// Cached block hashes, least recently used first.
    lru: VecDeque<u64>,
    publisher: Option<Publisher>,
    /// Batches handed to the current publisher (its next seq).
    published: u64,
    /// Blocks stored since the mock started (every publisher).
    pub stored_blocks: u64,
}

#[derive(Clone)]
pub struct Mock {
    pub engine: Arc<Mutex<Engine>>,
    pub ev_port: u16,
    pub replay_port: u16,
}

impl Mock {
    /// Serves one prompt: what the engine reports cached, then the blocks it stores.
    pub fn serve(&self, ids: &[u32]) -> u32 {
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
            e.stored_blocks += 1;
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
    pub async fn start_publisher(&self) {
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
    pub async fn crash(&self) {
        let p = {
            let mut e = self.engine.lock();
            e.lru.clear();
            e.publisher.take()
        };
        if let Some(p) = p {
            p.shutdown().await;
        }
    }

    pub fn skip_live(&self, n: u64) {
        if let Some(p) = &self.engine.lock().publisher {
            p.skip_live(n);
        }
    }

    pub fn published(&self) -> u64 {
        self.engine.lock().published
    }

    pub fn stored_blocks(&self) -> u64 {
        self.engine.lock().stored_blocks
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

pub async fn start_mock() -> (String, Mock, CancellationToken) {
    let mock = Mock {
        engine: Arc::new(Mutex::new(Engine {
            lru: VecDeque::new(),
            publisher: None,
            published: 0,
            stored_blocks: 0,
        })),
        ev_port: super::free_tcp().port(),
        replay_port: super::free_tcp().port(),
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
pub fn prompt(prefix: u32, suffix: u32, len: u32) -> Vec<u32> {
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

/// What one completion through the router said about its prompt's cache: the
/// engine's own `cached_tokens`, the router's count and where the count came from.
pub struct Answer {
    pub engine: u32,
    pub router: u32,
    pub source: String,
}

/// Sends a token-id prompt to the router's completions `url` (one output token) and
/// reads both counts.
pub async fn ask(url: String, ids: &[u32]) -> Answer {
    let resp = super::client()
        .post(url)
        .json(&serde_json::json!({"model": "m", "prompt": ids, "max_tokens": 1}))
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
    let router: u32 = h("x-headroom-cached-tokens").parse().expect("number");
    let source = h("x-headroom-cached-tokens-source");
    let v: serde_json::Value = resp.json().await.expect("json");
    Answer {
        engine: v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("engine count") as u32,
        router,
        source,
    }
}
