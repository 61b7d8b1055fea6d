//! The HTTP request a workload [`Request`] becomes.
//!
//! The prompt is sent as token ids synthesized from the request's hash ids
//! ([`tokens_for_hash_ids`]), so requests sharing hash ids share prompt prefixes token
//! for token and a prefix-caching engine (or the emulator) hits its cache exactly where
//! the trace says. Blocks the trace leaves uncovered get ids unique to the request.
//!
//! Output length: the body carries the trace's `output_tokens` in the emulator-only
//! field `emulator_output_tokens` (the emulator stops there; real engines ignore it)
//! and asks for `max_tokens = max(2 × output, 256)` within the context window, as the
//! simulator does — so a router, which reads `max_tokens`, does not learn the true
//! length from the request.

use headroom_engine::tokens_for_hash_ids;
use serde::Serialize;

use crate::workload::Request;

/// Top bit set: synthetic ids never collide with a trace's (small) hash ids.
const UNIQUE_ID_BASE: u64 = 1 << 63;

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// Common English words, one BPE token each in most vocabularies: text prompts map
/// every token id to one of them, so equal id prefixes stay equal text prefixes.
const WORDS: [&str; 128] = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "out", "up", "into", "do",
    "any", "your", "what", "has", "man", "could", "also", "than", "first", "been", "its", "time",
    "new", "some", "them", "these", "may", "other", "then", "two", "my", "about", "over", "such",
    "our", "like", "only", "most", "made", "after", "work", "well", "how", "good", "very", "make",
    "world", "still", "own", "see", "men", "long", "here", "between", "both", "life", "being",
    "under", "never", "day", "same", "another", "know", "while", "last", "might", "us", "great",
    "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take",
    "three", "place", "water", "small", "found", "home", "light",
];

/// How prompts are sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PromptForm {
    /// Token ids (vLLM, SGLang engines and the emulator accept them).
    #[default]
    Ids,
    /// Text, one word per token id (for routers that accept only strings).
    Text,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Prompt<'a> {
    Ids(&'a [u32]),
    Text(String),
}

#[derive(Serialize)]
struct CompletionBody<'a> {
    model: &'a str,
    prompt: Prompt<'a>,
    max_tokens: u32,
    emulator_output_tokens: u32,
    stream: bool,
    stream_options: StreamOptions,
}

/// Prompt token ids for `r`: its hash ids' tokens, padded with request-unique blocks
/// when the trace's ids do not cover `input_tokens` (at least one token).
pub fn prompt_tokens(r: &Request) -> Vec<u32> {
    let input = r.input_tokens.max(1);
    let per_id = r.block_tokens.max(1);
    let needed = input.div_ceil(per_id) as usize;
    let mut ids: Vec<u64> = r.hash_ids.iter().copied().take(needed).collect();
    let mut k = 0u64;
    while ids.len() < needed {
        ids.push(UNIQUE_ID_BASE | (r.id << 24) | k);
        k += 1;
    }
    // Covered by construction, so the error branch cannot be taken; fall back to a
    // constant prompt rather than panic.
    tokens_for_hash_ids(&ids, input, per_id).unwrap_or_else(|_| vec![1; input as usize])
}

/// `max_tokens` sent for `r`: twice its output length, at least 256 (what a client
/// that does not know the answer's length would ask for), within the context window.
pub fn max_tokens(r: &Request, max_model_len: Option<u32>) -> u32 {
    let out = r.output_tokens.max(1);
    let want = (out.saturating_mul(2)).max(256);
    match max_model_len {
        Some(ctx) => {
            let room = ctx.saturating_sub(r.input_tokens.max(1));
            want.min(room).max(out.min(room)).max(1)
        }
        None => want,
    }
}

/// The JSON body of a streaming `/v1/completions` request for `r`.
pub fn completion_body(
    r: &Request,
    model: &str,
    max_model_len: Option<u32>,
    vocab: Option<u32>,
    form: PromptForm,
) -> Vec<u8> {
    let mut prompt = prompt_tokens(r);
    // A real model rejects ids past its vocabulary; folding is deterministic, so shared
    // prefixes stay shared.
    if let Some(v) = vocab.filter(|v| *v > 0) {
        prompt.iter_mut().for_each(|t| *t %= v);
    }
    let text;
    let body = CompletionBody {
        model,
        prompt: match form {
            PromptForm::Ids => Prompt::Ids(&prompt),
            PromptForm::Text => {
                text = prompt
                    .iter()
                    .map(|t| WORDS[*t as usize % WORDS.len()])
                    .collect::<Vec<_>>()
                    .join(" ");
                Prompt::Text(text)
            }
        },
        max_tokens: max_tokens(r, max_model_len),
        emulator_output_tokens: r.output_tokens.max(1),
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
    };
    // Serialising plain integers and strings cannot fail.
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: u64, input: u32, hash_ids: Vec<u64>) -> Request {
        Request {
            id,
            arrival_s: 0.0,
            input_tokens: input,
            output_tokens: 9,
            hash_ids,
            block_tokens: 4,
            tenant: None,
            slo_ttft_ms: None,
            slo_tpot_ms: None,
        }
    }

    #[test]
    fn shared_hash_ids_share_prefix_tokens_only() {
        let a = prompt_tokens(&req(0, 10, vec![1, 2, 3]));
        let b = prompt_tokens(&req(1, 10, vec![1, 2, 7]));
        assert_eq!(a.len(), 10);
        assert_eq!(a[..8], b[..8]);
        assert_ne!(a[8..], b[8..]);
    }

    #[test]
    fn uncovered_blocks_are_unique_per_request() {
        let a = prompt_tokens(&req(0, 12, vec![]));
        let b = prompt_tokens(&req(1, 12, vec![]));
        assert_eq!(a.len(), 12);
        assert_ne!(a[..4], b[..4]);
        let c = prompt_tokens(&req(2, 12, vec![5]));
        let d = prompt_tokens(&req(3, 12, vec![5]));
        assert_eq!(c[..4], d[..4]);
        assert_ne!(c[4..], d[4..]);
        assert_eq!(prompt_tokens(&req(4, 0, vec![])).len(), 1);
    }

    #[test]
    fn body_hides_the_true_output_from_max_tokens() {
        let r = req(0, 10, vec![1, 2, 3]);
        let v: serde_json::Value =
            serde_json::from_slice(&completion_body(&r, "m", None, None, PromptForm::Ids))
                .expect("json");
        assert_eq!(v["max_tokens"], 256);
        assert_eq!(v["emulator_output_tokens"], 9);
        assert!(v.get("ignore_eos").is_none());
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["prompt"].as_array().map(Vec::len), Some(10));
        // Within the context window, never below the true output when it fits.
        assert_eq!(max_tokens(&r, Some(15)), 5);
        assert_eq!(max_tokens(&r, Some(100)), 90);
        assert_eq!(max_tokens(&r, Some(5)), 1);
    }

    #[test]
    fn vocab_folds_ids_and_keeps_shared_prefixes() {
        let body = |id| {
            let v: serde_json::Value = serde_json::from_slice(&completion_body(
                &req(id, 64, vec![7, 8]),
                "m",
                None,
                Some(50),
                PromptForm::Ids,
            ))
            .expect("json");
            v["prompt"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|t| t.as_u64().expect("id"))
                .collect::<Vec<_>>()
        };
        let (a, b) = (body(1), body(2));
        assert!(a.iter().chain(&b).all(|t| *t < 50));
        assert_eq!(a[..8], b[..8], "the shared hash ids give the same tokens");
    }

    #[test]
    fn text_prompts_keep_shared_prefixes_as_text() {
        let text = |id| {
            let v: serde_json::Value = serde_json::from_slice(&completion_body(
                &req(id, 64, vec![7, 8]),
                "m",
                None,
                None,
                PromptForm::Text,
            ))
            .expect("json");
            v["prompt"].as_str().expect("text").to_string()
        };
        let (a, b) = (text(1), text(2));
        assert_eq!(a.split(' ').count(), 64, "one word per token");
        let shared = |s: &str| s.split(' ').take(8).collect::<Vec<_>>().join(" ");
        assert_eq!(shared(&a), shared(&b));
        assert_ne!(a, b);
    }
}
