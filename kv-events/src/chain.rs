//! Headroom's block chain: the key the index files blocks under.
//!
//! `chain[i] = xxh3_64_with_seed(le_bytes(tokens of block i), chain[i-1])`, with
//! `chain[-1] = CHAIN_SEED ^ salt` (salt 0 for the base model, [`salt_for_adapter`]
//! for a LoRA adapter). Only full blocks are hashed. It is computed from token ids,
//! both for the events (`BlockStored.token_ids`) and for the router's prompts (its
//! own tokenizer output), so it agrees across replicas whatever hash algorithm or
//! seed each engine uses. It is the very scheme of the emulator's engine
//! (`headroom-bench` `engine::hashing`), so the emulator's block hashes equal it.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of every chain ("headroom" in ASCII).
pub const CHAIN_SEED: u64 = 0x6865_6164_726f_6f6d;

/// Chain salt for a LoRA adapter (the engine never shares blocks across adapters).
pub fn salt_for_adapter(adapter: Option<&str>) -> u64 {
    adapter.map_or(0, |name| xxh3_64_with_seed(name.as_bytes(), CHAIN_SEED))
}

/// The chain value before the first block.
pub fn chain_root(salt: u64) -> u64 {
    CHAIN_SEED ^ salt
}

/// The chain value of one full block after `parent`.
pub fn chain_next(parent: u64, block_tokens: &[u32]) -> u64 {
    // 128 tokens on the stack covers every common block size without allocating.
    let mut stack = [0u8; 512];
    if block_tokens.len() <= 128 {
        for (i, t) in block_tokens.iter().enumerate() {
            stack[i * 4..i * 4 + 4].copy_from_slice(&t.to_le_bytes());
        }
        return xxh3_64_with_seed(&stack[..block_tokens.len() * 4], parent);
    }
    let bytes: Vec<u8> = block_tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, parent)
}

/// The chain of a prompt's full `block_size`-token blocks.
pub fn prompt_chain(tokens: &[u32], block_size: usize, salt: u64) -> Vec<u64> {
    let bs = block_size.max(1);
    let mut parent = chain_root(salt);
    tokens
        .chunks_exact(bs)
        .map(|b| {
            parent = chain_next(parent, b);
            parent
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_to_the_emulator_engine_scheme() {
        // The same constant `headroom-bench`'s `hashes_are_stable_constants` pins.
        let h = prompt_chain(&(0..16).collect::<Vec<u32>>(), 16, 0);
        assert_eq!(h, vec![0x5313_4624_f925_e737]);
    }

    #[test]
    fn long_blocks_hash_like_short_ones() {
        let toks: Vec<u32> = (0..600).collect();
        let a = prompt_chain(&toks, 200, 0);
        let bytes: Vec<u8> = toks[..200].iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(a[0], xxh3_64_with_seed(&bytes, CHAIN_SEED));
        assert_eq!(a.len(), 3);
    }

    #[test]
    fn prefix_property_and_salt() {
        let a: Vec<u32> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 9999;
        let (ca, cb) = (prompt_chain(&a, 16, 0), prompt_chain(&b, 16, 0));
        assert_eq!(ca[..2], cb[..2]);
        assert!(ca[2..].iter().zip(&cb[2..]).all(|(x, y)| x != y));
        let lora = prompt_chain(&a, 16, salt_for_adapter(Some("sql")));
        assert!(ca.iter().zip(&lora).all(|(x, y)| x != y));
    }
}
