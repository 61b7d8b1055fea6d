//! A cache of the token ids of text segments already tokenized, so a long shared
//! system prompt is tokenized once, not per request. Used by every exact tokenizer
//! whose output on a text is the concatenation of its outputs on the text's segments
//! (tiktoken: [`crate::bpe_cache`]; Hugging Face: [`crate::hf_segments`]); each states
//! why its cuts are safe.
//!
//! The cut rule: a segment may end before byte `p` when `p` is a space with an ASCII
//! letter before and after it ([`safe_cut`]). Which safe positions are used depends on
//! the content, not on where the text starts: a segment ends at the first safe position
//! at least [`SEGMENT_BYTES`] after its start whose preceding 8 bytes hash into a
//! quarter of the range ([`content_cut`]: about every fourth word), or at the first safe
//! position past [`MAX_SEGMENT_BYTES`]. Two prompts that share a prefix share every
//! segment that ends inside it, and a passage that recurs at another offset (a
//! retrieved document, a system prompt behind a header of another length) shares its
//! segments from the first content cut inside it on, once both cut sequences meet one
//! (content-defined chunking's resynchronisation; test
//! `a_passage_at_another_offset_reuses_its_segments`). Each segment's ids are kept under
//! the 128-bit xxh3 of its bytes (a collision among 2^32 segments has probability
//! ≈ 2^-64).
//!
//! Cost: a hit costs one xxh3 pass (≈ 10 GB/s) and a copy of its ids; a miss costs the
//! tokenizer on the segment plus the insert. Memory is bounded: at most
//! [`MAX_CACHED_TOKENS`] ids (4 bytes each) plus ≈ 64 bytes of map entry per segment;
//! a shard over its share drops its least recently used half.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
};

use parking_lot::Mutex;
use xxhash_rust::xxh3::xxh3_128;

/// Minimum bytes per segment: small enough that a prompt's new tail costs little
/// tokenizing past what it shares (at 1 KB the tail's BPE was most of a 2 KB request's
/// routing cost), large enough that a hit (hash, lookup, copy) stays cheap. Segments
/// of English average 72–144 bytes (`segments_stay_within_their_bounds`). With 192
/// and a bound of 768, a 2 KB prompt varying at its end re-tokenized up to 768 bytes
/// a request: 64 / 256
/// took `proxy-overhead --vary-prompt suffix` from 0.141–0.152 to 0.098–0.104 ms CPU
/// per request with the HF tokenizer and 0.088 to 0.069–0.071 with cl100k; a 128k-token
/// prompt's whole path stayed at 1.28 ms (1.34 before).
pub const SEGMENT_BYTES: usize = 64;

/// A segment ends at the first safe position past this many bytes, whatever its
/// content (text whose words rarely hash to a cut: periodic or unusual text).
pub const MAX_SEGMENT_BYTES: usize = 256;

/// Ids held across all segments (16 MiB of `u32`s), per tokenizer.
pub const MAX_CACHED_TOKENS: usize = 4 << 20;

/// Shards of the map (each under its own lock).
pub const SHARDS: usize = 16;

struct Entry {
    ids: Arc<[u32]>,
    touched: u64,
}

#[derive(Default)]
struct Shard {
    map: HashMap<u128, Entry, foldhash::fast::RandomState>,
    tokens: usize,
}

/// Segments' ids under the hash of their bytes, for one tokenizer.
pub struct SegmentCache {
    shards: Vec<Mutex<Shard>>,
    clock: AtomicU64,
    /// Ids one shard may hold.
    shard_tokens: usize,
    /// Bytes of text that went through BPE (misses), for tests and `/debug`.
    pub encoded_bytes: AtomicU64,
    /// Bytes of text whose ids came from the cache.
    pub reused_bytes: AtomicU64,
}

impl Default for SegmentCache {
    fn default() -> Self {
        Self::with_capacity(MAX_CACHED_TOKENS)
    }
}

impl SegmentCache {
    /// A cache holding at most about `max_tokens` ids.
    pub fn with_capacity(max_tokens: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            clock: AtomicU64::new(0),
            shard_tokens: (max_tokens / SHARDS).max(1),
            encoded_bytes: AtomicU64::new(0),
            reused_bytes: AtomicU64::new(0),
        }
    }

    /// The ids of `text`: the cached ids of each of its segments, `encode` run on
    /// those not held. None if `encode` fails on a segment (nothing is cached for it).
    pub fn encode(
        &self,
        text: &str,
        encode: impl Fn(&str) -> Option<Vec<u32>>,
    ) -> Option<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3);
        self.encode_into(text, encode, &mut out)?;
        Some(out)
    }

    /// As [`SegmentCache::encode`], appending to `out` (so a caller can put ids before
    /// them without a second copy).
    pub fn encode_into(
        &self,
        text: &str,
        encode: impl Fn(&str) -> Option<Vec<u32>>,
        out: &mut Vec<u32>,
    ) -> Option<()> {
        for seg in segments(text) {
            self.encode_segment(seg, &encode, out)?;
        }
        Some(())
    }

    fn encode_segment(
        &self,
        seg: &str,
        encode: &impl Fn(&str) -> Option<Vec<u32>>,
        out: &mut Vec<u32>,
    ) -> Option<()> {
        let key = xxh3_128(seg.as_bytes());
        let shard = &self.shards[(key >> 124) as usize % SHARDS];
        let tick = self.clock.fetch_add(1, Relaxed);
        if let Some(e) = shard.lock().map.get_mut(&key) {
            e.touched = tick;
            out.extend_from_slice(&e.ids);
            self.reused_bytes.fetch_add(seg.len() as u64, Relaxed);
            return Some(());
        }
        // Encoded outside the lock: two requests missing the same segment both encode it.
        let ids: Arc<[u32]> = encode(seg)?.into();
        self.encoded_bytes.fetch_add(seg.len() as u64, Relaxed);
        out.extend_from_slice(&ids);
        let mut s = shard.lock();
        s.tokens += ids.len();
        if let Some(old) = s.map.insert(key, Entry { ids, touched: tick }) {
            s.tokens -= old.ids.len();
        }
        if s.tokens > self.shard_tokens {
            shrink(&mut s);
        }
        Some(())
    }

    /// Segments and ids held now.
    pub fn held(&self) -> (usize, usize) {
        self.shards.iter().fold((0, 0), |(n, t), s| {
            let s = s.lock();
            (n + s.map.len(), t + s.tokens)
        })
    }
}

/// Drops the least recently used half of a shard (amortised: a shard refills half its
/// share before the next sort).
fn shrink(s: &mut Shard) {
    let mut ticks: Vec<u64> = s.map.values().map(|e| e.touched).collect();
    let half = ticks.len() / 2;
    let (_, cut, _) = ticks.select_nth_unstable(half);
    let cut = *cut;
    s.map.retain(|_, e| e.touched > cut);
    s.tokens = s.map.values().map(|e| e.ids.len()).sum();
}

/// Whether a segment may end before byte `p` (see the module docs).
pub fn safe_cut(b: &[u8], p: usize) -> bool {
    p > 0 && p + 1 < b.len() && b[p] == b' ' && b[p - 1].is_ascii_alphabetic() && {
        b[p + 1].is_ascii_alphabetic()
    }
}

/// Whether the content before a safe position `p ≥ 8` makes it a cut: the 8 bytes before
/// it, mixed, fall in a quarter of the range.
pub fn content_cut(b: &[u8], p: usize) -> bool {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[p - 8..p]);
    u64::from_le_bytes(w).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 62 == 0
}

/// The text cut at safe positions (see the module docs); the pieces concatenate to the
/// text. Cuts fall on ASCII bytes, so on char boundaries.
pub fn segments(text: &str) -> impl Iterator<Item = &str> {
    let b = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= b.len() {
            return None;
        }
        let hard = start + MAX_SEGMENT_BYTES;
        let mut p = start + SEGMENT_BYTES;
        // Only a space can be a safe position: jump from space to space.
        while p < b.len() {
            match memchr::memchr(b' ', &b[p..]) {
                Some(off) => p += off,
                None => p = b.len(),
            }
            if p >= b.len() || (safe_cut(b, p) && (p >= hard || content_cut(b, p))) {
                break;
            }
            p += 1;
        }
        let end = p.min(b.len());
        let seg = &text[start..end];
        start = end;
        Some(seg)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    /// Non-periodic English-like text: words drawn by a fixed LCG.
    fn passage(seed: u64, bytes: usize) -> String {
        let words = [
            "the",
            "router",
            "sends",
            "each",
            "request",
            "where",
            "its",
            "objectives",
            "hold",
            "with",
            "headroom",
            "and",
            "learns",
            "from",
            "what",
            "engines",
            "report",
            "about",
            "prefill",
            "decode",
            "queues",
            "cache",
            "blocks",
            "tokens",
        ];
        let (mut x, mut out) = (seed, String::new());
        while out.len() < bytes {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            out.push_str(words[(x >> 33) as usize % words.len()]);
            out.push(if (x >> 20) % 11 == 0 { '.' } else { ' ' });
            if out.ends_with('.') {
                out.push(' ');
            }
        }
        out
    }

    /// Ids of a byte-per-token fake tokenizer: the cache's bookkeeping, not BPE's.
    fn bytes(s: &str) -> Option<Vec<u32>> {
        Some(s.bytes().map(u32::from).collect())
    }

    #[test]
    fn a_passage_at_another_offset_reuses_its_segments() {
        let cache = SegmentCache::default();
        let doc = passage(7, 12_000);
        let a = format!("Context for user one: {doc} What does it say?");
        let b = format!(
            "A different and much longer header, for another user entirely: {doc} Summarise."
        );
        assert_eq!(cache.encode(&a, bytes), bytes(&a));
        let before = cache.encoded_bytes.load(Relaxed);
        assert_eq!(cache.encode(&b, bytes), bytes(&b));
        let b_cost = cache.encoded_bytes.load(Relaxed) - before;
        assert!(
            b_cost < 3 * MAX_SEGMENT_BYTES as u64,
            "{b_cost} of {} bytes tokenized again",
            b.len()
        );
    }

    #[test]
    fn cuts_are_those_of_the_byte_by_byte_scan() {
        // The rule as first written: every position past the minimum is tried.
        fn scan(text: &str) -> Vec<&str> {
            let b = text.as_bytes();
            let (mut out, mut start) = (Vec::new(), 0);
            while start < b.len() {
                let hard = start + MAX_SEGMENT_BYTES;
                let mut p = start + SEGMENT_BYTES;
                while p < b.len() && !(safe_cut(b, p) && (p >= hard || content_cut(b, p))) {
                    p += 1;
                }
                let end = p.min(b.len());
                out.push(&text[start..end]);
                start = end;
            }
            out
        }
        let mut texts = vec![
            passage(5, 20_000),
            "x".repeat(3_000),
            format!("{} ", passage(6, 1_000)),
            " ".repeat(900),
        ];
        texts.push(texts[0].replace(' ', "  "));
        for t in &texts {
            assert_eq!(segments(t).collect::<Vec<_>>(), scan(t));
        }
    }

    #[test]
    fn segments_stay_within_their_bounds() {
        let text = passage(3, 50_000);
        let segs: Vec<&str> = segments(&text).collect();
        assert_eq!(segs.concat(), text);
        let body = &segs[..segs.len() - 1];
        assert!(body.iter().all(|s| s.len() >= SEGMENT_BYTES));
        // Past the hard bound only as far as the next safe position.
        assert!(body.iter().all(|s| s.len() < MAX_SEGMENT_BYTES + 64));
        // The minimum, then about every fourth word (≈ 6 bytes each here) cuts.
        let mean = text.len() / segs.len();
        assert!(
            (SEGMENT_BYTES + 8..SEGMENT_BYTES + 80).contains(&mean),
            "mean segment {mean} bytes"
        );
    }
}
