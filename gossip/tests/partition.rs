//! A partition between two groups of nodes is detected, and after healing, membership and
//! state converge again.

mod common;

use common::*;
use headroom_gossip::{FaultInjector, MeshEvent, Scope};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_heals_and_state_converges() {
    let ids = ["a", "b", "c", "d"];
    let dir = certs(&ids);
    let fault = FaultInjector::new();
    let nodes = start_region(dir.path(), &ids, "r1", Some(&fault)).await;
    for n in &nodes {
        eventually("full membership", || async {
            live_peers(n).await.len() == 3
        })
        .await;
    }
    let mut rx_c = nodes[2].subscribe();

    let (left, right): (Vec<_>, Vec<_>) = (
        nodes[..2].iter().map(|n| n.addr()).collect(),
        nodes[2..].iter().map(|n| n.addr()).collect(),
    );
    fault.partition(&[&left, &right]);
    for (i, n) in nodes.iter().enumerate() {
        let want: Vec<String> = if i < 2 {
            vec!["a", "b"]
        } else {
            vec!["c", "d"]
        }
        .into_iter()
        .filter(|s| *s != n.node_id())
        .map(String::from)
        .collect();
        eventually("each side sees only its own group", || async {
            live_peers(n).await == want
        })
        .await;
    }
    next_matching(
        &mut rx_c,
        |e| matches!(e, MeshEvent::MemberLeft { node, scope: Scope::Region } if &**node == "a"),
    )
    .await;

    // Written during the partition: must not reach the other side...
    let v = inflight(42, 3);
    nodes[0].publish("inflight", &v).await.unwrap();
    eventually("b gets a's value inside the partition", || async {
        nodes[1]
            .members()
            .await
            .iter()
            .any(|m| &*m.node_id == "a" && !m.keys.is_empty())
    })
    .await;
    assert!(
        !nodes[2]
            .members()
            .await
            .iter()
            .any(|m| &*m.node_id == "a" && m.live),
        "c must not see a while partitioned"
    );
    assert!(nodes[0].stats().fault_dropped > 0);

    // ...and must arrive once the partition heals.
    fault.heal();
    let ev = next_matching(
        &mut rx_c,
        |e| matches!(e, MeshEvent::Value { node, key, .. } if &**node == "a" && key == "inflight"),
    )
    .await;
    assert!(matches!(ev, MeshEvent::Value { value, .. } if value == v));
    for n in &nodes {
        eventually("membership converges after healing", || async {
            live_peers(n).await.len() == 3
        })
        .await;
    }
    shutdown_all(nodes).await;
}
