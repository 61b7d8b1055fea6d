//! The node's approximate prefix index: which replica was sent which prefix blocks.
//!
//! Each replica has an insertion cursor counting blocks this node has sent it that the
//! replica had to compute (misses). An entry `(replica, seq)` for a block is presumed
//! still cached while `cursor − seq < capacity` (the replica's KV capacity in router
//! blocks): an LRU approximation that needs no eviction lists. Within one send the
//! later blocks take the older positions, as vLLM frees a finished request's blocks
//! tail first, so along any chain the blocks presumed held form a prefix; matching
//! relies on that past its exact head (see `match_lengths`). Memory is bounded by
//! `max_entries`: a shard at its limit drops its least recently touched quarter
//! before a new block goes in. The limit is the shard's cap less a jitter of up to an
//! eighth, drawn anew at each drop: shards fill together (hashes spread evenly), and a
//! drop costs O(cap / shards), so without it all shards dropped in the same request
//! (one 128k-token prompt of new blocks waited 41 ms at p99 for 32 drops). Bytes per
//! entry: see [`BYTES_PER_ENTRY`].
//! Because block hashes are chained, a match on block `i` implies blocks `0..i`.
//!
//! Past the first [`EXACT_HEAD_BLOCKS`] a record keeps one block in
//! [`CHECKPOINT_STRIDE`] and the chain's last ([`recorded`]): a long prompt of new
//! blocks costs an eighth of the inserts and entries, and a match there lands on a
//! recorded block (up to `CHECKPOINT_STRIDE − 1` blocks short where a prompt parts from
//! a held chain inside a stride; exact where it extends one).
//!
//! Matching a chain that many replicas hold costs one pass over the holders of its last
//! block, not of every block: a holder there carries a certificate that it still holds
//! every earlier block (see [`Holder::since`]); only the others are walked block by block.
//! Where none of the chain's shards has dropped entries since a holder was last sent the
//! chain, its last block alone settles that holder before any walk: the hot prefix of a
//! small fleet costs one lookup instead of one per block.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed},
};

use parking_lot::Mutex;

/// Shards of the index: each has its own lock and drops its own least recently touched
/// quarter at its cap, an O(cap / SHARDS) rebuild under that lock. 256 keeps one drop
/// near 0.2 ms at the default 2 Mi entries (32 shards: 1–2 ms, which a request whose
/// blocks filled several shards waited for in turn, and a concurrent match waited for
/// at that shard's lock).
const SHARDS: usize = 256;
const _: () = assert!(SHARDS.is_power_of_two());

/// Leading blocks matched block by block (2k tokens at 16 per block); past them the
/// match is found by bisection (see [`PrefixIndex::match_lengths`]).
pub const EXACT_HEAD_BLOCKS: usize = 128;

/// Past the exact head a record keeps every `CHECKPOINT_STRIDE`-th block (those at
/// positions `i` with `(i + 1).is_multiple_of(CHECKPOINT_STRIDE)`) and the chain's last block
/// ([`recorded`]). A prompt of all-new blocks costs 1/8 of the inserts and 1/8 of the
/// entries (a 128k-token one: ≈ 1,070 instead of ≈ 7,600, and its record and the drops
/// it caused were ≈ 40% of the router's CPU per request); a match past the head stops
/// at a recorded block, so a prompt that parts from a held chain inside a stride is
/// matched up to 7 blocks short of where it parts (≤ 112 tokens at 16 per block), and
/// one that extends a held chain (a conversation's next turn) matches it whole, its
/// end being recorded.
pub const CHECKPOINT_STRIDE: usize = 8;
const _: () = assert!(EXACT_HEAD_BLOCKS.is_multiple_of(CHECKPOINT_STRIDE) && EXACT_HEAD_BLOCKS > 0);

/// Whether a record of a chain of `len` blocks keeps block `i`: the exact head, the
/// checkpoints past it, and the last block.
pub fn recorded(i: usize, len: usize) -> bool {
    i < EXACT_HEAD_BLOCKS || (i + 1).is_multiple_of(CHECKPOINT_STRIDE) || i + 1 == len
}

/// Position of checkpoint `k`: `k = 0` is the head's last block.
fn checkpoint(k: usize) -> usize {
    EXACT_HEAD_BLOCKS - 1 + k * CHECKPOINT_STRIDE
}

/// Alive candidates from which the walk asks the chain's last block for certificates
/// ([`PrefixIndex::certify`]): that costs a lookup per block left, which pays where
/// this many holders would be visited per block, and is mostly wasted where a few
/// candidates hold a short head of a chain that others hold further.
const CERTIFY_MIN_ALIVE: u32 = 8;

/// Chains up to this long are recorded block by block, longer ones grouped by shard
/// ([`PrefixIndex::record`]); at most [`EXACT_HEAD_BLOCKS`], so every block is kept.
const GROUP_RECORD_BLOCKS: usize = 64;
const _: () = assert!(GROUP_RECORD_BLOCKS <= EXACT_HEAD_BLOCKS);

/// Keys are xxh3 block hashes that clients can steer, so the map keeps a per-process
/// random seed (foldhash), at a fraction of SipHash's cost on the per-block lookups.
type Shard = HashMap<u64, Entry, foldhash::fast::RandomState>;

/// Who holds a block, and when (in that replica's cursor) it was last sent there.
#[derive(Clone, Copy, Debug)]
struct Holder {
    replica: u32,
    /// The index's eviction epoch read before the latest `record` that sent this
    /// replica the block (in the struct's padding: 16 bytes either way). That call sent
    /// it every earlier block of the chain too, so while no earlier block's entry was
    /// created after it (`Entry::born ≤ since`, none was dropped and made again) the
    /// replica is still among their holders: it matches the whole chain up to here.
    since: u32,
    seq: u64,
}

/// One block's holders. The first is stored inline: most blocks are held by one
/// replica, and a `Vec`'s first push costs a 64-byte allocation (capacity 4) plus the
/// allocator's header. A boxed slice, not a `Vec`: it grows one holder at a time
/// anyway, and its 8 bytes fewer make room for `born`. Slot size: 8 (key) + 48
/// (entry) + 1 control byte.
#[derive(Debug)]
struct Entry {
    first: Holder,
    more: Box<[Holder]>,
    touched: u64,
    /// The eviction epoch when this entry was created (under its shard's lock, after
    /// any eviction that made room for it).
    born: u32,
}

// The certificate fields live in padding: a holder and an entry stay 16 and 48 bytes.
const _: () = assert!(std::mem::size_of::<Holder>() == 16 && std::mem::size_of::<Entry>() == 48);

/// An epoch as a holder's `since`: past `u32::MAX` epochs (four billion evictions) 0,
/// so that no certificate holds (`born` saturates at the maximum).
fn since_tag(epoch: u64) -> u32 {
    u32::try_from(epoch)
        .ok()
        .filter(|&e| e < u32::MAX)
        .unwrap_or(0)
}

/// An epoch as an entry's `born`, saturating.
fn born_tag(epoch: u64) -> u32 {
    u32::try_from(epoch).unwrap_or(u32::MAX)
}

impl Entry {
    fn new(h: Holder, touched: u64, born: u32) -> Self {
        Self {
            first: h,
            more: Box::default(),
            touched,
            born,
        }
    }

    fn holders(&self) -> impl Iterator<Item = &Holder> {
        std::iter::once(&self.first).chain(self.more.iter())
    }

    /// Records `h`, keeping the later position (and certificate) for a replica already
    /// there.
    fn hold(&mut self, h: Holder) {
        match std::iter::once(&mut self.first)
            .chain(self.more.iter_mut())
            .find(|x| x.replica == h.replica)
        {
            Some(x) => {
                x.seq = x.seq.max(h.seq);
                x.since = x.since.max(h.since);
            }
            None => {
                // Grow one at a time: a `Vec`'s default first capacity is 4 holders.
                let mut more = std::mem::take(&mut self.more).into_vec();
                more.reserve_exact(1);
                more.push(h);
                self.more = more.into_boxed_slice();
            }
        }
    }

    /// Drops `replica`; false when no holder is left.
    fn release(&mut self, replica: u32) -> bool {
        let mut more = std::mem::take(&mut self.more).into_vec();
        more.retain(|h| h.replica != replica);
        if self.first.replica == replica {
            match more.pop() {
                Some(h) => self.first = h,
                None => return false,
            }
        }
        self.more = more.into_boxed_slice();
        true
    }
}

/// Bound on heap bytes per entry held, which `core/tests/prefix_memory.rs` holds the
/// index to at 1 and 3 million blocks (measured there: 77 and 72).
///
/// Derivation: a shard's table never exceeds `B` buckets, the power of two whose 7/8
/// is its cap (see `table_fit`), at 57 bytes a bucket (8 key + 48 entry + 1 control);
/// a full shard holds `7B/8` entries (65 bytes each), a just-shrunk one `21B/32`
/// (87 bytes each); each holder past a block's first adds 16. So the whole index
/// costs at most ≈ `max_entries × 65` bytes plus 16 per extra holder: 2 Mi entries
/// (the default) ≈ 120 MB (measured: 121 MiB with a quarter of blocks on two replicas).
pub const BYTES_PER_ENTRY: usize = 96;

/// A replica's position in its own block stream, as the index needs it.
#[derive(Clone, Copy, Debug)]
pub struct Cursor {
    pub replica: u32,
    /// Current value of the replica's insertion cursor.
    pub seq: u64,
    /// Blocks the replica can hold (`u64::MAX` when unknown).
    pub capacity: u64,
}

/// A candidate's cursor, indexed by replica id during a match (16 bytes: the walk
/// visits one per holder, half a million per decision at 1,024 replicas).
#[derive(Clone, Copy)]
struct Slot {
    slot: u32,
    /// Leading blocks matched so far by the walk: alive at block `i` while it is `i`.
    /// `HOLDS_NONE` for no candidate, or one whose capacity is 0: never a block index.
    matched: u32,
    /// The oldest position still presumed held: for capacity `c > 0`,
    /// `cursor − seq < c` (saturating) ⇔ `seq ≥ cursor − (c − 1)` (saturating), so
    /// the inner loop compares once instead of subtracting and comparing.
    min_seq: u64,
}

/// `Slot::matched` of a slot that holds nothing.
const HOLDS_NONE: u32 = u32::MAX;

impl Slot {
    const NONE: Slot = Slot {
        slot: u32::MAX,
        matched: HOLDS_NONE,
        min_seq: u64::MAX,
    };

    fn new(slot: u32, c: &Cursor) -> Slot {
        match c.capacity {
            0 => Slot { slot, ..Slot::NONE },
            cap => Slot {
                slot,
                matched: 0,
                min_seq: c.seq.saturating_sub(cap - 1),
            },
        }
    }

    /// This candidate's replica was sent the block within its last `capacity` misses.
    fn holds(&self, hd: &Holder) -> bool {
        self.matched != HOLDS_NONE && hd.seq >= self.min_seq
    }

    /// Leading blocks matched (0 for a slot that holds nothing).
    fn matched(&self) -> u32 {
        if self.matched == HOLDS_NONE {
            0
        } else {
            self.matched
        }
    }

    /// The walk at block `i` meets holder `hd` of it: one more block matched (1) when
    /// this candidate matched every earlier one and still holds this one. Branch-free,
    /// as the walk's inner loop; an empty slot's `matched` is never a block index.
    #[inline(always)]
    fn extend(&mut self, i: u32, hd: &Holder) -> u32 {
        let hit = u32::from((self.matched == i) & (hd.seq >= self.min_seq));
        self.matched += hit;
        hit
    }
}

/// Settles, among the holders of one block's `entry`, every candidate alive at block
/// `alive` (it matched every block before) that still holds it within its capacity and
/// whose certificate reaches `bar` (`since ≥ bar`): its match becomes `len`. Returns
/// how many. Shared by the settle before the walk and the certificate within it.
fn settle(entry: &Entry, tab: &mut [Slot], alive: u32, len: u32, bar: u32) -> u32 {
    let mut settled = 0u32;
    let mut one = |hd: &Holder| {
        if let Some(t) = tab.get_mut(hd.replica as usize)
            && t.matched == alive
            && hd.seq >= t.min_seq
            && hd.since >= bar
        {
            t.matched = len;
            settled += 1;
        }
    };
    one(&entry.first);
    entry.more.iter().for_each(one);
    settled
}

/// Approximate, bounded, concurrent prefix index.
#[derive(Debug)]
pub struct PrefixIndex {
    shards: Vec<Mutex<Shard>>,
    /// Per shard, the size at which it next drops entries (see the module docs).
    limits: Vec<AtomicUsize>,
    shard_cap: usize,
    clock: AtomicU64,
    /// Bumped before a shard drops entries (under its lock): an entry created later
    /// has a greater `born` than the `since` of any holder sent its chain before.
    epoch: AtomicU64,
    /// Per shard, the epoch its latest drop bumped to (0: never dropped), set before
    /// the drop under its lock; read without it, so a match sees whether a chain's
    /// shards dropped anything since a holder's `since` without visiting them.
    dropped: Vec<AtomicU64>,
}

/// The most entries, at most `n` (and at least 14), that fill a hash table without
/// growing it past a power of two of buckets (hashbrown holds 7/8 of its buckets):
/// a shard capped there never allocates a table twice the size its entries need.
fn table_fit(n: usize) -> usize {
    let buckets = (n.saturating_mul(8) / 7).max(16);
    let pow = if buckets.is_power_of_two() {
        buckets
    } else {
        buckets.next_power_of_two() / 2
    };
    pow / 8 * 7
}

/// Shard `s`'s next limit: `cap` less a jitter in `0..=cap/8` drawn from `(s, draw)`
/// (a fixed mix, not a random source: simulations stay deterministic).
fn limit(cap: usize, s: usize, draw: u64) -> usize {
    let z = crate::policy::rank::mix64(draw ^ ((s as u64) << 40) ^ 0x9e37_79b9_7f4a_7c15);
    cap - (z % (cap as u64 / 8 + 1)) as usize
}

fn shard_of(hash: u64) -> usize {
    // Block hashes are already well mixed; the top bits pick the shard.
    (hash >> (64 - SHARDS.trailing_zeros())) as usize
}

impl PrefixIndex {
    pub fn new(max_entries: usize) -> Self {
        let shard_cap = table_fit(max_entries / SHARDS);
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            limits: (0..SHARDS)
                .map(|s| AtomicUsize::new(limit(shard_cap, s, 0)))
                .collect(),
            shard_cap,
            clock: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            dropped: (0..SHARDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// For each cursor, how many leading blocks of `blocks` that replica likely holds.
    /// `out[i]` is written for `cursors[i]`.
    ///
    /// The first [`EXACT_HEAD_BLOCKS`] are walked block by block (exact). Past them
    /// the match is found by bisection on the chain invariant (holding block `i` implies
    /// holding `0..i`): the last block first, then halving each group of candidates
    /// that stopped in between. Cost: O(head × holders) plus O(groups × log blocks)
    /// lookups, so a 100k-token conversation turn costs a few dozen lookups past its
    /// head instead of thousands.
    pub fn match_lengths(&self, blocks: &[u64], cursors: &[Cursor], out: &mut [u32]) {
        let head = blocks.len().min(EXACT_HEAD_BLOCKS);
        let Some(tab) = self.walk(&blocks[..head], cursors, out) else {
            return;
        };
        if head == blocks.len() {
            return;
        }
        let alive: Vec<u32> = (0..cursors.len() as u32)
            .filter(|&s| out[s as usize] as usize == head)
            .collect();
        if alive.is_empty() {
            return;
        }
        // Most often every survivor holds the whole chain: one lookup settles it.
        let last = blocks.len() - 1;
        let (whole, rest) = self.split(blocks[last], &tab, &alive);
        for s in whole {
            out[s as usize] = blocks.len() as u32;
        }
        // Checkpoints `0..=top` lie before the last block; `top + 1` stands for "none
        // held past `top`". Checkpoint 0 (the head's last block) is held by the alive.
        let top = (last - 1 - checkpoint(0)) / CHECKPOINT_STRIDE;
        self.bisect(blocks, &tab, rest, 0, top + 1, out);
    }

    /// As [`PrefixIndex::match_lengths`], block by block over the whole prompt: exact
    /// even where the chain invariant does not hold, at O(blocks × holders). Past the
    /// head it goes as far as the recorded blocks held ([`recorded`]): a checkpoint not
    /// held ends it; any other block held (a shorter chain's end) extends it.
    pub fn match_lengths_exact(&self, blocks: &[u64], cursors: &[Cursor], out: &mut [u32]) {
        let head = blocks.len().min(EXACT_HEAD_BLOCKS);
        let Some(tab) = self.walk_with(&blocks[..head], cursors, out, u32::MAX) else {
            return;
        };
        for (slot, o) in out.iter_mut().enumerate() {
            if *o as usize != head {
                continue;
            }
            for (i, h) in blocks.iter().enumerate().skip(head) {
                let held = self.split(*h, &tab, &[slot as u32]).0.len() == 1;
                if held {
                    *o = i as u32 + 1;
                } else if (i + 1).is_multiple_of(CHECKPOINT_STRIDE) {
                    break;
                }
            }
        }
    }

    /// The block-by-block walk. Returns the replica-indexed table of the cursors, or
    /// None when there are none.
    ///
    /// The inner loop (blocks × holders, half a million holder visits for a 64-block
    /// prefix held by 512 replicas) keeps each candidate's progress in its table slot,
    /// next to its cursor: one load per holder instead of two dependent ones. Once
    /// [`CERTIFY_MIN_ALIVE`] candidates are alive, those the chain's last block
    /// certifies ([`PrefixIndex::certify`]) are settled at once and only the rest walk on.
    fn walk(&self, blocks: &[u64], cursors: &[Cursor], out: &mut [u32]) -> Option<Vec<Slot>> {
        self.walk_with(blocks, cursors, out, CERTIFY_MIN_ALIVE)
    }

    /// [`PrefixIndex::walk`], certifying once `certify_min` candidates are alive
    /// (`u32::MAX`: never, the plain walk).
    fn walk_with(
        &self,
        blocks: &[u64],
        cursors: &[Cursor],
        out: &mut [u32],
        certify_min: u32,
    ) -> Option<Vec<Slot>> {
        out.iter_mut().for_each(|o| *o = 0);
        if cursors.is_empty() {
            return None;
        }
        // Replica id → (candidate slot, progress, oldest position held): one lookup per
        // holder walked.
        let max_id = cursors.iter().map(|c| c.replica).max().unwrap_or(0) as usize;
        let mut tab = vec![Slot::NONE; max_id + 1];
        for (i, c) in cursors.iter().enumerate() {
            tab[c.replica as usize] = Slot::new(i as u32, c);
        }
        // The newest `born` of the blocks walked so far (the certificate's bar).
        let mut newest = 0u32;
        let mut certified = false;
        let whole = if certify_min == u32::MAX {
            0
        } else {
            self.settle_whole(blocks, &mut tab)
        };
        let walked = if whole as usize == cursors.len() {
            &[][..]
        } else {
            blocks
        };
        for (i, h) in walked.iter().enumerate() {
            let shard = self.shards[shard_of(*h)].lock();
            let Some(entry) = shard.get(h) else { break };
            newest = newest.max(entry.born);
            let i = i as u32;
            // Alive candidates are exactly those that matched every earlier block.
            let mut hits = 0u32;
            let mut visit = |hd: &Holder| {
                if let Some(t) = tab.get_mut(hd.replica as usize) {
                    hits += t.extend(i, hd);
                }
            };
            // Not `holders()`: a chained iterator cost half of the loop's instructions.
            visit(&entry.first);
            entry.more.iter().for_each(visit);
            drop(shard);
            if hits == 0 {
                break;
            }
            if !certified && hits >= certify_min && (i as usize) + 1 < blocks.len() {
                certified = true;
                if self.certify(blocks, i as usize + 1, newest, &mut tab) == hits {
                    break;
                }
            }
        }
        // A replica given twice keeps its last cursor (the table's), as matching did.
        for (i, c) in cursors.iter().enumerate() {
            let t = &tab[c.replica as usize];
            if t.slot == i as u32 {
                out[i] = t.matched();
            }
        }
        Some(tab)
    }

    /// Before any walk, settles every candidate that the chain's last block shows was sent
    /// the whole chain by a `record` after which none of the chain's shards dropped an
    /// entry (each shard's `dropped` at most the holder's `since`): that record put it
    /// among the holders of every block, none of those entries has gone since, and its
    /// position there is no older than in the last block (a record gives a chain's later
    /// blocks the older positions; a holder keeps its latest). Returns how many it
    /// settled. Cost: one lookup and a load per block of a read-mostly array (2 KB),
    /// where the walk locks and looks up every block. Blocks whose shards drop often
    /// (a full index) fail the check and are walked as before; a drop concurrent with
    /// the match may go unseen, as with the walk's other certificates.
    fn settle_whole(&self, blocks: &[u64], tab: &mut [Slot]) -> u32 {
        let Some(&last) = blocks.last() else {
            return 0;
        };
        let len = blocks.len() as u32;
        let shard = self.shards[shard_of(last)].lock();
        let Some(entry) = shard.get(&last) else {
            return 0;
        };
        let dropped = blocks
            .iter()
            .map(|h| self.dropped[shard_of(*h)].load(Relaxed))
            .max()
            .map_or(0, born_tag);
        settle(entry, tab, 0, len, dropped)
    }

    /// With the walk past blocks `..from` (`newest`: their newest `born`), settles every
    /// candidate alive there that the last block present (before the first not in the
    /// index) certifies ([`Holder::since`]): its match is every block present. The walk
    /// never counts it again (its `matched` is past every block left) and stops once
    /// the others stop. Returns how many it settled. Cost: one lookup per block left and
    /// one pass over one block's holders, instead of a pass over every block's holders.
    ///
    /// Equal to the walk's result, for any sequence of records, evictions and forgets: a
    /// certified holder was sent the whole chain by one `record` (chained hashes: its
    /// last block fixes every earlier one), which put it among the holders of every
    /// earlier block at positions no older than the last one's, and no such entry has
    /// been dropped since (it would have been made again with a later `born`); a holder
    /// leaves an entry otherwise only through `forget`, which removes it from the last
    /// block too. (Concurrent ones can differ: a `forget`, or an eviction between two
    /// sends of the chain, racing a `record` of the same replica may leave it in the
    /// last block and not in an earlier one; the certificate then counts what that
    /// `record` sent, as the replica was.)
    fn certify(&self, blocks: &[u64], from: usize, newest: u32, tab: &mut [Slot]) -> u32 {
        let mut newest = newest;
        let mut present = from;
        for h in &blocks[from..] {
            let shard = self.shards[shard_of(*h)].lock();
            let Some(entry) = shard.get(h) else { break };
            newest = newest.max(entry.born);
            present += 1;
        }
        if present == from {
            return 0;
        }
        let last = blocks[present - 1];
        let shard = self.shards[shard_of(last)].lock();
        // Gone since the pass above (a concurrent eviction): no certificates.
        let Some(entry) = shard.get(&last) else {
            return 0;
        };
        settle(entry, tab, from as u32, present as u32, newest)
    }

    /// Splits candidate `slots` into those presumed to hold block `hash` and the rest.
    fn split(&self, hash: u64, tab: &[Slot], slots: &[u32]) -> (Vec<u32>, Vec<u32>) {
        let shard = self.shards[shard_of(hash)].lock();
        let Some(entry) = shard.get(&hash) else {
            return (Vec::new(), slots.to_vec());
        };
        slots.iter().partition(|&&s| {
            entry.holders().any(|hd| {
                tab.get(hd.replica as usize)
                    .is_some_and(|t| t.slot == s && t.holds(hd))
            })
        })
    }

    /// `slots` hold checkpoint `lo` and not checkpoint `hi` (`lo < hi`; `hi` may be one
    /// past the last checkpoint before the chain's last block, which they do not hold):
    /// sets each one's match to one past the last recorded block it holds, halving the
    /// interval per lookup, then probing the (at most `CHECKPOINT_STRIDE − 1`) blocks
    /// after its last checkpoint for a shorter chain's end, latest first.
    fn bisect(
        &self,
        blocks: &[u64],
        tab: &[Slot],
        slots: Vec<u32>,
        lo: usize,
        hi: usize,
        out: &mut [u32],
    ) {
        if slots.is_empty() {
            return;
        }
        if hi - lo <= 1 {
            let base = checkpoint(lo);
            let end = (base + CHECKPOINT_STRIDE - 1).min(blocks.len() - 2);
            let mut rest = slots;
            for j in (base + 1..=end).rev() {
                if rest.is_empty() {
                    return;
                }
                let (held, not) = self.split(blocks[j], tab, &rest);
                for s in held {
                    out[s as usize] = j as u32 + 1;
                }
                rest = not;
            }
            for s in rest {
                out[s as usize] = base as u32 + 1;
            }
            return;
        }
        let mid = lo + (hi - lo) / 2;
        let (held, not) = self.split(blocks[checkpoint(mid)], tab, &slots);
        self.bisect(blocks, tab, held, mid, hi, out);
        self.bisect(blocks, tab, not, lo, mid, out);
    }

    /// Records that `blocks` were sent to the replica of `cursor`, of which the first
    /// `matched` were (presumed) cache hits. Returns the replica's new cursor value.
    ///
    /// Each shard is locked once per call, its blocks taken in the call's order: the
    /// per-block lock's atomics serialised the table lookups (a 128k-token prompt of new
    /// blocks is ≈ 7,600 inserts, each mostly a cache miss). A shard's state after the
    /// call is what block-by-block order gives: its inserts and its drop come in the same
    /// order; only the epoch another shard's drop bumps in between may be read earlier
    /// or later, which moves a certificate's validity, never its safety.
    pub fn record(&self, cursor: &AtomicU64, replica: u32, blocks: &[u64], matched: usize) -> u64 {
        let misses = blocks.len().saturating_sub(matched) as u64;
        let base = cursor.fetch_add(misses, Relaxed);
        let tick = self.clock.fetch_add(1, Relaxed);
        // Read before any block goes in: an entry this call joins that is dropped later
        // is dropped after a bump past it (the shard's lock orders the two).
        let since = since_tag(self.epoch.load(Relaxed));
        let put = |shard: &mut Shard, s: usize, i: usize| {
            let h = &blocks[i];
            // Hits are touched at the new cursor (just used). Misses take fresh
            // positions, the first miss the newest: vLLM frees a request's blocks
            // tail first, so a chain's tail is evicted before its head and what is
            // held is a prefix.
            let seq = if i < matched {
                base + misses
            } else {
                base + misses - 1 - (i - matched) as u64
            };
            let holder = Holder {
                replica,
                since,
                seq,
            };
            // Make room before a new key goes in, so the table never grows past its
            // cap.
            if shard.len() >= self.limits[s].load(Relaxed) && !shard.contains_key(h) {
                let draw = self.epoch.fetch_add(1, Relaxed) + 1;
                self.dropped[s].store(draw, Relaxed);
                Self::shrink(shard, self.shard_cap);
                self.limits[s].store(limit(self.shard_cap, s, draw), Relaxed);
            }
            shard
                .entry(*h)
                .and_modify(|e| {
                    e.touched = tick;
                    e.hold(holder);
                })
                .or_insert_with(|| Entry::new(holder, tick, born_tag(self.epoch.load(Relaxed))));
        };
        let len = blocks.len();
        // A short chain's blocks mostly fall in distinct shards (64 blocks share one
        // in ≈ 64·63/2/256 ≈ 8 pairs): grouping would save a few locks for two passes
        // over the 256 shards and a buffer, so each block takes its shard's lock in turn.
        if len <= GROUP_RECORD_BLOCKS {
            for (i, h) in blocks.iter().enumerate() {
                let s = shard_of(*h);
                put(&mut self.shards[s].lock(), s, i);
            }
            return base + misses;
        }
        // The blocks' indices grouped by shard, each group in call order (a counting sort).
        // Only the blocks a record keeps ([`recorded`]).
        let kept = || {
            blocks
                .iter()
                .enumerate()
                .filter(move |&(i, _)| recorded(i, len))
        };
        let mut starts = [0u32; SHARDS + 1];
        for (_, h) in kept() {
            starts[shard_of(*h) + 1] += 1;
        }
        for s in 0..SHARDS {
            starts[s + 1] += starts[s];
        }
        let mut next = starts;
        let mut grouped = vec![0u32; starts[SHARDS] as usize];
        for (i, h) in kept() {
            let s = shard_of(*h);
            grouped[next[s] as usize] = i as u32;
            next[s] += 1;
        }
        for s in 0..SHARDS {
            let group = &grouped[starts[s] as usize..starts[s + 1] as usize];
            if group.is_empty() {
                continue;
            }
            let mut shard = self.shards[s].lock();
            for &i in group {
                put(&mut shard, s, i as usize);
            }
        }
        base + misses
    }

    /// Drops the least recently touched quarter of a shard, into a fresh table: erasing
    /// in place leaves tombstones, and a table whose tombstones use up its free slots
    /// while it is over half full doubles instead of rehashing (measured: 107 bytes per
    /// entry instead of 77 at a million blocks). Cost O(cap), once per cap/4 inserts.
    fn shrink(shard: &mut Shard, cap: usize) {
        let mut ticks: Vec<u64> = shard.values().map(|e| e.touched).collect();
        let q = ticks.len() / 4;
        let (_, cut, _) = ticks.select_nth_unstable(q);
        let cut = *cut;
        let mut fresh = Shard::with_capacity_and_hasher(cap, shard.hasher().clone());
        fresh.extend(shard.drain().filter(|(_, e)| e.touched > cut));
        *shard = fresh;
    }

    /// Forgets a replica everywhere (it left the fleet).
    pub fn forget(&self, replica: u32) {
        for s in &self.shards {
            s.lock().retain(|_, e| e.release(replica));
        }
    }

    /// Entries held (for metrics).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain of `n` distinct, well-mixed block hashes (block `j` is `j + 1` mixed).
    fn chain_of(n: u64) -> Vec<u64> {
        (0..n)
            .map(|j| (j + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect()
    }

    fn cur(replica: u32, c: &AtomicU64, capacity: u64) -> Cursor {
        Cursor {
            replica,
            seq: c.load(Relaxed),
            capacity,
        }
    }

    /// Chained hashes of blocks with these contents, as [`crate::blocks::chain`] gives
    /// them: a block's hash fixes every earlier block's.
    fn chained(contents: &[u64]) -> Vec<u64> {
        contents
            .iter()
            .scan(0x6865_6164u64, |parent, c| {
                *parent = (*parent ^ c)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .rotate_left(29);
                Some(*parent)
            })
            .collect()
    }

    #[test]
    fn longest_prefix_per_replica() {
        let idx = PrefixIndex::new(1 << 16);
        let (c0, c1) = (AtomicU64::new(0), AtomicU64::new(0));
        idx.record(&c0, 0, &chained(&[1, 2, 3, 4]), 0);
        idx.record(&c1, 1, &chained(&[1, 2, 9]), 0);
        let mut out = [0u32; 2];
        let cursors = [cur(0, &c0, 100), cur(1, &c1, 100)];
        idx.match_lengths(&chained(&[1, 2, 3, 4, 5]), &cursors, &mut out);
        assert_eq!(out, [4, 2]);
        // The whole chain held: settled by its last block.
        idx.match_lengths(&chained(&[1, 2, 3, 4]), &cursors, &mut out);
        assert_eq!(out, [4, 2]);
        idx.match_lengths(&chained(&[7, 2, 3]), &cursors, &mut out);
        assert_eq!(out, [0, 0]);
    }

    #[test]
    fn blocks_age_out_after_capacity_misses() {
        let idx = PrefixIndex::new(1 << 16);
        let c = AtomicU64::new(0);
        idx.record(&c, 0, &[1, 2], 0);
        // 10 more blocks of other content on a replica that holds 8.
        idx.record(&c, 0, &(100..110).collect::<Vec<_>>(), 0);
        let mut out = [0u32; 1];
        idx.match_lengths(&[1, 2], &[cur(0, &c, 8)], &mut out);
        assert_eq!(out, [0]);
        idx.match_lengths(&[1, 2], &[cur(0, &c, 64)], &mut out);
        assert_eq!(out, [2]);
    }

    #[test]
    fn hits_refresh_without_advancing_cursor() {
        let idx = PrefixIndex::new(1 << 16);
        let c = AtomicU64::new(0);
        idx.record(&c, 0, &[1, 2, 3], 0);
        let after_first = c.load(Relaxed);
        idx.record(&c, 0, &[1, 2, 3], 3);
        assert_eq!(c.load(Relaxed), after_first);
    }

    /// Long prompts of new blocks fill every shard at the same pace; the shards must
    /// not all drop their quarter in the same request (each drop is O(cap / shards)).
    #[test]
    fn shards_filled_together_drop_apart() {
        let idx = PrefixIndex::new(SHARDS * 512);
        let c = AtomicU64::new(0);
        let (mut most, mut total) = (0, 0);
        for i in 0..400u64 {
            // ≈ 1,850 blocks kept of each ([`recorded`]).
            let blocks: Vec<u64> = (0..14_000)
                .map(|j| (i * 100_000 + j).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .collect();
            let before = idx.epoch.load(Relaxed);
            idx.record(&c, 0, &blocks, 0);
            let drops = idx.epoch.load(Relaxed) - before;
            most = most.max(drops);
            total += drops;
        }
        assert!(total >= 4 * SHARDS as u64, "{total} drops");
        assert!(
            most <= SHARDS as u64 / 3,
            "{most} of {SHARDS} shards dropped in one request"
        );
        assert!(idx.len() <= SHARDS * 512, "{}", idx.len());
    }

    #[test]
    fn memory_stays_bounded() {
        let idx = PrefixIndex::new(SHARDS * 64);
        let c = AtomicU64::new(0);
        for i in 0..100u64 {
            let blocks: Vec<u64> = (0..64)
                .map(|j| (i * 1000 + j).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .collect();
            idx.record(&c, 0, &blocks, 0);
        }
        assert!(idx.len() <= SHARDS * 64 + SHARDS, "{}", idx.len());
        // The newest blocks survive.
        let newest: Vec<u64> = (0..64u64)
            .map(|j| (99 * 1000 + j).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let mut out = [0u32; 1];
        idx.match_lengths(&newest, &[cur(0, &c, u64::MAX)], &mut out);
        assert!(out[0] > 0);
    }

    /// A conversation-like chain far past the exact head: bisection finds every
    /// replica's depth, as the block-by-block walk does.
    #[test]
    fn long_chains_match_by_bisection_like_the_exact_walk() {
        let idx = PrefixIndex::new(1 << 16);
        let chain = chain_of(3_000);
        let cs: Vec<AtomicU64> = (0..5).map(|_| AtomicU64::new(0)).collect();
        let held = [3_000usize, 2_000, 100, EXACT_HEAD_BLOCKS + 1, 0];
        for (r, &n) in held.iter().enumerate() {
            idx.record(&cs[r], r as u32, &chain[..n], 0);
        }
        let cursors: Vec<Cursor> = (0..5).map(|r| cur(r as u32, &cs[r], u64::MAX)).collect();
        let (mut fast, mut exact) = ([0u32; 5], [0u32; 5]);
        idx.match_lengths(&chain, &cursors, &mut fast);
        idx.match_lengths_exact(&chain, &cursors, &mut exact);
        assert_eq!(fast, [3_000, 2_000, 100, EXACT_HEAD_BLOCKS as u32 + 1, 0]);
        assert_eq!(fast, exact);
        // A longer prompt than anyone holds: nobody matches past what they were sent.
        let mut longer = chain.clone();
        longer.push(7);
        idx.match_lengths(&longer, &cursors, &mut fast);
        assert_eq!(fast, [3_000, 2_000, 100, EXACT_HEAD_BLOCKS as u32 + 1, 0]);
    }

    /// Past the exact head a record keeps the checkpoints and the chain's end: a
    /// 7,600-block prompt of new blocks is 1,062 entries, not 7,600.
    #[test]
    fn a_long_record_keeps_the_head_the_checkpoints_and_the_end() {
        let idx = PrefixIndex::new(1 << 16);
        let c = AtomicU64::new(0);
        let chain = chain_of(7_600);
        idx.record(&c, 0, &chain, 0);
        assert_eq!(idx.len(), 128 + (7_600 - 128) / CHECKPOINT_STRIDE);
        // The cursor counts every block sent (the replica computes them all).
        assert_eq!(c.load(Relaxed), 7_600);
        idx.record(&c, 0, &chain[..7_597], 0);
        assert_eq!(
            idx.len(),
            128 + (7_600 - 128) / CHECKPOINT_STRIDE + 1,
            "its end"
        );
    }

    /// What sparse records cost a match: a prompt parting from a held chain inside a
    /// stride is matched to the checkpoint before (fewer than `CHECKPOINT_STRIDE`
    /// blocks short), one parting at a checkpoint or extending a held chain (a
    /// conversation's next turn) is matched exactly.
    #[test]
    fn a_match_past_the_head_stops_at_a_recorded_block() {
        let idx = PrefixIndex::new(1 << 16);
        let chain = chain_of(3_000);
        let cs: Vec<AtomicU64> = (0..2).map(|_| AtomicU64::new(0)).collect();
        idx.record(&cs[0], 0, &chain, 0);
        idx.record(&cs[1], 1, &chain[..1_003], 0);
        let cursors: Vec<Cursor> = (0..2).map(|r| cur(r as u32, &cs[r], u64::MAX)).collect();
        let parted = |shared: usize| -> Vec<u64> {
            let mut p = chain[..shared].to_vec();
            p.extend((0..500u64).map(|j| (j + 77) << 20));
            p
        };
        let mut out = [0u32; 2];
        // Parts at 1,005: checkpoint 999 is the last recorded block held by both; 1,002
        // ends replica 1's chain.
        idx.match_lengths(&parted(1_005), &cursors, &mut out);
        assert_eq!(out, [1_000, 1_003]);
        // Parts right after checkpoint 1,007: exact for replica 0.
        idx.match_lengths(&parted(1_008), &cursors, &mut out);
        assert_eq!(out, [1_008, 1_003]);
        // The next turn of replica 1's conversation: its whole chain.
        idx.match_lengths(&chain[..2_000], &cursors, &mut out);
        assert_eq!(out, [2_000, 1_003]);
        for shared in [130, 1_005, 1_008, 2_999] {
            let mut exact = [0u32; 2];
            idx.match_lengths(&parted(shared), &cursors, &mut out);
            idx.match_lengths_exact(&parted(shared), &cursors, &mut exact);
            assert_eq!(out, exact);
            assert!(
                shared - (out[0] as usize) < CHECKPOINT_STRIDE,
                "{shared}: {out:?}"
            );
        }
    }

    proptest::proptest! {
        /// Replicas sent prefixes of one chain (matched as the router matches them, so
        /// later sends refresh earlier heads) between unrelated content that ages
        /// them out: however much each can hold, bisection agrees with the exact walk.
        #[test]
        fn bisection_agrees_with_the_exact_walk(
            sends in proptest::collection::vec((0usize..4, 0usize..1_200, 0usize..900), 1..10),
            caps in proptest::collection::vec(1u64..2_500, 4),
            len in 1usize..1_300,
        ) {
            let idx = PrefixIndex::new(1 << 18);
            let chain: Vec<u64> = (0..1_300u64)
                .map(|j| (j + 7).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .collect();
            let cs: Vec<AtomicU64> = (0..4).map(|_| AtomicU64::new(0)).collect();
            let cursors = |cs: &[AtomicU64]| -> Vec<Cursor> {
                (0..4).map(|r| cur(r as u32, &cs[r], caps[r])).collect()
            };
            for (k, &(r, n, other)) in sends.iter().enumerate() {
                let mut m = [0u32; 4];
                idx.match_lengths_exact(&chain[..n], &cursors(&cs), &mut m);
                idx.record(&cs[r], r as u32, &chain[..n], m[r] as usize);
                let filler: Vec<u64> = (0..other as u64)
                    .map(|j| ((k as u64 + 1) << 40 | j).wrapping_mul(0xD6E8_FEB8_6659_FD93))
                    .collect();
                idx.record(&cs[r], r as u32, &filler, 0);
            }
            let (mut fast, mut exact) = ([0u32; 4], [0u32; 4]);
            idx.match_lengths(&chain[..len], &cursors(&cs), &mut fast);
            idx.match_lengths_exact(&chain[..len], &cursors(&cs), &mut exact);
            proptest::prop_assert_eq!(fast, exact);
        }
    }

    /// Each candidate's match, block by block from its own holders: what the walk's
    /// shared pass over every block's holders must give.
    fn one_by_one(idx: &PrefixIndex, blocks: &[u64], cursors: &[Cursor]) -> Vec<u32> {
        cursors
            .iter()
            .map(|c| {
                blocks
                    .iter()
                    .take_while(|h| {
                        idx.shards[shard_of(**h)].lock().get(*h).is_some_and(|e| {
                            e.holders().any(|hd| {
                                hd.replica == c.replica && c.seq.saturating_sub(hd.seq) < c.capacity
                            })
                        })
                    })
                    .count() as u32
            })
            .collect()
    }

    proptest::proptest! {
        /// Replicas sent overlapping prefixes, some not candidates, candidates in any
        /// order: the walk matches each candidate as a walk of its own would.
        #[test]
        fn the_walk_matches_each_candidate_alone(
            sends in proptest::collection::vec((0u32..8, 0usize..60, 0usize..40), 1..16),
            caps in proptest::collection::vec(1u64..120, 8),
            picked in proptest::sample::subsequence((0u32..8).collect::<Vec<_>>(), 0..8),
            reversed: bool,
            len in 0usize..70,
        ) {
            let idx = PrefixIndex::new(1 << 14);
            let chain: Vec<u64> = (0..70u64)
                .map(|j| (j + 3).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .collect();
            let cs: Vec<AtomicU64> = (0..8).map(|_| AtomicU64::new(0)).collect();
            for (k, &(r, n, other)) in sends.iter().enumerate() {
                idx.record(&cs[r as usize], r, &chain[..n], 0);
                let filler: Vec<u64> = (0..other as u64)
                    .map(|j| ((k as u64 + 1) << 40 | j).wrapping_mul(0xD6E8_FEB8_6659_FD93))
                    .collect();
                idx.record(&cs[r as usize], r, &filler, 0);
            }
            let mut cursors: Vec<Cursor> = picked
                .iter()
                .map(|&r| cur(r, &cs[r as usize], caps[r as usize]))
                .collect();
            if reversed {
                cursors.reverse();
            }
            let mut out = vec![0u32; cursors.len()];
            idx.match_lengths_exact(&chain[..len], &cursors, &mut out);
            proptest::prop_assert_eq!(out, one_by_one(&idx, &chain[..len], &cursors));
        }
    }

    proptest::proptest! {
        /// A small index that evicts often (up to 400 filler blocks a send, ≈ 14 entries a
        /// shard; and forgets replicas): holders certified by their chain's last block,
        /// before or during the walk, match exactly what a walk of their own finds, also
        /// where an earlier block was evicted and made again by another replica.
        #[test]
        fn certified_holders_match_as_the_walk_does_through_evictions(
            ops in proptest::collection::vec((0u32..6, 0usize..3, 1usize..40, 0usize..400, 0u8..20), 1..40),
            caps in proptest::collection::vec(1u64..200, 6),
            len in 0usize..40,
        ) {
            let idx = PrefixIndex::new(SHARDS * 16);
            let chains: Vec<Vec<u64>> = (0..3u64)
                .map(|c| {
                    (0..40u64)
                        .map(|j| ((c + 1) << 32 | j).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                        .collect()
                })
                .collect();
            let cs: Vec<AtomicU64> = (0..6).map(|_| AtomicU64::new(0)).collect();
            for (k, &(r, c, n, other, forget)) in ops.iter().enumerate() {
                if forget == 0 {
                    idx.forget(r);
                    continue;
                }
                idx.record(&cs[r as usize], r, &chains[c][..n], 0);
                let filler: Vec<u64> = (0..other as u64)
                    .map(|j| ((k as u64 + 1) << 40 | j).wrapping_mul(0xD6E8_FEB8_6659_FD93))
                    .collect();
                idx.record(&cs[r as usize], r, &filler, 0);
            }
            let cursors: Vec<Cursor> =
                (0..6).map(|r| cur(r, &cs[r as usize], caps[r as usize])).collect();
            for chain in &chains {
                // Certifying from the first alive candidate, as the router does, and
                // never (the plain walk).
                let (mut out, mut dflt, mut plain) =
                    (vec![0u32; 6], vec![0u32; 6], vec![0u32; 6]);
                idx.walk_with(&chain[..len], &cursors, &mut out, 1);
                idx.walk_with(&chain[..len], &cursors, &mut dflt, CERTIFY_MIN_ALIVE);
                idx.walk_with(&chain[..len], &cursors, &mut plain, u32::MAX);
                proptest::prop_assert_eq!(&out, &plain);
                proptest::prop_assert_eq!(&dflt, &plain);
                proptest::prop_assert_eq!(out, one_by_one(&idx, &chain[..len], &cursors));
            }
        }
    }

    /// A replica missing from a middle block (evicted, then made again by another
    /// replica) is not certified by the last block it still holds: it is walked.
    #[test]
    fn an_evicted_middle_block_voids_the_certificate() {
        let idx = PrefixIndex::new(1 << 10);
        let chain: Vec<u64> = (1..=8u64)
            .map(|j| j.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let (c0, c1) = (AtomicU64::new(0), AtomicU64::new(0));
        idx.record(&c0, 0, &chain, 0);
        // Block 3 is dropped (as an eviction would) and made again by replica 1 alone.
        {
            let s = shard_of(chain[3]);
            let mut shard = idx.shards[s].lock();
            let draw = idx.epoch.fetch_add(1, Relaxed) + 1;
            idx.dropped[s].store(draw, Relaxed);
            shard.remove(&chain[3]);
        }
        idx.record(&c1, 1, &chain[..4], 0);
        let mut out = [0u32; 2];
        let cursors = [cur(0, &c0, u64::MAX), cur(1, &c1, u64::MAX)];
        idx.walk_with(&chain, &cursors, &mut out, 1);
        assert_eq!(out, [3, 4]);
        // Sent the chain again, replica 0 holds all of it.
        idx.record(&c0, 0, &chain, 8);
        let cursors = [cur(0, &c0, u64::MAX), cur(1, &c1, u64::MAX)];
        idx.walk_with(&chain, &cursors, &mut out, 1);
        assert_eq!(out, [8, 4]);
    }

    #[test]
    fn forget_removes_a_replica() {
        let idx = PrefixIndex::new(1 << 10);
        let c = AtomicU64::new(0);
        idx.record(&c, 3, &[5, 6], 0);
        idx.forget(3);
        assert!(idx.is_empty());
    }
}
