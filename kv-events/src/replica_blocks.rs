//! One replica's blocks: the engine's block hashes mapped to Headroom chain keys,
//! and the application of decoded events to the [`BlockIndex`].
//!
//! Invariants:
//! - `map[engine key] = (chain key, copies)`; a chain key is in the index for this
//!   replica iff some engine key maps to it with `copies > 0` (vLLM may cache two
//!   copies of one block and then stores and removes each).
//! - A `BlockStored` whose parent is unknown (its parent was stored before the events
//!   this replica saw) is skipped and counted as orphaned: its chain key cannot be
//!   known, and skipping keeps the index a subset of the truth.
//! - Only the engine's own tier counts: `medium` `None` or `GPU` (vLLM's CPU platform
//!   also reports `GPU` for its KV cache), group `None` or 0. Other tiers and groups
//!   are counted and ignored.
//! - At most `max_blocks` engine keys: past that the stream is broken (an engine
//!   cannot hold more blocks than it has), so the caller resyncs.

use std::collections::HashMap;

use crate::chain::{chain_next, chain_root, salt_for_adapter};
use crate::index::{BlockIndex, ReplicaId};
use crate::wire::{BlockRemoved, BlockStored, KvEvent};

/// What applying events found, cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    pub clears: u64,
    /// Stored blocks skipped because their parent was unknown.
    pub orphaned_blocks: u64,
    /// Removals of blocks this replica was not known to hold.
    pub unknown_removals: u64,
    /// Events of another tier, group or block size, or with token ids that do not
    /// fill their blocks.
    pub ignored_events: u64,
}

/// Why a batch could not be applied and the replica must be resynced.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ApplyError {
    #[error("replica holds over {0} blocks")]
    TooManyBlocks(usize),
}

/// See the module docs.
pub struct ReplicaBlocks {
    id: ReplicaId,
    block_size: u32,
    max_blocks: usize,
    map: HashMap<u64, (u64, u32)>,
    stats: ApplyStats,
}

impl ReplicaBlocks {
    pub fn new(id: ReplicaId, block_size: u32, max_blocks: usize) -> Self {
        ReplicaBlocks {
            id,
            block_size: block_size.max(1),
            max_blocks: max_blocks.max(1),
            map: HashMap::new(),
            stats: ApplyStats::default(),
        }
    }

    pub fn id(&self) -> ReplicaId {
        self.id
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Distinct engine blocks known held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn stats(&self) -> ApplyStats {
        self.stats
    }

    /// Bytes allocated by the engine-key map.
    pub fn heap_bytes(&self) -> usize {
        // std's SwissTable: one control byte per bucket plus the (key, value) slot.
        self.map.capacity() * (std::mem::size_of::<(u64, (u64, u32))>() + 1)
    }

    /// The chain key the engine's block `engine_key` was filed under.
    pub fn chain_of(&self, engine_key: u64) -> Option<u64> {
        self.map.get(&engine_key).map(|(c, _)| *c)
    }

    /// Forgets every block (engine reset, restart or resync).
    pub fn clear(&mut self, index: &mut BlockIndex) {
        index.clear_keys(self.map.values().map(|(c, _)| *c), self.id);
        self.map.clear();
        self.map.shrink_to(1024);
    }

    /// Applies one event.
    pub fn apply(&mut self, index: &mut BlockIndex, ev: &KvEvent) -> Result<(), ApplyError> {
        match ev {
            KvEvent::Stored(s) => self.stored(index, s),
            KvEvent::Removed(r) => {
                self.removed(index, r);
                Ok(())
            }
            KvEvent::AllCleared => {
                self.stats.clears += 1;
                self.clear(index);
                Ok(())
            }
        }
    }

    fn ours(medium: Option<&str>, group: Option<i64>) -> bool {
        matches!(medium, None | Some("GPU")) && matches!(group, None | Some(0))
    }

    fn stored(&mut self, index: &mut BlockIndex, s: &BlockStored) -> Result<(), ApplyError> {
        let bs = s.block_size as usize;
        if !Self::ours(s.medium.as_deref(), s.group_idx)
            || s.block_size != self.block_size
            || s.token_ids.len() != s.block_hashes.len() * bs
        {
            self.stats.ignored_events += 1;
            return Ok(());
        }
        let mut parent = match &s.parent_block_hash {
            None => chain_root(salt_for_adapter(s.lora_name.as_deref())),
            Some(p) => match self.map.get(&p.key()) {
                Some((c, _)) => *c,
                None => {
                    self.stats.orphaned_blocks += s.block_hashes.len() as u64;
                    return Ok(());
                }
            },
        };
        for (h, toks) in s.block_hashes.iter().zip(s.token_ids.chunks_exact(bs)) {
            let chain = chain_next(parent, toks);
            let key = h.key();
            match self.map.get_mut(&key) {
                Some(v) => v.1 += 1,
                None => {
                    if self.map.len() >= self.max_blocks {
                        return Err(ApplyError::TooManyBlocks(self.max_blocks));
                    }
                    self.map.insert(key, (chain, 1));
                }
            }
            index.insert(chain, self.id);
            self.stats.stored_blocks += 1;
            parent = chain;
        }
        Ok(())
    }

    fn removed(&mut self, index: &mut BlockIndex, r: &BlockRemoved) {
        if !Self::ours(r.medium.as_deref(), r.group_idx) {
            self.stats.ignored_events += 1;
            return;
        }
        for h in &r.block_hashes {
            let key = h.key();
            match self.map.get_mut(&key) {
                Some(v) if v.1 > 1 => v.1 -= 1,
                Some(_) => {
                    if let Some((chain, _)) = self.map.remove(&key) {
                        index.remove(chain, self.id);
                    }
                }
                None => {
                    self.stats.unknown_removals += 1;
                    continue;
                }
            }
            self.stats.removed_blocks += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::prompt_chain;
    use crate::wire::ExternalHash;

    fn stored(hashes: &[u64], parent: Option<u64>, toks: &[u32]) -> KvEvent {
        KvEvent::Stored(BlockStored {
            block_hashes: hashes.iter().map(|h| ExternalHash::Int(*h)).collect(),
            parent_block_hash: parent.map(ExternalHash::Int),
            token_ids: toks.to_vec(),
            block_size: 4,
            medium: Some("GPU".into()),
            ..Default::default()
        })
    }

    fn removed(hashes: &[u64]) -> KvEvent {
        KvEvent::Removed(BlockRemoved {
            block_hashes: hashes.iter().map(|h| ExternalHash::Int(*h)).collect(),
            medium: Some("GPU".into()),
            group_idx: None,
        })
    }

    #[test]
    fn events_build_the_prompt_chain() {
        let id = ReplicaId::new(3).expect("id");
        let mut ix = BlockIndex::new(100);
        let mut rb = ReplicaBlocks::new(id, 4, 100);
        let toks: Vec<u32> = (0..12).collect();
        // Two events: blocks 0-1, then block 2 as a child of engine hash 11.
        rb.apply(&mut ix, &stored(&[10, 11], None, &toks[..8]))
            .expect("ok");
        rb.apply(&mut ix, &stored(&[12], Some(11), &toks[8..]))
            .expect("ok");
        let chain = prompt_chain(&toks, 4, 0);
        assert_eq!(ix.longest_prefix(&chain).blocks_for(id), 3);
        rb.apply(&mut ix, &removed(&[11])).expect("ok");
        assert_eq!(ix.longest_prefix(&chain).blocks_for(id), 1);
        // Orphan: parent 99 never seen.
        rb.apply(&mut ix, &stored(&[13], Some(99), &toks[..4]))
            .expect("ok");
        assert_eq!(rb.stats().orphaned_blocks, 1);
        rb.apply(&mut ix, &KvEvent::AllCleared).expect("ok");
        assert!(ix.is_empty() && rb.is_empty());
    }

    #[test]
    fn duplicate_copies_need_two_removals() {
        let id = ReplicaId::new(0).expect("id");
        let mut ix = BlockIndex::new(100);
        let mut rb = ReplicaBlocks::new(id, 4, 100);
        let ev = stored(&[1], None, &[1, 2, 3, 4]);
        rb.apply(&mut ix, &ev).expect("ok");
        rb.apply(&mut ix, &ev).expect("ok");
        rb.apply(&mut ix, &removed(&[1])).expect("ok");
        assert_eq!(ix.len(), 1);
        rb.apply(&mut ix, &removed(&[1])).expect("ok");
        assert_eq!(ix.len(), 0);
        rb.apply(&mut ix, &removed(&[1])).expect("ok");
        assert_eq!(rb.stats().unknown_removals, 1);
    }

    #[test]
    fn other_tiers_sizes_and_short_tokens_are_ignored() {
        let id = ReplicaId::new(0).expect("id");
        let mut ix = BlockIndex::new(100);
        let mut rb = ReplicaBlocks::new(id, 4, 100);
        let KvEvent::Stored(mut s) = stored(&[1], None, &[1, 2, 3, 4]) else {
            unreachable!()
        };
        s.medium = Some("CPU".into());
        rb.apply(&mut ix, &KvEvent::Stored(s.clone())).expect("ok");
        s.medium = None;
        s.block_size = 8;
        rb.apply(&mut ix, &KvEvent::Stored(s.clone())).expect("ok");
        s.block_size = 4;
        s.token_ids.pop();
        rb.apply(&mut ix, &KvEvent::Stored(s)).expect("ok");
        assert_eq!(rb.stats().ignored_events, 3);
        assert!(ix.is_empty());
    }

    #[test]
    fn over_the_block_cap_is_an_error() {
        let id = ReplicaId::new(0).expect("id");
        let mut ix = BlockIndex::new(100);
        let mut rb = ReplicaBlocks::new(id, 4, 1);
        rb.apply(&mut ix, &stored(&[1], None, &[1, 2, 3, 4]))
            .expect("ok");
        assert_eq!(
            rb.apply(&mut ix, &stored(&[2], None, &[5, 6, 7, 8])),
            Err(ApplyError::TooManyBlocks(1))
        );
    }
}
