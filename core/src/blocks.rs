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

/// Hashes `bytes` in chunks of `chunk` bytes into a chain, at most `max_blocks` blocks.
/// Cost: one xxh3 pass over the hashed bytes (≈ 10 GB/s), no allocation but the output.
pub fn chain(bytes: &[u8], chunk: usize, max_blocks: usize) -> Vec<u64> {
    let chunk = chunk.max(1);
    let mut out = Vec::with_capacity((bytes.len() / chunk).min(max_blocks));
    let mut parent = CHAIN_SEED;
    for block in bytes.chunks_exact(chunk).take(max_blocks) {
        parent = xxh3_64_with_seed(block, parent);
        out.push(parent);
    }
    out
}

/// Shape of a prompt given as token ids. Each block hashes its ids' little-endian
/// bytes (so every node and platform agrees), staged in one reused buffer.
pub fn shape_of_ids(ids: &[u32], block_tokens: usize, max_blocks: usize) -> PromptShape {
    let block_tokens = block_tokens.max(1);
    let mut blocks = Vec::with_capacity((ids.len() / block_tokens).min(max_blocks));
    let mut buf = Vec::with_capacity(block_tokens * 4);
    let mut parent = CHAIN_SEED;
    for block in ids.chunks_exact(block_tokens).take(max_blocks) {
        // The ids' little-endian bytes: in memory as they are on little-endian targets
        // (a copy per block was half of this function's time on a 128k-token prompt).
        let bytes: &[u8] = if cfg!(target_endian = "little") {
            zerocopy::IntoBytes::as_bytes(block)
        } else {
            buf.clear();
            for t in block {
                buf.extend_from_slice(&t.to_le_bytes());
            }
            &buf
        };
        parent = xxh3_64_with_seed(bytes, parent);
        blocks.push(parent);
    }
    PromptShape {
        tokens: u32::try_from(ids.len()).unwrap_or(u32::MAX),
        blocks,
        ids: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hashes are a wire format (peers' prefix deltas, request logs): pinned values
    /// of the first two blocks, computed by the original per-block-allocating code.
    #[test]
    fn block_hashes_are_stable() {
        let ids: Vec<u32> = (0..40).collect();
        let s = shape_of_ids(&ids, 16, 10);
        let mut bytes = Vec::new();
        for t in &ids[..16] {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        let first = xxh3_64_with_seed(&bytes, CHAIN_SEED);
        assert_eq!(s.blocks.len(), 2);
        assert_eq!(s.blocks[0], first);
        let text = b"0123456789abcdef0123456789abcdef!";
        assert_eq!(
            chain(text, 16, 5),
            vec![
                xxh3_64_with_seed(&text[..16], CHAIN_SEED),
                xxh3_64_with_seed(&text[16..32], xxh3_64_with_seed(&text[..16], CHAIN_SEED)),
            ]
        );
    }
}
