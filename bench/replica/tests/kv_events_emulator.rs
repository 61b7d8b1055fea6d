//! The emulator's KV events against `headroom-kv-events`' subscriber, over real
//! ZMQ and HTTP on loopback: the publisher found through `/kv_event_sources`, the
//! index's cached-token count equal to the engine's `cached_tokens` for every
//! request (prefix sharing and evictions in a small KV cache), and the index
//! correct again after the replica restarts on the same ports.
//! Every process is killed on drop; every wait is bounded.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use headroom_kv_events::chain::prompt_chain;
use headroom_kv_events::discovery::parse_sources;
use headroom_kv_events::feed::FeedState;
use headroom_kv_events::{
    ReplicaId, SharedIndex, SubscriberConfig, engine_cached_tokens, shared_index, spawn_subscriber,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const BS: u32 = 16;

struct Replica {
    child: Child,
    base: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn spawn(listen: &str, ev: u16, rp: u16) -> Replica {
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom-replica"))
        .args(["--listen", listen, "--model", "m", "--seed", "7"])
        // 64 blocks of 16 tokens: the workload below overflows it (evictions).
        .args(["--num-gpu-blocks", "64", "--max-model-len", "900"])
        .args(["--time-scale", "0.02", "--step-noise", "0"])
        .arg(format!("--kv-events-endpoint=tcp://127.0.0.1:{ev}"))
        .arg(format!("--kv-events-replay-endpoint=tcp://127.0.0.1:{rp}"))
        .args(["--kv-events-topic", "kv-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn headroom-replica");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let mut r = Replica {
        child,
        base: String::new(),
    };
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("replica announced its address");
    r.base = line
        .trim()
        .strip_prefix("headroom-replica listening on ")
        .expect("announcement")
        .to_string();
    r
}

fn tokens(seed: u32, n: u32) -> Vec<u32> {
    (0..n)
        .map(|i| (seed.wrapping_mul(2_654_435_761) ^ i.wrapping_mul(40_503)) % 50_000)
        .collect()
}

/// Shared prefixes of 100 / 260 tokens with unique suffixes, and repeats.
fn workload(round: u32) -> Vec<Vec<u32>> {
    let pre = [tokens(1, 100), tokens(2, 260)];
    let mut out = Vec::new();
    for i in 0..16u32 {
        let mut p = pre[(i % 2) as usize].clone();
        p.extend(tokens(1000 + round * 100 + i, 10 + (i * 23) % 120));
        out.push(p.clone());
        if i % 5 == 4 {
            out.push(p);
        }
    }
    out
}

async fn complete(base: &str, toks: &[u32]) -> (u32, u32) {
    let v: Value = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&json!({"model": "m", "prompt": toks, "max_tokens": 2, "ignore_eos": true}))
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().expect("prompt_tokens") as u32,
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens") as u32,
    )
}

fn held(ix: &SharedIndex, toks: &[u32]) -> u32 {
    let chain = prompt_chain(toks, BS as usize, 0);
    ix.read()
        .longest_prefix(&chain)
        .blocks_for(ReplicaId::new(0).expect("id"))
}

async fn until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < limit, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t.elapsed()
}

/// Sends each prompt and checks the index predicted the engine's cached tokens.
async fn check_round(base: &str, ix: &SharedIndex, round: u32) -> u32 {
    let mut hits = 0;
    for p in workload(round) {
        let predicted = engine_cached_tokens(held(ix, &p), p.len() as u32, BS);
        let (n, cached) = complete(base, &p).await;
        assert_eq!(n, p.len() as u32);
        assert_eq!(predicted, cached, "index vs engine cached tokens");
        hits += u32::from(cached > 0);
        // Its blocks were stored during prefill; wait until the events are applied
        // (a block may also have been evicted since: then fewer is right).
        let t = Instant::now();
        while held(ix, &p) < p.len() as u32 / BS && t.elapsed() < Duration::from_millis(500) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    hits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_matches_engine_cached_tokens_and_survives_restart() {
    let (ev, rp) = (free_port(), free_port());
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let r = spawn(&listen, ev, rp);
    let body = reqwest::get(format!("{}/kv_event_sources", r.base))
        .await
        .expect("get")
        .text()
        .await
        .expect("body");
    let src = parse_sources(&body, "127.0.0.1").expect("sources");
    assert_eq!(src.len(), 1, "{body}");
    let index: SharedIndex = shared_index(100_000);
    let mut cfg =
        SubscriberConfig::new(ReplicaId::new(0).expect("id"), src[0].endpoint.clone(), BS);
    cfg.replay_endpoint = src[0].replay_endpoint.clone();
    cfg.topic = src[0].topic.clone();
    let cancel = CancellationToken::new();
    let sub = spawn_subscriber(cfg, index.clone(), cancel.clone());
    until("precise", Duration::from_secs(10), || {
        sub.status().state == FeedState::Precise
    })
    .await;
    let hits = check_round(&r.base, &index, 0).await;
    assert!(hits >= 10, "the workload shares prefixes: {hits} hits");
    let st = sub.status();
    assert!(
        st.apply.removed_blocks > 0,
        "the small cache evicted: {st:?}"
    );
    assert_eq!(st.state, FeedState::Precise);

    // Restart on the same ports: the index must forget the old engine's blocks.
    drop(r);
    let r = spawn(&listen, ev, rp);
    let first = workload(0).remove(0);
    let took = until("old blocks forgotten", Duration::from_secs(10), || {
        sub.status().state == FeedState::Precise && held(&index, &first) == 0
    })
    .await;
    println!(
        "index correct {} ms after the new replica announced itself",
        took.as_millis()
    );
    check_round(&r.base, &index, 1).await;
    assert_eq!(sub.status().state, FeedState::Precise);
    cancel.cancel();
    sub.shutdown().await;
}
