//! Sharing the precise index over the mesh (issue 16, item 4): what this node's feeds
//! publish ([`KvFeeds::share_tick`]) and how a peer's values become a mirror
//! ([`KvFeeds::mesh_value`]). The transport is `mesh/kv.rs`; the protocol is
//! `headroom-kv-events`' `share` (owner) and `mirror` (receiver).
//!
//! Invariants:
//! - Sharing starts once ([`KvFeeds::share_enable`], by the mesh runtime); from then
//!   every local feed's slot is logged in the index, and each tick drains the log under
//!   one write lock together with any due snapshot, so a snapshot `as_of` s holds
//!   exactly the changes of deltas ≤ s.
//! - One outbox per followed replica, created with a new epoch when the feed starts
//!   (or the log overflowed), dropped when it stops (the mesh then removes its keys).
//! - Values for a replica this node follows itself are ignored; a mirror is created
//!   for a replica in the fleet with `kv_events` when a slot is free (128 per node).
//! - A mirror whose source has been silent for 10 × the stale time is dropped and
//!   its slot cleared, so a dead owner's view does not hold a slot forever.

use std::collections::HashMap;

use headroom_kv_events::{
    FeedState, IndexOp, ReplicaId,
    mirror::{Delta, Mirror, Part},
    share::{NetDelta, Outbox, SeqDelta, next_epoch, snapshot_parts},
};
use serde_json::{Value, json};

use super::{KvFeeds, free_slot};
use crate::clock;

/// This node's sharing state: one outbox per followed replica.
pub(super) struct ShareState {
    stale_s: f64,
    /// Per followed replica: its mesh key, its outbox, and the engine seq its
    /// published deltas cover (every batch below it is in them).
    outboxes: HashMap<u32, (u64, Outbox, Option<u64>)>,
}

impl ShareState {
    /// `(epoch, last seq, engine seq covered)` of the stream this node publishes for
    /// replica `id`.
    pub(super) fn stream_of(&self, id: u32) -> Option<(u64, u64, Option<u64>)> {
        self.outboxes.get(&id).map(|(_, o, c)| (o.epoch, o.seq, *c))
    }
}

/// What one followed replica publishes this tick.
#[derive(Debug)]
pub struct ShareOut {
    /// The replica's mesh key.
    pub key: u64,
    pub epoch: u64,
    pub state: FeedState,
    pub block_size: u32,
    pub deltas: Vec<SeqDelta>,
    /// `(as_of, parts, complete)` when a snapshot was due.
    pub snapshot: Option<(u64, Vec<Vec<u64>>, bool)>,
}

/// A peer's value for one replica.
#[derive(Debug)]
pub enum MeshKv {
    Delta(Delta),
    Part(Part),
}

/// `/debug/replicas` `kv_events` of a mirrored replica.
pub(super) fn mirror_debug(m: &Mirror, now_s: f64) -> Value {
    let c = m.counters();
    json!({
        "state": m.state(now_s).as_str(), "source": "mesh", "owner": m.source(),
        "epoch": m.epoch(), "next_seq": m.next_seq(), "block_size": m.block_size(),
        "silent_s": m.silent_for(now_s), "deltas_applied": c.deltas_applied,
        "snapshots_applied": c.snapshots_applied, "gaps": c.gaps, "epochs": c.epochs,
        "source_changes": c.source_changes, "pending_dropped": c.pending_dropped,
    })
}

impl KvFeeds {
    /// Starts sharing this node's feeds; peers silent `stale_s` are not trusted.
    pub fn share_enable(&self, stale_s: f64) {
        let feeds = self.feeds.read();
        let mut share = self.share.lock();
        if share.is_some() {
            return;
        }
        *share = Some(ShareState {
            stale_s,
            outboxes: HashMap::new(),
        });
        let mut ix = self.index.write();
        for f in feeds.values() {
            ix.set_logged(f.slot, true);
        }
    }

    /// This tick's deltas and due snapshots per followed replica, and the keys of
    /// replicas no longer followed (their values are to be removed).
    pub fn share_tick(&self, now_s: f64, heartbeat_s: f64) -> (Vec<ShareOut>, Vec<u64>) {
        let feeds = self.feeds.read();
        let mut guard = self.share.lock();
        let Some(share) = guard.as_mut() else {
            return (Vec::new(), Vec::new());
        };
        let mut ix = self.index.write();
        let log = ix.drain_log();
        let mut ops: HashMap<ReplicaId, Vec<IndexOp>> = HashMap::new();
        for (slot, op) in log.ops {
            ops.entry(slot).or_default().push(op);
        }
        let mut out = Vec::new();
        for (id, f) in feeds.iter() {
            let r = f.key;
            let overflowed = log.overflowed & (1u128 << f.slot.index()) != 0;
            let entry = share
                .outboxes
                .entry(*id)
                .or_insert_with(|| (r, Outbox::new(next_epoch(clock::unix_ms())), None));
            let mut net = NetDelta::of(ops.remove(&f.slot).unwrap_or_default());
            if overflowed {
                // Changes were lost: peers start over from a snapshot of a new epoch.
                entry.1 = Outbox::new(next_epoch(clock::unix_ms()));
                net = NetDelta::default();
            }
            // Read under the index lock: a batch its status counts was applied before.
            let status = f.handle.status();
            let state = status.state;
            entry.2 = status.next_seq;
            let deltas = entry.1.deltas(net, state, now_s, heartbeat_s);
            let snapshot = entry.1.snapshot_due(now_s).then(|| {
                let (keys, evicted) = ix.keys_of(f.slot);
                let (parts, complete) = snapshot_parts(keys);
                entry.1.snapshot_taken(now_s);
                (entry.1.seq, parts, complete && !evicted)
            });
            out.push(ShareOut {
                key: r,
                epoch: entry.1.epoch,
                state,
                block_size: f.block_size,
                deltas,
                snapshot,
            });
        }
        drop(ix);
        let mut stopped = Vec::new();
        share.outboxes.retain(|id, (key, _, _)| {
            let keep = feeds.contains_key(id);
            if !keep {
                stopped.push(*key);
            }
            keep
        });
        (out, stopped)
    }

    /// A peer's value for replica `id` (in the fleet, with `kv_events`).
    pub fn mesh_value(&self, id: u32, node: &str, v: MeshKv) {
        let feeds = self.feeds.read();
        if feeds.contains_key(&id) {
            return;
        }
        let stale_s = match self.share.lock().as_ref() {
            Some(s) => s.stale_s,
            None => return,
        };
        let mut remote = self.remote.write();
        if !remote.contains_key(&id) {
            let Some(slot) = free_slot(&feeds, &remote) else {
                return;
            };
            remote.insert(id, Mirror::new(slot, stale_s));
        }
        drop(feeds);
        let Some(m) = remote.get_mut(&id) else {
            return;
        };
        let now = clock::now_s();
        let mut ix = self.index.write();
        match v {
            MeshKv::Delta(d) => m.delta(&mut ix, node, d, now),
            MeshKv::Part(p) => m.part(&mut ix, node, p, now),
        }
    }

    /// `node` left the mesh: mirrors following it start over.
    pub fn mesh_member_left(&self, node: &str) {
        let mut remote = self.remote.write();
        let mut ix = self.index.write();
        for m in remote.values_mut() {
            m.source_left(&mut ix, node);
        }
    }

    /// Gap timeouts, and mirrors of long-silent sources dropped.
    pub fn mesh_tick(&self) {
        let now = clock::now_s();
        let stale_s = match self.share.lock().as_ref() {
            Some(s) => s.stale_s,
            None => return,
        };
        let mut remote = self.remote.write();
        let mut ix = self.index.write();
        remote.retain(|_, m| {
            m.tick(&mut ix, now);
            let keep = m.silent_for(now) <= 10.0 * stale_s;
            if !keep {
                ix.remove_replica(m.slot());
            }
            keep
        });
    }
}
