//! Which Hugging Face tokenizers may be run segment by segment with their ids cached
//! ([`crate::segment_cache`]), exactly, and the special tokens to put around the
//! segments' ids.
//!
//! A `tokenizers` encode is: split out the added tokens, normalize, pre-tokenize into
//! pieces, run the model (BPE...) on each piece alone, then post-process (add BOS...).
//! So the ids of a text are the concatenation of its segments' ids (post-processing
//! aside) when every cut `p` (an ASCII letter, a space at `p`, an ASCII letter:
//! [`crate::segment_cache::safe_cut`]) is a boundary of each stage and each stage
//! treats a segment as it treats that stretch inside the whole:
//!
//! - Added tokens: none may span a cut, so none holds a letter followed by a space,
//!   ends in a letter and swallows the whitespace after it (`rstrip`), or starts with
//!   whitespace and checks its neighbours (`single_word`: a segment starts at a space,
//!   whose left neighbour differs alone).
//! - Normalizer: none, or NFC. NFC never composes across a space (a starter that is no
//!   composition's second half), so NFC of the whole is the concatenation of NFC of
//!   the segments.
//! - Pre-tokenizer, one of:
//!   - `ByteLevel` with its regex (GPT-2's: `... ?\p{L}+ ...`), or a `Split` by
//!     Llama 3's or Qwen 2's pattern (cl100k's, with digits by threes or one by one)
//!     then `ByteLevel` without a regex. In all three the alternatives that take
//!     letters take no whitespace but one leading non-letter, and the whitespace ones
//!     no letters, so a piece ends before `p` and the next starts at `p` (" word");
//!     no alternative looks behind, and `(?!\S)` sees the space at `p` as it sees the
//!     end of a segment. `add_prefix_space` prepends only to a piece that does not
//!     start with a space, and every segment but the first starts with one.
//!   - `Metaspace` that splits: the space at `p` becomes `▁` and a piece starts at
//!     each `▁`; the prepend rule skips a piece that starts with `▁`.
//!
//!   Without a pre-tokenizer that cuts at spaces (Llama 2's legacy `Prepend` +
//!   `Replace` normalizer, `Metaspace` with `split: false`), BPE merges run across the
//!   whole text and no cut is provably safe: such tokenizers encode every prompt whole.
//! - Post-processor: it adds special tokens around the ids and changes none
//!   (`TemplateProcessing`, `ByteLevel`, `Roberta`...); the prefix and suffix it adds
//!   are read at load from two probes that must agree.
//!
//! The router's tests check the equality on the real-vLLM suite's tokenizer and on
//! variants of it for each accepted pre-tokenizer, on a corpus and on random text.

use serde_json::Value;

/// Llama 3's pre-tokenizer pattern (also Mistral's Tekken).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's (2.5, 3): as Llama 3's with one digit per piece.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Why a `tokenizer.json` may not be encoded segment by segment (see the module
/// docs); Ok when it may.
pub fn check(json: &Value) -> Result<(), String> {
    check_normalizer(&json["normalizer"])?;
    check_pre_tokenizer(&json["pre_tokenizer"])?;
    for t in json["added_tokens"].as_array().into_iter().flatten() {
        check_added(t)?;
    }
    Ok(())
}

fn kind(v: &Value) -> &str {
    v["type"].as_str().unwrap_or("")
}

fn flag(v: &Value, key: &str, default: bool) -> bool {
    v[key].as_bool().unwrap_or(default)
}

fn check_normalizer(n: &Value) -> Result<(), String> {
    match kind(n) {
        _ if n.is_null() => Ok(()),
        "NFC" => Ok(()),
        "Sequence" => {
            for m in n["normalizers"].as_array().into_iter().flatten() {
                check_normalizer(m)?;
            }
            Ok(())
        }
        other => Err(format!("normalizer {other}")),
    }
}

fn check_pre_tokenizer(p: &Value) -> Result<(), String> {
    match kind(p) {
        "ByteLevel" if flag(p, "use_regex", true) => Ok(()),
        "Metaspace" if flag(p, "split", true) && p["replacement"].as_str() == Some("▁") => Ok(()),
        "Sequence" => match p["pretokenizers"].as_array().map(Vec::as_slice) {
            Some([split, byte_level])
                if kind(split) == "Split"
                    && kind(byte_level) == "ByteLevel"
                    && !flag(byte_level, "use_regex", true)
                    && split["behavior"].as_str() == Some("Isolated")
                    && !flag(split, "invert", false)
                    && matches!(
                        split["pattern"]["Regex"].as_str(),
                        Some(LLAMA3_SPLIT | QWEN2_SPLIT)
                    ) =>
            {
                Ok(())
            }
            _ => {
                Err("pre-tokenizer sequence other than Split (Llama 3 / Qwen 2) + ByteLevel".into())
            }
        },
        _ if p.is_null() => Err("no pre-tokenizer".into()),
        other => Err(format!("pre-tokenizer {other} with these options")),
    }
}

fn check_added(t: &Value) -> Result<(), String> {
    let content = t["content"].as_str().unwrap_or("");
    let b = content.as_bytes();
    let letter_space = b
        .windows(2)
        .any(|w| w[0].is_ascii_alphabetic() && w[1] == b' ');
    let ends_in_word = content.chars().last().is_some_and(char::is_alphanumeric);
    let starts_blank = content.chars().next().is_some_and(char::is_whitespace);
    if letter_space
        || (flag(t, "rstrip", false) && ends_in_word)
        || (flag(t, "single_word", false) && starts_blank)
    {
        return Err(format!("added token {content:?} may span a cut"));
    }
    Ok(())
}

/// The special tokens a post-processor puts before and after a text's ids, from two
/// probes encoded with and without them; None if the probes disagree or the bare ids
/// are not found whole inside the full ones.
pub fn specials(encode: impl Fn(&str, bool) -> Option<Vec<u32>>) -> Option<(Vec<u32>, Vec<u32>)> {
    let mut found = None;
    for probe in ["x", "Hello world, it's 2024."] {
        let full = encode(probe, true)?;
        let bare = encode(probe, false)?;
        let at = (0..=full.len().checked_sub(bare.len())?)
            .find(|&k| full[k..k + bare.len()] == bare[..])?;
        let around = (full[..at].to_vec(), full[at + bare.len()..].to_vec());
        if found.as_ref().is_some_and(|f| *f != around) {
            return None;
        }
        found = Some(around);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::HfTokenizer;
    use proptest::prelude::*;
    use std::{path::Path, sync::atomic::Ordering::Relaxed};

    /// The real-vLLM suite's tokenizer.json (byte-level BPE, GPT-2's regex).
    fn tiny_json() -> Value {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../scripts/vllm/fixtures/tiny-llama-tokenizer.json");
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    }

    fn load(json: &Value) -> (tempfile::TempDir, HfTokenizer) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, serde_json::to_vec(json).unwrap()).unwrap();
        let tok = HfTokenizer::load(&path, None).unwrap();
        (dir, tok)
    }

    fn with(mut json: Value, key: &str, v: Value) -> Value {
        json[key] = v;
        json
    }

    fn split_then_bytes(pattern: &str) -> Value {
        serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]})
    }

    /// The tiny tokenizer and a variant for each other accepted pre-tokenizer.
    fn accepted() -> Vec<(&'static str, Value)> {
        let tiny = tiny_json();
        let prefix_space = serde_json::json!(
            {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true});
        let metaspace = serde_json::json!(
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true});
        vec![
            ("byte-level", tiny.clone()),
            (
                "byte-level, prefix space",
                with(tiny.clone(), "pre_tokenizer", prefix_space),
            ),
            (
                "llama3 + NFC",
                with(
                    with(
                        tiny.clone(),
                        "pre_tokenizer",
                        split_then_bytes(LLAMA3_SPLIT),
                    ),
                    "normalizer",
                    serde_json::json!({"type": "NFC"}),
                ),
            ),
            (
                "qwen2",
                with(tiny.clone(), "pre_tokenizer", split_then_bytes(QWEN2_SPLIT)),
            ),
            ("metaspace", with(tiny, "pre_tokenizer", metaspace)),
        ]
    }

    /// Prose, code, numbers, contractions, added tokens in the text, odd whitespace,
    /// combining marks and non-Latin scripts, to well past many segments.
    fn corpus(k: usize) -> String {
        let parts = [
            "You are a helpful assistant. Answer briefly and don't make things up. ",
            "<s>system\nFollow the rules.</s>\n<s>user\nHi there</s>\n",
            "fn main() { let x = 12345678; println!(\"{x}\"); }\n",
            "It's 3.14159 o'clock;   they're   here!!!  ",
            "Ünïcödé wörds, cafe\u{301} 日本語のテキスト, and emoji 🙂🙂 mixed in. ",
            "CamelCaseWords and ALLCAPS Words with\ttabs\r\nand newlines\n\n",
            "a b c d e f g h i j k l m n o p ",
            "    indented    spaces before words   ",
            "'s 't 're 've 'm 'll 'd I'M YOU'RE ",
        ];
        let mut text = String::new();
        let mut i = k;
        while text.len() < 12_000 {
            text.push_str(parts[i % parts.len()]);
            i = (i * 7 + 3) % 1_009;
        }
        text
    }

    #[test]
    fn segmented_equals_whole_for_each_accepted_pre_tokenizer() {
        for (name, json) in accepted() {
            let (_dir, tok) = load(&json);
            assert!(tok.segment_cache().is_some(), "{name}: not segmented");
            for k in 0..6 {
                let text = corpus(k);
                for special in [true, false] {
                    for pass in ["fresh", "cached"] {
                        assert_eq!(
                            tok.encode(&text, special),
                            tok.encode_whole(&text, special),
                            "{name}, corpus {k}, special {special}, {pass}"
                        );
                    }
                }
            }
            assert_eq!(tok.encode("", true), tok.encode_whole("", true), "{name}");
        }
    }

    #[test]
    fn tokenizers_without_safe_cuts_encode_whole() {
        let tiny = tiny_json();
        let mut rstrip = tiny.clone();
        rstrip["added_tokens"].as_array_mut().unwrap().push(
            serde_json::json!({"id": 4095, "content": "assistant", "single_word": false,
                "lstrip": false, "rstrip": true, "normalized": false, "special": true}),
        );
        let legacy_llama = with(
            with(tiny.clone(), "pre_tokenizer", Value::Null),
            "normalizer",
            serde_json::json!({"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": "▁"},
                {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}),
        );
        let cases = [
            (
                "metaspace without split",
                with(
                    tiny.clone(),
                    "pre_tokenizer",
                    serde_json::json!({"type": "Metaspace", "replacement": "▁",
                        "prepend_scheme": "first", "split": false}),
                ),
            ),
            ("legacy llama", legacy_llama),
            (
                "unknown split pattern",
                with(tiny.clone(), "pre_tokenizer", split_then_bytes(r"\S+|\s+")),
            ),
            ("rstrip added token", rstrip),
        ];
        for (name, json) in cases {
            let (_dir, tok) = load(&json);
            assert!(tok.segment_cache().is_none(), "{name}: segmented");
            let text = corpus(1);
            assert_eq!(
                tok.encode(&text, true),
                tok.encode_whole(&text, true),
                "{name}"
            );
        }
    }

    #[test]
    fn a_shared_system_prompt_is_tokenized_once() {
        let (_dir, tok) = load(&tiny_json());
        let system = "Follow the policy below carefully and cite sources. ".repeat(200);
        let a = format!("{system}What is the capital of France?");
        let b = format!("{system}Summarize the policy in one line, please.");
        assert_eq!(tok.encode(&a, true), tok.encode_whole(&a, true));
        let cache = tok.segment_cache().unwrap();
        let after_a = cache.encoded_bytes.load(Relaxed);
        assert_eq!(tok.encode(&b, true), tok.encode_whole(&b, true));
        let b_cost = cache.encoded_bytes.load(Relaxed) - after_a;
        let seg = crate::segment_cache::MAX_SEGMENT_BYTES as u64;
        assert!(b_cost < 2 * seg + 64, "{b_cost} of {}", b.len());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn segments_agree_with_the_whole_text(
            words in proptest::collection::vec(
                proptest::string::string_regex(
                    "[a-zA-Z]{1,8}|[ ]{1,3}|[0-9]{1,5}|[.,;!?'\"()-]{1,3}|\n|\t|é|日本|🙂|<s>|</s>",
                ).expect("regex"),
                100..1_200,
            )
        ) {
            static TOK: std::sync::OnceLock<(tempfile::TempDir, HfTokenizer)> =
                std::sync::OnceLock::new();
            let (_, tok) = TOK.get_or_init(|| load(&tiny_json()));
            let text: String = words.concat();
            prop_assert_eq!(tok.encode(&text, true), tok.encode_whole(&text, true));
        }
    }
}
