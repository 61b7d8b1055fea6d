//! Response bodies and SSE chunks in vLLM's shapes for `/v1/completions` and
//! `/v1/chat/completions`.
//!
//! Streaming: every event is `data: <json>\n\n`; chat's first chunk carries
//! `delta.role` (content ""), each chunk carries the tokens the front end delivered
//! together (one unless the stream interval or a busy front end packed several; with
//! `continuous_usage_stats` its `usage` is the cumulative count at that chunk), the
//! last content chunk has
//! `finish_reason` (and vLLM's `stop_reason: null`); with `include_usage` every chunk
//! has `"usage": null` and one last chunk has `"choices": []` and the usage
//! (`prompt_tokens_details.cached_tokens` included, as vLLM does with
//! `--enable-prompt-tokens-details`); the stream ends with `data: [DONE]\n\n`.

use serde_json::{Value, json};

use super::request::Endpoint;

/// Per-response constants.
#[derive(Clone, Debug)]
pub struct Meta {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    pub continuous_usage: bool,
    pub prompt_tokens: u32,
}

/// Token counts for a usage object.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
}

pub fn usage_json(u: Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "completion_tokens": u.completion_tokens,
        "prompt_tokens_details": { "cached_tokens": u.cached_tokens },
    })
}

fn object(meta: &Meta, chunk: bool) -> &'static str {
    match (meta.endpoint, chunk) {
        (Endpoint::Chat, true) => "chat.completion.chunk",
        (Endpoint::Chat, false) => "chat.completion",
        (Endpoint::Completions, _) => "text_completion",
    }
}

/// Appends one `data: ...\n\n` event.
pub fn push_event(out: &mut String, v: &Value) {
    out.push_str("data: ");
    out.push_str(&v.to_string());
    out.push_str("\n\n");
}

/// Appends the terminator.
pub fn push_done(out: &mut String) {
    out.push_str("data: [DONE]\n\n");
}

/// A content chunk: `text` for completions, `delta` for chat (`role` on the first).
pub fn push_chunk(
    out: &mut String,
    meta: &Meta,
    role: bool,
    text: &str,
    finish: Option<&str>,
    completion_tokens: u32,
) {
    let choice = match meta.endpoint {
        Endpoint::Chat => {
            let delta = if role {
                json!({"role": "assistant", "content": text})
            } else {
                json!({"content": text})
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish,
                   "stop_reason": null})
        }
        Endpoint::Completions => json!({"index": 0, "text": text, "logprobs": null,
                                        "finish_reason": finish, "stop_reason": null}),
    };
    let mut v = json!({
        "id": meta.id, "object": object(meta, true), "created": meta.created,
        "model": meta.model, "choices": [choice],
    });
    if meta.continuous_usage {
        // Running totals; cached tokens are only known (and reported) at the end.
        v["usage"] = json!({
            "prompt_tokens": meta.prompt_tokens,
            "total_tokens": meta.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        });
    } else if meta.include_usage {
        v["usage"] = Value::Null;
    }
    push_event(out, &v);
}

/// The final usage-only chunk (`choices: []`).
pub fn push_usage_chunk(out: &mut String, meta: &Meta, usage: Usage) {
    let v = json!({
        "id": meta.id, "object": object(meta, true), "created": meta.created,
        "model": meta.model, "choices": [], "usage": usage_json(usage),
    });
    push_event(out, &v);
}

/// A complete non-streaming response.
pub fn full_response(meta: &Meta, text: &str, finish: &str, usage: Usage) -> Value {
    let choice = match meta.endpoint {
        Endpoint::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text, "refusal": null,
                        "tool_calls": [], "reasoning_content": null},
            "logprobs": null, "finish_reason": finish, "stop_reason": null,
        }),
        Endpoint::Completions => json!({
            "index": 0, "text": text, "logprobs": null, "finish_reason": finish,
            "stop_reason": null, "prompt_logprobs": null,
        }),
    };
    json!({
        "id": meta.id, "object": object(meta, false), "created": meta.created,
        "model": meta.model, "choices": [choice], "usage": usage_json(usage),
        "system_fingerprint": null, "service_tier": null, "prompt_logprobs": null,
        "kv_transfer_params": null,
    })
}
