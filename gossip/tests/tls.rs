//! Peers without a certificate from the cluster CA cannot join, and are counted.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use headroom_gossip::{Mesh, MeshConfig, TlsIdentity};

/// An identity whose certificate is self-signed (its own trust root).
fn self_signed(id: &str) -> TlsIdentity {
    let ck = rcgen::generate_simple_self_signed(vec![id.to_string()]).unwrap();
    let pem = ck.cert.pem();
    TlsIdentity::from_pem(
        pem.as_bytes(),
        pem.as_bytes(),
        ck.signing_key.serialize_pem().as_bytes(),
        id,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_outside_the_cluster_ca_are_rejected_and_counted() {
    let dir = certs(&["a", "b"]);
    let other_ca = certs(&["y"]);
    let nodes = start_region(dir.path(), &["a", "b"], "r1", None).await;
    eventually("a and b meet", || async {
        live_peers(&nodes[0]).await == vec!["b".to_string()]
    })
    .await;
    let a = nodes[0].addr();

    // x: self-signed; y: signed by another CA. Both dial a.
    let mut cx =
        MeshConfig::new("x", "r1", loopback(), self_signed("x")).with_gossip_interval(INTERVAL);
    cx.seeds = vec![a.to_string()];
    cx.connect_timeout = Duration::from_millis(500);
    cx.dial_timeout = cx.connect_timeout;
    let x = Mesh::start(cx).await.unwrap();
    let y = Mesh::start(config(other_ca.path(), "y", "r1", &[a], None))
        .await
        .unwrap();

    // A node added later with the same CA (ca.key kept) joins; another whose only seed is
    // an intruder refuses the intruder's server certificate every time it dials.
    headroom_gossip::write_dev_certs(dir.path(), &["c", "d"]).unwrap();
    let c = Mesh::start(config(dir.path(), "c", "r1", &[a], None))
        .await
        .unwrap();
    let d = Mesh::start(config(dir.path(), "d", "r1", &[x.addr()], None))
        .await
        .unwrap();

    eventually("a counts the rejected intruders", || async {
        nodes[0].stats().rejected_peers >= 2
    })
    .await;
    eventually("d counts the intruder it dialled", || async {
        d.stats().rejected_peers >= 1
    })
    .await;
    eventually("c joins", || async {
        live_peers(&c).await == vec!["a", "b"]
    })
    .await;
    tokio::time::sleep(INTERVAL * 10).await;
    for n in nodes.iter().chain([&c]) {
        let names: Vec<String> = n
            .members()
            .await
            .iter()
            .map(|m| m.node_id.to_string())
            .collect();
        assert!(
            !names.iter().any(|m| m == "x" || m == "y"),
            "{} lists an intruder: {names:?}",
            n.node_id()
        );
    }
    assert!(live_peers(&x).await.is_empty(), "x must not see anyone");
    assert!(live_peers(&y).await.is_empty(), "y must not see anyone");
    assert!(live_peers(&d).await.is_empty(), "d must not accept x");
    assert_eq!(x.stats().messages_received, 0);
    assert_eq!(y.stats().messages_received, 0);

    x.shutdown().await;
    y.shutdown().await;
    c.shutdown().await;
    d.shutdown().await;
    shutdown_all(nodes).await;
}

#[test]
fn identity_must_match_node_id_and_chain_to_the_ca() {
    let dir = certs(&["a"]);
    let other = certs(&["a"]);
    let err = TlsIdentity::load(dir.path(), "b").unwrap_err();
    assert!(err.to_string().contains("b.pem"), "{err}");
    // a's certificate from another CA does not verify against this CA bundle.
    let ca = std::fs::read(dir.path().join("ca.pem")).unwrap();
    let cert = std::fs::read(other.path().join("a.pem")).unwrap();
    let key = std::fs::read(other.path().join("a.key")).unwrap();
    assert!(TlsIdentity::from_pem(&ca, &cert, &key, "a").is_err());
    // A certificate for a, loaded as node z, is refused.
    let cert = std::fs::read(dir.path().join("a.pem")).unwrap();
    let key = std::fs::read(dir.path().join("a.key")).unwrap();
    assert!(TlsIdentity::from_pem(&ca, &cert, &key, "z").is_err());
    // Re-running keeps existing node files and the CA.
    let before = std::fs::read(dir.path().join("a.pem")).unwrap();
    let r = headroom_gossip::write_dev_certs(dir.path(), &["a", "n2"]).unwrap();
    assert!(!r.created_ca);
    assert_eq!(r.kept, vec!["a"]);
    assert_eq!(r.issued, vec!["n2"]);
    assert_eq!(std::fs::read(dir.path().join("a.pem")).unwrap(), before);
    TlsIdentity::load(dir.path(), "n2").unwrap();
    assert!(headroom_gossip::write_dev_certs(dir.path(), &["Bad_Id"]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_claiming_another_members_address_is_rejected() {
    let dir = certs(&["a", "b", "c"]);
    let nodes = start_region(dir.path(), &["a", "b"], "r1", None).await;
    eventually("a and b meet", || async {
        live_peers(&nodes[1]).await == vec!["a".to_string()]
    })
    .await;
    // c holds a valid certificate, but advertises a's address to hijack a's replies.
    let mut cc = config(dir.path(), "c", "r1", &[nodes[1].addr()], None);
    cc.advertise_addr = Some(nodes[0].addr());
    let c = Mesh::start(cc).await.unwrap();
    eventually("b refuses c's frames", || async {
        nodes[1].stats().rejected_peers >= 1
    })
    .await;
    tokio::time::sleep(INTERVAL * 10).await;
    assert_eq!(
        live_peers(&nodes[1]).await,
        vec!["a".to_string()],
        "b must still see a, and not c"
    );
    c.shutdown().await;
    shutdown_all(nodes).await;
}
