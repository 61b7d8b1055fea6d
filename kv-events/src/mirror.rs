//! The receiving side of [`crate::share`]: a router node that does not follow a
//! replica itself mirrors the owner's view of it into its own [`BlockIndex`] slot.
//! Pure and synchronous; the router's mesh feeds it values and the time.
//!
//! Invariants:
//! - One source at a time: values from the node it follows; another node's are
//!   ignored until the source is silent for `stale_s` (or leaves), then the mirror
//!   starts over from the new source. Epochs only move forward: an older epoch's
//!   values are ignored, a newer one clears the slot and starts over.
//! - The slot changes only by applying, in order, a complete snapshot `as_of` s and
//!   then the deltas s+1, s+2, …; deltas that arrive early wait (at most
//!   [`PENDING_MAX`], oldest dropped). A missing delta not filled within
//!   [`GAP_WAIT_S`] clears the slot until a snapshot covers the gap.
//! - `precise` only while in step (synced, no gap, heard within `stale_s`) with an
//!   owner that says `precise` and a snapshot that was complete; `recovering` when
//!   the owner says so or the snapshot was truncated (the slot is then a subset);
//!   `approximate` otherwise (the prefix index's estimate is used).

use std::collections::BTreeMap;

use crate::feed::FeedState;
use crate::index::{BlockIndex, ReplicaId};

/// Early deltas held while waiting for a missing one or a snapshot.
pub const PENDING_MAX: usize = 2 * crate::share::WINDOW as usize;
/// A gap not filled this long needs a snapshot.
pub const GAP_WAIT_S: f64 = 1.0;

/// One delta as the owner published it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delta {
    pub epoch: u64,
    pub seq: u64,
    pub state: FeedState,
    pub block_size: u32,
    pub clear: bool,
    pub stored: Vec<u64>,
    pub removed: Vec<u64>,
}

/// One part of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub epoch: u64,
    pub as_of: u64,
    pub part: u16,
    pub parts: u16,
    pub complete: bool,
    pub block_size: u32,
    pub hashes: Vec<u64>,
}

/// Counters since creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MirrorCounters {
    pub deltas_applied: u64,
    pub snapshots_applied: u64,
    pub gaps: u64,
    pub epochs: u64,
    pub source_changes: u64,
    pub pending_dropped: u64,
}

struct Assembly {
    as_of: u64,
    complete: bool,
    parts: Vec<Option<Vec<u64>>>,
}

/// See the module docs.
pub struct Mirror {
    slot: ReplicaId,
    stale_s: f64,
    source: Option<String>,
    epoch: u64,
    block_size: u32,
    next: Option<u64>,
    gap_since: Option<f64>,
    pending: BTreeMap<u64, Delta>,
    assembly: Option<Assembly>,
    owner_state: FeedState,
    latest_seq: u64,
    subset: bool,
    last_heard: f64,
    counters: MirrorCounters,
}

impl Mirror {
    /// A mirror writing into `slot`; a source silent for `stale_s` is not trusted.
    pub fn new(slot: ReplicaId, stale_s: f64) -> Self {
        Mirror {
            slot,
            stale_s,
            source: None,
            epoch: 0,
            block_size: 0,
            next: None,
            gap_since: None,
            pending: BTreeMap::new(),
            assembly: None,
            owner_state: FeedState::Approximate,
            latest_seq: 0,
            subset: false,
            last_heard: f64::NEG_INFINITY,
            counters: MirrorCounters::default(),
        }
    }

    pub fn slot(&self) -> ReplicaId {
        self.slot
    }

    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The owner's block size (0 before the first value).
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The next delta to apply (`None`: waiting for a snapshot).
    pub fn next_seq(&self) -> Option<u64> {
        self.next
    }

    pub fn counters(&self) -> MirrorCounters {
        self.counters
    }

    /// Seconds since the source was last heard.
    pub fn silent_for(&self, now_s: f64) -> f64 {
        now_s - self.last_heard
    }

    pub fn state(&self, now_s: f64) -> FeedState {
        if self.next.is_none() || self.gap_since.is_some() || self.silent_for(now_s) > self.stale_s
        {
            return FeedState::Approximate;
        }
        match self.owner_state {
            FeedState::Precise if self.subset => FeedState::Recovering,
            s => s,
        }
    }

    /// Forgets everything and clears the slot.
    fn reset(&mut self, ix: &mut BlockIndex) {
        ix.remove_replica(self.slot);
        self.next = None;
        self.gap_since = None;
        self.pending.clear();
        self.assembly = None;
        self.latest_seq = 0;
        self.subset = false;
        self.owner_state = FeedState::Approximate;
    }

    /// Whether a value from `node` in `epoch` is to be used (switching source or
    /// epoch on the way).
    fn accept(&mut self, ix: &mut BlockIndex, node: &str, epoch: u64, now_s: f64) -> bool {
        if self.source.as_deref() != Some(node) {
            if self.source.is_some() && self.silent_for(now_s) <= self.stale_s {
                return false;
            }
            self.reset(ix);
            self.counters.source_changes += 1;
            self.source = Some(node.to_string());
            self.epoch = epoch;
        }
        if epoch < self.epoch {
            return false;
        }
        if epoch > self.epoch {
            self.reset(ix);
            self.counters.epochs += 1;
            self.epoch = epoch;
        }
        self.last_heard = now_s;
        true
    }

    /// The source `node` left the mesh.
    pub fn source_left(&mut self, ix: &mut BlockIndex, node: &str) {
        if self.source.as_deref() == Some(node) {
            self.reset(ix);
            self.source = None;
            self.last_heard = f64::NEG_INFINITY;
        }
    }

    /// A delta from `node`.
    pub fn delta(&mut self, ix: &mut BlockIndex, node: &str, d: Delta, now_s: f64) {
        if !self.accept(ix, node, d.epoch, now_s) {
            return;
        }
        self.block_size = d.block_size;
        if d.seq >= self.latest_seq {
            self.latest_seq = d.seq;
            self.owner_state = d.state;
        }
        match self.next {
            Some(n) if d.seq < n => {}
            Some(n) if d.seq == n => {
                self.apply(ix, &d);
                self.drain(ix, now_s);
            }
            _ => {
                self.pending.insert(d.seq, d);
                if self.pending.len() > PENDING_MAX {
                    self.pending.pop_first();
                    self.counters.pending_dropped += 1;
                }
                if self.next.is_some() {
                    self.gap_since.get_or_insert(now_s);
                }
            }
        }
    }

    /// A snapshot part from `node`.
    pub fn part(&mut self, ix: &mut BlockIndex, node: &str, p: Part, now_s: f64) {
        if p.parts == 0 || p.part >= p.parts || !self.accept(ix, node, p.epoch, now_s) {
            return;
        }
        self.block_size = p.block_size;
        // In step already, or the snapshot is older than what was applied.
        let useful = match self.next {
            None => true,
            Some(n) => self.gap_since.is_some() && p.as_of + 1 >= n,
        };
        if !useful {
            return;
        }
        let fresh = self
            .assembly
            .as_ref()
            .is_none_or(|a| a.as_of != p.as_of || a.parts.len() != usize::from(p.parts));
        if fresh {
            if self.assembly.as_ref().is_some_and(|a| a.as_of > p.as_of) {
                return;
            }
            self.assembly = Some(Assembly {
                as_of: p.as_of,
                complete: true,
                parts: vec![None; usize::from(p.parts)],
            });
        }
        let Some(a) = self.assembly.as_mut() else {
            return;
        };
        a.complete &= p.complete;
        a.parts[usize::from(p.part)] = Some(p.hashes);
        if a.parts.iter().any(Option::is_none) {
            return;
        }
        let Some(a) = self.assembly.take() else {
            return;
        };
        ix.remove_replica(self.slot);
        for part in a.parts.into_iter().flatten() {
            for k in part {
                ix.insert(k, self.slot);
            }
        }
        self.subset = !a.complete;
        self.next = Some(a.as_of + 1);
        self.gap_since = None;
        self.counters.snapshots_applied += 1;
        self.drain(ix, now_s);
    }

    /// Gives up on a gap older than [`GAP_WAIT_S`]: the slot is cleared until a
    /// snapshot covers it.
    pub fn tick(&mut self, ix: &mut BlockIndex, now_s: f64) {
        if self.gap_since.is_some_and(|t| now_s - t >= GAP_WAIT_S) {
            self.counters.gaps += 1;
            ix.remove_replica(self.slot);
            self.next = None;
            self.gap_since = None;
            self.subset = false;
        }
    }

    fn apply(&mut self, ix: &mut BlockIndex, d: &Delta) {
        if d.clear {
            ix.remove_replica(self.slot);
            self.subset = false;
        }
        for &k in &d.removed {
            ix.remove(k, self.slot);
        }
        for &k in &d.stored {
            ix.insert(k, self.slot);
        }
        self.next = Some(d.seq + 1);
        self.counters.deltas_applied += 1;
    }

    fn drain(&mut self, ix: &mut BlockIndex, now_s: f64) {
        let Some(mut n) = self.next else { return };
        while let Some((&s, _)) = self.pending.first_key_value() {
            if s > n {
                break;
            }
            let Some((_, d)) = self.pending.pop_first() else {
                break;
            };
            if s == n {
                self.apply(ix, &d);
                n += 1;
            }
        }
        self.gap_since = if self.pending.is_empty() {
            None
        } else {
            Some(self.gap_since.unwrap_or(now_s))
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::{NetDelta, Outbox, snapshot_parts};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn r(i: usize) -> ReplicaId {
        ReplicaId::new(i).expect("id")
    }

    /// The owner: a truth set, an outbox, and everything it published.
    struct Owner {
        truth: BTreeSet<u64>,
        outbox: Outbox,
        deltas: Vec<Delta>,
        snapshots: Vec<Vec<Part>>,
        /// The truth after each seq (index 0: before any).
        at_seq: Vec<BTreeSet<u64>>,
    }

    impl Owner {
        fn new(epoch: u64) -> Self {
            Owner {
                truth: BTreeSet::new(),
                outbox: Outbox::new(epoch),
                deltas: Vec::new(),
                snapshots: Vec::new(),
                at_seq: vec![BTreeSet::new()],
            }
        }

        fn step(&mut self, ops: Vec<crate::index::IndexOp>, now: f64) {
            for op in &ops {
                match op {
                    crate::index::IndexOp::Stored(k) => {
                        self.truth.insert(*k);
                    }
                    crate::index::IndexOp::Removed(k) => {
                        self.truth.remove(k);
                    }
                    crate::index::IndexOp::Cleared => self.truth.clear(),
                }
            }
            let net = NetDelta::of(ops);
            for d in self.outbox.deltas(net, FeedState::Precise, now, 1.0) {
                self.deltas.push(Delta {
                    epoch: self.outbox.epoch,
                    seq: d.seq,
                    state: FeedState::Precise,
                    block_size: 16,
                    clear: d.clear,
                    stored: d.stored,
                    removed: d.removed,
                });
            }
            while self.at_seq.len() <= self.outbox.seq as usize {
                self.at_seq.push(self.truth.clone());
            }
            if self.outbox.snapshot_due(now) {
                let (parts, complete) = snapshot_parts(self.truth.iter().copied().collect());
                let n = parts.len() as u16;
                self.snapshots.push(
                    parts
                        .into_iter()
                        .enumerate()
                        .map(|(i, hashes)| Part {
                            epoch: self.outbox.epoch,
                            as_of: self.outbox.seq,
                            part: i as u16,
                            parts: n,
                            complete,
                            block_size: 16,
                            hashes,
                        })
                        .collect(),
                );
                self.outbox.snapshot_taken(now);
            }
        }
    }

    fn held(ix: &BlockIndex, slot: ReplicaId, keys: impl Iterator<Item = u64>) -> BTreeSet<u64> {
        keys.filter(|k| ix.holders(*k) & (1u128 << slot.index()) != 0)
            .collect()
    }

    #[test]
    fn a_late_joiner_catches_up_from_the_snapshot_and_the_deltas_after_it() {
        use crate::index::IndexOp::*;
        let mut o = Owner::new(5);
        o.step(vec![Stored(1), Stored(2)], 0.0);
        o.step(vec![Stored(3), Removed(1)], 0.1);
        let mut ix = BlockIndex::new(100);
        let mut m = Mirror::new(r(2), 3.0);
        // Joins late: the delta slots still hold seq 1 and 2, the snapshot is as of 1.
        m.delta(&mut ix, "a", o.deltas[1].clone(), 0.2);
        assert_eq!(m.state(0.2), FeedState::Approximate, "no snapshot yet");
        for p in o.snapshots[0].clone() {
            m.part(&mut ix, "a", p, 0.2);
        }
        assert_eq!(m.state(0.2), FeedState::Precise);
        assert_eq!(held(&ix, r(2), 0..10), o.truth);
        // Another node's values are ignored while the source is live.
        m.delta(
            &mut ix,
            "b",
            Delta {
                seq: 99,
                ..o.deltas[1].clone()
            },
            0.3,
        );
        assert_eq!(m.source(), Some("a"));
        assert_eq!(m.state(4.0), FeedState::Approximate, "silent source");
    }

    #[test]
    fn a_gap_clears_the_slot_until_a_snapshot_covers_it() {
        use crate::index::IndexOp::*;
        let mut o = Owner::new(5);
        o.step(vec![Stored(1)], 0.0);
        o.step(vec![Stored(2)], 0.1);
        o.step(vec![Removed(1)], 0.2);
        let mut ix = BlockIndex::new(100);
        let mut m = Mirror::new(r(0), 3.0);
        for p in o.snapshots[0].clone() {
            m.part(&mut ix, "a", p, 0.0);
        }
        m.delta(&mut ix, "a", o.deltas[0].clone(), 0.0);
        m.delta(&mut ix, "a", o.deltas[2].clone(), 0.3); // seq 2 lost
        assert_eq!(m.state(0.3), FeedState::Approximate);
        m.tick(&mut ix, 1.5);
        assert!(ix.is_empty(), "an unfillable gap clears the slot");
        o.outbox.snapshot_taken(-100.0); // force the next one
        o.step(vec![Stored(9)], 10.0);
        let snap = o.snapshots.last().expect("snapshot").clone();
        for p in snap {
            m.part(&mut ix, "a", p, 10.0);
        }
        m.delta(&mut ix, "a", o.deltas.last().expect("delta").clone(), 10.0);
        assert_eq!(m.state(10.0), FeedState::Precise);
        assert_eq!(held(&ix, r(0), 0..10), o.truth);
    }

    #[test]
    fn a_new_epoch_starts_over_and_an_old_one_is_ignored() {
        use crate::index::IndexOp::*;
        let mut old = Owner::new(5);
        old.step(vec![Stored(1)], 0.0);
        let mut new = Owner::new(6);
        new.step(vec![Stored(2)], 0.0);
        let mut ix = BlockIndex::new(100);
        let mut m = Mirror::new(r(0), 3.0);
        for p in old.snapshots[0].clone() {
            m.part(&mut ix, "a", p, 0.0);
        }
        for p in new.snapshots[0].clone() {
            m.part(&mut ix, "a", p, 0.1);
        }
        for p in old.snapshots[0].clone() {
            m.part(&mut ix, "a", p, 0.2);
        }
        assert_eq!(m.epoch(), 6);
        assert_eq!(held(&ix, r(0), 0..10), new.truth);
        m.source_left(&mut ix, "a");
        assert!(ix.is_empty());
        assert_eq!(m.state(0.3), FeedState::Approximate);
    }

    fn op() -> impl Strategy<Value = crate::index::IndexOp> {
        use crate::index::IndexOp::*;
        prop_oneof![
            8 => (0u64..60).prop_map(Stored),
            6 => (0u64..60).prop_map(Removed),
            1 => Just(Cleared),
        ]
    }

    proptest! {
        /// Whatever the mesh loses, reorders or repeats: while the mirror says
        /// `precise`, it holds exactly what the owner held as of the last delta it
        /// applied (a delta not yet heard of is lag, bounded by the owner's next
        /// delta or heartbeat; a lost one shows as a gap then).
        #[test]
        fn precise_means_equal_to_the_owner(
            steps in proptest::collection::vec(proptest::collection::vec(op(), 0..6), 1..80),
            fate in proptest::collection::vec(0u8..10, 200),
        ) {
            let mut o = Owner::new(9);
            let mut ix = BlockIndex::new(1000);
            let mut m = Mirror::new(r(1), 30.0);
            let (mut di, mut si, mut f) = (0usize, 0usize, 0usize);
            let mut roll = || { f += 1; fate[f % fate.len()] };
            for (i, ops) in steps.into_iter().enumerate() {
                let now = i as f64 * 0.25;
                o.step(ops, now);
                // Delivery: 0 = lost, 1 = delayed one step (re-sent later), else now.
                let mut late = Vec::new();
                while di < o.deltas.len() {
                    match roll() {
                        0 => {}
                        1 => late.push(o.deltas[di].clone()),
                        _ => m.delta(&mut ix, "a", o.deltas[di].clone(), now),
                    }
                    di += 1;
                }
                while si < o.snapshots.len() {
                    let mut parts = o.snapshots[si].clone();
                    parts.reverse();
                    for p in parts {
                        if roll() != 0 {
                            m.part(&mut ix, "a", p, now);
                        }
                    }
                    si += 1;
                }
                for d in late {
                    m.delta(&mut ix, "a", d, now);
                }
                m.tick(&mut ix, now);
                if m.state(now) == FeedState::Precise {
                    let at = m.next_seq().expect("synced") as usize - 1;
                    prop_assert_eq!(held(&ix, r(1), 0..60), o.at_seq[at].clone(), "step {}", i);
                }
            }
            // Everything re-sent (the mesh refreshes its values): the mirror is in step.
            let now = 1_000.0;
            m.tick(&mut ix, now);
            let (parts, complete) = snapshot_parts(o.truth.iter().copied().collect());
            let n = parts.len() as u16;
            for (i, hashes) in parts.into_iter().enumerate() {
                let p = Part { epoch: 9, as_of: o.outbox.seq, part: i as u16, parts: n, complete, block_size: 16, hashes };
                m.part(&mut ix, "a", p, now);
            }
            for d in o.deltas.clone() {
                m.delta(&mut ix, "a", d, now);
            }
            prop_assert_eq!(m.state(now), FeedState::Precise);
            prop_assert_eq!(held(&ix, r(1), 0..60), o.truth.clone());
        }
    }
}
