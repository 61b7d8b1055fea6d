//! Exact tiktoken BPE ids of prompt text that reuse the ids of segments already seen,
//! so a long shared system prompt is tokenized once, not per request.
//!
//! Why it is exact: tiktoken's `encode_ordinary` splits the text with its
//! pre-tokenizer regex and runs BPE on each piece alone, so the ids of a text are the
//! concatenation of the ids of its pieces. We cut the text only at *safe* positions
//! `p`: an ASCII letter, then a space at `p`, then an ASCII letter. In both
//! cl100k's and o200k's patterns the alternatives that match letters consist of
//! letters, marks, an optional leading non-letter and an optional contraction, and
//! the whitespace alternatives match no letters, so no piece spans a letter followed
//! by a space: some piece ends at `p` and the next one (" word") starts there. No
//! alternative looks behind, and the only lookahead (`(?!\S)`) sees a space at `p`
//! as it sees the end of the text; so each segment tokenizes alone exactly as it does
//! inside the whole. `tests::segmented_equals_whole` checks that on a corpus and
//! `segments_agree_with_the_whole_text` on random text.
//!
//! Segments are cut at the first safe position at least [`SEGMENT_BYTES`] after the
//! previous cut, so the cuts depend only on the text before them: two prompts that
//! share a prefix share every segment that ends inside it. Each segment's ids are
//! kept under the 128-bit xxh3 of its bytes (a collision among 2^32 segments has
//! probability ≈ 2^-64).
//!
//! Cost: a hit costs one xxh3 pass (≈ 10 GB/s) and a copy of its ids; a miss costs
//! BPE on the segment (≈ 0.04 ms per KB of English for cl100k here) plus the insert.
//! Memory is bounded: at most [`MAX_CACHED_TOKENS`] ids (4 bytes each) plus ≈ 64
//! bytes of map entry per segment; a shard over its share drops its least recently
//! used half.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
};

use parking_lot::Mutex;
use tiktoken_rs::CoreBPE;
use xxhash_rust::xxh3::xxh3_128;

/// Minimum bytes per segment: small enough that a prompt's new tail costs at most
/// about this much BPE past what it shares (at 1 KB the tail's BPE was most of a 2 KB
/// request's routing cost), large enough that a hit (hash, lookup, copy) stays cheap
/// and the map small (≈ 64 ids per entry).
pub const SEGMENT_BYTES: usize = 256;

/// Ids held across all segments (16 MiB of `u32`s), per vocabulary.
pub const MAX_CACHED_TOKENS: usize = 4 << 20;

const SHARDS: usize = 16;

struct Entry {
    ids: Arc<[u32]>,
    touched: u64,
}

#[derive(Default)]
struct Shard {
    map: HashMap<u128, Entry, foldhash::fast::RandomState>,
    tokens: usize,
}

/// A tiktoken vocabulary with its segment cache.
pub struct CachedBpe {
    bpe: CoreBPE,
    shards: Vec<Mutex<Shard>>,
    clock: AtomicU64,
    /// Ids one shard may hold.
    shard_tokens: usize,
    /// Bytes of text that went through BPE (misses), for tests and `/debug`.
    pub encoded_bytes: AtomicU64,
    /// Bytes of text whose ids came from the cache.
    pub reused_bytes: AtomicU64,
}

impl CachedBpe {
    pub fn new(bpe: CoreBPE) -> Self {
        Self::with_capacity(bpe, MAX_CACHED_TOKENS)
    }

    /// As [`CachedBpe::new`], holding at most about `max_tokens` ids.
    pub fn with_capacity(bpe: CoreBPE, max_tokens: usize) -> Self {
        Self {
            bpe,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            clock: AtomicU64::new(0),
            shard_tokens: (max_tokens / SHARDS).max(1),
            encoded_bytes: AtomicU64::new(0),
            reused_bytes: AtomicU64::new(0),
        }
    }

    /// The ids `encode_ordinary(text)` gives, reusing cached segments.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3);
        for seg in segments(text) {
            self.encode_segment(seg, &mut out);
        }
        out
    }

    /// The uncached tokenizer (for comparison).
    pub fn encode_whole(&self, text: &str) -> Vec<u32> {
        self.bpe.encode_ordinary(text)
    }

    fn encode_segment(&self, seg: &str, out: &mut Vec<u32>) {
        let key = xxh3_128(seg.as_bytes());
        let shard = &self.shards[(key >> 124) as usize % SHARDS];
        let tick = self.clock.fetch_add(1, Relaxed);
        if let Some(e) = shard.lock().map.get_mut(&key) {
            e.touched = tick;
            out.extend_from_slice(&e.ids);
            self.reused_bytes.fetch_add(seg.len() as u64, Relaxed);
            return;
        }
        // BPE outside the lock: two requests missing the same segment both encode it.
        let ids: Arc<[u32]> = self.bpe.encode_ordinary(seg).into();
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
fn safe_cut(b: &[u8], p: usize) -> bool {
    p > 0 && p + 1 < b.len() && b[p] == b' ' && b[p - 1].is_ascii_alphabetic() && {
        b[p + 1].is_ascii_alphabetic()
    }
}

/// The text cut at safe positions at least [`SEGMENT_BYTES`] apart; the pieces
/// concatenate to the text. Cuts fall on ASCII bytes, so on char boundaries.
pub fn segments(text: &str) -> impl Iterator<Item = &str> {
    let b = text.as_bytes();
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= b.len() {
            return None;
        }
        let mut p = start + SEGMENT_BYTES;
        while p < b.len() && !safe_cut(b, p) {
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
    use proptest::prelude::*;

    fn cl100k() -> &'static CachedBpe {
        static T: std::sync::OnceLock<CachedBpe> = std::sync::OnceLock::new();
        T.get_or_init(|| CachedBpe::new(tiktoken_rs::cl100k_base().expect("cl100k")))
    }

    fn o200k() -> &'static CachedBpe {
        static T: std::sync::OnceLock<CachedBpe> = std::sync::OnceLock::new();
        T.get_or_init(|| CachedBpe::new(tiktoken_rs::o200k_base().expect("o200k")))
    }

    /// Prose, code, numbers, contractions, punctuation runs, odd whitespace and
    /// non-Latin scripts: every segmented encoding equals the whole one.
    #[test]
    fn segmented_equals_whole() {
        let parts = [
            "You are a helpful assistant. Answer briefly and don't make things up. ",
            "fn main() { let x = 12345678; println!(\"{x}\"); }\n",
            "It's 3.14159 o'clock;   they're   here!!!  ",
            "Ünïcödé wörds, 日本語のテキスト, and emoji 🙂🙂 mixed in. ",
            "CamelCaseWords and ALLCAPS Words with\ttabs\r\nand newlines\n\n",
            "a b c d e f g h i j k l m n o p ",
            "    indented    spaces before words   ",
            "'s 't 're 've 'm 'll 'd I'M YOU'RE ",
        ];
        for tok in [cl100k(), o200k()] {
            for k in 0..parts.len() {
                let mut text = String::new();
                let mut i = k;
                while text.len() < 16_000 {
                    text.push_str(parts[i % parts.len()]);
                    i = (i * 7 + 3) % 1_009;
                }
                assert!(segments(&text).count() > 10);
                assert_eq!(tok.encode(&text), tok.encode_whole(&text), "corpus {k}");
                // Again, from the cache.
                assert_eq!(tok.encode(&text), tok.encode_whole(&text), "cached {k}");
            }
        }
    }

    #[test]
    fn a_shared_prefix_is_tokenized_once() {
        let tok = CachedBpe::new(tiktoken_rs::cl100k_base().expect("cl100k"));
        let system = "Follow the policy below carefully and cite sources. ".repeat(400);
        let a = format!("{system}What is the capital of France?");
        let b = format!("{system}Summarize the policy in one line, please.");
        assert_eq!(tok.encode(&a), tok.encode_whole(&a));
        let after_a = tok.encoded_bytes.load(Relaxed);
        assert_eq!(tok.encode(&b), tok.encode_whole(&b));
        let b_cost = tok.encoded_bytes.load(Relaxed) - after_a;
        // b re-encodes only its last segment (what follows the last cut in the prefix).
        assert!(
            b_cost < 2 * SEGMENT_BYTES as u64 + 64,
            "{b_cost} of {}",
            b.len()
        );
        assert!(tok.reused_bytes.load(Relaxed) as usize >= system.len() - 2 * SEGMENT_BYTES);
    }

    #[test]
    fn memory_stays_bounded() {
        let cap = 20_000;
        let tok = CachedBpe::with_capacity(tiktoken_rs::cl100k_base().expect("cl100k"), cap);
        // Distinct texts of ≈ 1 KB (≈ 180 ids each) to ten times the cap.
        for i in 0..1_000 {
            let text = format!("{i} {}", "lorem ipsum dolor ".repeat(60));
            assert_eq!(tok.encode(&text), tok.encode_whole(&text));
        }
        let (_, held) = tok.held();
        assert!(held > 0 && held <= cap + cap / SHARDS + 400, "{held}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn segments_agree_with_the_whole_text(
            words in proptest::collection::vec(
                proptest::string::string_regex("[a-zA-Z]{1,8}|[ ]{1,3}|[0-9]{1,5}|[.,;!?'\"()-]{1,3}|\n|\t|é|日本|🙂")
                    .expect("regex"),
                100..1_200,
            )
        ) {
            let text: String = words.concat();
            let tok = cl100k();
            prop_assert_eq!(segments(&text).collect::<String>(), text.clone());
            prop_assert_eq!(tok.encode(&text), tok.encode_whole(&text));
        }
    }
}
