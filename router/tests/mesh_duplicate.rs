//! The mesh refuses a second live node with an id already in use (issue 15): the
//! newcomer, holding a valid certificate for that id, fails to start with an error
//! naming the id, and the node already running logs it and counts it.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    io::Read,
    net::SocketAddr,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{Proc, client, free_tcp, free_udp, mock};

fn node(
    id: &str,
    http: SocketAddr,
    gossip: SocketAddr,
    seed: SocketAddr,
    tls: &std::path::Path,
    replica: &str,
) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(["serve", "--listen", &http.to_string(), "--node-id", id])
        .args(["--policy", "least-request", "--replica", replica])
        .args(["--gossip-listen", &gossip.to_string()])
        .args(["--gossip-tls-dir", tls.to_str().unwrap()])
        .args(["--peer", &seed.to_string()])
        .env("HEADROOM_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn headroom serve");
    Proc(child)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_live_node_with_the_same_id_is_refused_loudly() {
    let replica = mock("m").await;
    let tls = tempfile::tempdir().unwrap();
    headroom_gossip::write_dev_certs(tls.path(), &["a"]).unwrap();
    let (http_a, gossip_a) = (free_tcp(), free_udp());
    let _a = node("a", http_a, gossip_a, gossip_a, tls.path(), &replica.url());
    let c = client();
    let t0 = Instant::now();
    loop {
        if let Ok(r) = c.get(format!("http://{http_a}/debug/cluster")).send().await
            && r.status() == 200
        {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "first node never came up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Same id, same (valid) certificate, another address, seeded with the first node.
    let mut b = node(
        "a",
        free_tcp(),
        free_udp(),
        gossip_a,
        tls.path(),
        &replica.url(),
    );
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = b.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the duplicate node kept running"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut err = String::new();
    b.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!status.success(), "the duplicate exited cleanly: {err}");
    assert!(
        err.contains("node id `a` is already live in the mesh"),
        "no clear error: {err}"
    );

    // The running node noticed and counted it.
    let t0 = Instant::now();
    loop {
        let text = c
            .get(format!("http://{http_a}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if text.contains("headroom_mesh_duplicate_node_id_total 1") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the running node did not count the duplicate"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And it still serves.
    let r = c
        .post(format!("http://{http_a}/v1/completions"))
        .json(&serde_json::json!({"model": "m", "prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
