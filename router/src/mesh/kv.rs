//! The precise (KV-event) index over the mesh: the transport side of
//! `fleet/kv_feed/share.rs`.
//!
//! Keys, per replica this node follows (`kv/<replica>/…`, regional):
//! - `d<seq mod KV_WINDOW>`: the last [`schema::KV_WINDOW`] deltas in rotating slots.
//!   chitchat carries only a key's latest value, so a receiver that falls more than
//!   the window behind sees a seq jump (a gap) and waits for a snapshot;
//! - `s<part>`: the latest snapshot's parts, all with one `(epoch, as_of)`; parts past
//!   the current count are removed.
//!
//! Every tick (`mesh.prefix_interval_ms`): publish this node's deltas then any due
//! snapshot (chitchat versions follow publish order), remove the keys of replicas no
//! longer followed, and let mirrors time out their gaps.
//!
//! Bandwidth, per followed replica and receiving peer: deltas cost 8 B per changed
//! block plus ~100 B each (a heartbeat per `mesh.heartbeat_ms` when idle); snapshots
//! 8 B per held block, per [`headroom_kv_events::share::SNAPSHOT_EVERY_S`] (or per
//! window/2 deltas) while the view changes; and every value again per TTL/3 (the
//! mesh refreshes what it publishes). Measured: `router/tests/mesh_kv.rs`.

use std::{
    collections::HashMap,
    sync::{Arc, atomic::Ordering::Relaxed},
    time::Duration,
};

use headroom_gossip::keys;
use headroom_kv_events::{
    FeedState,
    mirror::{Delta, Part},
};

use super::{
    MeshRuntime, publish,
    schema::{self, KvDelta, KvSnapshot, WireValue},
};
use crate::{clock, fleet::kv_feed::MeshKv};

fn state_code(s: FeedState) -> u8 {
    match s {
        FeedState::Precise => 0,
        FeedState::Recovering => 1,
        FeedState::Approximate => 2,
    }
}

fn state_of(code: u8) -> FeedState {
    match code {
        0 => FeedState::Precise,
        1 => FeedState::Recovering,
        _ => FeedState::Approximate,
    }
}

/// A peer's KV value as the mirror takes it (`None`: not a KV value).
pub(super) fn mesh_kv(v: WireValue) -> Option<(u64, MeshKv)> {
    Some(match v {
        WireValue::KvDelta(d) => (
            d.replica,
            MeshKv::Delta(Delta {
                epoch: d.epoch,
                seq: d.seq,
                state: state_of(d.state),
                block_size: d.block_size,
                clear: d.clear,
                stored: d.stored,
                removed: d.removed,
            }),
        ),
        WireValue::KvSnapshot(p) => (
            p.replica,
            MeshKv::Part(Part {
                epoch: p.epoch,
                as_of: p.as_of,
                part: p.part,
                parts: p.parts,
                complete: p.complete,
                block_size: p.block_size,
                hashes: p.hashes,
            }),
        ),
        _ => return None,
    })
}

impl MeshRuntime {
    /// Publishes this node's KV deltas and snapshots; see the module docs.
    pub(super) async fn kv_loop(self: Arc<Self>) {
        let kv = self.local.kv.clone();
        if !kv.active() {
            return;
        }
        kv.share_enable(self.settings.peer_ttl_ms as f64 / 1e3);
        let every = Duration::from_millis(self.settings.prefix_interval_ms.max(10));
        let heartbeat_s = self.settings.heartbeat_ms as f64 / 1e3;
        // Snapshot parts published per replica key (to remove the surplus).
        let mut parts_out: HashMap<u64, u16> = HashMap::new();
        while self.tick(every).await {
            let (outs, stopped) = kv.share_tick(clock::now_s(), heartbeat_s);
            let Some(mesh) = self.mesh() else { return };
            for o in outs {
                for d in o.deltas {
                    let v = WireValue::KvDelta(KvDelta {
                        replica: o.key,
                        epoch: o.epoch,
                        seq: d.seq,
                        state: state_code(o.state),
                        block_size: o.block_size,
                        clear: d.clear,
                        removed: d.removed,
                        stored: d.stored,
                    });
                    let key = keys::kv_delta(o.key, d.seq, schema::KV_WINDOW);
                    match publish(&mesh, &key, &v).await {
                        Ok(n) => self.kv_sent(n),
                        Err(e) => tracing::debug!("kv delta not published: {e}"),
                    }
                }
                let Some((as_of, parts, complete)) = o.snapshot else {
                    continue;
                };
                let n = parts.len() as u16;
                for (i, hashes) in parts.into_iter().enumerate() {
                    let v = WireValue::KvSnapshot(KvSnapshot {
                        replica: o.key,
                        epoch: o.epoch,
                        as_of,
                        part: i as u16,
                        parts: n,
                        complete,
                        block_size: o.block_size,
                        hashes,
                    });
                    match publish(&mesh, &keys::kv_snapshot(o.key, i as u16), &v).await {
                        Ok(n) => self.kv_sent(n),
                        Err(e) => tracing::debug!("kv snapshot part not published: {e}"),
                    }
                }
                let before = parts_out.insert(o.key, n).unwrap_or(0);
                for i in n..before {
                    mesh.remove(&keys::kv_snapshot(o.key, i)).await;
                }
            }
            for key in stopped {
                for s in 0..schema::KV_WINDOW {
                    mesh.remove(&keys::kv_delta(key, s, schema::KV_WINDOW))
                        .await;
                }
                for i in 0..parts_out.remove(&key).unwrap_or(0) {
                    mesh.remove(&keys::kv_snapshot(key, i)).await;
                }
            }
            kv.mesh_tick();
        }
    }

    fn kv_sent(&self, bytes: usize) {
        self.kv_values.fetch_add(1, Relaxed);
        self.kv_bytes.fetch_add(bytes as u64, Relaxed);
    }

    /// Hands a peer's KV value (a `KvDelta` or `KvSnapshot`) to the node's feeds.
    pub(super) fn ingest_kv(&self, node: &str, value: WireValue) {
        let Some((key, v)) = mesh_kv(value) else {
            return;
        };
        let replicas = self.local.fleet.replicas();
        if let Some(r) = replicas.iter().find(|r| r.key == key && r.kv.is_some()) {
            self.local.kv.mesh_value(r.id, node, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_caps_are_the_protocols() {
        use headroom_kv_events::share;
        assert_eq!(schema::KV_DELTA_CAP, share::DELTA_CAP);
        assert_eq!(schema::KV_PART_CAP, share::PART_CAP);
        assert_eq!(usize::from(schema::KV_MAX_PARTS), share::MAX_PARTS);
        assert_eq!(schema::KV_WINDOW, share::WINDOW);
        for s in [
            FeedState::Precise,
            FeedState::Recovering,
            FeedState::Approximate,
        ] {
            assert_eq!(state_of(state_code(s)), s);
        }
    }
}
