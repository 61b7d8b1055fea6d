//! Per-request scheduler state, kept in a slab inside the engine.
//!
//! Invariants: `table.len() == blocks_for(num_computed + scheduled)` while running
//! and 0 while waiting; `hashed ≤ table.len()`; `hashes[..prompt_hashes]` are the
//! caller's prompt hashes and later entries are per-request hashes of blocks that
//! hold generated tokens (or unhashed prompt tails), appended as blocks fill.

use super::hashing::mix64;
use super::types::FinishReason;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Vacant,
    Waiting,
    Running,
}

#[derive(Clone, Debug)]
pub(crate) struct ReqState {
    pub(crate) id: u64,
    pub(crate) phase: Phase,
    pub(crate) prompt: u32,
    pub(crate) max_output: u32,
    /// Tokens to generate before finishing, and the reason given then.
    pub(crate) stop_after: u32,
    pub(crate) stop_reason: FinishReason,
    pub(crate) hashes: Vec<u64>,
    /// Salt for hashes of blocks the caller did not hash (unique per submission).
    pub(crate) salt: u64,
    pub(crate) table: Vec<u32>,
    /// Blocks reserved for the whole sequence (`Admission::FullSequence`), else 0.
    pub(crate) reserve_blocks: u32,
    /// Leading blocks of `table` already offered to the prefix cache.
    pub(crate) hashed: u32,
    pub(crate) num_computed: u32,
    pub(crate) generated: u32,
    pub(crate) cached_tokens: u32,
    pub(crate) admitted_once: bool,
    pub(crate) arrival_s: f64,
    pub(crate) first_token_s: Option<f64>,
    pub(crate) last_token_s: f64,
}

impl ReqState {
    pub(crate) fn vacant() -> Self {
        ReqState {
            id: 0,
            phase: Phase::Vacant,
            prompt: 0,
            max_output: 0,
            stop_after: 0,
            stop_reason: FinishReason::Length,
            hashes: Vec::new(),
            salt: 0,
            table: Vec::new(),
            reserve_blocks: 0,
            hashed: 0,
            num_computed: 0,
            generated: 0,
            cached_tokens: 0,
            admitted_once: false,
            arrival_s: 0.0,
            first_token_s: None,
            last_token_s: 0.0,
        }
    }

    /// Tokens of the sequence so far (prompt + generated).
    #[inline]
    pub(crate) fn total(&self) -> u32 {
        self.prompt + self.generated
    }

    /// Blocks this running request may still grow into under its reservation.
    #[inline]
    pub(crate) fn growth_reserved(&self) -> u64 {
        u64::from(self.reserve_blocks.saturating_sub(self.table.len() as u32))
    }

    /// Hash of full block `j`, extending the per-request chain when needed.
    /// Requires `j ≤ hashes.len()` (blocks fill in order).
    pub(crate) fn hash_of_block(&mut self, j: usize) -> u64 {
        if j < self.hashes.len() {
            return self.hashes[j];
        }
        let parent = if j == 0 {
            self.salt
        } else {
            self.hashes[j - 1]
        };
        let h = mix64(parent ^ self.salt.rotate_left(17) ^ j as u64);
        self.hashes.push(h);
        h
    }
}
