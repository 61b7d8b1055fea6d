//! Request bodies and response-structure helpers shared by the real-vLLM tests.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::harness::{Env, MODEL, Streamed, index_of};

pub fn path(chat: bool) -> &'static str {
    if chat {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    }
}

/// A fixed-length request: `ignore_eos` with `max_tokens`, greedy.
pub fn body(chat: bool, prompt: &str, max_tokens: u32) -> Value {
    let mut b = json!({
        "model": MODEL, "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0,
    });
    if chat {
        b["messages"] = json!([{ "role": "user", "content": prompt }]);
    } else {
        b["prompt"] = json!(prompt);
    }
    b
}

/// The streaming form of `b`, asking for the usage chunk when `usage`.
pub fn streaming(mut b: Value, usage: bool) -> Value {
    b["stream"] = json!(true);
    if usage {
        b["stream_options"] = json!({ "include_usage": true });
    }
    b
}

/// The structure of a JSON value: keys and value kinds, not values.
pub fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(shape).collect()),
        Value::String(_) => json!("string"),
        Value::Number(_) => json!("number"),
        Value::Bool(_) => json!("bool"),
        Value::Null => Value::Null,
    }
}

/// The distinct structures of a stream's chunks. `exact` false leaves out the
/// top-level `system_fingerprint`, which vLLM moves to the usage chunk when usage is
/// requested (see `t0_known_issue_injected_usage_drops_system_fingerprint`).
pub fn chunk_shapes(s: &Streamed, exact: bool) -> BTreeSet<String> {
    s.chunks()
        .iter()
        .map(|c| {
            let mut c = c.clone();
            if let (false, Some(m)) = (exact, c.as_object_mut()) {
                m.remove("system_fingerprint");
            }
            shape(&c).to_string()
        })
        .collect()
}

/// The server behind router replica `name`.
pub fn replica_url<'e>(env: &'e Env, name: &str) -> &'e str {
    &env.urls[index_of(name)]
}

/// Median and maximum of `xs` (NaN for an empty slice).
pub fn p50_max(xs: &[f64]) -> (f64, f64) {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => (f64::NAN, f64::NAN),
        n => (v[n / 2], v[n - 1]),
    }
}
