//! Parsing and validating OpenAI completion / chat-completion request bodies.
//!
//! Only what the emulator needs is read; unknown fields are ignored, as vLLM does
//! for sampling parameters it does not use here. Batched prompts and `n > 1` are
//! refused with 400 (one choice per request keeps token accounting exact).

use serde_json::Value;

use super::api_error::ApiError;

/// Which endpoint the body came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// The prompt as sent.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    /// `(role, content)` pairs of a chat.
    Messages(Vec<(String, String)>),
}

/// A validated request.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedRequest {
    pub endpoint: Endpoint,
    /// `None` means "the served model" (vLLM's default when omitted).
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub max_tokens: Option<u32>,
    pub min_tokens: u32,
    pub stream: bool,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub ignore_eos: bool,
    pub seed: Option<u64>,
    /// Emulator-only (trace replay): stop after exactly this many tokens, whatever
    /// `max_tokens` says, so a router sees a realistic `max_tokens` while the output
    /// length follows the trace. Real engines ignore unknown fields.
    pub emulator_output_tokens: Option<u32>,
    /// vLLM's `kv_transfer_params` (disaggregated prefill/decode), if any.
    pub kv_transfer: Option<super::pd::KvTransfer>,
}

fn opt_u32(body: &Value, key: &str, min: u32) -> Result<Option<u32>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= u64::from(min) && n <= u64::from(u32::MAX) => Ok(Some(n as u32)),
            _ => Err(ApiError::bad_param(
                key,
                format!("`{key}` must be an integer >= {min}, got {v}"),
            )),
        },
    }
}

fn opt_bool(body: &Value, key: &str) -> Result<bool, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::bad_param(
            key,
            format!("`{key}` must be a boolean, got {v}"),
        )),
    }
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

fn parse_prompt(body: &Value) -> Result<PromptInput, ApiError> {
    let bad = |m: &str| ApiError::bad_param("prompt", m);
    match body.get("prompt") {
        None | Some(Value::Null) => Err(bad("`prompt` is required")),
        Some(Value::String(s)) => Ok(PromptInput::Text(s.clone())),
        Some(Value::Array(items)) => {
            if items.is_empty() {
                return Err(bad("`prompt` must not be empty"));
            }
            if items.iter().all(Value::is_number) {
                return token_ids(items)
                    .map(PromptInput::Tokens)
                    .ok_or_else(|| bad("token ids must be integers in [0, 2^32)"));
            }
            if items.len() > 1 {
                return Err(bad(
                    "batched prompts are not supported; send one prompt per request",
                ));
            }
            match &items[0] {
                Value::String(s) => Ok(PromptInput::Text(s.clone())),
                Value::Array(ids) if !ids.is_empty() => token_ids(ids)
                    .map(PromptInput::Tokens)
                    .ok_or_else(|| bad("token ids must be integers in [0, 2^32)")),
                _ => Err(bad(
                    "`prompt` must be a string, a list of token ids, or one of either",
                )),
            }
        }
        Some(_) => Err(bad("`prompt` must be a string or a list of token ids")),
    }
}

fn parse_messages(body: &Value) -> Result<PromptInput, ApiError> {
    let bad = |m: String| ApiError::bad_param("messages", m);
    let Some(Value::Array(items)) = body.get("messages") else {
        return Err(bad("`messages` must be a non-empty array".into()));
    };
    if items.is_empty() {
        return Err(bad("`messages` must be a non-empty array".into()));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, m) in items.iter().enumerate() {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err(bad(format!("messages[{i}].role must be a string")));
        };
        let content = match m.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match p.get("text").and_then(Value::as_str) {
                        Some(t) => text.push_str(t),
                        None => {
                            return Err(bad(format!(
                                "messages[{i}].content parts must be text parts"
                            )));
                        }
                    }
                }
                text
            }
            Some(_) => {
                return Err(bad(format!(
                    "messages[{i}].content must be a string or parts"
                )));
            }
        };
        out.push((role.to_string(), content));
    }
    Ok(PromptInput::Messages(out))
}

/// Parses a JSON body for `endpoint`, with vLLM-like 400s for bad types.
pub fn parse(endpoint: Endpoint, bytes: &[u8]) -> Result<ParsedRequest, ApiError> {
    let body: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad_request("request body must be a JSON object"));
    }
    let model = match body.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            return Err(ApiError::bad_param(
                "model",
                format!("`model` must be a string, got {v}"),
            ));
        }
    };
    let prompt = match endpoint {
        Endpoint::Completions => parse_prompt(&body)?,
        Endpoint::Chat => parse_messages(&body)?,
    };
    let max_tokens = match endpoint {
        Endpoint::Chat => match opt_u32(&body, "max_completion_tokens", 1)? {
            Some(n) => Some(n),
            None => opt_u32(&body, "max_tokens", 1)?,
        },
        Endpoint::Completions => opt_u32(&body, "max_tokens", 1)?,
    };
    if let Some(n) = opt_u32(&body, "n", 1)?
        && n != 1
    {
        return Err(ApiError::bad_param(
            "n",
            "n > 1 is not supported by headroom-replica",
        ));
    }
    let stream = opt_bool(&body, "stream")?;
    let (include_usage, continuous_usage) = match body.get("stream_options") {
        None | Some(Value::Null) => (false, false),
        Some(opts @ Value::Object(_)) => {
            if !stream {
                return Err(ApiError::bad_param(
                    "stream_options",
                    "Stream options can only be defined when `stream=True`.",
                ));
            }
            (
                opt_bool(opts, "include_usage")?,
                opt_bool(opts, "continuous_usage_stats")?,
            )
        }
        Some(_) => {
            return Err(ApiError::bad_param(
                "stream_options",
                "`stream_options` must be an object",
            ));
        }
    };
    let seed = match body.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_i64()
                .map(|s| s as u64)
                .ok_or_else(|| ApiError::bad_param("seed", "`seed` must be an integer"))?,
        ),
    };
    Ok(ParsedRequest {
        endpoint,
        model,
        prompt,
        max_tokens,
        min_tokens: opt_u32(&body, "min_tokens", 0)?.unwrap_or(0),
        stream,
        include_usage,
        continuous_usage,
        ignore_eos: opt_bool(&body, "ignore_eos")?,
        seed,
        emulator_output_tokens: opt_u32(&body, "emulator_output_tokens", 1)?,
        kv_transfer: super::pd::parse(&body)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_usual_shapes() {
        let r = parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":[1,2,3],"max_tokens":4}"#,
        )
        .expect("ok");
        assert_eq!(r.prompt, PromptInput::Tokens(vec![1, 2, 3]));
        assert_eq!(r.max_tokens, Some(4));
        let r = parse(Endpoint::Completions, br#"{"prompt":["hi"]}"#).expect("ok");
        assert_eq!(r.prompt, PromptInput::Text("hi".into()));
        let r = parse(
            Endpoint::Chat,
            br#"{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
                "max_completion_tokens":3,"stream":true,"stream_options":{"include_usage":true}}"#,
        )
        .expect("ok");
        assert_eq!(
            r.prompt,
            PromptInput::Messages(vec![("user".into(), "ab".into())])
        );
        assert!(r.include_usage && r.stream);
        assert_eq!(r.max_tokens, Some(3));
        let r = parse(
            Endpoint::Completions,
            br#"{"prompt":[1],"max_tokens":256,"emulator_output_tokens":17}"#,
        )
        .expect("ok");
        assert_eq!(r.emulator_output_tokens, Some(17));
        assert!(
            parse(
                Endpoint::Completions,
                br#"{"prompt":[1],"emulator_output_tokens":0}"#
            )
            .is_err()
        );
    }

    #[test]
    fn rejects_bad_types_and_unsupported_options() {
        for body in [
            &br#"{"prompt": "x", "max_tokens": "ten"}"#[..],
            br#"{"prompt": "x", "max_tokens": 0}"#,
            br#"{"prompt": "x", "n": 2}"#,
            br#"{"prompt": ["a", "b"]}"#,
            br#"{"prompt": []}"#,
            br#"{"prompt": [1, -2]}"#,
            br#"{"prompt": "x", "stream": "yes"}"#,
            br#"{"prompt": "x", "stream_options": {"include_usage": true}}"#,
            br#"{"model": 3, "prompt": "x"}"#,
            br#"{"max_tokens": 3}"#,
            br#"[1,2]"#,
            br#"{"prompt": "x""#,
        ] {
            let e = parse(Endpoint::Completions, body)
                .expect_err(std::str::from_utf8(body).unwrap_or("?"));
            assert_eq!(e.status.as_u16(), 400);
        }
        assert!(parse(Endpoint::Chat, br#"{"messages": []}"#).is_err());
        assert!(parse(Endpoint::Chat, br#"{"messages": [{"content": "x"}]}"#).is_err());
    }
}
