//! Router nodes in a mesh, as real processes on loopback: membership converges, a
//! placement booked on one node is seen by the others, a killed node is removed and
//! its placements expire, and scraping is shared among owners.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    sync::atomic::Ordering::SeqCst,
    time::{Duration, Instant},
};

use common::{Behaviour, Proc, client, free_tcp, free_udp, mock};
use serde_json::{Value, json};

struct NodeProc {
    id: String,
    http: SocketAddr,
    proc: Option<Proc>,
}

fn start_node(
    id: &str,
    http: SocketAddr,
    gossip: SocketAddr,
    seeds: &[SocketAddr],
    tls: &std::path::Path,
    replica: &str,
) -> NodeProc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_headroom"));
    cmd.args([
        "serve",
        "--listen",
        &http.to_string(),
        "--node-id",
        id,
        "--policy",
        "least-request",
    ])
    .args(["--replica", replica])
    .args([
        "--gossip-listen",
        &gossip.to_string(),
        "--gossip-tls-dir",
        tls.to_str().unwrap(),
    ])
    .env("HEADROOM_LOG", "warn")
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    for s in seeds {
        cmd.args(["--peer", &s.to_string()]);
    }
    NodeProc {
        id: id.into(),
        http,
        proc: Some(Proc(cmd.spawn().expect("spawn headroom serve"))),
    }
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn live_members(n: &NodeProc) -> Vec<String> {
    let Some(v) = get_json(format!("http://{}/debug/cluster", n.http)).await else {
        return vec![];
    };
    let mut out: Vec<String> = v["members"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|x| x["live"] == true && x["scope"] == "region")
                .filter_map(|x| x["node_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

async fn peer_requests(n: &NodeProc) -> f64 {
    get_json(format!("http://{}/debug/replicas", n.http))
        .await
        .and_then(|v| v["replicas"][0]["peer_inflight"]["requests"].as_f64())
        .unwrap_or(-1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_placements_and_forget_a_dead_one() {
    let replica = mock("m").await;
    let tls = tempfile::tempdir().unwrap();
    headroom_gossip::write_dev_certs(tls.path(), &["a", "b", "c"]).unwrap();
    let gossip: Vec<SocketAddr> = (0..3).map(|_| free_udp()).collect();
    let mut nodes: Vec<NodeProc> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, id)| {
            start_node(
                id,
                free_tcp(),
                gossip[i],
                &[gossip[0]],
                tls.path(),
                &replica.url(),
            )
        })
        .collect();
    let all = vec!["a".to_string(), "b".into(), "c".into()];
    for n in &nodes {
        eventually(
            &format!("{} sees all members", n.id),
            Duration::from_secs(30),
            || async { live_members(n).await == all },
        )
        .await;
    }
    // Scraping is shared: with 3 nodes and 2 owners, the cluster view names the owners.
    let c = get_json(format!("http://{}/debug/cluster", nodes[1].http))
        .await
        .unwrap();
    assert_eq!(c["scrape_owners"]["k"], 2);

    // A request held open on node a is seen by b and c as peer in-flight work.
    replica.set(Behaviour::Stall);
    let a_url = format!("http://{}/v1/completions", nodes[0].http);
    let held = tokio::spawn(async move {
        let _ = reqwest::Client::new()
            .post(a_url)
            .timeout(Duration::from_secs(20))
            .json(&json!({"model":"m","prompt":"hold","max_tokens":4,"stream":true}))
            .send()
            .await;
    });
    eventually(
        "the replica got the held request",
        Duration::from_secs(10),
        || async { replica.hits.load(SeqCst) >= 1 },
    )
    .await;
    let seen = Instant::now();
    for n in &nodes[1..] {
        eventually(
            &format!("{} sees a's placement", n.id),
            Duration::from_secs(10),
            || async { peer_requests(n).await == 1.0 },
        )
        .await;
    }
    println!("placement visible on b and c after {:?}", seen.elapsed());

    // Kill a: it leaves the membership and its placement expires on b and c.
    nodes[0].proc.take();
    for n in &nodes[1..] {
        eventually(
            &format!("{} forgets a's placement", n.id),
            Duration::from_secs(20),
            || async { peer_requests(n).await == 0.0 },
        )
        .await;
        eventually(
            &format!("{} drops a from the live members", n.id),
            Duration::from_secs(30),
            || async { live_members(n).await == vec!["b".to_string(), "c".into()] },
        )
        .await;
    }
    held.abort();
    replica.set(Behaviour::Normal);
    // The survivors still route.
    let resp = client()
        .post(format!("http://{}/v1/completions", nodes[2].http))
        .json(&json!({"model":"m","prompt":"x","max_tokens":2}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    nodes.clear();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_cluster_certificate_is_not_a_member() {
    let replica = mock("m").await;
    let good = tempfile::tempdir().unwrap();
    let rogue = tempfile::tempdir().unwrap();
    headroom_gossip::write_dev_certs(good.path(), &["a", "b"]).unwrap();
    headroom_gossip::write_dev_certs(rogue.path(), &["mallory"]).unwrap();
    let g: Vec<SocketAddr> = (0..3).map(|_| free_udp()).collect();
    let a = start_node("a", free_tcp(), g[0], &[g[1]], good.path(), &replica.url());
    let b = start_node("b", free_tcp(), g[1], &[g[0]], good.path(), &replica.url());
    let m = start_node(
        "mallory",
        free_tcp(),
        g[2],
        &[g[0], g[1]],
        rogue.path(),
        &replica.url(),
    );
    let both = vec!["a".to_string(), "b".into()];
    eventually("a and b meet", Duration::from_secs(30), || async {
        live_members(&a).await == both
    })
    .await;
    // Give mallory time to try; it never appears.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(live_members(&a).await, both);
    assert_eq!(live_members(&b).await, both);
    assert!(!live_members(&m).await.contains(&"a".to_string()));
    drop((a, b, m));
}
