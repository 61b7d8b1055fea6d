//! A deterministic, fast hash map for u64 keys (replica and class ids).
//!
//! std's SipHash with random keys costs ~20 ns per lookup and iterates in a random order;
//! the predictor wants a few-ns lookup on the hot path and a reproducible iteration order
//! (simulations must be deterministic for a given seed). Keys are ids, not attacker input
//! that could be chosen to collide.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// splitmix64 finaliser over the written words.
#[derive(Default, Clone, Copy)]
pub struct MixHasher(u64);

impl Hasher for MixHasher {
    #[inline]
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }
}

/// HashMap keyed by ids with [`MixHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;
