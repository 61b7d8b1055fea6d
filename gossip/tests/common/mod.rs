//! Shared helpers for the loopback mesh tests: certificates in a temp dir, fast configs,
//! polling with a deadline, and a guard that shuts nodes down.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use headroom_gossip::{FaultInjector, Mesh, MeshConfig, MeshEvent, TlsIdentity, WireValue, wire};
use tokio::sync::mpsc;

pub const INTERVAL: Duration = Duration::from_millis(100);
/// Bound on every wait in these tests (the machine is shared; convergence takes < 2 s).
pub const DEADLINE: Duration = Duration::from_secs(20);

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

pub fn certs(nodes: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    headroom_gossip::write_dev_certs(dir.path(), nodes).unwrap();
    dir
}

pub fn config(
    dir: &Path,
    id: &str,
    region: &str,
    seeds: &[SocketAddr],
    fault: Option<&FaultInjector>,
) -> MeshConfig {
    let tls = TlsIdentity::load(dir, id).unwrap();
    let mut cfg = MeshConfig::new(id, region, loopback(), tls).with_gossip_interval(INTERVAL);
    cfg.seeds = seeds.iter().map(|a| a.to_string()).collect();
    cfg.value_ttl = Duration::from_secs(3);
    cfg.cross_region.gossip_interval = Duration::from_millis(200);
    cfg.cross_region.failure =
        headroom_gossip::FailureDetection::for_interval(Duration::from_millis(200));
    cfg.fault = fault.cloned();
    cfg.connect_timeout = Duration::from_millis(500);
    cfg
}

/// Starts `ids` in one region, each seeded with the first node.
pub async fn start_region(
    dir: &Path,
    ids: &[&str],
    region: &str,
    fault: Option<&FaultInjector>,
) -> Vec<Mesh> {
    let mut nodes: Vec<Mesh> = Vec::new();
    for id in ids {
        let seeds: Vec<SocketAddr> = nodes.first().map(|n| vec![n.addr()]).unwrap_or_default();
        nodes.push(
            Mesh::start(config(dir, id, region, &seeds, fault))
                .await
                .unwrap(),
        );
    }
    nodes
}

pub async fn shutdown_all(nodes: Vec<Mesh>) {
    for n in nodes {
        n.shutdown().await;
    }
}

/// Polls `f` every 50 ms until it returns true or `DEADLINE` passes.
pub async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < DEADLINE {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out after {DEADLINE:?} waiting for: {what}");
}

/// Live peers (self excluded) in the node's region.
pub async fn live_peers(m: &Mesh) -> Vec<String> {
    let mut v: Vec<String> = m
        .members()
        .await
        .into_iter()
        .filter(|x| x.live && !x.is_self && x.scope == headroom_gossip::Scope::Region)
        .map(|x| x.node_id.to_string())
        .collect();
    v.sort();
    v
}

/// Waits for an event matching `pred`, up to `DEADLINE`.
pub async fn next_matching(
    rx: &mut mpsc::Receiver<MeshEvent>,
    mut pred: impl FnMut(&MeshEvent) -> bool,
) -> MeshEvent {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(ev)) if pred(&ev) => return ev,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("event stream closed"),
            Err(_) => panic!("timed out waiting for an event"),
        }
    }
}

pub fn summary(region: &str, replicas: u32) -> WireValue {
    WireValue::Summary(wire::RegionSummary {
        region: region.into(),
        routers: 1,
        replicas,
        healthy_replicas: replicas,
        free_kv_fraction: 0.5,
        in_flight: 3.0,
        at_ms: 1,
    })
}

pub fn inflight(seq: u64, replicas: usize) -> WireValue {
    WireValue::Inflight(wire::InflightVector {
        seq,
        at_ms: seq,
        loads: (0..replicas)
            .map(|i| wire::ReplicaLoad {
                replica: i as u64,
                requests: 3,
                queued_prefill_tokens: 1000,
                decoding_requests: 2,
                decode_context_tokens: 4000,
                prefill_inflow_tps: 1500.0,
                queued_requests: 0,
                queued_attention_pairs: 0.0,
                decode_remaining_tokens: 0,
                min_tpot_slo_ms: 0.0,
            })
            .collect(),
    })
}
