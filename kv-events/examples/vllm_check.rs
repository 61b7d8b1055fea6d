//! Checks the KV-event index against a real vLLM server (run by
//! `scripts/vllm/kv-events-check.sh`).
//!
//! Sends token-id prompts with shared prefixes to `/v1/completions`; before each,
//! predicts the engine's cached tokens from the index (longest held prefix of the
//! prompt's chain, whole blocks, never the last token) and compares with the
//! response's `usage.prompt_tokens_details.cached_tokens`. Also checks that vLLM's
//! own block hashes (sha256 of the pickled block) equal the ones
//! `vllm_hash::prompt_hashes` computes. Then: a subscriber gap (the subscriber is
//! stopped while requests run and a new one catches up by replay), and an engine
//! restart (`--restart-cmd`), timing how long until the index is correct again.
//! Prints one line per request and a summary; exits 1 on any mismatch.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use headroom_kv_events::chain::prompt_chain;
use headroom_kv_events::feed::FeedState;
use headroom_kv_events::vllm_hash::{
    DEFAULT_NONE_HASH_SEED, VllmHashAlgo, external_int, prompt_hashes,
};
use headroom_kv_events::wire::{KvEvent, bytes_key, decode_batch, split_frames};
use headroom_kv_events::{
    BlockIndex, ReplicaId, SharedIndex, SubscriberConfig, SubscriberHandle, engine_cached_tokens,
    spawn_subscriber,
};
use parking_lot::{Mutex, RwLock};
use tokio_util::sync::CancellationToken;
use zeromq::{Socket, SocketRecv, SubSocket};

struct Args {
    api: String,
    events: String,
    replay: String,
    topic: String,
    block_size: u32,
    restart_cmd: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        api: String::new(),
        events: String::new(),
        replay: String::new(),
        topic: String::new(),
        block_size: 32,
        restart_cmd: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        match k.as_str() {
            "--api" => a.api = v,
            "--events" => a.events = v,
            "--replay" => a.replay = v,
            "--topic" => a.topic = v,
            "--block-size" => a.block_size = v.parse().map_err(|e| format!("{e}"))?,
            "--restart-cmd" => a.restart_cmd = Some(v),
            _ => return Err(format!("unknown flag {k}")),
        }
    }
    if a.api.is_empty() || a.events.is_empty() || a.replay.is_empty() {
        return Err("--api, --events and --replay are required".into());
    }
    Ok(a)
}

/// Deterministic token ids in 10..4000 (the tiny model's vocab is 4096).
fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            10 + (x % 3990) as u32
        })
        .collect()
}

/// The workload: 3 shared prefixes (120, 330, 700 tokens) with unique suffixes,
/// and exact repeats.
fn prompts(round: u64) -> Vec<Vec<u32>> {
    let prefixes = [tokens(1, 120), tokens(2, 330), tokens(3, 700)];
    let mut out = Vec::new();
    for i in 0..12u64 {
        let mut p = prefixes[(i % 3) as usize].clone();
        p.extend(tokens(100 + round * 1000 + i, 20 + (i as usize * 37) % 180));
        out.push(p);
        if i % 4 == 3 {
            out.push(out[out.len() - 1].clone());
        }
    }
    out
}

struct Check {
    a: Args,
    http: reqwest::Client,
    index: SharedIndex,
    seen_hashes: Arc<Mutex<HashSet<u64>>>,
    media: Arc<Mutex<HashSet<String>>>,
    mismatches: u32,
    requests: u32,
    hash_checked: u32,
    hash_missing: u32,
}

fn rid() -> ReplicaId {
    ReplicaId::new(0).unwrap_or_else(|| unreachable!())
}

impl Check {
    fn subscriber(&self, cancel: &CancellationToken) -> SubscriberHandle {
        let mut cfg = SubscriberConfig::new(rid(), self.a.events.clone(), self.a.block_size);
        cfg.replay_endpoint = Some(self.a.replay.clone());
        cfg.topic = self.a.topic.clone();
        spawn_subscriber(cfg, self.index.clone(), cancel.clone())
    }

    fn held_blocks(&self, toks: &[u32]) -> u32 {
        let chain = prompt_chain(toks, self.a.block_size as usize, 0);
        self.index.read().longest_prefix(&chain).blocks_for(rid())
    }

    async fn complete(&self, toks: &[u32]) -> Result<(u32, u32), String> {
        let body = serde_json::json!({
            "model": "tiny-llama", "prompt": toks, "max_tokens": 1, "temperature": 0,
        });
        let r = self
            .http
            .post(format!("{}/v1/completions", self.a.api))
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let v: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
        let u = &v["usage"];
        let prompt = u["prompt_tokens"]
            .as_u64()
            .ok_or(format!("no usage: {v}"))?;
        let cached = u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        Ok((prompt as u32, cached as u32))
    }

    /// One request: predicted vs engine cached tokens, then wait for its blocks.
    async fn request(&mut self, label: &str, toks: &[u32]) -> Result<(), String> {
        let bs = self.a.block_size;
        let n = toks.len() as u32;
        let predicted = engine_cached_tokens(self.held_blocks(toks), n, bs);
        let (prompt, cached) = self.complete(toks).await?;
        self.requests += 1;
        let ok = predicted == cached && prompt == n;
        if !ok {
            self.mismatches += 1;
        }
        // The engine stores every full block of the prompt; wait for the events.
        let t = Instant::now();
        let full = n / bs;
        while self.held_blocks(toks) < full && t.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let lag = t.elapsed();
        // vLLM's own hashes of this prompt, reproduced, must have been published.
        let hashes = prompt_hashes(
            VllmHashAlgo::Sha256,
            DEFAULT_NONE_HASH_SEED,
            toks,
            bs as usize,
        )
        .map_err(|e| e.to_string())?;
        // vLLM publishes the int form by default, the bytes with
        // VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0; either counts. The raw tap is a
        // separate socket and may lag the subscriber: give it up to 2 s.
        let missing_now = || {
            let seen = self.seen_hashes.lock();
            hashes
                .iter()
                .filter(|h| !seen.contains(&external_int(h)) && !seen.contains(&bytes_key(&h[..])))
                .count()
        };
        let t = Instant::now();
        while missing_now() > 0 && t.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let missing = missing_now();
        self.hash_checked += hashes.len() as u32;
        self.hash_missing += missing as u32;
        println!(
            "{label:<10} prompt {n:>5}  index predicts {predicted:>5}  engine cached {cached:>5}  {}  events applied after {:>4} ms  vllm-hash {}/{} reproduced",
            if ok { "OK  " } else { "DIFF" },
            lag.as_millis(),
            hashes.len() - missing,
            hashes.len()
        );
        Ok(())
    }
}

/// Records every block hash and medium vLLM publishes (a second, raw subscriber;
/// reconnects at once when the engine goes away).
async fn raw_tap(
    endpoint: String,
    topic: String,
    seen: Arc<Mutex<HashSet<u64>>>,
    media: Arc<Mutex<HashSet<String>>>,
    cancel: CancellationToken,
) {
    while !cancel.is_cancelled() {
        let mut sub = SubSocket::new();
        let mut monitor = sub.monitor();
        if sub.connect(&endpoint).await.is_err() || sub.subscribe(&topic).await.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        loop {
            let m = tokio::select! {
                _ = cancel.cancelled() => return,
                ev = monitor.next() => match ev {
                    Some(zeromq::SocketEvent::Disconnected(_)) | None => break,
                    _ => continue,
                },
                m = sub.recv() => m,
            };
            let Ok(m) = m else { continue };
            let frames = m.into_vec();
            let Ok((_, payload)) = split_frames(&frames) else {
                continue;
            };
            let Ok(b) = decode_batch(payload) else {
                continue;
            };
            for e in b.events {
                if let KvEvent::Stored(s) = e {
                    media
                        .lock()
                        .insert(s.medium.clone().unwrap_or_else(|| "None".into()));
                    for h in s.block_hashes {
                        seen.lock().insert(h.key());
                    }
                }
            }
        }
    }
}

async fn wait_state(sub: &SubscriberHandle, want: FeedState, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if sub.status().state == want {
            return Some(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

#[tokio::main]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("vllm_check: {e}");
            std::process::exit(2);
        }
    };
    let cancel = CancellationToken::new();
    let seen = Arc::new(Mutex::new(HashSet::new()));
    let media = Arc::new(Mutex::new(HashSet::new()));
    tokio::spawn(raw_tap(
        a.events.clone(),
        a.topic.clone(),
        seen.clone(),
        media.clone(),
        cancel.clone(),
    ));
    let mut c = Check {
        a,
        http: reqwest::Client::new(),
        index: Arc::new(RwLock::new(BlockIndex::new(1 << 20))),
        seen_hashes: seen,
        media: media.clone(),
        mismatches: 0,
        requests: 0,
        hash_checked: 0,
        hash_missing: 0,
    };
    if let Err(e) = run(&mut c, &cancel).await {
        eprintln!("vllm_check: {e}");
        cancel.cancel();
        std::process::exit(1);
    }
    cancel.cancel();
    println!(
        "summary: {} requests, {} cached-token mismatches; vLLM sha256 block hashes reproduced {}/{}; media seen {:?}",
        c.requests,
        c.mismatches,
        c.hash_checked - c.hash_missing,
        c.hash_checked,
        c.media.lock()
    );
    if c.mismatches > 0 || c.hash_missing > 0 {
        std::process::exit(1);
    }
}

async fn run(c: &mut Check, cancel: &CancellationToken) -> Result<(), String> {
    let sub_cancel = cancel.child_token();
    let sub = c.subscriber(&sub_cancel);
    let t = wait_state(&sub, FeedState::Precise, Duration::from_secs(30))
        .await
        .ok_or(format!("never precise: {:?}", sub.status()))?;
    println!("subscriber precise after {} ms", t.as_millis());
    tokio::time::sleep(Duration::from_millis(300)).await; // let the raw tap subscribe
    for (i, p) in prompts(0).iter().enumerate() {
        c.request(&format!("r{i}"), p).await?;
    }
    println!("status: {:?}", sub.status());

    // Lost events: no subscriber while 4 requests run; a new one must catch up.
    sub.shutdown().await;
    let gap: Vec<Vec<u32>> = prompts(1).into_iter().take(4).collect();
    for p in &gap {
        c.complete(p).await?;
    }
    let t = Instant::now();
    let sub = c.subscriber(&sub_cancel);
    wait_state(&sub, FeedState::Precise, Duration::from_secs(30))
        .await
        .ok_or(format!("not precise after the gap: {:?}", sub.status()))?;
    let caught = gap
        .iter()
        .all(|p| c.held_blocks(p) >= p.len() as u32 / c.a.block_size);
    println!(
        "gap: new subscriber precise after {} ms (replayed {} batches); the 4 unseen requests indexed: {caught}",
        t.elapsed().as_millis(),
        sub.status().counters.replayed_batches
    );
    if !caught {
        c.mismatches += 1;
    }
    for (i, p) in gap.iter().enumerate() {
        c.request(&format!("gap{i}"), p).await?;
    }

    let Some(cmd) = c.a.restart_cmd.clone() else {
        return Ok(());
    };
    println!("restarting the engine: {cmd}");
    let t = Instant::now();
    let st = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(&cmd)
        .status()
        .await
        .map_err(|e| e.to_string())?;
    if !st.success() {
        return Err(format!("restart command failed: {st}"));
    }
    let healthy = t.elapsed();
    // Correct again = the old engine's blocks gone and the feed precise.
    let t2 = Instant::now();
    let old = prompts(0);
    // (The old blocks may go already when the engine disconnects: a failed replay
    // resyncs; the new engine's empty replay buffer then makes the feed precise.)
    while !(sub.status().state == FeedState::Precise
        && sub.socket_counters().disconnects >= 1
        && old.iter().all(|p| c.held_blocks(p) == 0))
    {
        if t2.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "index not correct after restart: {:?}",
                sub.status()
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "restart: engine healthy after {:.1} s; index correct (old blocks dropped, precise) {} ms after healthy; status {:?}",
        healthy.as_secs_f64(),
        t2.elapsed().as_millis(),
        sub.status()
    );
    for (i, p) in prompts(2).iter().enumerate().take(8) {
        c.request(&format!("post{i}"), p).await?;
    }
    sub.shutdown().await;
    Ok(())
}
