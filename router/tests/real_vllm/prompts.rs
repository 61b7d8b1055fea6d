//! Deterministic prompt text for the real-vLLM suite.
//!
//! Common English words chosen by a seeded generator: the tiny model's byte-level BPE
//! turns them into about 4.4 characters per token (measured with vLLM's `/tokenize`),
//! close to the router's 4-bytes-per-token estimator. Every prompt starts with a
//! per-process nonce so a rerun against the same servers never finds the previous
//! run's prefixes in their caches.

use std::sync::OnceLock;

const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "by", "this", "are", "from", "or", "at", "an", "have", "not", "which", "but", "all", "were",
    "can", "has", "more", "one", "their", "been", "if", "will", "would", "there", "when", "who",
    "so", "what", "about", "out", "also", "other", "into", "only", "than", "its", "some", "time",
    "these", "may", "most", "then", "any", "such", "over", "new", "first", "could", "after", "two",
    "like", "our", "many", "where", "those", "way", "well", "even", "because", "through", "much",
    "before", "each", "long", "here", "both", "while", "under", "might", "last", "great", "year",
    "own", "same", "still", "should", "being", "water", "house", "world", "light", "number",
    "sound", "point", "place", "group", "given", "order", "part", "public", "state",
];

/// Characters per token of this text under the tiny model's tokenizer (measured).
pub const CHARS_PER_TOKEN: f64 = 4.4;

/// A tag unique to this test process.
pub fn nonce() -> &'static str {
    static N: OnceLock<String> = OnceLock::new();
    N.get_or_init(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        format!("run{:x}", (t as u64) ^ ((std::process::id() as u64) << 32))
    })
}

/// About `tokens` tokens of text for `seed`, starting with the process nonce and `tag`.
pub fn text(tag: &str, seed: u64, tokens: usize) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let target = (tokens as f64 * CHARS_PER_TOKEN) as usize;
    let mut s = format!("{} {tag}", nonce());
    while s.len() < target {
        // xorshift64*: small, deterministic, good enough for word choice.
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        s.push(' ');
        s.push_str(WORDS[(r >> 33) as usize % WORDS.len()]);
    }
    s
}
