//! Reading just what routing needs from an OpenAI request body.
//!
//! The body is forwarded byte for byte unless the router must ask upstream for usage
//! the client did not ask for: the final usage chunk (`stream_options.include_usage`)
//! and per-chunk counts (`stream_options.continuous_usage_stats`, which tell the
//! router how many tokens each chunk carried). Then those members are spliced into
//! the client's bytes — nothing else is re-encoded, so key order, number spelling and
//! whitespace reach the engine as sent — and the response side strips them again.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use serde::{
    Deserialize, Deserializer,
    de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor},
};
use serde_json::value::RawValue;

use crate::error::ApiError;

/// Which OpenAI endpoint a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    ChatCompletions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Completions => "/v1/completions",
            Endpoint::ChatCompletions => "/v1/chat/completions",
        }
    }
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::ChatCompletions => "chat",
        }
    }
}

/// The prompt in the form the client sent it.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    Text(String),
    Ids(Vec<u32>),
}

/// A parsed request: routing fields plus the body to forward.
#[derive(Clone, Debug)]
pub struct ParsedRequest {
    pub endpoint: Endpoint,
    pub model: String,
    pub prompt: PromptInput,
    /// Chat messages count (template overhead is estimated per message).
    pub messages: usize,
    pub max_tokens: Option<u32>,
    pub ignore_eos: bool,
    pub stream: bool,
    /// The client asked for the usage chunk itself.
    pub client_wants_usage: bool,
    /// Body to send upstream.
    pub upstream_body: Bytes,
    /// What the router added to `upstream_body` (nothing: it is the client's body).
    pub injected: InjectedUsage,
    /// The client set the engine's `priority` itself: the router leaves it.
    pub client_priority: bool,
}

/// Usage the router asked the engine for on the client's behalf, so the response must
/// lose it again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InjectedUsage {
    /// `include_usage`: the final usage chunk (and `"usage":null` in content chunks).
    pub final_chunk: bool,
    /// `continuous_usage_stats`: a usage object in every content chunk.
    pub per_chunk: bool,
}

impl InjectedUsage {
    pub fn any(self) -> bool {
        self.final_chunk || self.per_chunk
    }
}

/// The members of a JSON object named in `keys`, as raw slices of the input (the last
/// of duplicate keys, as the engines' JSON parsers keep), and how many members it has.
/// Every other member is checked for syntax and skipped without being built.
struct Picked<'a, const N: usize> {
    vals: [Option<&'a RawValue>; N],
    members: usize,
}

/// Maps an object key to its position in the wanted keys without allocating it.
#[derive(Clone, Copy)]
struct KeyIndex<'k>(&'k [&'static str]);

impl<'de> DeserializeSeed<'de> for KeyIndex<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeyIndex<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object key")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(self.0.iter().position(|k| *k == v))
    }
}

struct Pick<'k, const N: usize>(&'k [&'static str; N]);

impl<'de, const N: usize> Visitor<'de> for Pick<'_, N> {
    type Value = Picked<'de, N>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Picked {
            vals: [None; N],
            members: 0,
        };
        let keys = KeyIndex(self.0);
        while let Some(at) = map.next_key_seed(keys)? {
            out.members += 1;
            match at {
                Some(i) => out.vals[i] = Some(map.next_value::<&'de RawValue>()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}

/// [`Picked`] members of the whole document `json` (trailing bytes other than
/// whitespace are an error).
fn pick<'a, const N: usize>(
    json: &'a [u8],
    keys: &[&'static str; N],
) -> Result<Picked<'a, N>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let picked = de.deserialize_map(Pick(keys))?;
    de.end()?;
    Ok(picked)
}

/// [`Picked`] members of a raw value that is an object (the caller checked its `{`).
fn pick_in<'a, const N: usize>(
    raw: &'a RawValue,
    keys: &[&'static str; N],
) -> Result<Picked<'a, N>, serde_json::Error> {
    pick(raw.get().as_bytes(), keys)
}

/// A string that borrows from the body unless it holds escapes.
#[derive(Deserialize)]
struct Str<'a>(#[serde(borrow)] Cow<'a, str>);

/// The text of a raw JSON string: the bytes between its quotes where it holds no
/// escape (a raw value was validated as it was read — no control character, UTF-8 —
/// so they are the text), else `serde_json`'s decoding; `None` where it is not a
/// string. A 2 KB prompt is then searched once (SIMD) for a backslash instead of
/// decoded a second time.
fn str_of(raw: &RawValue) -> Option<Cow<'_, str>> {
    let s = raw.get();
    let b = s.as_bytes();
    if b.len() >= 2 && b[0] == b'"' && memchr::memchr(b'\\', &b[1..]).is_none() {
        return Some(Cow::Borrowed(&s[1..s.len() - 1]));
    }
    serde_json::from_str::<Str<'_>>(s).ok().map(|x| x.0)
}

/// The first byte of a raw value (never empty: it is a whole JSON value).
fn lead(raw: &RawValue) -> u8 {
    raw.get().as_bytes().first().copied().unwrap_or(b'n')
}

fn is_null(raw: Option<&RawValue>) -> bool {
    raw.is_none_or(|r| r.get() == "null")
}

fn field_u32(raw: Option<&RawValue>, key: &'static str) -> Result<Option<u32>, ApiError> {
    match raw {
        None => Ok(None),
        Some(v) => serde_json::from_str::<Option<u32>>(v.get()).map_err(|_| {
            ApiError::bad_request(format!("`{key}` must be a non-negative integer")).with_param(key)
        }),
    }
}

fn field_bool(raw: Option<&RawValue>, key: &'static str) -> Result<bool, ApiError> {
    match raw {
        None => Ok(false),
        Some(v) => serde_json::from_str::<Option<bool>>(v.get())
            .map(Option::unwrap_or_default)
            .map_err(|_| {
                ApiError::bad_request(format!("`{key}` must be a boolean")).with_param(key)
            }),
    }
}

fn prompt_of(raw: Option<&RawValue>) -> Result<PromptInput, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "`prompt` must be a string, a list of strings, a list of token ids or a list of such lists",
        )
        .with_param("prompt")
    };
    let Some(raw) = raw else {
        return Err(ApiError::bad_request("`prompt` is required").with_param("prompt"));
    };
    match lead(raw) {
        b'"' => str_of(raw)
            .map(|s| PromptInput::Text(s.into_owned()))
            .ok_or_else(bad),
        b'[' => {
            let items: Vec<&RawValue> = serde_json::from_str(raw.get()).map_err(|_| bad())?;
            let first = items.first().ok_or_else(bad)?;
            match lead(first) {
                b'"' => {
                    let parts: Vec<Str<'_>> = serde_json::from_str(raw.get()).map_err(|_| bad())?;
                    let mut text = String::with_capacity(parts.iter().map(|p| p.0.len() + 1).sum());
                    for (i, p) in parts.iter().enumerate() {
                        if i > 0 {
                            text.push('\n');
                        }
                        text.push_str(&p.0);
                    }
                    Ok(PromptInput::Text(text))
                }
                b'[' => {
                    let lists: Vec<Vec<u32>> =
                        serde_json::from_str(raw.get()).map_err(|_| bad())?;
                    Ok(PromptInput::Ids(lists.into_iter().flatten().collect()))
                }
                _ => serde_json::from_str::<Vec<u32>>(raw.get())
                    .map(PromptInput::Ids)
                    .map_err(|_| bad()),
            }
        }
        _ => Err(bad()),
    }
}

/// Flattens chat messages to text (role-tagged), which is what the prefix index and
/// the token estimate see.
fn messages_of(raw: Option<&RawValue>) -> Result<(String, usize), ApiError> {
    let bad = |m: &str| ApiError::bad_request(m.to_string()).with_param("messages");
    let msgs: Vec<&RawValue> = match raw {
        None => return Err(bad("`messages` is required")),
        Some(r) if lead(r) == b'[' => {
            serde_json::from_str(r.get()).map_err(|_| bad("`messages` must be a list"))?
        }
        Some(_) => return Err(bad("`messages` must be a list")),
    };
    if msgs.is_empty() {
        return Err(bad("`messages` must not be empty"));
    }
    let mut text = String::with_capacity(msgs.iter().map(|m| m.get().len()).sum());
    for m in &msgs {
        if lead(m) != b'{' {
            return Err(bad("each message must be an object"));
        }
        let [role, content] = pick_in(m, &["role", "content"])
            .map_err(|_| bad("each message must be an object"))?
            .vals;
        let role = role
            .and_then(str_of)
            .ok_or_else(|| bad("each message needs a string `role`"))?;
        text.push_str(&role);
        text.push_str(": ");
        match content {
            None => {}
            Some(c) if c.get() == "null" => {}
            Some(c) if lead(c) == b'"' => {
                let s = str_of(c)
                    .ok_or_else(|| bad("message `content` must be a string or a list of parts"))?;
                text.push_str(&s);
            }
            Some(c) if lead(c) == b'[' => {
                let parts: Vec<&RawValue> = serde_json::from_str(c.get())
                    .map_err(|_| bad("message `content` must be a string or a list of parts"))?;
                for p in parts.into_iter().filter(|p| lead(p) == b'{') {
                    let Ok(Picked {
                        vals: [Some(t)], ..
                    }) = pick_in(p, &["text"])
                    else {
                        continue;
                    };
                    if let Some(s) = str_of(t) {
                        text.push_str(&s);
                    }
                }
            }
            Some(_) => return Err(bad("message `content` must be a string or a list of parts")),
        }
        text.push('\n');
    }
    Ok((text, msgs.len()))
}

/// The top-level members routing reads; everything else is only checked for syntax.
const TOP: [&str; 9] = [
    "model",
    "prompt",
    "messages",
    "max_completion_tokens",
    "max_tokens",
    "stream",
    "ignore_eos",
    "stream_options",
    "priority",
];

/// Parses and validates a request body. With `chunk_usage`, a streaming request asks
/// the engine for per-chunk usage (see the module docs).
///
/// One pass over the body: the members routing reads are kept as raw slices of it
/// and decoded on their own (strings borrowed where they hold no escapes); the rest
/// is validated and skipped, never built into a tree.
pub fn parse(
    endpoint: Endpoint,
    body: &Bytes,
    chunk_usage: bool,
) -> Result<ParsedRequest, ApiError> {
    // JSON is UTF-8 (RFC 8259) and the members routing skips are never decoded, so a
    // stray byte there would pass through to the engine: one scan of the whole body
    // makes it a 400 here (the fuzz test found `"\x80"` as a nested key forwarded).
    if let Err(e) = std::str::from_utf8(body) {
        return Err(ApiError::bad_request(format!(
            "malformed JSON body: not UTF-8 at byte {}",
            e.valid_up_to()
        )));
    }
    let top = pick(body, &TOP).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => {
            ApiError::bad_request("request body must be a JSON object")
        }
        _ => ApiError::bad_request(format!("malformed JSON body: {e}")),
    })?;
    let [
        model,
        prompt,
        messages,
        max_completion_tokens,
        max_tokens,
        stream,
        ignore_eos,
        stream_options,
        priority,
    ] = top.vals;
    let model = model
        .filter(|m| lead(m) == b'"')
        .and_then(str_of)
        .filter(|m| !m.is_empty())
        .map(Cow::into_owned)
        .ok_or_else(|| {
            ApiError::bad_request("`model` must be a non-empty string").with_param("model")
        })?;
    let (prompt, messages) = match endpoint {
        Endpoint::Completions => (prompt_of(prompt)?, 0),
        Endpoint::ChatCompletions => {
            let (t, n) = messages_of(messages)?;
            (PromptInput::Text(t), n)
        }
    };
    let max_tokens = match field_u32(max_completion_tokens, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => field_u32(max_tokens, "max_tokens")?,
    };
    let stream = field_bool(stream, "stream")?;
    let ignore_eos = field_bool(ignore_eos, "ignore_eos")?;
    let (client_wants_usage, client_wants_chunk_usage) = match stream_options {
        so if is_null(so) => (false, false),
        Some(o) if lead(o) == b'{' => {
            let [usage, per_chunk] = pick_in(o, &["include_usage", "continuous_usage_stats"])
                .map_err(|_| {
                    ApiError::bad_request("`stream_options` must be an object")
                        .with_param("stream_options")
                })?
                .vals;
            (
                field_bool(usage, "include_usage")?,
                field_bool(per_chunk, "continuous_usage_stats")?,
            )
        }
        _ => {
            return Err(ApiError::bad_request("`stream_options` must be an object")
                .with_param("stream_options"));
        }
    };
    let injected = InjectedUsage {
        final_chunk: stream && !client_wants_usage,
        per_chunk: stream && chunk_usage && !client_wants_chunk_usage,
    };
    let upstream_body = if injected.any() {
        splice_stream_options(body, injected, stream_options, top.members)?
    } else {
        body.clone()
    };
    Ok(ParsedRequest {
        endpoint,
        model,
        prompt,
        messages,
        max_tokens,
        ignore_eos,
        stream,
        client_wants_usage,
        upstream_body,
        injected,
        client_priority: priority.is_some(),
    })
}

/// The client's body with `want`'s members added to its `stream_options` (created if
/// absent or null). A member the client set to `false` is repeated after its own
/// (JSON parsers keep the last of duplicate keys, as vLLM's and SGLang's do).
/// `options` is the body's last top-level `stream_options` as a slice of `body`, and
/// `members` how many top-level members the body has.
fn splice_stream_options(
    body: &Bytes,
    want: InjectedUsage,
    options: Option<&RawValue>,
    members_in_body: usize,
) -> Result<Bytes, ApiError> {
    let bad = |why: String| ApiError::bad_request(format!("cannot add stream options: {why}"));
    let members: &str = match (want.final_chunk, want.per_chunk) {
        (true, true) => "\"include_usage\":true,\"continuous_usage_stats\":true",
        (true, false) => "\"include_usage\":true",
        (false, true) => "\"continuous_usage_stats\":true",
        (false, false) => return Ok(body.clone()),
    };
    let offset_of = |raw: &RawValue| -> Result<usize, ApiError> {
        let at = (raw.get().as_ptr() as usize)
            .checked_sub(body.as_ptr() as usize)
            .filter(|at| at + raw.get().len() <= body.len());
        at.ok_or_else(|| bad("value outside the body".into()))
    };
    let mut out = BytesMut::with_capacity(body.len() + members.len() + 24);
    match options {
        Some(raw) if raw.get().starts_with('{') => {
            let (at, text) = (offset_of(raw)?, raw.get());
            let close = at + text.len() - 1;
            let empty = text[1..text.len() - 1].trim().is_empty();
            out.extend_from_slice(&body[..close]);
            if !empty {
                out.extend_from_slice(b",");
            }
            out.extend_from_slice(members.as_bytes());
            out.extend_from_slice(&body[close..]);
        }
        Some(raw) => {
            // `null` (anything else was refused above): replaced by the object.
            let at = offset_of(raw)?;
            out.extend_from_slice(&body[..at]);
            out.extend_from_slice(b"{");
            out.extend_from_slice(members.as_bytes());
            out.extend_from_slice(b"}");
            out.extend_from_slice(&body[at + raw.get().len()..]);
        }
        None => {
            let open = body
                .iter()
                .position(|&b| b == b'{')
                .ok_or_else(|| bad("not an object".into()))?;
            out.extend_from_slice(&body[..=open]);
            out.extend_from_slice(b"\"stream_options\":{");
            out.extend_from_slice(members.as_bytes());
            out.extend_from_slice(b"}");
            if members_in_body > 0 {
                out.extend_from_slice(b",");
            }
            out.extend_from_slice(&body[open + 1..]);
        }
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn a_raw_string_reads_as_the_parser_decodes_it() {
        for text in [
            r#""""#,
            r#""plain prompt""#,
            r#""caf\u00e9 \"quoted\" \\ back""#,
            r#""line\nbreak""#,
            "\"é中 unescaped\"",
            r#""\ud83d\ude00""#,
        ] {
            let raw = RawValue::from_string(text.to_string()).expect("valid JSON");
            let want: String = serde_json::from_str(text).expect("a string");
            assert_eq!(str_of(&raw).as_deref(), Some(want.as_str()), "{text}");
        }
        for other in ["12", "null", "[\"a\"]", "{}"] {
            let raw = RawValue::from_string(other.to_string()).expect("valid JSON");
            assert_eq!(str_of(&raw), None, "{other}");
        }
    }

    fn p(e: Endpoint, s: &str) -> Result<ParsedRequest, ApiError> {
        parse(e, &Bytes::from(s.to_string()), true)
    }

    #[test]
    fn completions_text_and_ids() {
        let r = p(
            Endpoint::Completions,
            r#"{"model":"m","prompt":"hi","max_tokens":5}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, PromptInput::Text("hi".into()));
        assert_eq!(r.max_tokens, Some(5));
        assert!(!r.injected.any());
        let r = p(Endpoint::Completions, r#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(r.prompt, PromptInput::Ids(vec![1, 2, 3]));
        let r = p(
            Endpoint::Completions,
            r#"{"model":"m","prompt":[[1],[2,3]]}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, PromptInput::Ids(vec![1, 2, 3]));
    }

    #[test]
    fn streaming_without_usage_injects_it_and_keeps_other_fields() {
        let r = p(
            Endpoint::ChatCompletions,
            r#"{"model":"m","stream":true,"temperature":0.5,"messages":[{"role":"user","content":"x"}]}"#,
        )
        .unwrap();
        assert!(r.injected.final_chunk && r.injected.per_chunk && !r.client_wants_usage);
        let v: Value = serde_json::from_slice(&r.upstream_body).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["stream_options"]["continuous_usage_stats"], true);
        assert_eq!(v["temperature"], 0.5);
        let r = p(
            Endpoint::ChatCompletions,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}"#,
        )
        .unwrap();
        assert!(!r.injected.final_chunk && r.injected.per_chunk && r.client_wants_usage);
        let r = p(
            Endpoint::ChatCompletions,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[{"role":"user","content":"x"}]}"#,
        )
        .unwrap();
        assert!(!r.injected.any());
        assert_eq!(
            r.upstream_body,
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"messages":[{"role":"user","content":"x"}]}"#
        );
        // Per-chunk usage off: only the final chunk is asked for.
        let body = r#"{"model":"m","stream":true,"prompt":"x"}"#;
        let r = parse(Endpoint::Completions, &Bytes::from(body), false).unwrap();
        assert!(r.injected.final_chunk && !r.injected.per_chunk);
        let v: Value = serde_json::from_slice(&r.upstream_body).unwrap();
        assert!(v["stream_options"].get("continuous_usage_stats").is_none());
    }

    #[test]
    fn injection_splices_without_re_encoding_anything_else() {
        // Key order, integers beyond f64, spacing and duplicate keys all survive.
        let cases = [
            (
                r#"{"model":"m", "stream":true, "seed":18446744073709551615, "prompt":"x", "response_format":{"schema":{"z":1,"a":2}}}"#,
                r#"{"stream_options":{"include_usage":true,"continuous_usage_stats":true},"model":"m", "stream":true, "seed":18446744073709551615, "prompt":"x", "response_format":{"schema":{"z":1,"a":2}}}"#,
            ),
            (
                r#"{"model":"m","stream":true,"prompt":"x","stream_options":null}"#,
                r#"{"model":"m","stream":true,"prompt":"x","stream_options":{"include_usage":true,"continuous_usage_stats":true}}"#,
            ),
            (
                r#"{"model":"m","stream":true,"prompt":"x","stream_options":{ }}"#,
                r#"{"model":"m","stream":true,"prompt":"x","stream_options":{ "include_usage":true,"continuous_usage_stats":true}}"#,
            ),
            (
                r#"{"model":"m","stream":true,"prompt":"x","stream_options":{"include_usage":false}}"#,
                r#"{"model":"m","stream":true,"prompt":"x","stream_options":{"include_usage":false,"include_usage":true,"continuous_usage_stats":true}}"#,
            ),
            (
                " \n{\"model\":\"m\",\"stream\":true,\"prompt\":\"x\"}",
                " \n{\"stream_options\":{\"include_usage\":true,\"continuous_usage_stats\":true},\"model\":\"m\",\"stream\":true,\"prompt\":\"x\"}",
            ),
        ];
        for (sent, upstream) in cases {
            let r = p(Endpoint::Completions, sent).unwrap();
            assert_eq!(std::str::from_utf8(&r.upstream_body).unwrap(), upstream);
        }
    }

    /// A byte that is not UTF-8 inside a member routing never decodes is still a 400,
    /// not a body forwarded to the engine.
    #[test]
    fn a_body_that_is_not_utf8_is_400() {
        let body = Bytes::from_static(b"{\"model\":\"m\",\"prompt\":\"x\",\"user\":{\"\x80\":1}}");
        let err = parse(Endpoint::Completions, &body, false).unwrap_err();
        assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
        assert!(err.message.contains("not UTF-8"), "{}", err.message);
    }

    #[test]
    fn bad_inputs_are_400_with_param() {
        for (e, body, param) in [
            (Endpoint::Completions, "{not json", None),
            (Endpoint::Completions, "[1,2]", None),
            (Endpoint::Completions, r#"{"prompt":"x"}"#, Some("model")),
            (Endpoint::Completions, r#"{"model":"m"}"#, Some("prompt")),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":[1,"a"]}"#,
                Some("prompt"),
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","max_tokens":-1}"#,
                Some("max_tokens"),
            ),
            (
                Endpoint::Completions,
                r#"{"model":"m","prompt":"x","stream":"yes"}"#,
                Some("stream"),
            ),
            (
                Endpoint::ChatCompletions,
                r#"{"model":"m","messages":[]}"#,
                Some("messages"),
            ),
            (
                Endpoint::ChatCompletions,
                r#"{"model":"m","messages":[{"content":"x"}]}"#,
                Some("messages"),
            ),
        ] {
            let err = p(e, body).unwrap_err();
            assert_eq!(err.status, http::StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(err.param, param, "{body}");
        }
    }

    #[test]
    fn last_duplicate_wins_and_escapes_are_decoded() {
        // As the engines' parsers read it: the last `model`, an escaped key, escapes in
        // the prompt; the members routing does not read are skipped but still checked.
        let r = p(
            Endpoint::Completions,
            r#"{"model":"a","extra":{"deep":[1,{"x":null}]},"mod\u0065l":"b","prompt":"q\n\"x\"","max_tokens":3,"max_tokens":4}"#,
        )
        .unwrap();
        assert_eq!(r.model, "b");
        assert_eq!(r.prompt, PromptInput::Text("q\n\"x\"".into()));
        assert_eq!(r.max_tokens, Some(4));
        let r = p(
            Endpoint::Completions,
            r#"{"model":"m","prompt":["a","b\u00e9"],"stream":null,"max_completion_tokens":2,"max_tokens":"x"}"#,
        )
        .unwrap();
        assert_eq!(r.prompt, PromptInput::Text("a\nb\u{e9}".into()));
        assert_eq!(r.max_tokens, Some(2));
        assert!(!r.stream);
        for bad in [
            r#"{"model":"m","prompt":"x","extra":[1,}"#,
            r#"{"model":"m","prompt":"x"} trailing"#,
            r#"{"model":"m","prompt":[[1],2]}"#,
            r#"{"model":"m","prompt":[1.5]}"#,
            r#"{"model":"m","prompt":null}"#,
        ] {
            assert!(p(Endpoint::Completions, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn chat_content_parts_are_flattened() {
        let r = p(
            Endpoint::ChatCompletions,
            r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hello"}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.messages, 2);
        assert_eq!(
            r.prompt,
            PromptInput::Text("system: be brief\nuser: hello\n".into())
        );
    }
}
