//! Prefix knowledge crosses the mesh, with real processes on loopback: a prompt placed
//! through node A is recorded in node B's prefix index (gossiped `prefix/<replica>`),
//! so a repeat through B goes to the replica that holds it.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{Proc, client, free_tcp, free_udp, mock};
use serde_json::{Value, json};

fn start_node(
    id: &str,
    http: SocketAddr,
    gossip: SocketAddr,
    seed: SocketAddr,
    tls: &std::path::Path,
    replicas: &[String],
) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_headroom"));
    // dynamo-kv is an argmin over (prefill + decode) blocks: with no load anywhere, the
    // replica known to hold the prompt wins outright, the others tie at random.
    cmd.args(["serve", "--listen", &http.to_string(), "--node-id", id])
        .args(["--policy", "dynamo-kv"])
        .args(["--gossip-listen", &gossip.to_string()])
        .args(["--gossip-tls-dir", tls.to_str().unwrap()])
        .args(["--peer", &seed.to_string()])
        .env("HEADROOM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    for r in replicas {
        cmd.args(["--replica", r]);
    }
    Proc(cmd.spawn().expect("spawn headroom serve"))
}

async fn get_json(url: String) -> Option<Value> {
    client().get(url).send().await.ok()?.json().await.ok()
}

async fn eventually<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < limit, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `(routable replicas, prefix index entries)` of a node.
async fn state(http: SocketAddr) -> (usize, u64) {
    let Some(v) = get_json(format!("http://{http}/debug/replicas")).await else {
        return (0, 0);
    };
    let routable = v["replicas"]
        .as_array()
        .map_or(0, |l| l.iter().filter(|r| r["routable"] == true).count());
    (routable, v["prefix_index_entries"].as_u64().unwrap_or(0))
}

async fn place(http: SocketAddr, prompt: &str) -> String {
    let resp = client()
        .post(format!("http://{http}/v1/completions"))
        .timeout(Duration::from_secs(10))
        .json(&json!({"model": "m", "prompt": prompt, "max_tokens": 4}))
        .send()
        .await
        .expect("router answers");
    assert_eq!(resp.status(), 200);
    let replica = resp.headers()[headroom::REPLICA_HEADER]
        .to_str()
        .unwrap()
        .to_string();
    resp.bytes().await.unwrap();
    replica
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_placed_through_one_node_is_found_through_another() {
    let (r1, r2) = (mock("m").await, mock("m").await);
    let replicas = [r1.url(), r2.url()];
    let tls = tempfile::tempdir().unwrap();
    headroom_gossip::write_dev_certs(tls.path(), &["a", "b"]).unwrap();
    let (ga, gb) = (free_udp(), free_udp());
    let (ha, hb) = (free_tcp(), free_tcp());
    let _a = start_node("a", ha, ga, ga, tls.path(), &replicas);
    let _b = start_node("b", hb, gb, ga, tls.path(), &replicas);
    for n in [ha, hb] {
        eventually(
            "both replicas routable",
            Duration::from_secs(30),
            || async { state(n).await.0 == 2 },
        )
        .await;
    }
    // Four distinct long prompts: a node that knew nothing would match each one by a
    // coin toss (1 in 16 for all four).
    for k in 0..4 {
        let prompt = format!("doc {k}: {}", "a long shared document body ".repeat(150));
        let before = state(hb).await.1;
        let home = place(ha, &prompt).await;
        eventually(
            "b hears a's prefix delta",
            Duration::from_secs(20),
            || async { state(hb).await.1 > before },
        )
        .await;
        let via_b = place(hb, &prompt).await;
        assert_eq!(via_b, home, "prompt {k}: b did not send it where a had");
    }
}
