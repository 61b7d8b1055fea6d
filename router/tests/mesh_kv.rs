//! The precise (KV-event) index shared over the mesh, with real processes on
//! loopback: two `headroom serve` nodes (`mesh.scrape_owners = 1`, so exactly one
//! follows the engine's events) and a mock engine publishing vLLM-framed events.
//!
//! What a user relies on: a request through the node that does NOT follow the engine
//! gets the engine's exact cached-token count (`x-headroom-cached-tokens-source:
//! precise`), through shared prefixes, repeats, evictions and a burst; that node never
//! claims `precise` from a silent owner; when the owner dies the other node takes the
//! replica over (subscribes, replays, `precise` again) within a bounded time.
//! Prints the sync lag, the KV share's bytes and the handover time.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    net::SocketAddr,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{
    Proc, client, free_tcp, free_udp,
    kv_engine::{self, Answer, Mock, prompt, start_mock},
};
use serde_json::{Value, json};

fn start_node(
    id: &str,
    http: SocketAddr,
    gossip: SocketAddr,
    seed: SocketAddr,
    tls: &Path,
    config: &Path,
    replica: &str,
) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_headroom"));
    cmd.args(["serve", "--config", config.to_str().unwrap()])
        .args(["--listen", &http.to_string(), "--node-id", id])
        .args(["--policy", "least-request"])
        .args(["--gossip-listen", &gossip.to_string()])
        .args(["--gossip-tls-dir", tls.to_str().unwrap()])
        .args(["--peer", &seed.to_string()])
        .args(["--replica", &format!("{replica},kv-events=discover")])
        .env("HEADROOM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    Proc(cmd.spawn().expect("spawn headroom serve"))
}

async fn get_json(url: String) -> Option<Value> {
    client()
        .get(url)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// The replica's `kv_events` on a node (`Null` when it does not answer).
async fn feed(http: SocketAddr) -> Value {
    get_json(format!("http://{http}/debug/replicas"))
        .await
        .map_or(Value::Null, |v| v["replicas"][0]["kv_events"].clone())
}

async fn cluster(http: SocketAddr) -> Value {
    get_json(format!("http://{http}/debug/cluster"))
        .await
        .unwrap_or(Value::Null)
}

async fn until(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < limit, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

async fn send(http: SocketAddr, ids: &[u32]) -> Answer {
    kv_engine::ask(format!("http://{http}/v1/completions"), ids).await
}

/// Waits until the owner published deltas covering every batch the engine published
/// and the mirror on `other` applied them; returns how long that took.
async fn synced(owner: SocketAddr, other: SocketAddr, mock: &Mock) -> Duration {
    let want = mock.published();
    until(
        "the mirror to catch up",
        Duration::from_secs(10),
        async || {
            let (o, m) = (feed(owner).await, feed(other).await);
            o["state"] == "precise"
                && o["mesh_covers_next_seq"].as_u64().unwrap_or(0) >= want
                && m["state"] == "precise"
                && m["epoch"] == o["mesh_epoch"]
                && m["next_seq"].as_u64() == o["mesh_seq"].as_u64().map(|s| s + 1)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_does_not_follow_the_engine_counts_cached_tokens_exactly() {
    let (url, mock, _stop) = start_mock().await;
    let dir = tempfile::tempdir().unwrap();
    headroom_gossip::write_dev_certs(dir.path(), &["a", "b", "c"]).unwrap();
    let config = dir.path().join("headroom.toml");
    std::fs::write(
        &config,
        "[mesh]\nscrape_owners = 1\nprefix_interval_ms = 50\n\n[kv_events]\ncheck_interval_ms = 50\n",
    )
    .unwrap();
    let (ga, gb) = (free_udp(), free_udp());
    let (ha, hb) = (free_tcp(), free_tcp());
    let mut procs = vec![
        Some(start_node("a", ha, ga, ga, dir.path(), &config, &url)),
        Some(start_node("b", hb, gb, ga, dir.path(), &config, &url)),
    ];
    let http = [ha, hb];

    // One node follows the events, the other mirrors it: both precise.
    let t = until(
        "one follower and one mirror, both precise",
        Duration::from_secs(40),
        async || {
            let (a, b) = (feed(ha).await, feed(hb).await);
            let mut sources = [a["source"].clone(), b["source"].clone()];
            sources.sort_by_key(|s| s.to_string());
            a["state"] == "precise" && b["state"] == "precise" && sources == ["events", "mesh"]
        },
    )
    .await;
    eprintln!(
        "follower and mirror precise {} ms after start",
        t.as_millis()
    );
    let owner_i = if feed(ha).await["source"] == "events" {
        0
    } else {
        1
    };
    let (owner, other) = (http[owner_i], http[1 - owner_i]);

    // 1. Through the node that does not follow the engine: exact, request by request.
    let mut lags = Vec::new();
    let mut nonzero = 0;
    for i in 0..14u32 {
        let ids = prompt(i % 3, i / 2, 100 + 13 * (i % 5));
        let a = send(other, &ids).await;
        assert_eq!(a.source, "precise", "request {i}");
        assert_eq!(a.router, a.engine, "request {i}: mirror vs engine");
        nonzero += u32::from(a.engine > 0);
        lags.push(synced(owner, other, &mock).await.as_millis());
    }
    assert!(nonzero >= 6, "the workload reuses prefixes");
    lags.sort_unstable();
    eprintln!(
        "engine event → mirror in step: median {} ms, max {} ms ({} requests)",
        lags[lags.len() / 2],
        lags[lags.len() - 1],
        lags.len()
    );

    // 2. Paced load through the owner (evictions, many deltas); the share's bytes
    // against the owner's idle gossip just before.
    let idle0 = (cluster(owner).await, Instant::now());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let idle1 = cluster(owner).await;
    let idle_bps = (idle1["gossip_bytes_sent"].as_u64().unwrap_or(0)
        - idle0.0["gossip_bytes_sent"].as_u64().unwrap_or(0)) as f64
        / idle0.1.elapsed().as_secs_f64();
    let c0 = cluster(owner).await;
    let (b0, t0) = (mock.stored_blocks(), Instant::now());
    for i in 0..150u32 {
        send(owner, &prompt(i % 7, 300 + i, 96 + 16 * (i % 4))).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    synced(owner, other, &mock).await;
    let secs = t0.elapsed().as_secs_f64();
    let c1 = cluster(owner).await;
    let d = |k: &str| c1[k].as_u64().unwrap_or(0) - c0[k].as_u64().unwrap_or(0);
    eprintln!(
        "load: {:.0} blocks stored/s for {secs:.1} s; KV share published {} values, {:.0} B/s \
         (first sends); all gossip from the owner {:.0} B/s (idle before: {idle_bps:.0} B/s)",
        (mock.stored_blocks() - b0) as f64 / secs,
        d("kv_values_published"),
        d("kv_bytes_published") as f64 / secs,
        d("gossip_bytes_sent") as f64 / secs,
    );
    assert!(d("kv_values_published") > 0);
    for (p, q) in [(0, 300), (3, 303), (6, 9)] {
        let a = send(other, &prompt(p, q, 112)).await;
        assert_eq!(a.source, "precise");
        assert_eq!(a.router, a.engine, "after the burst: prompt {p}/{q}");
        synced(owner, other, &mock).await;
    }

    // 3. A third node joins: it catches up from the owner's snapshot and deltas (the
    // rendezvous may also hand it the replica; either way one node follows the events
    // and every other mirrors it, exactly).
    let (gc, hc) = (free_udp(), free_tcp());
    procs.push(Some(start_node("c", hc, gc, ga, dir.path(), &config, &url)));
    let http = [ha, hb, hc];
    let joined = Instant::now();
    let owner_i = roles(&http, "after c joined").await;
    eprintln!(
        "c joined: one follower, two mirrors, all precise in {} ms",
        joined.elapsed().as_millis()
    );
    exact_through_mirrors(&http, owner_i, &mock, 700).await;

    // 4. The owner dies: no survivor claims `precise` from its silent stream; one of
    // them follows the events itself, the other mirrors that one, exact again.
    let killed = Instant::now();
    procs[owner_i] = None;
    let alive: Vec<SocketAddr> = (0..3).filter(|i| *i != owner_i).map(|i| http[i]).collect();
    let old = http[owner_i];
    until(
        "a survivor takes the replica over",
        Duration::from_secs(40),
        async || {
            let mut events = 0;
            for n in &alive {
                let s = feed(*n).await;
                if s["source"] == "mesh"
                    && s["owner"] == old_id(old, &http)
                    && killed.elapsed() > Duration::from_millis(3_500)
                {
                    assert_ne!(s["state"], "precise", "precise from a dead owner: {s}");
                }
                events += usize::from(s["source"] == "events" && s["state"] == "precise");
            }
            events == 1
        },
    )
    .await;
    let new_i = roles(&alive, "after the owner died").await;
    eprintln!(
        "owner killed → a survivor follows the events and the other mirrors it, all precise, in {} ms",
        killed.elapsed().as_millis()
    );
    exact_through_mirrors(&alive, new_i, &mock, 800).await;
    drop(procs);
}

/// The node id behind `addr` among `http` (ids a, b, c in start order).
fn old_id(addr: SocketAddr, http: &[SocketAddr]) -> Value {
    let i = http.iter().position(|h| *h == addr).unwrap_or(0);
    json!(["a", "b", "c"][i])
}

/// Waits until exactly one of `nodes` follows the events and every other mirrors it,
/// all `precise`; returns the follower's position.
async fn roles(nodes: &[SocketAddr], what: &str) -> usize {
    let mut owner = 0;
    until(what, Duration::from_secs(40), async || {
        let mut events = Vec::new();
        let mut all = true;
        for (i, n) in nodes.iter().enumerate() {
            let s = feed(*n).await;
            all &= s["state"] == "precise";
            if s["source"] == "events" {
                events.push(i);
            } else {
                all &= s["source"] == "mesh";
            }
        }
        if all && events.len() == 1 {
            owner = events[0];
            true
        } else {
            false
        }
    })
    .await;
    owner
}

/// Requests through every node but the follower: each count equals the engine's.
async fn exact_through_mirrors(nodes: &[SocketAddr], owner_i: usize, mock: &Mock, base: u32) {
    let owner = nodes[owner_i];
    for (j, other) in nodes.iter().enumerate().filter(|(j, _)| *j != owner_i) {
        for i in 0..3u32 {
            let ids = prompt(i % 2, base + 10 * j as u32 + i, 110);
            let a = send(*other, &ids).await;
            assert_eq!(a.source, "precise", "node {j}, request {i}");
            assert_eq!(
                a.router, a.engine,
                "node {j}, request {i}: mirror vs engine"
            );
            for n in nodes.iter().filter(|n| **n != owner) {
                synced(owner, *n, mock).await;
            }
        }
    }
}
