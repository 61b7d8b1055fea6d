//! Watching an OpenAI SSE stream as it passes: when content starts and ends, how
//! many tokens the usage chunk reports, and (when the router injected
//! `include_usage`) removing what the client did not ask for.
//!
//! Events leave exactly as they arrived except in that one case, where the usage
//! event is dropped and the `,"usage":null` field is cut from each chunk. Both are
//! textual edits: inside a JSON string every quote is escaped, so the unescaped
//! sequence `,"usage":null` can only be structural.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;

/// Token counts from the usage chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: u32,
    #[serde(default)]
    pub completion_tokens: u32,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: u32,
}

#[derive(Deserialize)]
struct UsageOnly {
    usage: Option<Usage>,
}

/// Stream state seen so far.
#[derive(Debug)]
pub struct SseScanner {
    pending: BytesMut,
    strip_usage: bool,
    pub first_content: Option<Instant>,
    pub last_content: Option<Instant>,
    /// Content events seen (a fast server may pack several tokens into one).
    pub content_events: u32,
    /// Which read (1-based count of `feed` calls) carried the first and last content.
    pub first_content_read: u32,
    pub last_content_read: u32,
    reads: u32,
    pub usage: Option<Usage>,
    pub done: bool,
    /// The upstream sent an error event.
    pub upstream_error: bool,
}

const USAGE_NULL: &[u8] = b",\"usage\":null";

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// End of the first complete event in `buf` (index after its blank line).
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            if buf[i + 1] == b'\n' {
                return Some(i + 2);
            }
            if buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

impl SseScanner {
    pub fn new(strip_usage: bool) -> Self {
        Self {
            pending: BytesMut::new(),
            strip_usage,
            first_content: None,
            last_content: None,
            content_events: 0,
            first_content_read: 0,
            last_content_read: 0,
            reads: 0,
            usage: None,
            done: false,
            upstream_error: false,
        }
    }

    /// Feeds a chunk received at `now`; returns the bytes to pass on (complete events
    /// only; a partial event waits for its end).
    pub fn feed(&mut self, chunk: &Bytes, now: Instant) -> Bytes {
        self.reads += 1;
        if self.pending.is_empty() && !self.strip_usage && event_end_at_tail(chunk) {
            // Fast path: whole events, nothing to edit: scan and pass the same bytes.
            let mut rest: &[u8] = chunk;
            while let Some(end) = event_end(rest) {
                self.observe(&rest[..end], now);
                rest = &rest[end..];
            }
            return chunk.clone();
        }
        self.pending.extend_from_slice(chunk);
        let mut out = BytesMut::new();
        while let Some(end) = event_end(&self.pending) {
            let ev = self.pending.split_to(end);
            if self.observe(&ev, now) == Verdict::Drop {
                continue;
            }
            if self.strip_usage {
                let mut rest: &[u8] = &ev;
                while let Some(i) = find(rest, USAGE_NULL) {
                    out.extend_from_slice(&rest[..i]);
                    rest = &rest[i + USAGE_NULL.len()..];
                }
                out.extend_from_slice(rest);
            } else {
                out.extend_from_slice(&ev);
            }
        }
        out.freeze()
    }

    /// Bytes of an unfinished event left at the end of the stream.
    pub fn leftover(&mut self) -> Bytes {
        self.pending.split().freeze()
    }

    fn observe(&mut self, ev: &[u8], now: Instant) -> Verdict {
        let data = ev
            .strip_prefix(b"data:")
            .map(|d| d.trim_ascii_start())
            .unwrap_or(b"");
        if data.starts_with(b"[DONE]") {
            self.done = true;
            return Verdict::Pass;
        }
        if data.starts_with(b"{\"error\"") {
            self.upstream_error = true;
            return Verdict::Pass;
        }
        if find(data, b"\"usage\":{").is_some() {
            if let Ok(UsageOnly { usage: Some(u) }) = serde_json::from_slice(data.trim_ascii_end())
            {
                self.usage = Some(u);
            }
            // The final usage chunk has no choices; drop it if the client did not ask.
            if find(data, b"\"choices\":[]").is_some() {
                return if self.strip_usage {
                    Verdict::Drop
                } else {
                    Verdict::Pass
                };
            }
        }
        if find(data, b"\"choices\":[{").is_some() {
            if self.first_content.is_none() {
                self.first_content = Some(now);
                self.first_content_read = self.reads;
            }
            self.last_content = Some(now);
            self.last_content_read = self.reads;
            self.content_events += 1;
        }
        Verdict::Pass
    }
}

fn event_end_at_tail(chunk: &[u8]) -> bool {
    chunk.ends_with(b"\n\n") || chunk.ends_with(b"\n\r\n")
}

#[derive(PartialEq, Eq)]
enum Verdict {
    Pass,
    Drop,
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK1: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}],\"usage\":null}\n\n";
    const CHUNK2: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" \\\",\\\"usage\\\":null there\"},\"finish_reason\":\"length\"}],\"usage\":null}\n\n";
    const USAGE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn run(strip: bool, chunks: &[&[u8]]) -> (SseScanner, String) {
        let mut s = SseScanner::new(strip);
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(&s.feed(&Bytes::copy_from_slice(c), Instant::now()));
        }
        (s, String::from_utf8(out).unwrap())
    }

    #[test]
    fn passes_through_untouched_when_client_asked_for_usage() {
        let all = format!("{CHUNK1}{CHUNK2}{USAGE}{DONE}");
        let (s, out) = run(false, &[all.as_bytes()]);
        assert_eq!(out, all);
        assert_eq!(s.content_events, 2);
        assert_eq!(s.usage.unwrap().completion_tokens, 2);
        assert_eq!(
            s.usage
                .unwrap()
                .prompt_tokens_details
                .unwrap()
                .cached_tokens,
            3
        );
        assert!(s.done && s.first_content.is_some());
    }

    #[test]
    fn strips_injected_usage_but_not_lookalike_content() {
        let all = format!("{CHUNK1}{CHUNK2}{USAGE}{DONE}");
        let (s, out) = run(true, &[all.as_bytes()]);
        assert_eq!(s.usage.unwrap().completion_tokens, 2);
        assert!(!out.contains("\"usage\":{"));
        assert!(!out.contains("\"usage\":null}"));
        // The escaped look-alike inside the content string survives.
        assert!(out.contains("\\\",\\\"usage\\\":null there"));
        assert!(out.ends_with(DONE));
        for ev in out.split("\n\n").filter(|e| e.starts_with("data: {")) {
            serde_json::from_str::<serde_json::Value>(&ev[6..]).expect("still valid JSON");
        }
    }

    #[test]
    fn events_split_across_chunks_are_reassembled() {
        let all = format!("{CHUNK1}{USAGE}{DONE}");
        let bytes = all.as_bytes();
        let pieces: Vec<&[u8]> = bytes.chunks(7).collect();
        let (s, out) = run(false, &pieces);
        assert_eq!(out, all);
        assert_eq!(s.content_events, 1);
        assert!(s.done);
    }

    #[test]
    fn upstream_error_event_is_noticed() {
        let (s, _) = run(
            false,
            &[b"data: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n"],
        );
        assert!(s.upstream_error && s.done);
    }
}
