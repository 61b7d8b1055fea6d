//! Prefix-block hashing and deterministic token synthesis for trace replay.
//!
//! Invariants:
//! - A block hash is `xxh3_64_with_seed(le_bytes(block tokens), parent)`, with the
//!   chain starting at [`CHAIN_SEED`] (xor a salt, e.g. a LoRA adapter). So equal
//!   leading tokens give equal leading hashes, and a match on block `i` implies a
//!   match on every block before it. Only FULL blocks are hashed. The scheme is fixed
//!   (xxh3 is a specified algorithm with constant keys), hence stable across processes
//!   and releases; it is deliberately the same chain the router computes over token ids.
//! - [`tokens_for_hash_ids`] gives token `t` of hash id `h` as a pure function of
//!   `(h, t)`, so equal hash ids give equal tokens and equal engine block hashes.
//! - [`block_hashes_for_hash_ids`] returns exactly
//!   `block_hashes_for_tokens(&tokens_for_hash_ids(..), ..)` without materialising the
//!   token vector (proved by test).

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::error::EngineError;

/// Seed of every chain ("headroom" in ASCII); any constant works if all agree.
pub const CHAIN_SEED: u64 = 0x6865_6164_726f_6f6d;

/// Synthesized token ids stay below this (a valid id in cl100k/o200k/Llama-3 vocabs).
pub const SYNTH_VOCAB: u32 = 100_000;

/// Chain salt for a LoRA adapter (vLLM puts the adapter in the block hash's extra
/// keys, so the base model and each adapter never share cached blocks). Base = 0.
pub fn salt_for_adapter(adapter: Option<&str>) -> u64 {
    adapter.map_or(0, |name| xxh3_64_with_seed(name.as_bytes(), CHAIN_SEED))
}

/// Chained hashes of the full `block_size`-token blocks of `tokens` (base model).
pub fn block_hashes_for_tokens(tokens: &[u32], block_size: usize) -> Vec<u64> {
    block_hashes_for_tokens_salted(tokens, block_size, 0)
}

/// Like [`block_hashes_for_tokens`], with the chain seed xor `salt`.
pub fn block_hashes_for_tokens_salted(tokens: &[u32], block_size: usize, salt: u64) -> Vec<u64> {
    let bs = block_size.max(1);
    let mut out = Vec::with_capacity(tokens.len() / bs);
    let mut bytes = Vec::with_capacity(bs * 4);
    let mut parent = CHAIN_SEED ^ salt;
    for block in tokens.chunks_exact(bs) {
        bytes.clear();
        for t in block {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        parent = xxh3_64_with_seed(&bytes, parent);
        out.push(parent);
    }
    out
}

/// SplitMix64 finaliser: a fast, well-mixed bijection on u64.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Token at `offset` inside the block of trace hash id `hash_id`.
#[inline]
pub fn token_for_hash_id(hash_id: u64, offset: u32) -> u32 {
    token_from_id_seed(mix64(hash_id), offset)
}

/// [`token_for_hash_id`] with `mix64(hash_id)` hoisted out of per-token loops.
#[inline]
fn token_from_id_seed(id_seed: u64, offset: u32) -> u32 {
    (mix64(id_seed ^ u64::from(offset)) % u64::from(SYNTH_VOCAB)) as u32
}

fn check_cover(hash_ids: &[u64], input_len: u32, tokens_per_id: u32) -> Result<(), EngineError> {
    if tokens_per_id == 0 {
        return Err(EngineError::InvalidRequest(
            "tokens_per_id must be > 0".into(),
        ));
    }
    let cover = hash_ids.len() as u64 * u64::from(tokens_per_id);
    if u64::from(input_len) > cover {
        return Err(EngineError::InvalidRequest(format!(
            "input_len {input_len} exceeds {} hash ids x {tokens_per_id} tokens",
            hash_ids.len()
        )));
    }
    Ok(())
}

/// Prompt token ids for a trace row: `input_len` tokens, the `i`-th hash id standing
/// for tokens `[i·tokens_per_id, (i+1)·tokens_per_id)` (512 for Mooncake). Extra ids
/// past `input_len` are ignored; too few ids is an error.
pub fn tokens_for_hash_ids(
    hash_ids: &[u64],
    input_len: u32,
    tokens_per_id: u32,
) -> Result<Vec<u32>, EngineError> {
    check_cover(hash_ids, input_len, tokens_per_id)?;
    Ok((0..input_len)
        .map(|p| token_for_hash_id(hash_ids[(p / tokens_per_id) as usize], p % tokens_per_id))
        .collect())
}

/// Block hashes of the prompt that [`tokens_for_hash_ids`] would synthesize, computed
/// block by block with one reused buffer (no token vector).
pub fn block_hashes_for_hash_ids(
    hash_ids: &[u64],
    input_len: u32,
    tokens_per_id: u32,
    block_size: usize,
    salt: u64,
) -> Result<Vec<u64>, EngineError> {
    check_cover(hash_ids, input_len, tokens_per_id)?;
    let bs = block_size.max(1) as u32;
    let full = input_len / bs;
    let mut out = Vec::with_capacity(full as usize);
    let mut bytes = Vec::with_capacity(bs as usize * 4);
    let mut parent = CHAIN_SEED ^ salt;
    let (mut seed_idx, mut id_seed) = (usize::MAX, 0u64);
    for b in 0..full {
        bytes.clear();
        for p in b * bs..(b + 1) * bs {
            let idx = (p / tokens_per_id) as usize;
            if idx != seed_idx {
                (seed_idx, id_seed) = (idx, mix64(hash_ids[idx]));
            }
            let t = token_from_id_seed(id_seed, p % tokens_per_id);
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        parent = xxh3_64_with_seed(&bytes, parent);
        out.push(parent);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_path_equals_synthesized_tokens() {
        let ids = [7u64, 8, 9, 4242, 1];
        for (len, tpi, bs) in [
            (2100u32, 512u32, 16usize),
            (2048, 512, 16),
            (5, 512, 16),
            (45, 10, 16),
            (35, 7, 3),
        ] {
            let n_ids = len.div_ceil(tpi) as usize;
            let toks = tokens_for_hash_ids(&ids[..n_ids], len, tpi).expect("covered");
            assert_eq!(toks.len(), len as usize);
            let slow = block_hashes_for_tokens(&toks, bs);
            let fast = block_hashes_for_hash_ids(&ids[..n_ids], len, tpi, bs, 0).expect("covered");
            assert_eq!(slow, fast, "len {len} tpi {tpi} bs {bs}");
        }
    }

    #[test]
    fn equal_ids_share_prefix_hashes_and_differ_after() {
        let a = block_hashes_for_hash_ids(&[1, 2, 3], 1536, 512, 16, 0).expect("ok");
        let b = block_hashes_for_hash_ids(&[1, 2, 4], 1536, 512, 16, 0).expect("ok");
        assert_eq!(a.len(), 96);
        assert_eq!(a[..64], b[..64]);
        assert!(a[64..].iter().zip(&b[64..]).all(|(x, y)| x != y));
    }

    #[test]
    fn salt_separates_adapters() {
        let toks: Vec<u32> = (0..64).collect();
        let base = block_hashes_for_tokens(&toks, 16);
        let lora = block_hashes_for_tokens_salted(&toks, 16, salt_for_adapter(Some("sql")));
        assert_eq!(salt_for_adapter(None), 0);
        assert!(base.iter().zip(&lora).all(|(x, y)| x != y));
    }

    #[test]
    fn hashes_are_stable_constants() {
        // Pinned: a change of scheme breaks cross-process and router agreement.
        let h = block_hashes_for_tokens(&(0..16).collect::<Vec<u32>>(), 16);
        assert_eq!(h, vec![0x5313_4624_f925_e737]);
        let t = tokens_for_hash_ids(&[0, 1], 3, 2).expect("covered");
        assert_eq!(t, vec![47055, 32430, 24158]);
    }

    #[test]
    fn too_few_ids_is_an_error() {
        assert!(tokens_for_hash_ids(&[1], 513, 512).is_err());
        assert!(block_hashes_for_hash_ids(&[1], 10, 0, 16, 0).is_err());
    }
}
