//! A replica whose engine restarts in place (same address, empty prefix cache): the
//! router sees its counters go back in the next scrape, forgets what it placed there
//! and counts the restart, so repeats are no longer forecast as cache hits.

mod common;

use std::{sync::atomic::Ordering::SeqCst, time::Duration};

use common::*;
use headroom::policy::PolicyName;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_engine_is_forgotten_by_the_prefix_index() {
    let m = mock("m").await;
    m.prefix_queries.store(50_000, SeqCst);
    let r = router(&[m.url()], PolicyName::Slo, |_| {}).await;
    let prompt = "the shared system prompt of a long conversation ".repeat(40);
    let resp = client()
        .post(r.url("/v1/completions"))
        .json(&json!({"model": "m", "prompt": prompt, "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    resp.bytes().await.unwrap();
    assert!(
        !r.node.path.prefix.is_empty(),
        "the prompt's blocks are remembered"
    );
    // Scrapes with the counter still rising change nothing.
    m.prefix_queries.store(60_000, SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !r.node.path.prefix.is_empty(),
        "no restart, nothing forgotten"
    );

    m.prefix_queries.store(12, SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !r.node.path.prefix.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the restart was not noticed within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = r.metrics_text().await;
    let line = text
        .lines()
        .find(|l| l.starts_with("headroom_replica_restarts_total{"))
        .unwrap_or_else(|| panic!("no restart counter in /metrics"));
    assert!(line.ends_with(" 1"), "{line}");
}
