//! The router following an engine's KV events, over real ZMQ and HTTP on loopback:
//! a mock engine (an LRU prefix cache of 16-token blocks) publishes vLLM-framed
//! `BlockStored` / `BlockRemoved` batches through `headroom-kv-events`' publisher
//! (the emulator's), found by the router through `GET /kv_event_sources`.
//!
//! What a user relies on: the router's `x-headroom-cached-tokens` equals the engine's
//! own `usage.prompt_tokens_details.cached_tokens` for every request while the feed
//! is `precise` (shared prefixes, repeats, evictions); dropped events are noticed
//! (by the gap the next batch shows, or by silence when the lost batch was the last)
//! and repaired by replay (`precise` again, counts equal);
//! a publisher that goes away makes the replica `approximate` (the prefix index's
//! estimate is used), and an engine restart (empty cache, sequence from 0) is
//! followed again, exactly, within a bounded time. Every wait is bounded.

mod common;

use std::time::{Duration, Instant};

use common::kv_engine::{Answer, BS, CAPACITY, Mock, prompt, start_mock};
use headroom::policy::PolicyName;
use serde_json::Value;

async fn send(router: &common::TestRouter, ids: &[u32]) -> Answer {
    common::kv_engine::ask(router.url("/v1/completions"), ids).await
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

    // 2. Dropped events. (a) The last batch never arrives live: no later frame
    // shows the gap, so the silence after the request asks the replay endpoint,
    // which fills it. (b) A batch lost between two that arrive. Either way the
    // counts are exact again.
    let replays = feed(&r).await["replays"].as_u64().unwrap_or(0);
    mock.skip_live(1);
    send(&r, &prompt(7, 70, 120)).await;
    synced(&r, &mock).await;
    let s = feed(&r).await;
    assert!(
        s["replays"].as_u64().unwrap_or(0) > replays && s["gaps"] == 0,
        "the silence check replayed the lost batch: {s}"
    );
    let replays = s["replays"].as_u64().unwrap_or(0);
    mock.skip_live(1);
    send(&r, &prompt(8, 80, 120)).await;
    send(&r, &prompt(9, 90, 120)).await;
    synced(&r, &mock).await;
    let s = feed(&r).await;
    // Usually the gap (the next batch comes in milliseconds); on a loaded machine
    // the silence check may come first. Both replay.
    assert!(s["replays"].as_u64().unwrap_or(0) > replays, "{s}");
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
    let m = r.metrics_text().await;
    assert!(
        m.lines().any(|l| l.starts_with("headroom_kv_feed_state{")
            && l.contains("state=\"precise\"")
            && l.ends_with(" 1")),
        "{m}"
    );
    assert!(m.contains("headroom_kv_feed_incidents_total{"), "{m}");
}
