//! Watching an OpenAI SSE stream as it passes: when content starts and ends, how many
//! tokens each chunk carried, what the usage reports, and removing the usage the
//! router asked for but the client did not.
//!
//! Token counts come from the engine, not from events: vLLM packs several tokens into
//! one chunk (`stream_interval`) and flushes bursts of chunks when its API server is
//! busy, so the router asks for per-chunk usage (`stream_options.continuous_usage_stats`)
//! and reads each chunk's cumulative `completion_tokens`. Without it, a chunk counts as
//! one token, and the final usage says whether that held.
//!
//! Events leave exactly as they arrived except where the router injected usage: the
//! final usage event is dropped (the client did not ask for `include_usage`), and the
//! `,"usage":null` or `,"usage":{…}` member is cut from each content chunk (the client
//! did not ask for per-chunk usage). Both are textual edits: inside a JSON string
//! every quote is escaped, so an unescaped `"usage":` followed by `null` or `{` can
//! only be structural.
//!
//! The time-per-output-token *label* (what the predictor learns from) is kept apart
//! from the TPOT the client saw: see [`SseScanner::tpot_label_s`].

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;

use super::failover::Transcript;
use crate::request::InjectedUsage;

/// Token counts from a usage object (the final chunk's, or a content chunk's when the
/// engine reports usage continuously).
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

impl Usage {
    pub fn cached_tokens(&self) -> Option<u32> {
        self.prompt_tokens_details.map(|d| d.cached_tokens)
    }
}

/// Per-request timings some engines add to the final usage chunk (vLLM with
/// `--enable-per-request-metrics`): the engine's own view, used to check the labels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
pub struct EngineTimings {
    #[serde(default)]
    pub time_to_first_token_ms: Option<f64>,
    #[serde(default)]
    pub queue_time_ms: Option<f64>,
    #[serde(default)]
    pub mean_itl_ms: Option<f64>,
}

#[derive(Deserialize)]
struct TimingsOnly {
    metrics: Option<EngineTimings>,
}

/// A TPOT label needs at least this many token intervals between the first and the
/// last read that carried content.
pub const LABEL_MIN_TOKENS: u32 = 2;
/// … spread over at least this many reads after the first one.
pub const LABEL_MIN_LATER_READS: u32 = 2;

/// Stream state seen so far.
#[derive(Debug)]
pub struct SseScanner {
    pending: BytesMut,
    strip: InjectedUsage,
    pub first_content: Option<Instant>,
    pub last_content: Option<Instant>,
    /// Content events seen (one event may carry several tokens).
    pub content_events: u32,
    /// Completion tokens streamed so far: the latest chunk's cumulative usage where the
    /// engine reports it, else one per content event.
    pub tokens: u32,
    /// Some content chunk carried its own usage (token counts are the engine's).
    pub chunk_usage: bool,
    /// Prompt tokens as a content chunk's usage reported them (known at the first token).
    pub chunk_prompt_tokens: Option<u32>,
    /// Cached prompt tokens as a content chunk's usage reported them, where it does.
    pub chunk_cached_tokens: Option<u32>,
    /// The first read that carried content: when it arrived and the tokens streamed by
    /// its end.
    first_read: Option<(Instant, u32)>,
    /// The latest such read.
    last_read: Option<(Instant, u32)>,
    /// Reads after the first that carried content, and the most tokens one of them held.
    later_reads: u32,
    max_read_tokens: u32,
    /// Which read (1-based count of `feed` calls) carried the first and last content.
    pub first_content_read: u32,
    pub last_content_read: u32,
    reads: u32,
    /// The final usage chunk's counts.
    pub usage: Option<Usage>,
    /// The engine's per-request timings, where it reports them.
    pub engine: Option<EngineTimings>,
    pub done: bool,
    /// The upstream sent an error event.
    pub upstream_error: bool,
    /// Set when the stream may fail over: the generated text is kept, and an upstream
    /// error event (with the `[DONE]` after it) is held back rather than passed on,
    /// so that a continuation can take the stream over (`proxy/failover.rs`).
    pub transcript: Option<Box<Transcript>>,
}

const USAGE_NULL: &[u8] = b",\"usage\":null";
const USAGE_OBJ: &[u8] = b"\"usage\":{";

/// A marker searched for in every event, its SIMD searcher built once: `memmem::find`
/// builds one per call, which was ≈ 4% of the router's CPU per request (a few markers
/// × 22 events).
pub(super) type Marker = std::sync::LazyLock<memchr::memmem::Finder<'static>>;

static M_USAGE_NULL: Marker = Marker::new(|| memchr::memmem::Finder::new(USAGE_NULL));
static M_USAGE_OBJ: Marker = Marker::new(|| memchr::memmem::Finder::new(USAGE_OBJ));
const CHOICES: &[u8] = b"\"choices\":[";
static M_CHOICES: Marker = Marker::new(|| memchr::memmem::Finder::new(CHOICES));
static M_CHOICES_SOME: Marker = Marker::new(|| memchr::memmem::Finder::new(b"\"choices\":[{"));
static M_CHOICES_NONE: Marker = Marker::new(|| memchr::memmem::Finder::new(b"\"choices\":[]"));
static M_METRICS: Marker = Marker::new(|| memchr::memmem::Finder::new(b"\"metrics\":{"));

/// End of the first complete event in `buf` (index after its blank line).
pub(super) fn event_end(buf: &[u8]) -> Option<usize> {
    // Jumps from newline to newline (memchr) instead of testing every byte.
    let mut from = 0;
    while let Some(k) = memchr::memchr(b'\n', &buf[from..]) {
        let i = from + k;
        match buf.get(i + 1) {
            Some(b'\n') => return Some(i + 2),
            Some(b'\r') if buf.get(i + 2) == Some(&b'\n') => return Some(i + 3),
            Some(_) => from = i + 1,
            None => return None,
        }
    }
    None
}

/// The usage object in `data` (an event's payload): its value and the byte range of
/// the whole `"usage":{…}` member, widened by one adjacent comma so that cutting the
/// range leaves valid JSON.
fn usage_member(data: &[u8]) -> Option<(Usage, std::ops::Range<usize>)> {
    usage_member_with(data, true)
}

/// [`usage_member`], reading the plain object without the parser where `flat`
/// (`flat_usage.rs`; `false`: the reference its tests compare with).
fn usage_member_with(data: &[u8], flat: bool) -> Option<(Usage, std::ops::Range<usize>)> {
    let at = M_USAGE_OBJ.find(data)?;
    let obj = at + USAGE_OBJ.len() - 1;
    let (usage, end) = match flat
        .then(|| super::flat_usage::read(&data[obj..]))
        .flatten()
    {
        Some((u, len)) => (u, obj + len),
        None => {
            let mut it = serde_json::Deserializer::from_slice(&data[obj..]).into_iter::<Usage>();
            let usage = it.next()?.ok()?;
            (usage, obj + it.byte_offset())
        }
    };
    let range = if at > 0 && data[at - 1] == b',' {
        at - 1..end
    } else if data.get(end) == Some(&b',') {
        at..end + 1
    } else {
        at..end
    };
    Some((usage, range))
}

/// Where the first `"choices":[` in `data` ends (the offset of the array's first byte).
pub(super) fn choices_end(data: &[u8]) -> Option<usize> {
    M_CHOICES.find(data).map(|at| at + CHOICES.len())
}

/// Whether the payload is a content chunk (a `"choices":[{`), given where its first
/// `"choices":[` ends: the one search serves the transcript too. `"choices":[` cannot
/// overlap itself, so a later `"choices":[{` starts at or past `first`.
fn has_choices(data: &[u8], first: Option<usize>) -> bool {
    match first {
        None => false,
        Some(i) if data.get(i) == Some(&b'{') => true,
        Some(i) => M_CHOICES_SOME.find(&data[i..]).is_some(),
    }
}

impl SseScanner {
    pub fn new(strip: InjectedUsage) -> Self {
        Self {
            pending: BytesMut::new(),
            strip,
            first_content: None,
            last_content: None,
            content_events: 0,
            tokens: 0,
            chunk_usage: false,
            chunk_prompt_tokens: None,
            chunk_cached_tokens: None,
            first_read: None,
            last_read: None,
            later_reads: 0,
            max_read_tokens: 0,
            first_content_read: 0,
            last_content_read: 0,
            reads: 0,
            usage: None,
            engine: None,
            done: false,
            upstream_error: false,
            transcript: None,
        }
    }

    /// Feeds a chunk received at `now`; returns the bytes to pass on (complete events
    /// only; a partial event waits for its end).
    pub fn feed(&mut self, chunk: &Bytes, now: Instant) -> Bytes {
        self.reads += 1;
        let (events_before, tokens_before) = (self.content_events, self.tokens);
        let out = if self.pending.is_empty() && event_end_at_tail(chunk) {
            // Whole events: scan and pass the same bytes while no event is edited or
            // held back; from the first that is, the rest is copied event by event.
            let mut at = 0;
            let mut copy: Option<BytesMut> = None;
            while let Some(end) = event_end(&chunk[at..]) {
                let ev = &chunk[at..at + end];
                let verdict = self.observe(ev, now);
                match copy.as_mut() {
                    Some(c) => self.put(ev, verdict, c),
                    None if verdict == Verdict::Pass && !self.strips_in(ev) => {}
                    None => {
                        let mut c = BytesMut::with_capacity(chunk.len());
                        c.extend_from_slice(&chunk[..at]);
                        self.put(ev, verdict, &mut c);
                        copy = Some(c);
                    }
                }
                at += end;
            }
            match copy {
                Some(mut c) => {
                    // Bytes after the last whole event (a stray line end) pass as they are.
                    c.extend_from_slice(&chunk[at..]);
                    c.freeze()
                }
                None => chunk.clone(),
            }
        } else {
            self.pending.extend_from_slice(chunk);
            let mut out = BytesMut::new();
            while let Some(end) = event_end(&self.pending) {
                let ev = self.pending.split_to(end);
                let verdict = self.observe(&ev, now);
                self.put(&ev, verdict, &mut out);
            }
            out.freeze()
        };
        if self.content_events > events_before {
            match self.first_read {
                None => self.first_read = Some((now, self.tokens)),
                Some(_) => {
                    self.later_reads += 1;
                    self.max_read_tokens = self
                        .max_read_tokens
                        .max(self.tokens.saturating_sub(tokens_before));
                    self.last_read = Some((now, self.tokens));
                }
            }
        }
        out
    }

    /// Appends what leaves of `ev` under `verdict` to `out`.
    fn put(&self, ev: &[u8], verdict: Verdict, out: &mut BytesMut) {
        match verdict {
            Verdict::Drop => {}
            Verdict::Pass => self.pass(ev, None, out),
            Verdict::Cut(r) => self.pass(ev, Some(r), out),
        }
    }

    /// Whether passing `ev` whole still edits it (`,"usage":null` the router asked for).
    fn strips_in(&self, ev: &[u8]) -> bool {
        self.strip.final_chunk && M_USAGE_NULL.find(ev).is_some()
    }

    /// Appends `ev` to `out` without the member in `cut` (a range of the whole event)
    /// and, when the router injected `include_usage`, without `,"usage":null`.
    fn pass(&self, ev: &[u8], cut: Option<std::ops::Range<usize>>, out: &mut BytesMut) {
        let mut put = |part: &[u8]| {
            if !self.strip.final_chunk {
                out.extend_from_slice(part);
                return;
            }
            let mut rest = part;
            while let Some(i) = M_USAGE_NULL.find(rest) {
                out.extend_from_slice(&rest[..i]);
                rest = &rest[i + USAGE_NULL.len()..];
            }
            out.extend_from_slice(rest);
        };
        match cut {
            Some(r) => {
                put(&ev[..r.start]);
                put(&ev[r.end..]);
            }
            None => put(ev),
        }
    }

    /// Bytes of an unfinished event left at the end of the stream.
    pub fn leftover(&mut self) -> Bytes {
        self.pending.split().freeze()
    }

    /// TPOT as the client saw it: (last − first content) / (tokens − 1), from the final
    /// usage's token count. `None` when everything came in one read (the spacing is
    /// unknowable) or fewer than two tokens were streamed.
    pub fn client_tpot_s(&self) -> Option<f64> {
        let tokens = self.usage.map_or(self.tokens, |u| u.completion_tokens);
        match (self.first_content, self.last_content) {
            (Some(a), Some(b))
                if tokens >= 2 && self.last_content_read > self.first_content_read =>
            {
                Some(b.duration_since(a).as_secs_f64() / f64::from(tokens - 1))
            }
            _ => None,
        }
    }

    /// The TPOT label: (t_last − t_first) / (N_last − N_first) between the first and the
    /// last read that carried content, N the tokens streamed by the end of each. Token
    /// counts must be the engine's (per-chunk usage, or one token per chunk as the
    /// final usage confirms). No label — never a near-zero one — when the span is too
    /// short or a single burst carried most of it: then the tokens' spacing was lost in
    /// the engine's or the network's buffering.
    pub fn tpot_label_s(&self) -> Option<f64> {
        let ((t1, n1), (t2, n2)) = (self.first_read?, self.last_read?);
        let exact = self.chunk_usage
            || self
                .usage
                .is_some_and(|u| u.completion_tokens == self.content_events);
        let span = n2.checked_sub(n1)?;
        if !exact
            || span < LABEL_MIN_TOKENS
            || self.later_reads < LABEL_MIN_LATER_READS
            || 2 * self.max_read_tokens > span
        {
            return None;
        }
        let dt = t2.duration_since(t1).as_secs_f64();
        (dt > 0.0).then(|| dt / f64::from(span))
    }

    fn observe(&mut self, ev: &[u8], now: Instant) -> Verdict {
        // `offset`: where the payload starts within the event (for the cut range).
        let (offset, data) = match ev.strip_prefix(b"data:") {
            Some(d) => {
                let d = d.trim_ascii_start();
                (ev.len() - d.len(), d)
            }
            None => (0, &b""[..]),
        };
        let holding = self.transcript.is_some();
        if data.starts_with(b"[DONE]") {
            if holding && self.upstream_error {
                // The end of a held-back error: the stream is not over for the client.
                return Verdict::Drop;
            }
            self.done = true;
            return Verdict::Pass;
        }
        if data.starts_with(b"{\"error\"") {
            self.upstream_error = true;
            return if holding {
                Verdict::Drop
            } else {
                Verdict::Pass
            };
        }
        let choices = choices_end(data);
        let content = has_choices(data, choices);
        let member = usage_member(data);
        if !content {
            if member.is_some() || M_USAGE_OBJ.find(data).is_some() {
                if let Some((u, _)) = member {
                    self.usage = Some(u);
                }
                if M_METRICS.find(data).is_some()
                    && let Ok(t) = serde_json::from_slice::<TimingsOnly>(data.trim_ascii_end())
                {
                    self.engine = t.metrics;
                }
                // The final usage chunk has no choices; drop it if the client did not ask.
                if M_CHOICES_NONE.find(data).is_some() && self.strip.final_chunk {
                    return Verdict::Drop;
                }
            }
            return Verdict::Pass;
        }
        if self.first_content.is_none() {
            self.first_content = Some(now);
            self.first_content_read = self.reads;
        }
        self.last_content = Some(now);
        self.last_content_read = self.reads;
        self.content_events += 1;
        if let Some(t) = self.transcript.as_mut() {
            t.note_at(data.trim_ascii_end(), choices);
        }
        match member {
            Some((u, range)) => {
                self.chunk_usage = true;
                // Cumulative counts; never let a stale or reordered chunk move them back.
                self.tokens = self.tokens.max(u.completion_tokens);
                self.chunk_prompt_tokens.get_or_insert(u.prompt_tokens);
                if let Some(c) = u.cached_tokens() {
                    self.chunk_cached_tokens.get_or_insert(c);
                }
                if self.strip.per_chunk {
                    return Verdict::Cut(range.start + offset..range.end + offset);
                }
            }
            None if !self.chunk_usage => self.tokens += 1,
            None => {}
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
    /// Pass without this byte range of the event (the per-chunk usage member).
    Cut(std::ops::Range<usize>),
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The plain-form usage reader gives what the parser gives, value and range, for
    /// objects built from members in random order, values and repeats.
    #[test]
    fn the_flat_usage_reader_reads_what_the_parser_reads() {
        use proptest::prelude::*;
        let number = prop_oneof![
            Just("0".to_string()),
            (0u64..5_000_000_000).prop_map(|v| v.to_string()),
            Just("-3".to_string()),
            Just("1.5".to_string()),
            Just("2e3".to_string()),
            Just("007".to_string()),
            Just("null".to_string()),
            Just("\"12\"".to_string()),
        ];
        let member = prop_oneof![
            number
                .clone()
                .prop_map(|v| format!(r#""prompt_tokens":{v}"#)),
            number
                .clone()
                .prop_map(|v| format!(r#""completion_tokens":{v}"#)),
            number
                .clone()
                .prop_map(|v| format!(r#""total_tokens":{v}"#)),
            number
                .clone()
                .prop_map(|v| format!(r#""prompt_tokens_details":{{"cached_tokens":{v}}}"#)),
            Just(r#""prompt_tokens_details":null"#.to_string()),
            Just(r#""prompt_tokens_details":{}"#.to_string()),
            Just(r#""prompt_tokens_details":{"cached_tokens":1,"audio_tokens":0}"#.to_string()),
            Just(r#""reasoning_tokens":4"#.to_string()),
            Just(r#""completion_tokens_details":null"#.to_string()),
            Just(r#""completion_tokens_details":{"reasoning_tokens":0}"#.to_string()),
            Just(r#" "prompt_tokens":1"#.to_string()),
        ];
        let chunk =
            (proptest::collection::vec(member, 0..6), any::<bool>()).prop_map(|(m, after)| {
                let tail = if after {
                    r#","system_fingerprint":"x"}"#
                } else {
                    "}"
                };
                format!(
                    r#"{{"id":"c","choices":[{{"index":0,"text":"a"}}],"usage":{{{}}}{tail}"#,
                    m.join(",")
                )
            });
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 3000,
            ..ProptestConfig::default()
        });
        runner
            .run(&chunk, |c| {
                let d = c.as_bytes();
                prop_assert_eq!(
                    usage_member_with(d, true),
                    usage_member_with(d, false),
                    "{}",
                    c
                );
                Ok(())
            })
            .expect("the flat usage reader agrees with the parser");
    }

    const CHUNK1: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}],\"usage\":null}\n\n";
    const CHUNK2: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" \\\",\\\"usage\\\":null there\"},\"finish_reason\":\"length\"}],\"usage\":null}\n\n";
    const USAGE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":3}},\"system_fingerprint\":\"fp\"}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    const KEEP: InjectedUsage = InjectedUsage {
        final_chunk: false,
        per_chunk: false,
    };
    const INJECTED: InjectedUsage = InjectedUsage {
        final_chunk: true,
        per_chunk: true,
    };

    /// A completions chunk as vLLM sends it with `continuous_usage_stats`.
    fn counted(text: &str, prompt: u32, done: u32) -> String {
        format!(
            "data: {{\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\"{text}\",\"finish_reason\":null}}],\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{done}}}}}\n\n",
            prompt + done
        )
    }

    fn final_usage(prompt: u32, done: u32) -> String {
        format!(
            "data: {{\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"total_tokens\":{},\"completion_tokens\":{done}}}}}\n\n",
            prompt + done
        )
    }

    /// Feeds each read at its offset (ms) from a common start.
    fn timed(strip: InjectedUsage, reads: &[(u64, String)]) -> (SseScanner, String) {
        let t0 = Instant::now();
        let mut s = SseScanner::new(strip);
        let mut out = Vec::new();
        for (ms, r) in reads {
            let at = t0 + Duration::from_millis(*ms);
            out.extend_from_slice(&s.feed(&Bytes::from(r.clone()), at));
        }
        (s, String::from_utf8(out).unwrap())
    }

    /// A stream the router asked per-chunk usage for, from an engine that sent none:
    /// nothing to edit, so the upstream's buffer passes on uncopied; once an event is
    /// cut, the events after it are still passed whole.
    #[test]
    fn an_edited_stream_passes_untouched_events_without_a_copy() {
        let per_chunk = InjectedUsage {
            final_chunk: false,
            per_chunk: true,
        };
        let plain = format!("{CHUNK1}{USAGE}{DONE}");
        let input = Bytes::from(plain.clone());
        let mut s = SseScanner::new(per_chunk);
        let out = s.feed(&input, Instant::now());
        assert_eq!(out, input);
        assert_eq!(out.as_ptr(), input.as_ptr(), "copied");
        assert!(s.done && s.usage.is_some());
        let mixed = format!("{CHUNK1}{}{}{DONE}", counted("a", 5, 1), counted("b", 5, 2));
        let mut s = SseScanner::new(per_chunk);
        let out = s.feed(&Bytes::from(mixed), Instant::now());
        let want = format!(
            "{CHUNK1}{}{}{DONE}",
            counted("a", 5, 1).replace(
                ",\"usage\":{\"prompt_tokens\":5,\"total_tokens\":6,\"completion_tokens\":1}",
                ""
            ),
            counted("b", 5, 2).replace(
                ",\"usage\":{\"prompt_tokens\":5,\"total_tokens\":7,\"completion_tokens\":2}",
                ""
            ),
        );
        assert_eq!(String::from_utf8(out.to_vec()).unwrap(), want);
        assert_eq!(s.tokens, 2);
    }

    fn run(strip: InjectedUsage, chunks: &[&[u8]]) -> (SseScanner, String) {
        let reads: Vec<(u64, String)> = chunks
            .iter()
            .map(|c| (0, String::from_utf8(c.to_vec()).unwrap()))
            .collect();
        timed(strip, &reads)
    }

    fn assert_valid_events(out: &str) {
        for ev in out.split("\n\n").filter(|e| e.starts_with("data: {")) {
            serde_json::from_str::<serde_json::Value>(&ev[6..]).expect("still valid JSON");
        }
    }

    #[test]
    fn passes_through_untouched_when_client_asked_for_usage() {
        let all = format!("{CHUNK1}{CHUNK2}{USAGE}{DONE}");
        let (s, out) = run(KEEP, &[all.as_bytes()]);
        assert_eq!(out, all);
        assert_eq!(s.content_events, 2);
        assert_eq!(s.usage.unwrap().completion_tokens, 2);
        assert_eq!(s.usage.unwrap().cached_tokens(), Some(3));
        assert!(s.done && s.first_content.is_some());
    }

    #[test]
    fn strips_injected_usage_but_not_lookalike_content() {
        let all = format!("{CHUNK1}{CHUNK2}{USAGE}{DONE}");
        let (s, out) = run(INJECTED, &[all.as_bytes()]);
        assert_eq!(s.usage.unwrap().completion_tokens, 2);
        assert!(!out.contains("\"usage\":{"));
        assert!(!out.contains("\"usage\":null}"));
        // The escaped look-alike inside the content string survives.
        assert!(out.contains("\\\",\\\"usage\\\":null there"));
        assert!(out.ends_with(DONE));
        assert_valid_events(&out);
    }

    #[test]
    fn per_chunk_usage_counts_tokens_and_is_cut_from_what_the_client_sees() {
        // stream_interval 12: the first token alone, then 12 per chunk.
        let reads: Vec<(u64, String)> = vec![
            (0, counted("a", 40, 1)),
            (120, counted("b", 40, 13)),
            (240, counted("c", 40, 25)),
            (360, counted("d", 40, 37)),
            (361, format!("{}{DONE}", final_usage(40, 37))),
        ];
        let (s, out) = timed(INJECTED, &reads);
        assert_eq!(s.tokens, 37);
        assert_eq!(s.content_events, 4);
        assert!(s.chunk_usage);
        assert_eq!(s.chunk_prompt_tokens, Some(40));
        assert!(!out.contains("usage"), "{out}");
        assert!(out.contains("\"text\":\"d\""));
        assert_valid_events(&out);
        // 360 ms over 36 token intervals, not over 3 chunk intervals.
        let label = s.tpot_label_s().unwrap();
        assert!((label - 0.010).abs() < 1e-9, "{label}");
        let client = s.client_tpot_s().unwrap();
        assert!((client - 0.010).abs() < 1e-9, "{client}");
    }

    #[test]
    fn client_asking_only_for_the_final_usage_keeps_it() {
        let strip = InjectedUsage {
            final_chunk: false,
            per_chunk: true,
        };
        let reads = vec![
            (0, counted("a", 8, 1)),
            (
                10,
                format!("{}{}{DONE}", counted("b", 8, 2), final_usage(8, 2)),
            ),
        ];
        let (s, out) = timed(strip, &reads);
        assert_eq!(out.matches("\"usage\":{").count(), 1, "{out}");
        assert!(out.contains("\"choices\":[],\"usage\":{\"prompt_tokens\":8"));
        assert_eq!(s.usage.unwrap().completion_tokens, 2);
        assert_valid_events(&out);
    }

    #[test]
    fn a_burst_gives_no_label_rather_than_a_tiny_one() {
        // Everything after the first token flushed in one read: the spacing is lost.
        let burst: String = (2..=30).map(|n| counted("t", 10, n)).collect();
        let (s, _) = timed(INJECTED, &[(0, counted("a", 10, 1)), (300, burst)]);
        assert_eq!(s.tokens, 30);
        assert_eq!(s.tpot_label_s(), None);
        // One read holding most of the span is a burst too.
        let big: String = (4..=30).map(|n| counted("t", 10, n)).collect();
        let (s, _) = timed(
            INJECTED,
            &[
                (0, counted("a", 10, 1)),
                (10, counted("b", 10, 2)),
                (20, counted("c", 10, 3)),
                (300, big),
            ],
        );
        assert_eq!(s.tpot_label_s(), None);
        // And a lone read is no span at all.
        let (s, _) = timed(INJECTED, &[(0, counted("a", 10, 1))]);
        assert_eq!(s.tpot_label_s(), None);
    }

    #[test]
    fn without_per_chunk_usage_a_chunk_is_a_token_only_if_the_total_agrees() {
        let chunk = |t: &str| {
            format!(
                "data: {{\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\"{t}\"}}]}}\n\n"
            )
        };
        let reads = |total: u32| -> Vec<(u64, String)> {
            vec![
                (0, chunk("a")),
                (10, chunk("b")),
                (20, chunk("c")),
                (30, format!("{}{}{DONE}", chunk("d"), final_usage(5, total))),
            ]
        };
        let (s, _) = timed(KEEP, &reads(4));
        let label = s.tpot_label_s().unwrap();
        assert!((label - 0.010).abs() < 1e-9, "{label}");
        // Four chunks but twelve tokens: how they were spread is unknown.
        let (s, _) = timed(KEEP, &reads(12));
        assert_eq!(s.tpot_label_s(), None);
        assert!(s.client_tpot_s().is_some());
    }

    #[test]
    fn events_split_across_chunks_are_reassembled() {
        let all = format!("{CHUNK1}{USAGE}{DONE}");
        let bytes = all.as_bytes();
        let pieces: Vec<&[u8]> = bytes.chunks(7).collect();
        let (s, out) = run(KEEP, &pieces);
        assert_eq!(out, all);
        assert_eq!(s.content_events, 1);
        assert!(s.done);
        // Split and edited: the cut still lands on the right bytes.
        let all = format!("{}{}{DONE}", counted("z", 3, 1), final_usage(3, 1));
        let pieces: Vec<&[u8]> = all.as_bytes().chunks(5).collect();
        let (s, out) = run(INJECTED, &pieces);
        assert_eq!(s.tokens, 1);
        assert!(!out.contains("usage"));
        assert_valid_events(&out);
    }

    #[test]
    fn a_failover_stream_holds_back_the_error_and_its_done_and_keeps_the_text() {
        let all = format!("{CHUNK1}data: {{\"error\":{{\"message\":\"x\"}}}}\n\n{DONE}");
        // Whole events in one read (the fast path) and split reads (the slow one).
        for pieces in [vec![all.as_bytes()], all.as_bytes().chunks(9).collect()] {
            let mut s = SseScanner::new(KEEP);
            s.transcript = Some(Box::default());
            let mut out = Vec::new();
            for p in pieces {
                out.extend_from_slice(&s.feed(&Bytes::copy_from_slice(p), Instant::now()));
            }
            assert_eq!(String::from_utf8(out).unwrap(), CHUNK1);
            assert!(s.upstream_error && !s.done);
            assert_eq!(s.transcript.unwrap().text, "Hi");
        }
    }

    #[test]
    fn upstream_error_event_is_noticed() {
        let (s, _) = run(
            KEEP,
            &[b"data: {\"error\":{\"message\":\"x\"}}\n\ndata: [DONE]\n\n"],
        );
        assert!(s.upstream_error && s.done);
    }
}
