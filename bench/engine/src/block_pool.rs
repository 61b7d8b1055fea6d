//! KV block pool: reference counts, a prefix-cache map and an LRU free list.
//!
//! Invariants (checked by [`BlockPool::check`]):
//! - Block 0 is vLLM's null block: never allocated, never free. Usable = n − 1.
//! - A block is in the free list iff its `ref_cnt` is 0; `num_free` is that list's
//!   length. So `num_free + blocks with ref_cnt > 0 == usable`.
//! - Free blocks keep their hash (still hit-able) until they are popped for reuse,
//!   which evicts the hash. The list is LRU: pop at the head, release at the tail.
//! - `cached[h] == b` implies `blocks[b].hash == Some(h)`; at most one block per hash
//!   (a duplicate full block simply stays unhashed, unlike vLLM's multi-map — it only
//!   loses a redundant copy).
//! - With the KV log on ([`BlockPool::enable_kv_log`]), every hash leaving `cached`
//!   is logged as [`KvLog::Removed`] at that moment, and the scheduler logs
//!   [`KvLog::Stored`] right after each successful `register`: the log replays the
//!   map's history in order, as vLLM's `BlockStored`/`BlockRemoved` do.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const NIL: u32 = u32::MAX;

/// Multiplicative hasher for u64 keys that are ids or already-random hashes.
#[derive(Default, Clone, Copy)]
pub(crate) struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // Fold the high half down so hashbrown's top-7-bit tags see every input bit.
        let m = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = m ^ (m >> 32);
    }
}

pub(crate) type MixMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;

/// One change of the prefix-cache map, for KV-event publishing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvLog {
    /// Block `block` (0-based, in the request's sequence) of request `request`
    /// became hit-able under `hash`, a child of `parent` (`None`: first block).
    Stored {
        request: u64,
        block: u32,
        hash: u64,
        parent: Option<u64>,
    },
    /// `hash` is no longer hit-able (its block was reused).
    Removed { hash: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Block {
    ref_cnt: u32,
    prev: u32,
    next: u32,
    hash: Option<u64>,
}

/// Fixed-size pool of KV blocks with prefix caching.
#[derive(Clone, Debug)]
pub(crate) struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: u32,
    cached: MixMap<u64, u32>,
    kv_log: Option<Vec<KvLog>>,
}

impl BlockPool {
    /// `num_gpu_blocks` ≥ 2 (checked by `Profile::validate`).
    pub(crate) fn new(num_gpu_blocks: u32) -> Self {
        let n = num_gpu_blocks.max(2);
        let mut blocks = vec![
            Block {
                ref_cnt: 0,
                prev: NIL,
                next: NIL,
                hash: None,
            };
            n as usize
        ];
        blocks[0].ref_cnt = 1; // the null block is permanently held
        for i in 1..n {
            blocks[i as usize].prev = if i == 1 { NIL } else { i - 1 };
            blocks[i as usize].next = if i + 1 == n { NIL } else { i + 1 };
        }
        BlockPool {
            blocks,
            head: 1,
            tail: n - 1,
            num_free: n - 1,
            cached: MixMap::with_capacity_and_hasher(n as usize, Default::default()),
            kv_log: None,
        }
    }

    /// Starts logging map changes (see the module docs).
    pub(crate) fn enable_kv_log(&mut self) {
        self.kv_log.get_or_insert_with(Vec::new);
    }

    /// Appends to the KV log when it is on.
    pub(crate) fn log(&mut self, ev: KvLog) {
        if let Some(l) = self.kv_log.as_mut() {
            l.push(ev);
        }
    }

    /// Moves the logged changes into `out` (oldest first).
    pub(crate) fn drain_kv_log(&mut self, out: &mut Vec<KvLog>) {
        if let Some(l) = self.kv_log.as_mut() {
            out.append(l);
        }
    }

    pub(crate) fn usable(&self) -> u32 {
        self.blocks.len() as u32 - 1
    }

    /// Free blocks, including evictable cached ones (vLLM's `get_num_free_blocks`).
    pub(crate) fn num_free(&self) -> u32 {
        self.num_free
    }

    /// Blocks whose hash is currently hit-able.
    pub(crate) fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Leading `hashes` cached now (what a prompt with them would hit).
    pub(crate) fn cached_prefix(&self, hashes: &[u64]) -> u32 {
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count() as u32
    }

    pub(crate) fn lookup(&self, hash: u64) -> Option<u32> {
        self.cached.get(&hash).copied()
    }

    pub(crate) fn ref_cnt(&self, block: u32) -> u32 {
        self.blocks[block as usize].ref_cnt
    }

    fn unlink(&mut self, b: u32) {
        let Block { prev, next, .. } = self.blocks[b as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.blocks[b as usize].prev = NIL;
        self.blocks[b as usize].next = NIL;
        self.num_free -= 1;
    }

    fn push_tail(&mut self, b: u32) {
        self.blocks[b as usize].prev = self.tail;
        self.blocks[b as usize].next = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.blocks[self.tail as usize].next = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    /// Takes a reference on a cache hit (leaving the free list if it was free).
    pub(crate) fn touch(&mut self, b: u32) {
        if self.blocks[b as usize].ref_cnt == 0 {
            self.unlink(b);
        }
        self.blocks[b as usize].ref_cnt += 1;
    }

    /// Pops the least recently freed block, evicting its cached hash.
    pub(crate) fn allocate(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.unlink(b);
        if let Some(h) = self.blocks[b as usize].hash.take() {
            self.cached.remove(&h);
            self.log(KvLog::Removed { hash: h });
        }
        self.blocks[b as usize].ref_cnt = 1;
        Some(b)
    }

    /// Drops one reference; a block reaching 0 goes to the LRU tail, hash kept.
    pub(crate) fn release(&mut self, b: u32) {
        let blk = &mut self.blocks[b as usize];
        debug_assert!(blk.ref_cnt > 0, "release of a free block");
        blk.ref_cnt = blk.ref_cnt.saturating_sub(1);
        if blk.ref_cnt == 0 {
            self.push_tail(b);
        }
    }

    /// Publishes a just-filled block under `hash` unless another block holds it;
    /// true when it did.
    pub(crate) fn register(&mut self, b: u32, hash: u64) -> bool {
        if self.blocks[b as usize].hash.is_some() {
            return false;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.cached.entry(hash) {
            e.insert(b);
            self.blocks[b as usize].hash = Some(hash);
            return true;
        }
        false
    }

    /// Verifies every invariant in the module docs; O(blocks).
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut in_list = vec![false; self.blocks.len()];
        let (mut cur, mut prev, mut count) = (self.head, NIL, 0u32);
        while cur != NIL {
            if in_list[cur as usize] {
                return Err(format!("free list cycles at block {cur}"));
            }
            in_list[cur as usize] = true;
            if self.blocks[cur as usize].prev != prev {
                return Err(format!("block {cur} has a wrong prev link"));
            }
            prev = cur;
            cur = self.blocks[cur as usize].next;
            count += 1;
        }
        if prev != self.tail || count != self.num_free {
            return Err(format!(
                "free list length {count} != num_free {}",
                self.num_free
            ));
        }
        if in_list[0] || self.blocks[0].ref_cnt == 0 {
            return Err("null block became free".into());
        }
        for (i, blk) in self.blocks.iter().enumerate().skip(1) {
            if (blk.ref_cnt == 0) != in_list[i] {
                return Err(format!(
                    "block {i}: ref {} but in_free_list {}",
                    blk.ref_cnt, in_list[i]
                ));
            }
            if let Some(h) = blk.hash
                && self.cached.get(&h) != Some(&(i as u32))
            {
                return Err(format!("block {i} hash not in map"));
            }
        }
        for (h, b) in &self.cached {
            if self.blocks.get(*b as usize).and_then(|x| x.hash) != Some(*h) {
                return Err(format!("map entry {h:#x} -> {b} stale"));
            }
        }
        Ok(())
    }

    /// Free-list order, head (next evicted) first; for tests.
    #[cfg(test)]
    pub(crate) fn free_order(&self) -> Vec<u32> {
        let mut out = Vec::new();
        let mut cur = self.head;
        while cur != NIL {
            out.push(cur);
            cur = self.blocks[cur as usize].next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_least_recently_released_first() {
        let mut p = BlockPool::new(5); // usable blocks 1..=4
        let a: Vec<u32> = (0..4).map(|_| p.allocate().expect("free")).collect();
        assert_eq!(p.num_free(), 0);
        assert!(p.allocate().is_none());
        for (i, b) in a.iter().enumerate() {
            p.register(*b, 100 + i as u64);
        }
        // Release in order 2, 0, 3, 1: eviction must follow that order.
        for i in [2, 0, 3, 1] {
            p.release(a[i]);
        }
        assert_eq!(p.free_order(), vec![a[2], a[0], a[3], a[1]]);
        p.touch(a[0]); // a hit takes block 0 out of the LRU
        assert_eq!(p.allocate(), Some(a[2]));
        assert_eq!(p.lookup(102), None, "evicted hash is gone");
        assert_eq!(p.lookup(103), Some(a[3]), "free but cached hash still hits");
        p.check().expect("invariants");
    }

    #[test]
    fn kv_log_replays_to_the_cached_map() {
        let mut p = BlockPool::new(6); // 5 usable blocks
        p.enable_kv_log();
        let mut held = Vec::new();
        for h in 0..40u64 {
            // Keep at most 3 blocks referenced; the rest cycle through the LRU.
            if held.len() == 3 {
                p.release(held.remove(0));
            }
            let b = p.allocate().expect("a free block");
            if p.register(b, 1000 + h % 13) {
                p.log(KvLog::Stored {
                    request: h,
                    block: 0,
                    hash: 1000 + h % 13,
                    parent: None,
                });
            }
            held.push(b);
        }
        let mut log = Vec::new();
        p.drain_kv_log(&mut log);
        let mut replayed = std::collections::HashSet::new();
        for ev in log {
            match ev {
                KvLog::Stored { hash, .. } => assert!(replayed.insert(hash), "stored twice"),
                KvLog::Removed { hash } => assert!(replayed.remove(&hash), "removed unknown"),
            }
        }
        let cached: std::collections::HashSet<u64> = p.cached.keys().copied().collect();
        assert_eq!(replayed, cached);
        p.check().expect("invariants");
    }

    #[test]
    fn duplicate_hash_stays_unregistered() {
        let mut p = BlockPool::new(4);
        let (x, y) = (p.allocate().expect("a"), p.allocate().expect("b"));
        p.register(x, 7);
        p.register(y, 7);
        assert_eq!(p.lookup(7), Some(x));
        p.release(x);
        p.release(y);
        p.check().expect("invariants");
    }
}
