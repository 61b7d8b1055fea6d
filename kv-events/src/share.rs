//! The owner's side of sharing a followed replica's blocks with other router nodes:
//! the index's change log ([`crate::index::IndexOp`]) turned into numbered deltas and
//! periodic snapshots. The transport (the router's mesh) is not here; [`crate::mirror`]
//! is the receiving side.
//!
//! Invariants:
//! - Per replica one stream: `epoch` (chosen when the owner starts sharing it,
//!   strictly increasing within a process and across restarts of it: wall-clock ms)
//!   and `seq` 1, 2, 3, … without holes. Applying every delta of an epoch in order,
//!   starting from a snapshot `as_of` s with the deltas s+1, …, gives the owner's view.
//! - A delta is the net effect of the ops it covers: after an optional clear, a key is
//!   in `stored` or `removed` (the last op on it wins), never both, so applying
//!   clear → removed → stored equals applying the ops in order.
//! - At most [`DELTA_CAP`] keys per delta (larger intervals become several deltas),
//!   [`PART_CAP`] per snapshot part, [`MAX_PARTS`] parts (a replica holding more is
//!   shared as a subset, `complete = false`).
//! - A snapshot is due when none was taken, or the view changed since the last one and
//!   [`SNAPSHOT_EVERY_S`] passed or [`WINDOW`]/2 deltas went out: receivers keep the
//!   last `WINDOW` deltas reachable, so a snapshot plus the deltas after it always is.
//! - Cost per tick per replica: O(ops) to net, one `keys_of` scan of the index
//!   (O(index)) only when a snapshot is due. Bytes on the wire: 8 per changed key per
//!   delta + ~80 of header, and 8 per held block per snapshot.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::feed::FeedState;
use crate::index::IndexOp;

/// Keys (stored + removed) in one delta: 24 KiB, under the mesh's 32 KiB values.
pub const DELTA_CAP: usize = 3072;
/// Hashes in one snapshot part.
pub const PART_CAP: usize = 3072;
/// Parts of one snapshot: at most `PART_CAP × MAX_PARTS` = 196,608 blocks shared.
pub const MAX_PARTS: usize = 64;
/// Deltas a receiver can reach (the owner's rotating delta slots).
pub const WINDOW: u64 = 64;
/// A changed view is snapshotted at least this often.
pub const SNAPSHOT_EVERY_S: f64 = 5.0;

/// The net change of one interval (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetDelta {
    pub clear: bool,
    pub stored: Vec<u64>,
    pub removed: Vec<u64>,
}

impl NetDelta {
    /// The net effect of `ops`, in the order they happened.
    pub fn of(ops: impl IntoIterator<Item = IndexOp>) -> NetDelta {
        let mut clear = false;
        let mut last: HashMap<u64, bool> = HashMap::new();
        for op in ops {
            match op {
                IndexOp::Cleared => {
                    clear = true;
                    last.clear();
                }
                IndexOp::Stored(k) => {
                    last.insert(k, true);
                }
                IndexOp::Removed(k) => {
                    last.insert(k, false);
                }
            }
        }
        let (mut stored, mut removed) = (Vec::new(), Vec::new());
        for (k, held) in last {
            if held {
                stored.push(k);
            } else if !clear {
                // After a clear nothing is held: a removal changes nothing.
                removed.push(k);
            }
        }
        stored.sort_unstable();
        removed.sort_unstable();
        NetDelta {
            clear,
            stored,
            removed,
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.clear && self.stored.is_empty() && self.removed.is_empty()
    }
}

/// One numbered delta, ready for the transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqDelta {
    pub seq: u64,
    pub clear: bool,
    pub stored: Vec<u64>,
    pub removed: Vec<u64>,
}

/// Snapshot parts of `keys` (at most [`MAX_PARTS`]; `.1` false when truncated).
pub fn snapshot_parts(mut keys: Vec<u64>) -> (Vec<Vec<u64>>, bool) {
    let complete = keys.len() <= PART_CAP * MAX_PARTS;
    keys.truncate(PART_CAP * MAX_PARTS);
    keys.sort_unstable();
    let mut parts: Vec<Vec<u64>> = keys.chunks(PART_CAP).map(<[u64]>::to_vec).collect();
    if parts.is_empty() {
        parts.push(Vec::new());
    }
    (parts, complete)
}

static LAST_EPOCH: AtomicU64 = AtomicU64::new(0);

/// A new epoch: wall-clock ms, strictly above every epoch this process chose.
pub fn next_epoch(unix_ms: u64) -> u64 {
    let mut cur = LAST_EPOCH.load(Ordering::Relaxed);
    loop {
        let want = unix_ms.max(cur + 1);
        match LAST_EPOCH.compare_exchange(cur, want, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return want,
            Err(c) => cur = c,
        }
    }
}

/// The owner's stream state for one replica (see the module docs).
#[derive(Clone, Debug)]
pub struct Outbox {
    pub epoch: u64,
    /// The last seq handed out (0: none yet).
    pub seq: u64,
    snap_seq: Option<u64>,
    snap_at: f64,
    changed: bool,
    last_sent_at: f64,
    last_state: Option<FeedState>,
}

impl Outbox {
    pub fn new(epoch: u64) -> Self {
        Outbox {
            epoch,
            seq: 0,
            snap_seq: None,
            snap_at: f64::NEG_INFINITY,
            changed: false,
            last_sent_at: f64::NEG_INFINITY,
            last_state: None,
        }
    }

    /// The deltas for one interval's `net` change: none when nothing changed, the
    /// state is the same and a delta went out within `heartbeat_s`; else at least one
    /// (an empty one is the heartbeat receivers judge staleness by).
    pub fn deltas(
        &mut self,
        net: NetDelta,
        state: FeedState,
        now_s: f64,
        heartbeat_s: f64,
    ) -> Vec<SeqDelta> {
        if net.is_empty()
            && self.last_state == Some(state)
            && now_s - self.last_sent_at < heartbeat_s
        {
            return Vec::new();
        }
        self.last_state = Some(state);
        self.last_sent_at = now_s;
        self.changed |= !net.is_empty();
        let mut out = Vec::new();
        let mut clear = net.clear;
        let mut removed = net.removed.as_slice();
        let mut stored = net.stored.as_slice();
        loop {
            let r = removed.len().min(DELTA_CAP);
            let s = stored.len().min(DELTA_CAP - r);
            self.seq += 1;
            out.push(SeqDelta {
                seq: self.seq,
                clear,
                removed: removed[..r].to_vec(),
                stored: stored[..s].to_vec(),
            });
            clear = false;
            removed = &removed[r..];
            stored = &stored[s..];
            if removed.is_empty() && stored.is_empty() {
                return out;
            }
        }
    }

    /// Whether a snapshot should be taken now (after this tick's deltas).
    pub fn snapshot_due(&self, now_s: f64) -> bool {
        match self.snap_seq {
            None => true,
            Some(s) => {
                self.changed
                    && (now_s - self.snap_at >= SNAPSHOT_EVERY_S || self.seq - s >= WINDOW / 2)
            }
        }
    }

    /// A snapshot as of [`Self::seq`] was taken.
    pub fn snapshot_taken(&mut self, now_s: f64) {
        self.snap_seq = Some(self.seq);
        self.snap_at = now_s;
        self.changed = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_keeps_the_last_op_per_key_and_what_follows_a_clear() {
        use IndexOp::*;
        let n = NetDelta::of([Stored(1), Removed(1), Stored(2), Removed(3)]);
        assert_eq!((n.clear, n.stored, n.removed), (false, vec![2], vec![1, 3]));
        let n = NetDelta::of([Stored(1), Cleared, Stored(4), Removed(5)]);
        assert_eq!((n.clear, n.stored, n.removed), (true, vec![4], vec![]));
        assert!(NetDelta::of([]).is_empty());
    }

    #[test]
    fn deltas_split_at_the_cap_and_heartbeat_when_idle() {
        let mut o = Outbox::new(7);
        let big = NetDelta {
            clear: true,
            stored: (0..DELTA_CAP as u64 + 10).collect(),
            removed: vec![u64::MAX],
        };
        let d = o.deltas(big, FeedState::Precise, 0.0, 1.0);
        assert_eq!(d.len(), 2);
        assert_eq!((d[0].seq, d[1].seq), (1, 2));
        assert!(d[0].clear && !d[1].clear);
        assert_eq!(d[0].stored.len() + d[0].removed.len(), DELTA_CAP);
        assert_eq!(d[1].stored.len(), 11);
        assert!(
            o.deltas(NetDelta::default(), FeedState::Precise, 0.5, 1.0)
                .is_empty()
        );
        let hb = o.deltas(NetDelta::default(), FeedState::Precise, 1.0, 1.0);
        assert_eq!(hb.len(), 1, "heartbeat");
        let st = o.deltas(NetDelta::default(), FeedState::Recovering, 1.1, 1.0);
        assert_eq!(st[0].seq, 4, "a state change goes out at once");
    }

    #[test]
    fn snapshots_come_first_then_when_changed_and_due() {
        let mut o = Outbox::new(1);
        assert!(o.snapshot_due(0.0));
        o.snapshot_taken(0.0);
        assert!(!o.snapshot_due(100.0), "nothing changed");
        for i in 0..WINDOW / 2 {
            let n = NetDelta {
                stored: vec![i],
                ..Default::default()
            };
            o.deltas(n, FeedState::Precise, 0.1, 1.0);
        }
        assert!(o.snapshot_due(0.2), "half the window went out");
        o.snapshot_taken(0.2);
        o.deltas(
            NetDelta {
                stored: vec![1],
                ..Default::default()
            },
            FeedState::Precise,
            0.3,
            1.0,
        );
        assert!(!o.snapshot_due(1.0));
        assert!(o.snapshot_due(0.2 + SNAPSHOT_EVERY_S));
    }

    #[test]
    fn parts_are_bounded_and_say_when_truncated() {
        let (p, c) = snapshot_parts(vec![]);
        assert_eq!((p.len(), c), (1, true));
        let (p, c) = snapshot_parts((0..PART_CAP as u64 + 1).collect());
        assert_eq!((p.len(), p[1].len(), c), (2, 1, true));
        let (p, c) = snapshot_parts((0..(PART_CAP * MAX_PARTS) as u64 + 1).collect());
        assert_eq!((p.len(), c), (MAX_PARTS, false));
    }

    #[test]
    fn epochs_only_increase() {
        let a = next_epoch(1_000);
        let b = next_epoch(1_000);
        let c = next_epoch(5);
        assert!(a < b && b < c);
    }
}
