//! Three or more nodes on loopback: membership converges, values spread, a killed node is
//! removed and its values expire.

mod common;

use std::time::Duration;

use common::*;
use headroom_gossip::{Mesh, MeshEvent, Scope, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_converge_and_share_values() {
    let dir = certs(&["a", "b", "c"]);
    let nodes = start_region(dir.path(), &["a", "b", "c"], "r1", None).await;
    let mut rx_b = nodes[1].subscribe();
    let mut rx_c = nodes[2].subscribe();

    for (i, n) in nodes.iter().enumerate() {
        let want: Vec<String> = ["a", "b", "c"]
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, s)| s.to_string())
            .collect();
        eventually(&format!("{} sees the others", n.node_id()), || async {
            live_peers(n).await == want
        })
        .await;
    }

    let v = inflight(7, 4);
    nodes[0].publish("inflight", &v).await.unwrap();
    for rx in [&mut rx_b, &mut rx_c] {
        let ev = next_matching(
            rx,
            |e| matches!(e, MeshEvent::Value { key, .. } if key == "inflight"),
        )
        .await;
        let MeshEvent::Value {
            node, scope, value, ..
        } = ev
        else {
            unreachable!()
        };
        assert_eq!(&*node, "a");
        assert_eq!(scope, Scope::Region);
        assert_eq!(value, v);
    }
    // The publisher's key shows up in everyone's member list.
    eventually("b lists a's key", || async {
        nodes[1]
            .members()
            .await
            .iter()
            .any(|m| &*m.node_id == "a" && m.keys == vec!["inflight".to_string()])
    })
    .await;
    let s = nodes[1].stats();
    assert!(
        s.messages_received > 0 && s.bytes_received > 0 && s.udp_bytes_sent > 0,
        "{s:?}"
    );
    assert_eq!(s.rejected_values, 0, "{s:?}");
    assert_eq!(s.rejected_peers, 0, "{s:?}");
    shutdown_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_node_is_removed_and_its_values_expire() {
    let dir = certs(&["a", "b", "c"]);
    let mut nodes = start_region(dir.path(), &["a", "b", "c"], "r1", None).await;
    for n in &nodes {
        eventually("full membership", || async {
            live_peers(n).await.len() == 2
        })
        .await;
    }
    let mut rx_a = nodes[0].subscribe();
    nodes[2].publish("info", &summary_info()).await.unwrap();
    next_matching(
        &mut rx_a,
        |e| matches!(e, MeshEvent::Value { node, .. } if &**node == "c"),
    )
    .await;

    let c = nodes.pop().unwrap();
    c.shutdown().await;

    next_matching(
        &mut rx_a,
        |e| matches!(e, MeshEvent::MemberLeft { node, scope: Scope::Region } if &**node == "c"),
    )
    .await;
    assert_eq!(live_peers(&nodes[0]).await, vec!["b".to_string()]);
    // After the TTL (3 s here) the dead node's value is gone from every view.
    eventually("c's key expired on a and b", || async {
        let mut gone = true;
        for n in &nodes {
            gone &= !n
                .members()
                .await
                .iter()
                .any(|m| &*m.node_id == "c" && !m.keys.is_empty());
        }
        gone
    })
    .await;
    // The survivors still gossip: a new value still arrives.
    nodes[1].publish("inflight", &inflight(1, 1)).await.unwrap();
    next_matching(
        &mut rx_a,
        |e| matches!(e, MeshEvent::Value { node, .. } if &**node == "b"),
    )
    .await;
    shutdown_all(nodes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_key_is_reported_and_late_subscribers_get_a_replay() {
    let dir = certs(&["a", "b", "c"]);
    let nodes = start_region(dir.path(), &["a", "b", "c"], "r1", None).await;
    let v = inflight(3, 2);
    nodes[0].publish("inflight", &v).await.unwrap();
    eventually("c has a's value", || async {
        nodes[2]
            .members()
            .await
            .iter()
            .any(|m| &*m.node_id == "a" && !m.keys.is_empty())
    })
    .await;
    // A subscriber that arrives late still learns the current state.
    let mut rx = nodes[2].subscribe();
    let ev = next_matching(
        &mut rx,
        |e| matches!(e, MeshEvent::Value { key, .. } if key == "inflight"),
    )
    .await;
    assert!(matches!(ev, MeshEvent::Value { value, .. } if value == v));
    nodes[0].remove("inflight").await;
    next_matching(&mut rx, |e| matches!(e, MeshEvent::ValueRemoved { node, key, .. } if &**node == "a" && key == "inflight")).await;
    // A value published and kept alive outlives the TTL thanks to the refresher; a
    // measurement (a scrape) is never re-stamped, so one not published again expires.
    nodes[1].publish("info", &summary_info()).await.unwrap();
    nodes[1].publish("scrape:7", &scrape(7)).await.unwrap();
    eventually("c has b's scrape", || async {
        nodes[2]
            .members()
            .await
            .iter()
            .any(|m| &*m.node_id == "b" && m.keys.contains(&"scrape:7".to_string()))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        nodes[2]
            .members()
            .await
            .iter()
            .any(|m| &*m.node_id == "b" && m.keys == vec!["info".to_string()]),
        "a refreshed value must survive its TTL, an old scrape must not"
    );
    shutdown_all(nodes).await;
}

fn scrape(replica: u64) -> Value {
    Value::new(SCRAPE, 1, replica.to_le_bytes().to_vec())
}

fn summary_info() -> Value {
    Value::new(INFO, 0, b"r1 127.0.0.1:8080".to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_every_task() {
    let metrics = tokio::runtime::Handle::current().metrics();
    let dir = certs(&["a", "b", "c"]);
    let nodes = start_region(dir.path(), &["a", "b", "c"], "r1", None).await;
    for n in &nodes {
        eventually("full membership", || async {
            live_peers(n).await.len() == 2
        })
        .await;
    }
    let _rx = nodes[0].subscribe();
    nodes[0].broadcast_datagram(&inflight(1, 1)).unwrap();
    assert!(
        metrics.num_alive_tasks() > 10,
        "the mesh runs background tasks"
    );
    shutdown_all(nodes).await;
    // quinn's endpoint drivers wind down once the last handle is gone.
    eventually("no task left on the runtime", || async {
        metrics.num_alive_tasks() == 0
    })
    .await;
}

/// A node sending raw frames (`compress_frames` off, as while a mesh upgrades) and nodes
/// sending compressed ones form one mesh and read each other's values; compressed frames
/// carry the digests in fewer bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_compressed_frames_mix_in_one_mesh() {
    let ids = ["a", "b", "c"];
    let dir = certs(&ids);
    let a = Mesh::start(config(dir.path(), "a", "r1", &[], None))
        .await
        .unwrap();
    let mut raw_cfg = config(dir.path(), "b", "r1", &[a.addr()], None);
    raw_cfg.compress_frames = false;
    let b = Mesh::start(raw_cfg).await.unwrap();
    let c = Mesh::start(config(dir.path(), "c", "r1", &[a.addr()], None))
        .await
        .unwrap();
    let nodes = vec![a, b, c];
    for (i, n) in nodes.iter().enumerate() {
        let want: Vec<String> = ids
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, s)| s.to_string())
            .collect();
        eventually(&format!("{} sees the others", n.node_id()), || async {
            live_peers(n).await == want
        })
        .await;
    }
    let mut rx_a = nodes[0].subscribe();
    let mut rx_b = nodes[1].subscribe();
    let (from_b, from_c) = (inflight(5, 8), inflight(6, 8));
    nodes[1].publish("inflight", &from_b).await.unwrap();
    nodes[2].publish("inflight", &from_c).await.unwrap();
    let ev = next_matching(
        &mut rx_a,
        |e| matches!(e, MeshEvent::Value { node, key, .. } if &**node == "b" && key == "inflight"),
    )
    .await;
    assert!(matches!(ev, MeshEvent::Value { value, .. } if value == from_b));
    let ev = next_matching(
        &mut rx_b,
        |e| matches!(e, MeshEvent::Value { node, key, .. } if &**node == "c" && key == "inflight"),
    )
    .await;
    assert!(matches!(ev, MeshEvent::Value { value, .. } if value == from_c));
    // Per message, c (compressing) sent fewer gossip bytes than b (raw) in the same role.
    let per_msg =
        |s: headroom_gossip::MeshStats| s.bytes_sent as f64 / s.messages_sent.max(1) as f64;
    let (raw, packed) = (per_msg(nodes[1].stats()), per_msg(nodes[2].stats()));
    assert!(
        packed < raw,
        "compressed {packed:.0} B/message vs raw {raw:.0}"
    );
    shutdown_all(nodes).await;
}
