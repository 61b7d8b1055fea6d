//! Reading an OpenAI-style server-sent-event stream as a client sees it.
//!
//! [`SseScanner`] splits arbitrary byte chunks into event payloads (the `data:` lines
//! of one event joined by `\n`; comments and other fields ignored; `\n` and `\r\n`
//! line ends). [`StreamTally`] interprets payloads: a *content event* is one whose
//! choice carries non-empty `text` (completions) or `delta.content` (chat) — a chat
//! stream's opening role-only chunk is not content, so TTFT is measured to the first
//! token actually generated. Usage (with cached prompt tokens) is taken from the last
//! event that carries a non-null `usage`; `data: {"error": …}` marks the stream failed.
//!
//! Invariant: neither type panics or allocates without bound on any input — a line
//! longer than [`MAX_LINE`] is dropped (and counted as malformed).

use std::borrow::Cow;
use std::time::Instant;

use serde::Deserialize;

/// Longest SSE line kept (a usage or error event is far below this).
pub const MAX_LINE: usize = 1 << 20;

/// Incremental splitter of an SSE byte stream into event payloads.
#[derive(Debug, Default)]
pub struct SseScanner {
    line: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
    overflow: bool,
    /// Lines dropped for exceeding [`MAX_LINE`].
    pub dropped_lines: u32,
}

impl SseScanner {
    /// Feeds `bytes`; calls `on_event` with each completed event's payload.
    pub fn feed(&mut self, bytes: &[u8], mut on_event: impl FnMut(&[u8])) {
        let mut rest = bytes;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            self.push(&rest[..pos]);
            self.end_line(&mut on_event);
            rest = &rest[pos + 1..];
        }
        self.push(rest);
    }

    /// Flushes an event left open when the stream ended without a blank line.
    pub fn finish(&mut self, mut on_event: impl FnMut(&[u8])) {
        if !self.line.is_empty() || self.overflow {
            self.end_line(&mut on_event);
        }
        if self.has_data {
            on_event(&self.data);
            self.data.clear();
            self.has_data = false;
        }
    }

    fn push(&mut self, part: &[u8]) {
        if self.overflow || self.line.len() + part.len() > MAX_LINE {
            self.overflow = true;
            self.line.clear();
        } else {
            self.line.extend_from_slice(part);
        }
    }

    fn end_line(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if self.overflow {
            self.overflow = false;
            self.dropped_lines += 1;
            self.line.clear();
            return;
        }
        let mut line: &[u8] = &self.line;
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        if line.is_empty() {
            if self.has_data {
                on_event(&self.data);
                self.data.clear();
                self.has_data = false;
            }
        } else if let Some(v) = line.strip_prefix(b"data:") {
            let v = v.strip_prefix(b" ").unwrap_or(v);
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(v);
            self.has_data = true;
        }
        self.line.clear();
    }
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    finish_reason: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u32>,
}

/// Token counts reported by the server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u32,
    #[serde(default)]
    pub completion_tokens: u32,
    #[serde(skip)]
    pub cached_tokens: u32,
}

#[derive(Deserialize)]
struct RawUsage {
    #[serde(default)]
    prompt_tokens: u32,
    #[serde(default)]
    completion_tokens: u32,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(borrow, default)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    usage: Option<RawUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// What one stream delivered, with client-side timestamps.
#[derive(Clone, Debug, Default)]
pub struct StreamTally {
    pub first_content: Option<Instant>,
    pub last_content: Option<Instant>,
    /// Events that carried generated text.
    pub content_events: u32,
    pub usage: Option<Usage>,
    /// The message of an in-stream error event.
    pub error: Option<String>,
    /// `data: [DONE]` was seen.
    pub done: bool,
    /// Payloads that were neither JSON nor `[DONE]`.
    pub malformed: u32,
}

impl StreamTally {
    /// Accounts one event payload that arrived at `at`.
    pub fn event(&mut self, payload: &[u8], at: Instant) {
        let trimmed = payload.trim_ascii();
        if trimmed == b"[DONE]" {
            self.done = true;
            return;
        }
        let ev: Event<'_> = match serde_json::from_slice(trimmed) {
            Ok(ev) => ev,
            Err(_) => {
                self.malformed += 1;
                return;
            }
        };
        if let Some(err) = ev.error {
            let msg = err
                .get("message")
                .and_then(|m| m.as_str())
                .map_or_else(|| err.to_string(), str::to_string);
            self.error.get_or_insert(msg);
        }
        let content = ev.choices.iter().flatten().any(|c| {
            let text = c
                .text
                .as_deref()
                .or_else(|| c.delta.as_ref().and_then(|d| d.content.as_deref()));
            text.is_some_and(|t| !t.is_empty())
        });
        if content {
            self.first_content.get_or_insert(at);
            self.last_content = Some(at);
            self.content_events += 1;
        } else if self.first_content.is_none()
            && ev
                .choices
                .iter()
                .flatten()
                .any(|c| c.finish_reason.is_some())
        {
            // A generation whose only token decodes to no text (an end-of-sequence
            // first) still had a first token: the event that ended it.
            self.first_content = Some(at);
            self.last_content = Some(at);
        }
        if let Some(u) = ev.usage {
            self.usage = Some(Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
                cached_tokens: u
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0),
            });
        }
    }

    /// Generated tokens: the server's count when it sent usage, else content events.
    pub fn output_tokens(&self) -> u32 {
        self.usage
            .map_or(self.content_events, |u| u.completion_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<String> {
        let mut s = SseScanner::default();
        let mut out = Vec::new();
        for c in chunks {
            s.feed(c, |e| out.push(String::from_utf8_lossy(e).into_owned()));
        }
        s.finish(|e| out.push(String::from_utf8_lossy(e).into_owned()));
        out
    }

    #[test]
    fn splits_events_across_arbitrary_chunk_boundaries() {
        let text =
            b"data: {\"a\":1}\n\n: comment\ndata: x\r\ndata: y\r\n\r\nevent: e\ndata: [DONE]\n\n";
        let whole = events(&[text]);
        assert_eq!(whole, vec!["{\"a\":1}", "x\ny", "[DONE]"]);
        for cut in 1..text.len() {
            assert_eq!(events(&[&text[..cut], &text[cut..]]), whole, "cut at {cut}");
        }
        assert_eq!(
            events(&[b"data: tail-without-blank-line"]),
            vec!["tail-without-blank-line"]
        );
    }

    #[test]
    fn overlong_lines_are_dropped_not_buffered() {
        let mut s = SseScanner::default();
        let big = vec![b'x'; MAX_LINE + 10];
        let mut n = 0;
        s.feed(b"data: ", |_| n += 1);
        s.feed(&big, |_| n += 1);
        s.feed(b"\n\ndata: ok\n\n", |_| n += 1);
        assert_eq!(n, 1);
        assert_eq!(s.dropped_lines, 1);
    }

    /// A random-weight model can end a generation with its first token, an
    /// end-of-sequence that decodes to no text (seen on the real-vLLM pair): the
    /// request still had a time to first token, when that event came.
    #[test]
    fn a_generation_of_one_textless_token_still_has_a_first_token() {
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_millis(30);
        let mut t = StreamTally::default();
        t.event(
            br#"{"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"stop","stop_reason":null}]}"#,
            t1,
        );
        t.event(
            br#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1}}"#,
            t1,
        );
        assert_eq!((t.first_content, t.last_content), (Some(t1), Some(t1)));
        assert_eq!(t.output_tokens(), 1);
        // A chat role chunk (no finish) is not a token.
        let mut c = StreamTally::default();
        c.event(
            br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
            t0,
        );
        assert_eq!(c.first_content, None);
    }

    #[test]
    fn tally_reads_content_usage_errors() {
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_millis(5);
        let t2 = t0 + std::time::Duration::from_millis(9);
        let mut t = StreamTally::default();
        t.event(
            br#"{"choices":[{"delta":{"role":"assistant","content":""}}],"usage":null}"#,
            t0,
        );
        assert!(t.first_content.is_none());
        t.event(
            br#"{"choices":[{"delta":{"content":" hi"}}],"usage":null}"#,
            t1,
        );
        t.event(
            br#"{"choices":[{"text":" there","finish_reason":"length"}]}"#,
            t2,
        );
        t.event(
            br#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#,
            t2,
        );
        t.event(b"[DONE]", t2);
        assert_eq!(t.first_content, Some(t1));
        assert_eq!(t.last_content, Some(t2));
        assert_eq!(t.content_events, 2);
        assert_eq!(
            t.usage,
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 2,
                cached_tokens: 4
            })
        );
        assert!(t.done && t.error.is_none());
        let mut e = StreamTally::default();
        e.event(br#"{"error":{"message":"boom","type":"x"}}"#, t0);
        e.event(b"not json", t0);
        assert_eq!(e.error.as_deref(), Some("boom"));
        assert_eq!(e.malformed, 1);
        assert_eq!(e.output_tokens(), 0);
    }
}
