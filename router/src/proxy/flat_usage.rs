//! A streamed chunk's usage object read without a JSON parser, where it has the plain
//! shape engines send; anything else is left to `serde_json`.
//!
//! Why: the router asks engines for usage in every content chunk
//! (`continuous_usage_stats`, [`super::sse`]), so the scanner reads one usage object per
//! *token* on vLLM: through `serde_json` that is a parse per token beside the
//! transcript's ([`super::flat_choice`]).
//!
//! Invariant (tested against `serde_json` in `sse.rs`): where [`read`] returns `Some`,
//! the usage and the object's end are what the `serde_json` path gives. It accepts only
//! compact JSON (no whitespace) `{members}` whose members, in any order and each at
//! most once, are `prompt_tokens`, `completion_tokens` (integers that fit a `u32`),
//! `total_tokens` (an integer, read past), `prompt_tokens_details` (`null` or
//! `{"cached_tokens":n}`) and `completion_tokens_details` (`null`, as vLLM 0.32's chat
//! chunks carry it); integers without sign, fraction, exponent or leading zero.
//! Every other form returns `None`, and the caller parses the object as before.
//! Cost: one pass over the object's bytes.

use super::{
    flat_choice::{expect, object},
    sse::{PromptDetails, Usage},
};

const PROMPT: u16 = 1;
const COMPLETION: u16 = 1 << 1;
const TOTAL: u16 = 1 << 2;
const DETAILS: u16 = 1 << 3;
const COMPLETION_DETAILS: u16 = 1 << 4;

/// The usage in the object at the start of `obj` (its `{`), and the offset just past
/// its `}`; `None` where the object is not of the plain form.
pub fn read(obj: &[u8]) -> Option<(Usage, usize)> {
    read_vllm(obj).or_else(|| read_members(obj))
}

/// The three counts in the order real vLLM writes them (0.32), read straight
/// through: a plain object [`read_members`] reads the same, at a fraction of the cost.
pub(super) fn read_vllm(obj: &[u8]) -> Option<(Usage, usize)> {
    let (prompt_tokens, at) = small(obj, expect(obj, 0, b"{\"prompt_tokens\":")?)?;
    let (_, at) = integer(obj, expect(obj, at, b",\"total_tokens\":")?)?;
    let (completion_tokens, at) = small(obj, expect(obj, at, b",\"completion_tokens\":")?)?;
    let mut usage = Usage {
        prompt_tokens,
        completion_tokens,
        prompt_tokens_details: None,
    };
    // `--enable-prompt-tokens-details` adds the cached count last.
    let at = match expect(obj, at, b",\"prompt_tokens_details\":") {
        None => at,
        Some(d) => match expect(obj, d, b"null") {
            Some(after) => after,
            None => {
                let (cached_tokens, after) = small(obj, expect(obj, d, b"{\"cached_tokens\":")?)?;
                usage.prompt_tokens_details = Some(PromptDetails { cached_tokens });
                expect(obj, after, b"}")?
            }
        },
    };
    // Chat chunks carry an empty completion breakdown.
    let at = expect(obj, at, b",\"completion_tokens_details\":null").unwrap_or(at);
    Some((usage, expect(obj, at, b"}")?))
}

/// [`read`] without the vLLM order: the members one by one, in any order.
fn read_members(obj: &[u8]) -> Option<(Usage, usize)> {
    let mut u = Usage::default();
    let end = object(obj, 0, |k, at| match k {
        b"prompt_tokens" => {
            let after;
            (u.prompt_tokens, after) = small(obj, at)?;
            Some((PROMPT, after))
        }
        b"completion_tokens" => {
            let after;
            (u.completion_tokens, after) = small(obj, at)?;
            Some((COMPLETION, after))
        }
        b"total_tokens" => Some((TOTAL, integer(obj, at)?.1)),
        b"prompt_tokens_details" => {
            if let Some(after) = expect(obj, at, b"null") {
                return Some((DETAILS, after));
            }
            let (cached, after) = small(obj, expect(obj, at, b"{\"cached_tokens\":")?)?;
            u.prompt_tokens_details = Some(PromptDetails {
                cached_tokens: cached,
            });
            Some((DETAILS, expect(obj, after, b"}")?))
        }
        b"completion_tokens_details" => Some((COMPLETION_DETAILS, expect(obj, at, b"null")?)),
        _ => None,
    })?;
    Some((u, end))
}

/// A JSON integer without sign, fraction or exponent at `at` (`0` or no leading zero),
/// and where it ends; `None` past `u64`.
fn integer(obj: &[u8], at: usize) -> Option<(u64, usize)> {
    let rest = obj.get(at..)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || (digits > 1 && rest[0] == b'0') {
        return None;
    }
    // The digits folded in place (checked: `None` past `u64`), not through a `str`.
    let v = rest[..digits].iter().try_fold(0u64, |v, d| {
        v.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })?;
    Some((v, at + digits))
}

/// [`integer`] that fits a `u32`.
fn small(obj: &[u8], at: usize) -> Option<(u32, usize)> {
    let (v, end) = integer(obj, at)?;
    Some((u32::try_from(v).ok()?, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_exact_up_to_u64_and_refused_past_it() {
        assert_eq!(integer(b"18446744073709551615,", 0), Some((u64::MAX, 20)));
        assert_eq!(integer(b"18446744073709551616", 0), None);
        assert_eq!(integer(b"x 0}", 2), Some((0, 3)));
        assert_eq!(integer(b"07", 0), None, "a leading zero is not JSON");
        assert_eq!(integer(b"-1", 0), None);
    }

    #[test]
    fn reads_the_plain_forms() {
        let (u, end) =
            read(br#"{"prompt_tokens":32,"total_tokens":33,"completion_tokens":1},"x":1}"#)
                .expect("plain");
        assert_eq!(
            (
                u.prompt_tokens,
                u.completion_tokens,
                u.prompt_tokens_details
            ),
            (32, 1, None)
        );
        assert_eq!(end, 60, "just past the object's brace");
        let (u, _) = read(br#"{"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":16},"prompt_tokens":40}"#)
            .expect("details");
        assert_eq!(u.prompt_tokens_details.map(|d| d.cached_tokens), Some(16));
        assert_eq!(read(b"{}").map(|(u, e)| (u.prompt_tokens, e)), Some((0, 2)));
    }

    #[test]
    fn the_vllm_order_reads_what_the_members_read() {
        let plain = br#"{"prompt_tokens":812,"total_tokens":940,"completion_tokens":128},"x":1}"#;
        assert_eq!(
            read_members(plain).map(|(u, e)| (u.completion_tokens, e)),
            Some((128, 64))
        );
        let cached = br#"{"prompt_tokens":812,"total_tokens":940,"completion_tokens":128,"prompt_tokens_details":{"cached_tokens":64}}}"#;
        assert_eq!(
            read_vllm(cached).and_then(|(u, _)| u.cached_tokens()),
            Some(64)
        );
        let none = br#"{"prompt_tokens":8,"total_tokens":9,"completion_tokens":1,"prompt_tokens_details":null}"#;
        // A chat chunk's usage as vLLM 0.32 streams it.
        let chat = br#"{"prompt_tokens":14,"total_tokens":15,"completion_tokens":1,"completion_tokens_details":null}"#;
        for whole in [&plain[..], cached, none, chat] {
            assert!(read_vllm(whole).is_some());
            assert_eq!(read_vllm(whole), read_members(whole));
            // Each single-byte change reads the same both ways (or falls to the members).
            for i in 0..whole.len() {
                for b in [b'x', b'0', b'9', b',', b'}', b'-', b'n'] {
                    let mut bent = whole.to_vec();
                    bent[i] = b;
                    assert_eq!(
                        read(&bent),
                        read_members(&bent),
                        "{}",
                        String::from_utf8_lossy(&bent)
                    );
                }
            }
        }
    }

    #[test]
    fn leaves_every_other_form_to_the_parser() {
        for obj in [
            &br#"{"prompt_tokens":-1}"#[..],
            br#"{"prompt_tokens":1.0}"#,
            br#"{"prompt_tokens":1e3}"#,
            br#"{"prompt_tokens":01}"#,
            br#"{"prompt_tokens":4294967296}"#,
            br#"{"prompt_tokens":1,"prompt_tokens":2}"#,
            br#"{"prompt_tokens":null}"#,
            br#"{"prompt_tokens_details":{"cached_tokens":1,"audio_tokens":0}}"#,
            br#"{"prompt_tokens":1,"reasoning_tokens":2}"#,
            br#"{ "prompt_tokens":1}"#,
            br#"{"prompt_tokens":1"#,
        ] {
            assert!(read(obj).is_none(), "{}", String::from_utf8_lossy(obj));
        }
    }
}
