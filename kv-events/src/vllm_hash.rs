//! vLLM v1's own block hashes, reproduced: `hash_block_tokens(hash_fn, parent,
//! tokens, extra_keys)` = `hash_fn((parent or NONE_HASH, tuple(tokens), extra_keys))`.
//!
//! - `sha256` (vLLM's default `--prefix-caching-hash-algo`): SHA-256 of
//!   `pickle.dumps(obj, protocol=5)`; this module writes the exact bytes CPython's
//!   pickler writes for that tuple (PROTO 5, one FRAME, SHORT_BINBYTES + MEMOIZE, the
//!   token tuple as MARK…TUPLE (TUPLE1-3 when short) of BININT1/BININT2/BININT, None,
//!   TUPLE3, STOP).
//! - `sha256_cbor`: SHA-256 of canonical CBOR of the same triple.
//! - `NONE_HASH = hash_fn(seed)`, the seed being `PYTHONHASHSEED` when set, else
//!   `"vllm-none-hash"` for these cryptographic algorithms (vLLM ≥ 0.2x); so two
//!   engines with the same algorithm and seed agree, and so does this code.
//! - Not reproducible: `xxhash`/`xxhash_cbor` without `PYTHONHASHSEED` (the engine
//!   draws a random seed per process), and blocks with extra keys (LoRA, multimodal,
//!   cache salt, prompt embeddings) — [`hash_block`] handles `extra_keys = None`
//!   only. For those the index keys on [`crate::chain`] over the events' token ids.
//!
//! Checked against vectors produced by vLLM 0.32.0's own functions (tests below).

use sha2::{Digest, Sha256};

/// A vLLM block hash (32 bytes of SHA-256).
pub type VllmBlockHash = [u8; 32];

/// The seed vLLM derives `NONE_HASH` from when `PYTHONHASHSEED` is unset.
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// The `--prefix-caching-hash-algo` values this module reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VllmHashAlgo {
    Sha256,
    Sha256Cbor,
}

impl VllmHashAlgo {
    /// Parses vLLM's spelling (`sha256`, `sha256_cbor`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sha256" => Some(Self::Sha256),
            "sha256_cbor" => Some(Self::Sha256Cbor),
            _ => None,
        }
    }
}

/// Inputs this module cannot serialise as CPython would.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum VllmHashError {
    #[error("token id {0} exceeds a 32-bit signed int (pickle would use LONG1)")]
    TokenTooLarge(u32),
    #[error("block of {0} tokens exceeds one pickle frame (64 KiB)")]
    BlockTooLarge(usize),
}

/// `NONE_HASH` for `algo` and `seed` (see module docs).
pub fn none_hash(algo: VllmHashAlgo, seed: &str) -> VllmBlockHash {
    let s = seed.as_bytes();
    let body = match algo {
        VllmHashAlgo::Sha256 => {
            let mut b = Vec::with_capacity(s.len() + 8);
            if s.len() < 256 {
                b.push(0x8c); // SHORT_BINUNICODE
                b.push(s.len() as u8);
            } else {
                b.push(b'X'); // BINUNICODE
                b.extend_from_slice(&(s.len() as u32).to_le_bytes());
            }
            b.extend_from_slice(s);
            b.push(0x94); // MEMOIZE
            b.push(b'.');
            framed(b)
        }
        VllmHashAlgo::Sha256Cbor => {
            let mut b = Vec::with_capacity(s.len() + 9);
            cbor_head(&mut b, 3, s.len() as u64);
            b.extend_from_slice(s);
            b
        }
    };
    Sha256::digest(&body).into()
}

/// `PROTO 5` + one `FRAME` holding `body` (CPython frames anything ≥ 4 bytes).
fn framed(body: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 11);
    out.extend_from_slice(&[0x80, 5, 0x95]);
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn cbor_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    if n < 24 {
        out.push(m | n as u8);
    } else if n < 256 {
        out.extend_from_slice(&[m | 24, n as u8]);
    } else if n < 65_536 {
        out.push(m | 25);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n < (1 << 32) {
        out.push(m | 26);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        out.push(m | 27);
        out.extend_from_slice(&n.to_be_bytes());
    }
}

/// The serialised `(parent, tuple(tokens), None)` that vLLM hashes.
pub fn serialise_block(
    algo: VllmHashAlgo,
    parent: &VllmBlockHash,
    tokens: &[u32],
) -> Result<Vec<u8>, VllmHashError> {
    if let Some(&t) = tokens.iter().find(|t| **t > i32::MAX as u32) {
        return Err(VllmHashError::TokenTooLarge(t));
    }
    match algo {
        VllmHashAlgo::Sha256 => {
            if tokens.len() * 5 + 64 > 64 * 1024 {
                return Err(VllmHashError::BlockTooLarge(tokens.len()));
            }
            let mut b = Vec::with_capacity(tokens.len() * 3 + 48);
            b.extend_from_slice(&[b'C', 32]); // SHORT_BINBYTES
            b.extend_from_slice(parent);
            b.push(0x94);
            let short = tokens.len() <= 3;
            if !short {
                b.push(b'('); // MARK
            }
            for &t in tokens {
                if t < 256 {
                    b.extend_from_slice(&[b'K', t as u8]);
                } else if t < 65_536 {
                    b.push(b'M');
                    b.extend_from_slice(&(t as u16).to_le_bytes());
                } else {
                    b.push(b'J');
                    b.extend_from_slice(&(t as i32).to_le_bytes());
                }
            }
            match tokens.len() {
                0 => b.push(b')'), // EMPTY_TUPLE, not memoized
                1 => b.extend_from_slice(&[0x85, 0x94]),
                2 => b.extend_from_slice(&[0x86, 0x94]),
                3 => b.extend_from_slice(&[0x87, 0x94]),
                _ => b.extend_from_slice(&[b't', 0x94]),
            }
            b.extend_from_slice(&[b'N', 0x87, 0x94, b'.']);
            Ok(framed(b))
        }
        VllmHashAlgo::Sha256Cbor => {
            let mut b = Vec::with_capacity(tokens.len() * 3 + 40);
            b.extend_from_slice(&[0x83, 0x58, 32]);
            b.extend_from_slice(parent);
            cbor_head(&mut b, 4, tokens.len() as u64);
            for &t in tokens {
                cbor_head(&mut b, 0, u64::from(t));
            }
            b.push(0xf6);
            Ok(b)
        }
    }
}

/// The integer form vLLM publishes by default (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`
/// = 1): the hash's low 64 bits, i.e. its last 8 bytes big-endian.
pub fn external_int(h: &VllmBlockHash) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&h[24..]);
    u64::from_be_bytes(b)
}

/// vLLM's `hash_block_tokens` for a block without extra keys.
pub fn hash_block(
    algo: VllmHashAlgo,
    parent: &VllmBlockHash,
    tokens: &[u32],
) -> Result<VllmBlockHash, VllmHashError> {
    Ok(Sha256::digest(serialise_block(algo, parent, tokens)?).into())
}

/// The engine's hashes of a prompt's full blocks (no LoRA, no multimodal input).
pub fn prompt_hashes(
    algo: VllmHashAlgo,
    seed: &str,
    tokens: &[u32],
    block_size: usize,
) -> Result<Vec<VllmBlockHash>, VllmHashError> {
    let mut parent = none_hash(algo, seed);
    tokens
        .chunks_exact(block_size.max(1))
        .map(|b| {
            parent = hash_block(algo, &parent, b)?;
            Ok(parent)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Vectors from vLLM 0.32.0: `init_none_hash(sha256)`, `hash_block_tokens(...)`,
    /// `pickle.dumps(..., protocol=5)`, `cbor2.dumps(..., canonical=True)`.
    const NONE_SHA256: &str = "066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d71198";
    const H1: &str = "b1bdb84c40e30190f50cb343f03308ea5a7350a3737218f2c102464dbe767670";
    const H2: &str = "9c9f0f984490730634c350bf43a36773a15da5bb4075fab6b3f5ef5c90aad0ce";
    const P1: &str = "8005956a000000000000004320066b1e8987e027138e98701c46128929378935f9b6cd1549105ae6b4f0d7119894284b004b014b024b034b044b054b064b074b084b094b0a4b0b4b0c4b0d4b0e4b0f4b104b114b124b134b144b154b164b174b184b194b1a4b1b4b1c4b1d4b1e4b1f74944e87942e";
    const NONE_CBOR: &str = "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0";
    const C1: &str = "30653d0f357fa985ff3562ec776f5216ffbff896fa64a7fa05860120ecc90928";
    const C2: &str = "da8465ace28d19fed30efb07cd8d41e50f5df8f6814b647754cde90724ba62ef";

    fn toks2() -> Vec<u32> {
        let mut t = vec![1, 255, 256, 65535, 65536, 4095, (1 << 31) - 1];
        t.extend(300..325);
        t
    }

    #[test]
    fn sha256_pickle_matches_vllm() {
        let a = VllmHashAlgo::Sha256;
        let none = none_hash(a, DEFAULT_NONE_HASH_SEED);
        assert_eq!(hex(&none), NONE_SHA256);
        let first: Vec<u32> = (0..32).collect();
        assert_eq!(hex(&serialise_block(a, &none, &first).expect("ok")), P1);
        let h = prompt_hashes(a, DEFAULT_NONE_HASH_SEED, &first, 32).expect("ok");
        assert_eq!(hex(&h[0]), H1);
        let h2 = hash_block(a, &h[0], &toks2()).expect("ok");
        assert_eq!(hex(&h2), H2);
        // int.from_bytes(h2, "big") & (2**64 - 1)
        assert_eq!(external_int(&h2), 0xb3f5_ef5c_90aa_d0ce);
    }

    #[test]
    fn sha256_cbor_matches_vllm() {
        let a = VllmHashAlgo::Sha256Cbor;
        let none = none_hash(a, DEFAULT_NONE_HASH_SEED);
        assert_eq!(hex(&none), NONE_CBOR);
        let c1 = hash_block(a, &none, &(0..32).collect::<Vec<u32>>()).expect("ok");
        assert_eq!(hex(&c1), C1);
        assert_eq!(hex(&hash_block(a, &c1, &toks2()).expect("ok")), C2);
    }

    #[test]
    fn unrepresentable_inputs_are_errors() {
        let none = [0u8; 32];
        assert_eq!(
            hash_block(VllmHashAlgo::Sha256, &none, &[u32::MAX]),
            Err(VllmHashError::TokenTooLarge(u32::MAX))
        );
        assert!(hash_block(VllmHashAlgo::Sha256, &none, &vec![1; 20_000]).is_err());
        assert_eq!(VllmHashAlgo::parse("builtin"), None);
    }
}
