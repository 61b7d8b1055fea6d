//! The global block index: chain key → the replicas that hold that block.
//!
//! Invariants:
//! - At most `cap` entries; every entry has at least one holder (an entry whose last
//!   holder leaves is removed at once).
//! - Eviction at the cap is CLOCK (second chance), an LRU approximation: a lookup
//!   that matches the block, a second store of it, or [`BlockIndex::touch`] sets the
//!   entry's reference bit (a first store does not: a block earns its place by being
//!   reused); the hand clears set bits and evicts the first clear one. A lookup
//!   stops at the first block no replica holds, so the children of an evicted block
//!   are never touched again and go next: the index keeps hot prefixes.
//! - Eviction only ever removes knowledge, so the index under-reports (a miss), never
//!   claims a block a replica does not hold, as long as the events are complete.
//! - Lookups take `&self` (reference bits are atomics), so readers share a
//!   `RwLock` read guard while one subscriber applies a batch under the write guard.
//! - Table hashes are the key mixed with a per-process random secret, so crafted
//!   prompts cannot force collisions.
//! - Replica ids are `0..MAX_REPLICAS`; holders are one 128-bit set per entry.
//! - For replicas marked with [`BlockIndex::set_logged`] (those a router node follows
//!   itself and shares over its mesh) every change the events make is appended to a
//!   bounded change log, drained by [`BlockIndex::drain_log`]: a first store of a block
//!   for the replica, every removal asked for (found or not: an evicted block the
//!   engine then drops must be dropped by peers too) and whole-replica clears.
//!   Evictions are not logged (they are this node's memory limit, not the engine's
//!   state). Past [`LOG_CAP`] ops an op is dropped and its replica flagged overflowed.

use std::sync::atomic::{AtomicBool, Ordering};

use hashbrown::HashTable;

/// Replicas one index can track (one bit each per block).
pub const MAX_REPLICAS: usize = 128;

/// Most ops the change log holds between drains (16 B each: 16 MiB).
pub const LOG_CAP: usize = 1 << 20;

/// One logged change of a replica's blocks (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexOp {
    Stored(u64),
    Removed(u64),
    /// Every block of the replica was dropped.
    Cleared,
}

/// What [`BlockIndex::drain_log`] hands over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainedLog {
    /// In the order they happened.
    pub ops: Vec<(ReplicaId, IndexOp)>,
    /// Replicas whose ops were dropped at [`LOG_CAP`] since the last drain.
    pub overflowed: u128,
}

/// A replica's slot in the index, `0..MAX_REPLICAS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(u8);

impl ReplicaId {
    /// `None` when `i ≥ MAX_REPLICAS`.
    pub fn new(i: usize) -> Option<Self> {
        (i < MAX_REPLICAS).then_some(ReplicaId(i as u8))
    }

    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    fn bit(self) -> u128 {
        1u128 << self.0
    }
}

struct Entry {
    holders: u128,
    key: u64,
    referenced: AtomicBool,
}

/// Counters since creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// (block, replica) pairs added.
    pub inserts: u64,
    /// (block, replica) pairs removed by events.
    pub removes: u64,
    /// Entries evicted at the cap.
    pub evictions: u64,
}

/// The number of leading blocks of a chain each replica holds (only replicas with
/// at least one), in replica-id order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    pub blocks: Vec<(ReplicaId, u32)>,
}

impl PrefixMatch {
    /// Leading blocks `r` holds (0 when absent).
    pub fn blocks_for(&self, r: ReplicaId) -> u32 {
        self.blocks
            .iter()
            .find(|(id, _)| *id == r)
            .map_or(0, |(_, n)| *n)
    }
}

/// Tokens vLLM serves from its cache for a prompt of `prompt_tokens` when `blocks`
/// leading blocks are cached: whole blocks, never the prompt's last token.
pub fn engine_cached_tokens(blocks: u32, prompt_tokens: u32, block_size: u32) -> u32 {
    if block_size == 0 || prompt_tokens == 0 {
        return 0;
    }
    blocks.min((prompt_tokens - 1) / block_size) * block_size
}

/// See the module docs.
pub struct BlockIndex {
    entries: Vec<Entry>,
    table: HashTable<u32>,
    cap: usize,
    hand: usize,
    secret: u64,
    stats: IndexStats,
    logged: u128,
    log: DrainedLog,
}

#[inline]
fn mix(key: u64, secret: u64) -> u64 {
    let z = (key ^ secret).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z ^ (z >> 29)
}

fn random_secret() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x6b76);
    h.finish()
}

impl BlockIndex {
    /// An empty index holding at most `cap` blocks (at least 1).
    pub fn new(cap: usize) -> Self {
        BlockIndex {
            entries: Vec::new(),
            table: HashTable::new(),
            cap: cap.clamp(1, u32::MAX as usize),
            hand: 0,
            secret: random_secret(),
            stats: IndexStats::default(),
            logged: 0,
            log: DrainedLog::default(),
        }
    }

    /// Starts (`on`) or stops logging `r`'s changes; stopping drops its pending ops.
    pub fn set_logged(&mut self, r: ReplicaId, on: bool) {
        if on {
            self.logged |= r.bit();
        } else {
            self.logged &= !r.bit();
            self.log.ops.retain(|(id, _)| *id != r);
            self.log.overflowed &= !r.bit();
        }
    }

    /// Takes the change log (see the module docs).
    pub fn drain_log(&mut self) -> DrainedLog {
        std::mem::take(&mut self.log)
    }

    fn note(&mut self, r: ReplicaId, op: IndexOp) {
        if self.logged & r.bit() == 0 {
            return;
        }
        if self.log.ops.len() >= LOG_CAP {
            self.log.overflowed |= r.bit();
            return;
        }
        self.log.ops.push((r, op));
    }

    /// Every block `r` holds here (O(len)); true in `.1` when the index ever evicted,
    /// so the list may miss blocks the replica holds.
    pub fn keys_of(&self, r: ReplicaId) -> (Vec<u64>, bool) {
        let keys = self
            .entries
            .iter()
            .filter(|e| e.holders & r.bit() != 0)
            .map(|e| e.key)
            .collect();
        (keys, self.stats.evictions > 0)
    }

    /// Drops `r` from each of `keys` and logs one clear, not one removal per key.
    pub fn clear_keys(&mut self, keys: impl IntoIterator<Item = u64>, r: ReplicaId) {
        let logged = self.logged & r.bit();
        self.logged &= !r.bit();
        for k in keys {
            self.remove(k, r);
        }
        self.logged |= logged;
        self.note(r, IndexOp::Cleared);
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Blocks held by at least one replica.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn stats(&self) -> IndexStats {
        self.stats
    }

    /// Bytes allocated by the index (entries and table).
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<Entry>() + self.table.allocation_size()
    }

    fn find(&self, key: u64) -> Option<u32> {
        let entries = &self.entries;
        self.table
            .find(mix(key, self.secret), |&i| entries[i as usize].key == key)
            .copied()
    }

    /// The replicas holding `key`, as a bit set (bit i = replica i).
    pub fn holders(&self, key: u64) -> u128 {
        self.find(key)
            .map_or(0, |i| self.entries[i as usize].holders)
    }

    /// Marks `key` recently used.
    pub fn touch(&self, key: u64) {
        if let Some(i) = self.find(key) {
            self.entries[i as usize]
                .referenced
                .store(true, Ordering::Relaxed);
        }
    }

    /// Records that `r` holds `key`; evicts one entry first when full.
    pub fn insert(&mut self, key: u64, r: ReplicaId) {
        if let Some(i) = self.find(key) {
            let e = &mut self.entries[i as usize];
            let new = e.holders & r.bit() == 0;
            e.holders |= r.bit();
            *e.referenced.get_mut() = true;
            if new {
                self.stats.inserts += 1;
                self.note(r, IndexOp::Stored(key));
            }
            return;
        }
        if self.entries.len() >= self.cap {
            self.evict_one();
        }
        let slot = self.entries.len() as u32;
        self.entries.push(Entry {
            holders: r.bit(),
            key,
            referenced: AtomicBool::new(false),
        });
        let (entries, secret) = (&self.entries, self.secret);
        self.table.insert_unique(mix(key, secret), slot, |&i| {
            mix(entries[i as usize].key, secret)
        });
        self.stats.inserts += 1;
        self.note(r, IndexOp::Stored(key));
    }

    /// Records that `r` no longer holds `key`; true when it did.
    pub fn remove(&mut self, key: u64, r: ReplicaId) -> bool {
        self.note(r, IndexOp::Removed(key));
        let Some(i) = self.find(key) else {
            return false;
        };
        let e = &mut self.entries[i as usize];
        if e.holders & r.bit() == 0 {
            return false;
        }
        e.holders &= !r.bit();
        self.stats.removes += 1;
        if e.holders == 0 {
            self.delete_slot(i);
        }
        true
    }

    /// Drops every block of `r` (O(index); a subscriber clears by its own list).
    pub fn remove_replica(&mut self, r: ReplicaId) {
        self.note(r, IndexOp::Cleared);
        let mut i = 0;
        while i < self.entries.len() {
            let e = &mut self.entries[i];
            if e.holders & r.bit() != 0 {
                e.holders &= !r.bit();
                self.stats.removes += 1;
                if e.holders == 0 {
                    self.delete_slot(i as u32);
                    continue; // the last entry moved into slot i
                }
            }
            i += 1;
        }
    }

    fn delete_slot(&mut self, i: u32) {
        let secret = self.secret;
        let key = self.entries[i as usize].key;
        if let Ok(occ) = self.table.find_entry(mix(key, secret), |&s| s == i) {
            occ.remove();
        }
        let last = self.entries.len() as u32 - 1;
        self.entries.swap_remove(i as usize);
        if i != last {
            let moved = self.entries[i as usize].key;
            if let Some(s) = self.table.find_mut(mix(moved, secret), |&s| s == last) {
                *s = i;
            }
        }
        if self.hand >= self.entries.len() {
            self.hand = 0;
        }
    }

    fn evict_one(&mut self) {
        // Two sweeps at most: the first clears every reference bit.
        for _ in 0..2 * self.entries.len() + 1 {
            if self.entries.is_empty() {
                return;
            }
            if self.hand >= self.entries.len() {
                self.hand = 0;
            }
            let e = &mut self.entries[self.hand];
            if std::mem::replace(e.referenced.get_mut(), false) {
                self.hand += 1;
                continue;
            }
            self.delete_slot(self.hand as u32);
            // The newest entry moved into this slot: step past it, so it gets a
            // full sweep before it can go (as if appended behind the hand).
            self.hand += 1;
            self.stats.evictions += 1;
            return;
        }
    }

    /// For each replica, how many leading blocks of `chain` it holds; touches every
    /// matched block.
    pub fn longest_prefix(&self, chain: &[u64]) -> PrefixMatch {
        let mut out = PrefixMatch::default();
        let mut alive = u128::MAX;
        let mut depth = 0u32;
        for &key in chain {
            let (holders, slot) = match self.find(key) {
                Some(i) => (self.entries[i as usize].holders, Some(i)),
                None => (0, None),
            };
            let next = alive & holders;
            if depth > 0 {
                push_lost(&mut out, alive & !next, depth);
            }
            if next == 0 {
                alive = 0;
                break;
            }
            if let Some(i) = slot {
                self.entries[i as usize]
                    .referenced
                    .store(true, Ordering::Relaxed);
            }
            alive = next;
            depth += 1;
        }
        if depth > 0 {
            push_lost(&mut out, alive, depth);
        }
        out.blocks.sort_unstable_by_key(|(r, _)| *r);
        out
    }

    /// Checks every invariant in the module docs; O(len).
    pub fn check(&self) -> Result<(), String> {
        if self.entries.len() > self.cap {
            return Err(format!(
                "{} entries over cap {}",
                self.entries.len(),
                self.cap
            ));
        }
        if self.table.len() != self.entries.len() {
            return Err("table and entries differ in length".into());
        }
        for (i, e) in self.entries.iter().enumerate() {
            if e.holders == 0 {
                return Err(format!("entry {i} has no holder"));
            }
            if self.find(e.key) != Some(i as u32) {
                return Err(format!("entry {i} not found by its key"));
            }
        }
        Ok(())
    }
}

fn push_lost(out: &mut PrefixMatch, mut set: u128, depth: u32) {
    while set != 0 {
        let r = set.trailing_zeros() as u8;
        set &= set - 1;
        out.blocks.push((ReplicaId(r), depth));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    fn r(i: usize) -> ReplicaId {
        ReplicaId::new(i).expect("id")
    }

    #[test]
    fn longest_prefix_per_replica() {
        let mut ix = BlockIndex::new(100);
        for k in [1, 2, 3] {
            ix.insert(k, r(0));
        }
        ix.insert(1, r(5));
        ix.insert(3, r(5)); // block 2 missing: only 1 leading block counts
        ix.insert(2, r(7)); // not the first block: 0
        let m = ix.longest_prefix(&[1, 2, 3, 4]);
        assert_eq!(m.blocks, vec![(r(0), 3), (r(5), 1)]);
        assert_eq!(m.blocks_for(r(7)), 0);
        assert_eq!(ix.longest_prefix(&[9, 1]).blocks, vec![]);
        assert_eq!(ix.longest_prefix(&[]).blocks, vec![]);
        ix.check().expect("ok");
    }

    #[test]
    fn engine_cached_tokens_never_counts_the_last_token() {
        assert_eq!(engine_cached_tokens(3, 96, 32), 64);
        assert_eq!(engine_cached_tokens(3, 97, 32), 96);
        assert_eq!(engine_cached_tokens(1, 97, 32), 32);
        assert_eq!(engine_cached_tokens(5, 0, 32), 0);
    }

    #[test]
    fn removal_of_last_holder_deletes_entry() {
        let mut ix = BlockIndex::new(10);
        ix.insert(1, r(0));
        ix.insert(1, r(1));
        assert!(ix.remove(1, r(0)));
        assert!(!ix.remove(1, r(0)));
        assert_eq!(ix.holders(1), 0b10);
        assert!(ix.remove(1, r(1)));
        assert!(ix.is_empty());
        ix.check().expect("ok");
    }

    #[test]
    fn eviction_keeps_the_hot_prefix() {
        let mut ix = BlockIndex::new(64);
        let hot: Vec<u64> = (1000..1016).collect();
        for &k in &hot {
            ix.insert(k, r(1));
        }
        for cold in 0..2000u64 {
            // The router keeps matching the hot prefix while cold blocks stream in.
            assert_eq!(ix.longest_prefix(&hot).blocks_for(r(1)), 16, "at {cold}");
            ix.insert(10_000 + cold, r(2));
        }
        assert_eq!(ix.len(), 64);
        assert_eq!(ix.stats().evictions, 2016 - 64, "{:?}", ix.stats());
        ix.check().expect("ok");
    }

    #[test]
    fn a_new_chain_survives_its_own_insertion_into_a_full_index() {
        let mut ix = BlockIndex::new(1000);
        for k in 0..1000u64 {
            ix.insert(k, r(0));
        }
        let chain: Vec<u64> = (5000..5500).collect();
        for &k in &chain {
            ix.insert(k, r(1));
        }
        assert_eq!(ix.longest_prefix(&chain).blocks_for(r(1)), 500);
        ix.check().expect("ok");
    }

    #[test]
    fn the_log_records_a_followed_replicas_changes_but_not_evictions() {
        let mut ix = BlockIndex::new(2);
        ix.set_logged(r(1), true);
        ix.insert(1, r(1));
        ix.insert(1, r(1)); // already held: nothing new
        ix.insert(7, r(2)); // not logged
        ix.insert(2, r(1)); // evicts one entry: not logged
        ix.remove(99, r(1)); // unknown here, still logged
        ix.clear_keys([1, 2], r(1));
        let d = ix.drain_log();
        assert_eq!(
            d.ops,
            vec![
                (r(1), IndexOp::Stored(1)),
                (r(1), IndexOp::Stored(2)),
                (r(1), IndexOp::Removed(99)),
                (r(1), IndexOp::Cleared),
            ]
        );
        assert_eq!(d.overflowed, 0);
        assert!(ix.drain_log().ops.is_empty());
        ix.insert(3, r(1));
        ix.set_logged(r(1), false);
        assert!(ix.drain_log().ops.is_empty(), "stopping drops pending ops");
        let (keys, evicted) = ix.keys_of(r(1));
        assert_eq!((keys, evicted), (vec![3], true));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64, usize),
        Remove(u64, usize),
        Clear(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..40, 0usize..4).prop_map(|(k, r)| Op::Insert(k, r)),
            (0u64..40, 0usize..4).prop_map(|(k, r)| Op::Remove(k, r)),
            (0usize..4).prop_map(Op::Clear),
        ]
    }

    proptest! {
        /// Against a model: the index holds a subset of the truth, equal to it
        /// while under the cap, and never breaks its invariants.
        #[test]
        fn index_is_a_subset_of_the_truth(ops in proptest::collection::vec(op(), 1..300), cap in 1usize..50) {
            let mut ix = BlockIndex::new(cap);
            let mut truth: HashMap<u64, HashSet<usize>> = HashMap::new();
            let mut evicted = false;
            for o in ops {
                match o {
                    Op::Insert(k, i) => {
                        let before = ix.stats().evictions;
                        ix.insert(k, r(i));
                        evicted |= ix.stats().evictions > before;
                        truth.entry(k).or_default().insert(i);
                    }
                    Op::Remove(k, i) => {
                        ix.remove(k, r(i));
                        if let Some(s) = truth.get_mut(&k) { s.remove(&i); }
                    }
                    Op::Clear(i) => {
                        ix.remove_replica(r(i));
                        for s in truth.values_mut() { s.remove(&i); }
                    }
                }
                prop_assert!(ix.check().is_ok(), "{:?}", ix.check());
                for k in 0..40u64 {
                    let want: u128 = truth.get(&k).map_or(0, |s| s.iter().map(|i| 1u128 << i).sum());
                    let got = ix.holders(k);
                    prop_assert_eq!(got & !want, 0, "claims a block nobody holds: {}", k);
                    if !evicted {
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }
}
