//! A streamed chunk's one choice read without a JSON parser, where it has the plain
//! shape engines send for nearly every token; anything else is left to `serde_json`.
//!
//! Why: the failover transcript ([`super::failover::Transcript`]) reads every content
//! event of an eligible stream. Through `serde_json` that cost ≈ 0.3 µs per event on
//! the 2-core Xeon VM — per *token*, so ≈ 8% of the router's CPU per request on
//! `proxy-overhead`'s 20-token answers and more on longer ones.
//!
//! Invariant (tested against `serde_json` in `failover.rs`): where [`read`] returns
//! `Some`, the transcript notes exactly what the `serde_json` path notes — the same
//! text appended, not finished, not opaque. It accepts only compact JSON (no
//! whitespace) of the form `{members}]` right after `"choices":[`, a single choice whose
//! members, in any order and each at most once, are:
//! - `"index":0`;
//! - `"text":"…"` and `"delta":{"content":"…"}`, strings without escapes or control
//!   characters (valid UTF-8);
//! - `"finish_reason"`, `null` or a string without escapes (the generation is over);
//! - `"logprobs"` and the members the `serde_json` path ignores (`stop_reason`,
//!   `token_ids`, `prompt_token_ids`, `matched_stop`), as `null`.
//!
//! An empty choices list (`]`, the usage chunk) or an empty choice (`{}`) reads as no
//! text. Every other form —
//! an escape, a second choice, a role or tool-call delta, an unknown or repeated
//! member — returns `None`, and the caller parses the event as before.
//! Cost: one pass over the choice's bytes.

/// Members accepted as `null` beside the text: the one the transcript reads (a
/// non-null `logprobs` makes it opaque) and the ones it ignores.
const NULL_MEMBERS: [&[u8]; 5] = [
    b"logprobs",
    b"stop_reason",
    b"token_ids",
    b"prompt_token_ids",
    b"matched_stop",
];

/// Bits of the members seen, so a repeated one is refused (`serde` refuses it too).
const INDEX: u16 = 1;
const TEXT: u16 = 1 << 1;
const DELTA: u16 = 1 << 2;
const NULLS: u16 = 1 << 3;
const FINISH: u16 = 1 << 15;

/// What a plain choice adds to the transcript.
#[derive(Debug, Default, PartialEq)]
pub struct Choice<'a> {
    pub text: Option<&'a str>,
    pub content: Option<&'a str>,
    /// A finish reason came: the generation is over.
    pub finished: bool,
}

/// The exact bytes real vLLM sends around a token's text (0.32, completions and chat,
/// as in `scripts/vllm/fixtures`): the text's opening and what follows its closing
/// quote, through the choices' `]`. A choice of one of these forms is a plain one
/// whose members [`read_members`] reads to the same text, not finished; matching the
/// two literals costs a fraction of reading the members one by one.
const TEMPLATES: [(&[u8], &[u8], bool); 2] = [
    (
        br#"{"index":0,"text":""#,
        br#","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]"#,
        false,
    ),
    (
        br#"{"index":0,"delta":{"content":""#,
        br#"},"logprobs":null,"finish_reason":null,"token_ids":null}]"#,
        true,
    ),
];

/// The choice's text and delta content (either may be absent), from the bytes right
/// after `"choices":[`; `None` where the chunk is not of the plain form.
pub fn read(rest: &[u8]) -> Option<Choice<'_>> {
    template(rest).or_else(|| read_members(rest))
}

/// [`read`] where the choice is of one of the [`TEMPLATES`]; `None` otherwise.
fn template(rest: &[u8]) -> Option<Choice<'_>> {
    for (head, tail, delta) in TEMPLATES {
        if let Some(open) = expect(rest, 0, head)
            && let Some(len) = plain(&rest[open..])
            && expect(rest, open + len + 1, tail).is_some()
        {
            let s = std::str::from_utf8(&rest[open..open + len]).ok()?;
            let (text, content) = if delta {
                (None, Some(s))
            } else {
                (Some(s), None)
            };
            return Some(Choice {
                text,
                content,
                finished: false,
            });
        }
    }
    None
}

/// [`read`] without the templates: the members one by one, in any order.
fn read_members(rest: &[u8]) -> Option<Choice<'_>> {
    if rest.first() == Some(&b']') {
        return Some(Choice::default());
    }
    let (mut text, mut content, mut finished) = (None, None, false);
    let end = object(rest, 0, |k, at| match k {
        b"index" => Some((INDEX, expect(rest, at, b"0")?)),
        b"text" => {
            let (s, after) = string(rest, at)?;
            text = Some(s);
            Some((TEXT, after))
        }
        b"delta" => {
            let (s, after) = string(rest, expect(rest, at, b"{\"content\":")?)?;
            content = Some(s);
            Some((DELTA, expect(rest, after, b"}")?))
        }
        b"finish_reason" => match expect(rest, at, b"null") {
            Some(after) => Some((FINISH, after)),
            None => {
                let (_, after) = string(rest, at)?;
                finished = true;
                Some((FINISH, after))
            }
        },
        k => {
            let i = NULL_MEMBERS.iter().position(|m| *m == k)?;
            Some((NULLS << i, expect(rest, at, b"null")?))
        }
    })?;
    expect(rest, end, b"]")?;
    Some(Choice {
        text,
        content,
        finished,
    })
}

/// A compact object at `at` whose every member `member` reads: given its key and where
/// its value starts, the member's bit and where the value ends. `None` where a member is
/// not read or comes twice (`serde` refuses a repeated field too); else the offset just
/// past the object's `}`. Shared by both flat readers.
pub(super) fn object(
    rest: &[u8],
    at: usize,
    mut member: impl FnMut(&[u8], usize) -> Option<(u16, usize)>,
) -> Option<usize> {
    let mut at = expect(rest, at, b"{")?;
    if rest.get(at) == Some(&b'}') {
        return Some(at + 1);
    }
    let mut seen = 0u16;
    loop {
        let (k, value) = key(rest, at)?;
        let (bit, after) = member(k, value)?;
        if seen & bit != 0 {
            return None;
        }
        seen |= bit;
        at = after;
        match rest.get(at)? {
            b',' => at += 1,
            b'}' => return Some(at + 1),
            _ => return None,
        }
    }
}

/// `at` past `lit` where `rest[at..]` starts with it.
pub(super) fn expect(rest: &[u8], at: usize, lit: &[u8]) -> Option<usize> {
    rest.get(at..)?.starts_with(lit).then_some(at + lit.len())
}

/// A member's key (`"key":`) at `at`, and where its value starts.
fn key(rest: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let open = expect(rest, at, b"\"")?;
    // Keys with escapes are not the plain form (and none of ours has one).
    let len = plain(rest.get(open..)?)?;
    Some((&rest[open..open + len], expect(rest, open + len + 1, b":")?))
}

/// A string value without escapes or control characters at `at`, and what follows it.
fn string(rest: &[u8], at: usize) -> Option<(&str, usize)> {
    let open = expect(rest, at, b"\"")?;
    let len = plain(rest.get(open..)?)?;
    Some((
        std::str::from_utf8(&rest[open..open + len]).ok()?,
        open + len + 1,
    ))
}

/// The length of the plain string body at the start of `tail` (up to its closing
/// quote); `None` at an escape, a raw control character (JSON forbids them;
/// `serde_json` refuses them) or no closing quote. Eight bytes a step (SWAR): keys and
/// tokens are a few bytes, where a SIMD search's setup costs more than the scan.
fn plain(tail: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut words = tail.chunks_exact(8);
    for (k, w) in words.by_ref().enumerate() {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        // `(x - LO·n) & !x & HI` flags the bytes of `x` below `n`; the lowest flag is
        // exact (a borrow only spreads upwards), so the first byte flagged is the first
        // quote, backslash or control character.
        let (q, s) = (v ^ (LO * u64::from(b'"')), v ^ (LO * u64::from(b'\\')));
        let m = ((q.wrapping_sub(LO) & !q)
            | (s.wrapping_sub(LO) & !s)
            | (v.wrapping_sub(LO * 0x20) & !v))
            & HI;
        if m != 0 {
            let i = 8 * k + (m.trailing_zeros() / 8) as usize;
            return (tail[i] == b'"').then_some(i);
        }
    }
    let done = tail.len() - words.remainder().len();
    let i = words
        .remainder()
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
    (tail[done + i] == b'"').then_some(done + i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_plain_forms_in_any_member_order() {
        let vllm = br#"{"index":0,"text":" information","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}"#;
        let text = |t| Choice {
            text: Some(t),
            ..Choice::default()
        };
        assert_eq!(read(vllm), Some(text(" information")));
        let sorted =
            br#"{"finish_reason":null,"index":0,"logprobs":null,"stop_reason":null,"text":"ok"}]}"#;
        assert_eq!(read(sorted), Some(text("ok")));
        let chat = br#"{"index":0,"delta":{"content":"40 core"},"logprobs":null,"finish_reason":null,"token_ids":null}]}"#;
        let content = Choice {
            content: Some("40 core"),
            ..Choice::default()
        };
        assert_eq!(read(chat), Some(content));
        assert_eq!(read(b"],\"usage\":{}}"), Some(Choice::default()));
        // The last token's chunk: its text, and the generation is over.
        let last = br#"{"index":0,"text":"end","finish_reason":"length","stop_reason":null}]"#;
        assert_eq!(
            read(last),
            Some(Choice {
                finished: true,
                ..text("end")
            })
        );
    }

    #[test]
    fn the_word_scan_finds_the_first_quote_escape_or_control_character() {
        let scalar = |t: &[u8]| {
            let i = t
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
            (t[i] == b'"').then_some(i)
        };
        // Every position of every stop byte, after bytes just above and below the flags'
        // bounds (a borrow from a flagged byte must not hide or fake an earlier one).
        let fill = [b' ', b'!', b'#', b'[', b']', 0x7f, 0x80, 0xff, 0x21, 0x5b];
        for len in 0..40 {
            for stop in [b'"', b'\\', 0x00, 0x1f, 0x0a] {
                for at in 0..=len {
                    let mut t: Vec<u8> = (0..len).map(|i| fill[i % fill.len()]).collect();
                    if at < len {
                        t[at] = stop;
                    }
                    t.extend_from_slice(b"\"x\\");
                    assert_eq!(plain(&t), scalar(&t), "{t:?}");
                }
            }
        }
    }

    #[test]
    fn the_templates_read_what_the_members_read() {
        let texts = [
            "",
            " information",
            "0000000000000000",
            "é中",
            "a\\b",
            "x\"y",
            "\u{1}",
        ];
        for (head, tail, _) in TEMPLATES {
            for t in texts {
                // The template itself, and each single-byte change of its tail.
                let whole = [head, t.as_bytes(), b"\"", tail].concat();
                assert_eq!(
                    read(&whole),
                    read_members(&whole),
                    "{}",
                    String::from_utf8_lossy(&whole)
                );
                let at = head.len() + t.len() + 1;
                for i in at..whole.len() {
                    let mut bent = whole.clone();
                    bent[i] = b'x';
                    assert_eq!(
                        read(&bent),
                        read_members(&bent),
                        "{}",
                        String::from_utf8_lossy(&bent)
                    );
                }
            }
        }
        let vllm = [head_of(0), " information".as_bytes(), b"\"", TEMPLATES[0].1].concat();
        assert_eq!(read(&vllm).and_then(|c| c.text), Some(" information"));
    }

    /// Real vLLM's streams (`scripts/vllm/fixtures`, captured from the server the suite
    /// runs) take the straight reads for every token but the first and the last: a
    /// layout change in a new vLLM fails here, not silently in the router's CPU.
    #[test]
    fn real_vllm_tokens_take_the_straight_reads() {
        for fixture in [
            "completion-stream-chunk-usage.sse",
            "chat-stream-chunk-usage.sse",
        ] {
            let path = format!(
                "{}/../scripts/vllm/fixtures/{fixture}",
                env!("CARGO_MANIFEST_DIR")
            );
            let sse = std::fs::read(path).expect("fixture");
            let content: Vec<&[u8]> = sse
                .split(|&b| b == b'\n')
                .filter_map(|l| l.strip_prefix(b"data: "))
                .filter(|d| d.windows(12).any(|w| w == b"\"choices\":[{"))
                .collect();
            assert!(content.len() >= 8, "{fixture}: {} events", content.len());
            for data in &content[1..content.len() - 1] {
                let at = super::super::sse::choices_end(data).expect("choices");
                assert!(
                    template(&data[at..]).is_some(),
                    "{}",
                    String::from_utf8_lossy(data)
                );
                let u = data
                    .windows(9)
                    .position(|w| w == b"\"usage\":{")
                    .expect("usage")
                    + 8;
                assert!(
                    super::super::flat_usage::read_vllm(&data[u..]).is_some(),
                    "{}",
                    String::from_utf8_lossy(data)
                );
            }
        }
    }

    fn head_of(i: usize) -> &'static [u8] {
        TEMPLATES[i].0
    }

    #[test]
    fn leaves_every_other_form_to_the_parser() {
        for rest in [
            &br#"{"index":0,"text":"a \"b\"","finish_reason":null}]"#[..],
            br#"{"index":0,"text":"end","finish_reason":"a\"b"}]"#,
            br#"{"index":0,"text":"end","finish_reason":1}]"#,
            br#"{"index":0,"finish_reason":null,"finish_reason":"stop"}]"#,
            br#"{"index":1,"text":"x"}]"#,
            br#"{"index":0,"text":"x"},{"index":1,"text":"y"}]"#,
            br#"{"index":0,"delta":{"role":"assistant","content":""}}]"#,
            br#"{"index":0,"delta":{"tool_calls":[]}}]"#,
            br#"{"index":0,"text":"x","text":"y"}]"#,
            br#"{"index":0,"text":"x","logprobs":{"tokens":[]}}]"#,
            br#"{"index":0,"text":"x","seed":null}]"#,
            br#"{ "index":0,"text":"x"}]"#,
            br#"{"index":0,"text":"x"}"#,
            br#"{"index":0,"text":"x"#,
            b"{\"index\":0,\"text\":\"a\x01b\"}]",
            b"{\"index\":0,\"text\":\"\xff\"}]",
        ] {
            assert_eq!(read(rest), None, "{}", String::from_utf8_lossy(rest));
        }
    }
}
