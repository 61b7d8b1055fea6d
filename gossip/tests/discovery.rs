//! Hostname seeds are re-resolved: a node that appears behind the name later is found.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use headroom_gossip::{Mesh, SeedResolver};
use parking_lot::Mutex;

/// A stand-in for DNS whose answer the test changes.
#[derive(Default)]
struct FakeDns(Mutex<Vec<SocketAddr>>);

#[async_trait]
impl SeedResolver for FakeDns {
    async fn resolve(&self, host_port: &str) -> std::io::Result<Vec<SocketAddr>> {
        assert_eq!(host_port, "routers.mesh.test:7946");
        Ok(self.0.lock().clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostname_seeds_are_re_resolved() {
    let dir = certs(&["a", "b", "c"]);
    let dns = Arc::new(FakeDns::default());
    let start = |id: &'static str| {
        let mut cfg = config(dir.path(), id, "r1", &[], None);
        cfg.seeds = vec!["routers.mesh.test:7946".into()];
        cfg.resolver = Some(dns.clone());
        cfg.dns_refresh_interval = Duration::from_millis(200);
        Mesh::start(cfg)
    };
    let a = start("a").await.unwrap();
    dns.0.lock().push(a.addr());
    let b = start("b").await.unwrap();
    eventually("b finds a through the name", || async {
        live_peers(&b).await == vec!["a".to_string()]
    })
    .await;

    // c starts while the name does not list it yet (it resolves to a and b only)...
    dns.0.lock().push(b.addr());
    let mut c_cfg = config(dir.path(), "c", "r1", &[], None);
    c_cfg.dns_refresh_interval = Duration::from_millis(200);
    let c = Mesh::start(c_cfg).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        live_peers(&c).await.is_empty(),
        "c has no seeds and nobody knows it yet"
    );
    // ...then the name starts listing c: a and b re-resolve and reach it.
    dns.0.lock().push(c.addr());
    eventually("c is found once the name lists it", || async {
        live_peers(&c).await == vec!["a", "b"]
    })
    .await;
    for m in [a, b, c] {
        m.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localhost_name_resolves_with_the_system_resolver() {
    let dir = certs(&["a", "b"]);
    let a = Mesh::start(config(dir.path(), "a", "r1", &[], None))
        .await
        .unwrap();
    let mut cfg = config(dir.path(), "b", "r1", &[], None);
    cfg.seeds = vec![format!("localhost:{}", a.addr().port())];
    let b = Mesh::start(cfg).await.unwrap();
    eventually("b joins a via localhost", || async {
        live_peers(&a).await == vec!["b".to_string()]
    })
    .await;
    a.shutdown().await;
    b.shutdown().await;
}
