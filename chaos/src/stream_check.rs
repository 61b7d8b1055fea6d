//! What one response delivered, checked event by event for output integrity.
//!
//! A stream is sound when every event belongs to one completion (one `id`), chat
//! opens with at most one role chunk, `data: [DONE]` comes exactly once and last, at
//! most one final usage object arrives, and the generated tokens never exceed
//! `max_tokens` or the usage count. Tokens are counted from each chunk's own usage
//! (clients ask for `continuous_usage_stats`: the emulator, like vLLM, packs several
//! tokens into one chunk when its stream is not read), else one per content event.
//! A router that retried a stream after its first byte would splice a second
//! completion in: a second id, a second role chunk, or more tokens than asked.

use serde::Serialize;
use serde_json::Value;

/// Integrity counters of one response.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct StreamFacts {
    /// Events carrying generated text.
    pub content_events: u32,
    /// Tokens generated so far: the latest content chunk's cumulative usage, else one
    /// per content event.
    pub tokens: u32,
    /// Some content chunk carried its own usage.
    #[serde(skip)]
    chunk_usage: bool,
    /// Distinct completion ids seen (sound: at most 1).
    pub distinct_ids: u32,
    /// Chat chunks that open an assistant message.
    pub role_chunks: u32,
    pub done_events: u32,
    /// Events after `[DONE]`.
    pub after_done: u32,
    /// `{"error": …}` events.
    pub error_events: u32,
    /// An error event was followed by `[DONE]`.
    pub error_then_done: bool,
    /// Final usage objects seen (chunks without choices), and their completion count.
    pub usage_events: u32,
    pub usage_tokens: Option<u32>,
    /// Payloads that were neither JSON nor `[DONE]`.
    pub malformed: u32,
    #[serde(skip)]
    first_id: Option<String>,
    #[serde(skip)]
    other_ids: Vec<String>,
}

impl StreamFacts {
    /// Accounts one SSE payload; returns true when it carried generated text.
    pub fn event(&mut self, payload: &[u8]) -> bool {
        let trimmed = payload.trim_ascii();
        if self.done_events > 0 {
            self.after_done += 1;
        }
        if trimmed == b"[DONE]" {
            self.done_events += 1;
            if self.error_events > 0 {
                self.error_then_done = true;
            }
            return false;
        }
        let v: Value = match serde_json::from_slice(trimmed) {
            Ok(v) => v,
            Err(_) => {
                self.malformed += 1;
                return false;
            }
        };
        if v.get("error").is_some_and(|e| !e.is_null()) {
            self.error_events += 1;
        }
        if let Some(id) = v.get("id").and_then(Value::as_str) {
            self.note_id(id);
        }
        let has_choices = v
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty());
        let usage_tokens = v.get("usage").filter(|u| !u.is_null()).map(|u| {
            u.get("completion_tokens")
                .and_then(Value::as_u64)
                .and_then(|n| u32::try_from(n).ok())
        });
        match (usage_tokens, has_choices) {
            (Some(n), false) => {
                self.usage_events += 1;
                self.usage_tokens = n;
            }
            (Some(Some(n)), true) => {
                self.chunk_usage = true;
                self.tokens = self.tokens.max(n);
            }
            _ => {}
        }
        let mut content = false;
        for c in v
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let delta = c.get("delta");
            if delta
                .and_then(|d| d.get("role"))
                .is_some_and(|r| !r.is_null())
            {
                self.role_chunks += 1;
            }
            let text = c
                .get("text")
                .and_then(Value::as_str)
                .or_else(|| delta.and_then(|d| d.get("content")).and_then(Value::as_str));
            content |= text.is_some_and(|t| !t.is_empty());
        }
        if content {
            self.content_events += 1;
            if !self.chunk_usage {
                self.tokens += 1;
            }
        }
        content
    }

    fn note_id(&mut self, id: &str) {
        match &self.first_id {
            None => {
                self.first_id = Some(id.to_string());
                self.distinct_ids = 1;
            }
            Some(f) if f == id => {}
            Some(_) => {
                if !self.other_ids.iter().any(|o| o == id) {
                    self.other_ids.push(id.to_string());
                    self.distinct_ids += 1;
                }
            }
        }
    }

    /// Integrity violations against `max_tokens` (empty = sound). `complete` asks in
    /// addition that a successful response delivered exactly `max_tokens` (requests
    /// are sent with `ignore_eos`).
    pub fn violations(&self, max_tokens: u32, complete: bool) -> Vec<String> {
        let mut v = Vec::new();
        if self.tokens > max_tokens {
            v.push(format!(
                "{} tokens streamed for max_tokens {max_tokens}",
                self.tokens
            ));
        }
        if let Some(u) = self.usage_tokens {
            if self.tokens > u {
                v.push(format!(
                    "{} tokens streamed but usage says {u}",
                    self.tokens
                ));
            }
            if u > max_tokens {
                v.push(format!("usage {u} exceeds max_tokens {max_tokens}"));
            }
        }
        if self.distinct_ids > 1 {
            v.push(format!(
                "{} completion ids in one stream",
                self.distinct_ids
            ));
        }
        if self.role_chunks > 1 {
            v.push(format!("{} role chunks in one stream", self.role_chunks));
        }
        if self.done_events > 1 {
            v.push(format!("[DONE] sent {} times", self.done_events));
        }
        if self.after_done > 0 {
            v.push(format!("{} events after [DONE]", self.after_done));
        }
        if self.usage_events > 1 {
            v.push(format!("{} usage objects", self.usage_events));
        }
        if complete && self.tokens != max_tokens {
            v.push(format!(
                "successful stream delivered {} of {max_tokens} tokens",
                self.tokens
            ));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(events: &[&str]) -> StreamFacts {
        let mut f = StreamFacts::default();
        for e in events {
            f.event(e.as_bytes());
        }
        f
    }

    #[test]
    fn a_clean_stream_is_sound_and_complete() {
        let f = feed(&[
            r#"{"id":"a","choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"id":"a","choices":[{"delta":{"content":" x"}}],"usage":null}"#,
            r#"{"id":"a","choices":[{"delta":{"content":" y"}}],"usage":null}"#,
            r#"{"id":"a","choices":[],"usage":{"completion_tokens":2}}"#,
            "[DONE]",
        ]);
        assert_eq!(f.content_events, 2);
        assert_eq!(f.role_chunks, 1);
        assert!(
            f.violations(2, true).is_empty(),
            "{:?}",
            f.violations(2, true)
        );
        assert_eq!(f.violations(3, true).len(), 1);
    }

    #[test]
    fn coalesced_chunks_count_their_tokens() {
        // Three tokens in two chunks, as a stream that was not read for a while gets.
        let f = feed(&[
            r#"{"id":"a","choices":[{"text":" x"}],"usage":{"completion_tokens":1}}"#,
            r#"{"id":"a","choices":[{"text":" y z"}],"usage":{"completion_tokens":3}}"#,
            r#"{"id":"a","choices":[],"usage":{"completion_tokens":3}}"#,
            "[DONE]",
        ]);
        assert_eq!((f.content_events, f.tokens, f.usage_events), (2, 3, 1));
        assert!(
            f.violations(3, true).is_empty(),
            "{:?}",
            f.violations(3, true)
        );
        assert_eq!(
            f.violations(2, true).len(),
            3,
            "{:?}",
            f.violations(2, true)
        );
    }

    #[test]
    fn a_spliced_retry_is_caught() {
        let f = feed(&[
            r#"{"id":"a","choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"id":"a","choices":[{"delta":{"content":" x"}}]}"#,
            r#"{"id":"b","choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"id":"b","choices":[{"delta":{"content":" x"}}]}"#,
            r#"{"id":"b","choices":[{"delta":{"content":" y"}}]}"#,
            "[DONE]",
            "[DONE]",
        ]);
        let v = f.violations(2, false);
        assert!(v.iter().any(|m| m.contains("completion ids")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("role chunks")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("tokens streamed")), "{v:?}");
        assert!(v.iter().any(|m| m.contains("[DONE] sent 2")), "{v:?}");
    }

    #[test]
    fn an_error_then_done_is_recorded() {
        let f = feed(&[
            r#"{"id":"a","choices":[{"text":" x"}]}"#,
            r#"{"error":{"message":"boom","type":"upstream_error"}}"#,
            "[DONE]",
        ]);
        assert!(f.error_then_done);
        assert_eq!(f.error_events, 1);
        assert!(f.violations(4, false).is_empty());
    }
}
