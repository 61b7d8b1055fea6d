//! Full state stays within a region; summaries and predictor slots cross regions.

mod common;

use std::time::Duration;

use common::*;
use headroom_gossip::{Mesh, MeshError, MeshEvent, Scope, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_state_stays_in_region_and_summaries_cross() {
    let dir = certs(&["a1", "a2", "b1", "b2"]);
    let b1 = Mesh::start(config(dir.path(), "b1", "b", &[], None))
        .await
        .unwrap();
    let b2 = Mesh::start(config(dir.path(), "b2", "b", &[b1.addr()], None))
        .await
        .unwrap();
    let mut ca1 = config(dir.path(), "a1", "a", &[], None);
    ca1.cross_region.remote_seeds = vec![b1.addr().to_string()];
    let a1 = Mesh::start(ca1).await.unwrap();
    let a2 = Mesh::start(config(dir.path(), "a2", "a", &[a1.addr()], None))
        .await
        .unwrap();
    let mut rx_b2 = b2.subscribe();
    let mut rx_a2 = a2.subscribe();

    a1.publish("inflight", &inflight(5, 4)).await.unwrap();
    a1.publish_global("summary/a", &summary("a", 12))
        .await
        .unwrap();
    let slot = Value::new(PREDICTOR, 0, vec![7u8; 120]);
    a1.publish_global("pred/0", &slot).await.unwrap();
    assert!(matches!(
        a1.publish_global("inflight", &inflight(1, 1)).await,
        Err(MeshError::NotGlobal(_))
    ));

    // Same region: the full state arrives.
    next_matching(&mut rx_a2, |e| matches!(e, MeshEvent::Value { node, key, scope: Scope::Region, .. } if &**node == "a1" && key == "inflight")).await;
    // Other region: the summary and the slot arrive, on the global scope.
    let mut got = Vec::new();
    while got.len() < 2 {
        let ev = next_matching(
            &mut rx_b2,
            |e| matches!(e, MeshEvent::Value { node, .. } if &**node == "a1"),
        )
        .await;
        let MeshEvent::Value { scope, key, .. } = ev else {
            unreachable!()
        };
        assert_eq!(
            scope,
            Scope::Global,
            "only global values may come from another region"
        );
        assert_ne!(key, "inflight");
        if !got.contains(&key) {
            got.push(key);
        }
    }
    got.sort();
    assert_eq!(got, vec!["pred/0", "summary/a"]);

    // Membership: b2 lists a1/a2 only as remote (global) members, never as region peers.
    eventually("b2 sees region a on the global cluster", || async {
        b2.members().await.iter().any(|m| {
            &*m.node_id == "a2" && m.scope == Scope::Global && m.region.as_deref() == Some("a")
        })
    })
    .await;
    assert_eq!(live_peers(&b2).await, vec!["b1".to_string()]);
    assert_eq!(live_peers(&a2).await, vec!["a1".to_string()]);

    // Let several more regional rounds pass: still nothing regional crosses.
    tokio::time::sleep(Duration::from_secs(1)).await;
    while let Ok(ev) = rx_b2.try_recv() {
        if let MeshEvent::Value {
            node, scope, key, ..
        } = ev
        {
            assert!(
                !node.starts_with('a') || scope == Scope::Global,
                "regional value {key} from {node} crossed regions"
            );
        }
    }
    for m in [a1, a2, b1, b2] {
        m.shutdown().await;
    }
}
