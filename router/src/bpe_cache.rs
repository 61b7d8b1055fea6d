//! Exact tiktoken BPE ids of prompt text that reuse the ids of segments already seen
//! (the cache and its cut rule: [`crate::segment_cache`]).
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
//! Cost: a miss costs BPE on the segment, ≈ 0.04 ms per KB of English for cl100k here.

use std::ops::Deref;

use tiktoken_rs::CoreBPE;

use crate::segment_cache::SegmentCache;

/// A tiktoken vocabulary with its segment cache.
pub struct CachedBpe {
    bpe: CoreBPE,
    cache: SegmentCache,
}

impl CachedBpe {
    pub fn new(bpe: CoreBPE) -> Self {
        Self::with_capacity(bpe, crate::segment_cache::MAX_CACHED_TOKENS)
    }

    /// As [`CachedBpe::new`], holding at most about `max_tokens` ids.
    pub fn with_capacity(bpe: CoreBPE, max_tokens: usize) -> Self {
        Self {
            bpe,
            cache: SegmentCache::with_capacity(max_tokens),
        }
    }

    /// The ids `encode_ordinary(text)` gives, reusing cached segments.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.cache
            .encode(text, |seg| Some(self.bpe.encode_ordinary(seg)))
            .unwrap_or_default()
    }

    /// The uncached tokenizer (for comparison).
    pub fn encode_whole(&self, text: &str) -> Vec<u32> {
        self.bpe.encode_ordinary(text)
    }
}

/// The cache's counters and size.
impl Deref for CachedBpe {
    type Target = SegmentCache;
    fn deref(&self) -> &SegmentCache {
        &self.cache
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment_cache::{MAX_SEGMENT_BYTES, SHARDS, segments};
    use proptest::prelude::*;
    use std::sync::atomic::Ordering::Relaxed;

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
            b_cost < 2 * MAX_SEGMENT_BYTES as u64 + 64,
            "{b_cost} of {}",
            b.len()
        );
        assert!(tok.reused_bytes.load(Relaxed) as usize >= system.len() - 2 * MAX_SEGMENT_BYTES);
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
