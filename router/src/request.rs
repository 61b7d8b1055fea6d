//! Reading just what routing needs from an OpenAI request body.
//!
//! The body is forwarded byte for byte unless the router must ask upstream for usage
//! the client did not ask for: the final usage chunk (`stream_options.include_usage`)
//! and per-chunk counts (`stream_options.continuous_usage_stats`, which tell the
//! router how many tokens each chunk carried). Then those members are spliced into
//! the client's bytes — nothing else is re-encoded, so key order, number spelling and
//! whitespace reach the engine as sent — and the response side strips them again.

use std::{borrow::Cow, collections::BTreeMap};

use bytes::{Bytes, BytesMut};
use serde_json::{Map, Value, value::RawValue};

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

fn field_u32(map: &Map<String, Value>, key: &'static str) -> Result<Option<u32>, ApiError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| {
                ApiError::bad_request(format!("`{key}` must be a non-negative integer"))
                    .with_param(key)
            }),
    }
}

fn field_bool(map: &Map<String, Value>, key: &'static str) -> Result<bool, ApiError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::bad_request(format!("`{key}` must be a boolean")).with_param(key)),
    }
}

fn ids_of(v: &[Value]) -> Option<Vec<u32>> {
    v.iter()
        .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

fn prompt_of(map: &Map<String, Value>) -> Result<PromptInput, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "`prompt` must be a string, a list of strings, a list of token ids or a list of such lists",
        )
        .with_param("prompt")
    };
    match map.get("prompt") {
        Some(Value::String(s)) => Ok(PromptInput::Text(s.clone())),
        Some(Value::Array(items)) if items.is_empty() => Err(bad()),
        Some(Value::Array(items)) => {
            if items.iter().all(Value::is_string) {
                let joined: Vec<&str> = items.iter().filter_map(Value::as_str).collect();
                Ok(PromptInput::Text(joined.join("\n")))
            } else if items.iter().all(Value::is_number) {
                ids_of(items).map(PromptInput::Ids).ok_or_else(bad)
            } else if items.iter().all(Value::is_array) {
                let mut all = Vec::new();
                for it in items {
                    all.extend(ids_of(it.as_array().ok_or_else(bad)?).ok_or_else(bad)?);
                }
                Ok(PromptInput::Ids(all))
            } else {
                Err(bad())
            }
        }
        None => Err(ApiError::bad_request("`prompt` is required").with_param("prompt")),
        Some(_) => Err(bad()),
    }
}

/// Flattens chat messages to text (role-tagged), which is what the prefix index and
/// the token estimate see.
fn messages_of(map: &Map<String, Value>) -> Result<(String, usize), ApiError> {
    let bad = |m: &str| ApiError::bad_request(m.to_string()).with_param("messages");
    let msgs = match map.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => return Err(bad("`messages` must not be empty")),
        None => return Err(bad("`messages` is required")),
        Some(_) => return Err(bad("`messages` must be a list")),
    };
    let mut text = String::new();
    for m in msgs {
        let obj = m
            .as_object()
            .ok_or_else(|| bad("each message must be an object"))?;
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("each message needs a string `role`"))?;
        text.push_str(role);
        text.push_str(": ");
        match obj.get("content") {
            Some(Value::String(s)) => text.push_str(s),
            Some(Value::Array(parts)) => {
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        text.push_str(t);
                    }
                }
            }
            None | Some(Value::Null) => {}
            Some(_) => return Err(bad("message `content` must be a string or a list of parts")),
        }
        text.push('\n');
    }
    Ok((text, msgs.len()))
}

/// Parses and validates a request body. With `chunk_usage`, a streaming request asks
/// the engine for per-chunk usage (see the module docs).
pub fn parse(
    endpoint: Endpoint,
    body: &Bytes,
    chunk_usage: bool,
) -> Result<ParsedRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON body: {e}")))?;
    let Value::Object(map) = value else {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    };
    let model = match map.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(
                ApiError::bad_request("`model` must be a non-empty string").with_param("model")
            );
        }
    };
    let (prompt, messages) = match endpoint {
        Endpoint::Completions => (prompt_of(&map)?, 0),
        Endpoint::ChatCompletions => {
            let (t, n) = messages_of(&map)?;
            (PromptInput::Text(t), n)
        }
    };
    let max_tokens = match field_u32(&map, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => field_u32(&map, "max_tokens")?,
    };
    let stream = field_bool(&map, "stream")?;
    let ignore_eos = field_bool(&map, "ignore_eos")?;
    let (client_wants_usage, client_wants_chunk_usage) = match map.get("stream_options") {
        None | Some(Value::Null) => (false, false),
        Some(Value::Object(o)) => (
            field_bool(o, "include_usage")?,
            field_bool(o, "continuous_usage_stats")?,
        ),
        Some(_) => {
            return Err(ApiError::bad_request("`stream_options` must be an object")
                .with_param("stream_options"));
        }
    };
    let injected = InjectedUsage {
        final_chunk: stream && !client_wants_usage,
        per_chunk: stream && chunk_usage && !client_wants_chunk_usage,
    };
    let upstream_body = if injected.any() {
        splice_stream_options(body, injected)?
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
    })
}

/// The client's body with `want`'s members added to its `stream_options` (created if
/// absent or null). A member the client set to `false` is repeated after its own
/// (JSON parsers keep the last of duplicate keys, as vLLM's and SGLang's do).
fn splice_stream_options(body: &Bytes, want: InjectedUsage) -> Result<Bytes, ApiError> {
    let bad = |why: String| ApiError::bad_request(format!("cannot add stream options: {why}"));
    let mut members = Vec::new();
    if want.final_chunk {
        members.push("\"include_usage\":true");
    }
    if want.per_chunk {
        members.push("\"continuous_usage_stats\":true");
    }
    let members = members.join(",");
    // The top-level members as raw slices of `body`; the last of duplicate keys wins,
    // as it does upstream.
    let top: BTreeMap<Cow<'_, str>, &RawValue> =
        serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    let offset_of = |raw: &RawValue| -> Result<usize, ApiError> {
        let at = (raw.get().as_ptr() as usize)
            .checked_sub(body.as_ptr() as usize)
            .filter(|at| at + raw.get().len() <= body.len());
        at.ok_or_else(|| bad("value outside the body".into()))
    };
    let mut out = BytesMut::with_capacity(body.len() + members.len() + 24);
    match top.get("stream_options") {
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
            out.extend_from_slice(format!("{{{members}}}").as_bytes());
            out.extend_from_slice(&body[at + raw.get().len()..]);
        }
        None => {
            let open = body
                .iter()
                .position(|&b| b == b'{')
                .ok_or_else(|| bad("not an object".into()))?;
            let empty = top.is_empty();
            out.extend_from_slice(&body[..=open]);
            out.extend_from_slice(format!("\"stream_options\":{{{members}}}").as_bytes());
            if !empty {
                out.extend_from_slice(b",");
            }
            out.extend_from_slice(&body[open + 1..]);
        }
    }
    Ok(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

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
