//! Prefix blocks: a prompt's chained block hashes, the keys of the prefix index.
//!
//! Invariant: equal leading content gives equal leading block hashes, because each
//! block's hash is seeded with its parent's (a chain), so a match on block `i` implies
//! a match on every block before it. The seed is fixed, so every node agrees.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of the first block in every chain (any constant; fixed so all nodes agree).
const CHAIN_SEED: u64 = 0x6865_6164_726f_6f6d; // "headroom"

/// What routing needs to know about a prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptShape {
    /// Prompt tokens (exact with a real tokenizer or token ids, estimated otherwise).
    pub tokens: u32,
    /// Chained hashes of the prompt's full prefix blocks, in order.
    pub blocks: Vec<u64>,
    /// The prompt's token ids exactly as the engine will see them, kept only when the
    /// host matches them against the engines' KV events (`None` otherwise).
    pub ids: Option<std::sync::Arc<[u32]>>,
}

/// Hashes `units` in chunks of `chunk` items into a chain, at most `max_blocks` blocks.
pub fn chain<T: Copy>(
    units: &[T],
    chunk: usize,
    max_blocks: usize,
    as_bytes: impl Fn(&[T]) -> Vec<u8>,
) -> Vec<u64> {
    let mut out = Vec::with_capacity((units.len() / chunk.max(1)).min(max_blocks));
    let mut parent = CHAIN_SEED;
    for block in units.chunks_exact(chunk.max(1)).take(max_blocks) {
        parent = xxh3_64_with_seed(&as_bytes(block), parent);
        out.push(parent);
    }
    out
}

/// Shape of a prompt given as token ids.
pub fn shape_of_ids(ids: &[u32], block_tokens: usize, max_blocks: usize) -> PromptShape {
    PromptShape {
        tokens: u32::try_from(ids.len()).unwrap_or(u32::MAX),
        blocks: chain(ids, block_tokens, max_blocks, |b| {
            b.iter().flat_map(|t| t.to_le_bytes()).collect()
        }),
        ids: None,
    }
}
