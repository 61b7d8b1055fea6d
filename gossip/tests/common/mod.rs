//! Shared helpers for the loopback mesh tests: certificates in a temp dir, fast configs,
//! polling with a deadline, and a guard that shuts nodes down.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use headroom_gossip::{FaultInjector, KindPolicy, Mesh, MeshConfig, MeshEvent, TlsIdentity, Value};
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
    cfg.dial_timeout = cfg.connect_timeout;
    cfg.kinds
        .set(
            SCRAPE,
            KindPolicy {
                measurement: true,
                crosses_regions: false,
            },
        )
        .set(
            SUMMARY,
            KindPolicy {
                measurement: false,
                crosses_regions: true,
            },
        )
        .set(
            PREDICTOR,
            KindPolicy {
                measurement: false,
                crosses_regions: true,
            },
        );
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

/// Test kinds (the mesh does not read payloads; these tests set their own policies).
pub const INFO: u8 = 1;
pub const INFLIGHT: u8 = 2;
pub const SCRAPE: u8 = 3;
pub const PREDICTOR: u8 = 5;
pub const SUMMARY: u8 = 6;

/// A stand-in for a region summary (cross-region kind), about its size.
pub fn summary(region: &str, replicas: u32) -> Value {
    let mut p = region.as_bytes().to_vec();
    p.extend_from_slice(&replicas.to_le_bytes());
    p.resize(p.len() + 40, 0);
    Value::new(SUMMARY, 0, p)
}

/// A stand-in for an in-flight vector: `seq`, then 48 bytes per replica.
pub fn inflight(seq: u64, replicas: usize) -> Value {
    let mut p = seq.to_le_bytes().to_vec();
    for i in 0..replicas {
        p.extend_from_slice(&(i as u64).to_le_bytes());
        p.extend_from_slice(&[3; 40]);
    }
    Value::new(INFLIGHT, 0, p)
}
