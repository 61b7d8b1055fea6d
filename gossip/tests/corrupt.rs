//! Corrupt frames (bad encoding, bad magic, bad frame version, bad header, oversized) are
//! refused and counted by the receiver, which keeps working. Payloads are opaque here:
//! the router's schema tests cover theirs (`router/src/mesh/schema.rs`).

mod common;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use common::*;
use headroom_gossip::wire::FRAME_VERSION;
use headroom_gossip::{MeshEvent, Value};

fn b64(bytes: &[u8]) -> String {
    STANDARD_NO_PAD.encode(bytes)
}

fn header(version: u16, reserved: u8) -> Vec<u8> {
    let mut h = b"HR".to_vec();
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&[4, 0, reserved, 0]);
    h.extend_from_slice(&1u64.to_le_bytes());
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_values_are_rejected_counted_and_harmless() {
    let dir = certs(&["a", "b"]);
    let nodes = start_region(dir.path(), &["a", "b"], "r1", None).await;
    for (n, peer) in [(&nodes[0], "b"), (&nodes[1], "a")] {
        eventually("a and b meet", || async {
            live_peers(n).await == vec![peer.to_string()]
        })
        .await;
    }
    let mut rx = nodes[1].subscribe();
    let a = &nodes[0];

    a.publish_raw_for_test("bad-encoding", "%%% not base64 %%%")
        .await;
    a.publish_raw_for_test("bad-magic", &b64(b"XXXXXXXXXXXXXXXXXXXXXXXX"))
        .await;
    a.publish_raw_for_test("bad-version", &b64(&header(FRAME_VERSION + 7, 0)))
        .await;
    a.publish_raw_for_test("bad-header", &b64(&header(FRAME_VERSION, 9)))
        .await;
    a.publish_raw_for_test("oversized", &"A".repeat(40_000))
        .await;
    let good = inflight(1, 2);
    a.publish("good", &good).await.unwrap();

    let ev = next_matching(
        &mut rx,
        |e| matches!(e, MeshEvent::Value { key, .. } if key == "good"),
    )
    .await;
    assert!(matches!(ev, MeshEvent::Value { value, .. } if value == good));
    eventually("b counted five rejections", || async {
        nodes[1].stats().rejected_values >= 5
    })
    .await;
    let s = nodes[1].stats();
    // Each reason once (more only if a flapping member's values were re-read).
    for (reason, n) in &s.rejected_by_reason {
        assert!(*n >= 1, "reason {reason} not counted: {s:?}");
    }
    // Nothing corrupt surfaced as a value.
    while let Ok(ev) = rx.try_recv() {
        if let MeshEvent::Value { key, .. } = ev {
            assert_eq!(key, "good");
        }
    }

    // Datagrams go through the same decoder.
    let before = nodes[1].stats().rejected_values;
    assert_eq!(
        a.broadcast_raw_datagram_for_test(&header(FRAME_VERSION, 9)),
        1
    );
    eventually("b rejects the garbage datagram", || async {
        nodes[1].stats().rejected_values > before
    })
    .await;
    let v = inflight(9, 8);
    a.broadcast_datagram(&v).unwrap();
    let ev = next_matching(&mut rx, |e| matches!(e, MeshEvent::Datagram { .. })).await;
    assert!(matches!(ev, MeshEvent::Datagram { node, value, .. } if &*node == "a" && value == v));
    // Too large for one datagram: refused at the sender with a clear error.
    assert!(a.broadcast_datagram(&inflight(1, 200)).is_err());
    // Encoding refuses values over the cap, locally, before anything is sent.
    let big = Value::new(4, 0, vec![7u8; 40_000]);
    assert!(a.publish("big", &big).await.is_err());

    // b is still a working member.
    a.publish("after", &good).await.unwrap();
    next_matching(
        &mut rx,
        |e| matches!(e, MeshEvent::Value { key, .. } if key == "after"),
    )
    .await;
    shutdown_all(nodes).await;
}
