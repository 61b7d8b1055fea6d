//! Mid-stream failover: a stream that a replica breaks after the client got its first
//! byte continues on another replica, so the client's one stream completes.
//!
//! The continuation asks for the rest of the same generation: the prompt followed by
//! the text already streamed (completions: appended to `prompt`; chat: a final
//! assistant message with vLLM's `continue_final_message`) with `max_tokens` less the
//! tokens already streamed. Its events are spliced into the client's stream (see
//! [`splice`]): the `id` and `created` the client already saw, no second `role`
//! delta, and usage over the whole stream — completion tokens of every part, the
//! prompt tokens of the client's own prompt.
//!
//! Invariants: the client never sees a byte twice (a partial event at the cut is
//! dropped, and the continuation regenerates from the last whole event); an upstream
//! error event is held back while a continuation may still take over (`sse.rs`), and
//! if none can, the stream ends with one SSE error and `[DONE]` as before. The broken
//! attempt is closed out as a failure of its replica (ejection counts it) and the
//! continuation never goes back to that replica.
//!
//! Well defined only where the rest of a generation depends on nothing but its text:
//! not with `n`/`best_of` > 1, `echo`, log-probabilities, tools, reasoning deltas or
//! structured output (a grammar's state is not in the text), nor for a token-id
//! prompt (the router does not detokenize). Sampling resumes from the text, so a
//! seeded request is not reproducible across a cut.
//!
//! Cost: nothing until a cut but one parse of each content event's choice (µs, only
//! for eligible streams); at a cut, one routing decision and the continuation's
//! prefill of prompt + streamed tokens (a prefix-cache hit only where the new replica
//! holds the prompt), which is the pause the client sees (`headroom_failover_seconds`).

use std::{borrow::Cow, sync::Arc, time::Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Response, StatusCode};
use hyper::body::Incoming;
use rand::Rng;
use serde::{
    Deserialize,
    de::{DeserializeSeed, SeqAccess, Visitor},
};
use serde_json::{Map, Value};

use headroom_core::lifecycle;

use super::{
    body::Tracking,
    sse::{choices_end, event_end},
};
use crate::{
    clock,
    node::RequestPath,
    policy::RequestProfile,
    request::{Endpoint, InjectedUsage, ParsedRequest, PromptInput},
};

/// What a stream's content events said so far (kept across continuations).
#[derive(Debug, Default)]
pub struct Transcript {
    /// The first content chunk, kept whole: its header members are parsed only when a
    /// continuation or a final usage event needs them ([`Transcript::header`]), since
    /// few streams are ever cut (parsing every stream's first chunk was ≈ 7k
    /// instructions a request).
    head: Option<Box<[u8]>>,
    /// `head` parsed, at first use; `None` inside where it is not a readable chunk.
    header: std::cell::OnceCell<Option<Header>>,
    /// The generated text the client has received.
    pub text: String,
    /// A choice carried a `finish_reason`: the generation itself is over.
    pub finished: bool,
    /// Something the text does not capture went by (a tool-call or reasoning delta, a
    /// second choice, an unreadable event): no continuation is well defined. See
    /// [`Transcript::opaque`], which also counts an unreadable first chunk.
    opaque: bool,
}

/// The stream's header members, as its first content chunk gave them.
#[derive(Debug, Default, PartialEq)]
pub struct Header {
    pub id: Option<String>,
    pub created: Option<u64>,
    pub object: Option<String>,
    pub model: Option<String>,
}

#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(default)]
    created: Option<u64>,
    #[serde(borrow, default)]
    object: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    model: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Vec<Choice<'a>>,
}

/// Notes each element of a content chunk's choices array as it is parsed (no list
/// is built).
struct NoteChoices<'t>(&'t mut Transcript);

impl<'de> DeserializeSeed<'de> for NoteChoices<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for NoteChoices<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of choices")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(ch) = seq.next_element::<Choice<'de>>()? {
            self.0.note_choice(ch);
        }
        Ok(())
    }
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: u32,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    logprobs: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(default)]
    tool_calls: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    reasoning_content: Option<serde::de::IgnoredAny>,
}

impl Transcript {
    /// Notes one content event's payload (JSON, `data: ` stripped).
    pub fn note(&mut self, data: &[u8]) {
        self.note_at(data, choices_end(data));
    }

    /// [`Self::note`] where the caller has already looked for the first `"choices":[`:
    /// `choices` is where it ends ([`choices_end`]), so the event is searched once.
    pub fn note_at(&mut self, data: &[u8], choices: Option<usize>) {
        self.note_with(data, choices, true);
    }

    /// [`Self::note_at`], reading the plain choice forms without the parser where `flat`
    /// (`flat_choice.rs`; `false`: the reference its tests compare with).
    fn note_with(&mut self, data: &[u8], choices: Option<usize>, flat: bool) {
        if let Some(at) = choices {
            // Chunks are read from their choices on (an unescaped `"choices":[` is
            // structural, as in `sse.rs`); the first is kept for its header members.
            if self.head.is_none() {
                self.head = Some(data.into());
            }
            if flat && let Some(c) = super::flat_choice::read(&data[at..]) {
                self.text.push_str(c.text.unwrap_or_default());
                self.text.push_str(c.content.unwrap_or_default());
                self.finished |= c.finished;
                return;
            }
            let mut de = serde_json::Deserializer::from_slice(&data[at - 1..]);
            if NoteChoices(self).deserialize(&mut de).is_err() {
                self.opaque = true;
            }
            return;
        }
        // No choices marker: the whole chunk through the parser.
        let Ok(c) = serde_json::from_slice::<Chunk<'_>>(data) else {
            self.opaque = true;
            return;
        };
        if self.head.is_none() && c.id.is_some() {
            self.head = Some(data.into());
        }
        for ch in c.choices {
            self.note_choice(ch);
        }
    }

    /// The header members of the first content chunk; `None` before one came or where
    /// it is not a readable chunk.
    pub fn header(&self) -> Option<&Header> {
        self.header
            .get_or_init(|| {
                let c = serde_json::from_slice::<Chunk<'_>>(self.head.as_deref()?).ok()?;
                Some(Header {
                    id: c.id.map(Cow::into_owned),
                    created: c.created,
                    object: c.object.map(Cow::into_owned),
                    model: c.model.map(Cow::into_owned),
                })
            })
            .as_ref()
    }

    /// Something the text does not capture went by, or the first chunk is unreadable:
    /// no continuation is well defined.
    pub fn opaque(&self) -> bool {
        self.opaque || (self.head.is_some() && self.header().is_none())
    }

    fn note_choice(&mut self, ch: Choice<'_>) {
        if ch.index != 0 || ch.logprobs.is_some() {
            self.opaque = true;
        }
        if let Some(t) = ch.text {
            self.text.push_str(&t);
        }
        if let Some(d) = ch.delta {
            if d.tool_calls.is_some() || d.reasoning_content.is_some() {
                self.opaque = true;
            }
            if let Some(t) = d.content {
                self.text.push_str(&t);
            }
        }
        if ch.finish_reason.is_some() {
            self.finished = true;
        }
    }
}

/// What a cut stream can become.
#[derive(Debug, PartialEq)]
pub enum Cut {
    /// Continue with this request body.
    Resume(Bytes),
    /// The generation was already over (its last token came): end the stream cleanly.
    Finished,
    /// No continuation is well defined, for this reason.
    Ineligible(&'static str),
}

fn positive(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|x| x > 0.0),
        Some(_) => true,
    }
}

/// The request that continues a stream cut after `streamed` tokens whose text is in
/// `t`; `body` is the request as first sent upstream.
pub fn continuation(endpoint: Endpoint, body: &[u8], t: &Transcript, streamed: u32) -> Cut {
    if t.finished {
        return Cut::Finished;
    }
    if t.opaque() {
        return Cut::Ineligible("opaque_stream");
    }
    let Ok(Value::Object(mut m)) = serde_json::from_slice::<Value>(body) else {
        return Cut::Ineligible("unreadable_body");
    };
    if m.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1)
        || m.get("best_of")
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 1)
    {
        return Cut::Ineligible("several_choices");
    }
    if positive(m.get("echo")) {
        return Cut::Ineligible("echo");
    }
    if positive(m.get("logprobs"))
        || positive(m.get("top_logprobs"))
        || positive(m.get("prompt_logprobs"))
    {
        return Cut::Ineligible("logprobs");
    }
    if m.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        return Cut::Ineligible("tools");
    }
    let structured = [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
    ]
    .iter()
    .any(|k| positive(m.get(*k)))
        || positive(m.get("structured_outputs"))
        || m.get("response_format")
            .and_then(|f| f.get("type"))
            .and_then(Value::as_str)
            .is_some_and(|ty| ty != "text");
    if structured {
        return Cut::Ineligible("structured_output");
    }
    for key in ["max_completion_tokens", "max_tokens"] {
        if let Some(max) = m.get(key).and_then(Value::as_u64) {
            let left = max.saturating_sub(u64::from(streamed));
            if left == 0 {
                return Cut::Finished;
            }
            m.insert(key.into(), left.into());
        }
    }
    if let Some(min) = m.get("min_tokens").and_then(Value::as_u64) {
        m.insert(
            "min_tokens".into(),
            min.saturating_sub(streamed.into()).into(),
        );
    }
    let extended = match endpoint {
        Endpoint::Completions => extend_prompt(&mut m, &t.text),
        Endpoint::ChatCompletions => extend_chat(&mut m, &t.text),
    };
    if let Err(why) = extended {
        return Cut::Ineligible(why);
    }
    match serde_json::to_vec(&m) {
        Ok(b) => Cut::Resume(Bytes::from(b)),
        Err(_) => Cut::Ineligible("unreadable_body"),
    }
}

fn extend_prompt(m: &mut Map<String, Value>, text: &str) -> Result<(), &'static str> {
    match m.get_mut("prompt") {
        Some(Value::String(p)) => p.push_str(text),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            if let Some(Value::String(p)) = a.first_mut() {
                p.push_str(text);
            }
        }
        _ => return Err("prompt_not_text"),
    }
    Ok(())
}

fn extend_chat(m: &mut Map<String, Value>, text: &str) -> Result<(), &'static str> {
    if text.is_empty() {
        // Nothing generated yet: the original request is its own continuation.
        return Ok(());
    }
    let continuing = positive(m.get("continue_final_message"));
    let Some(Value::Array(msgs)) = m.get_mut("messages") else {
        return Err("no_messages");
    };
    if continuing {
        // The client already asked to extend its last message: extend it further.
        match msgs.last_mut().and_then(|l| l.get_mut("content")) {
            Some(Value::String(c)) => c.push_str(text),
            _ => return Err("final_message_not_text"),
        }
    } else {
        msgs.push(serde_json::json!({"role": "assistant", "content": text}));
    }
    m.insert("continue_final_message".into(), Value::Bool(true));
    m.insert("add_generation_prompt".into(), Value::Bool(false));
    Ok(())
}

/// How a continuation's events are made part of the client's stream.
#[derive(Clone, Debug)]
pub struct Splice {
    pub id: Option<String>,
    pub created: Option<u64>,
    /// Completion tokens the client received before this continuation.
    pub tokens_before: u32,
    /// The client's own prompt tokens, where the first replica reported them.
    pub prompt_tokens: Option<u32>,
}

/// Rewrites whole SSE events of a continuation (see the module docs); events that are
/// not JSON objects (`[DONE]`) pass unchanged.
pub fn splice(events: &[u8], s: &Splice) -> Bytes {
    let mut out = BytesMut::with_capacity(events.len() + 16);
    let mut rest = events;
    while !rest.is_empty() {
        let end = event_end(rest).unwrap_or(rest.len());
        let (ev, tail) = rest.split_at(end);
        rest = tail;
        match rewrite(ev, s) {
            Some(b) => out.extend_from_slice(&b),
            None => out.extend_from_slice(ev),
        }
    }
    out.freeze()
}

fn rewrite(ev: &[u8], s: &Splice) -> Option<Vec<u8>> {
    let data = ev.strip_prefix(b"data:")?.trim_ascii();
    let Ok(Value::Object(mut m)) = serde_json::from_slice::<Value>(data) else {
        return None;
    };
    if let Some(id) = &s.id {
        m.insert("id".into(), Value::String(id.clone()));
    }
    if let (Some(c), true) = (s.created, m.contains_key("created")) {
        m.insert("created".into(), c.into());
    }
    if let Some(Value::Array(choices)) = m.get_mut("choices") {
        for ch in choices {
            if let Some(Value::Object(d)) = ch.get_mut("delta") {
                d.remove("role");
            }
        }
    }
    if let Some(Value::Object(u)) = m.get_mut("usage") {
        let done = u
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0)
            + u64::from(s.tokens_before);
        let prompt = s.prompt_tokens.map(u64::from).unwrap_or_else(|| {
            u.get("prompt_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .saturating_sub(s.tokens_before.into())
        });
        u.insert("completion_tokens".into(), done.into());
        u.insert("prompt_tokens".into(), prompt.into());
        u.insert("total_tokens".into(), (prompt + done).into());
    }
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, &m).ok()?;
    out.extend_from_slice(b"\n\n");
    Some(out)
}

/// The final usage event of a stream that ended at a cut after its last token, for a
/// client that asked for usage.
pub fn final_usage(t: &Transcript, prompt_tokens: Option<u32>, completion: u32) -> Bytes {
    let prompt = prompt_tokens.unwrap_or(0);
    let h = t.header();
    let ev = serde_json::json!({
        "id": h.and_then(|h| h.id.as_deref()),
        "object": h.and_then(|h| h.object.as_deref()),
        "created": h.and_then(|h| h.created),
        "model": h.and_then(|h| h.model.as_deref()),
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    });
    Bytes::from(format!("data: {ev}\n\n"))
}

/// A stream's failover state, fixed at dispatch and carried by its body.
pub struct Failover {
    pub path: Arc<RequestPath>,
    pub endpoint: Endpoint,
    /// The request as first sent upstream.
    pub body: Bytes,
    pub headers: HeaderMap,
    pub profile: RequestProfile,
    pub strip: InjectedUsage,
    /// The request's deadline priority (`priority`), kept by its continuations.
    pub deadline: Option<i64>,
    pub arrived: Instant,
    /// Continuations still allowed.
    pub left: u32,
    /// Set once a continuation streams: how its events are spliced.
    pub splice: Option<Splice>,
    /// When the current cut happened.
    pub cut_at: Option<Instant>,
}

impl Failover {
    /// The state for a stream that may fail over, or `None` where it may not (not a
    /// stream, the tenant opted out, no continuation allowed, a token-id prompt).
    pub fn new(
        path: &Arc<RequestPath>,
        parsed: &ParsedRequest,
        profile: &RequestProfile,
        headers: &HeaderMap,
        arrived: Instant,
        tenant_allows: bool,
    ) -> Option<Self> {
        let left = path.cfg.proxy.failover_attempts;
        let text = matches!(parsed.prompt, PromptInput::Text(_));
        (parsed.stream && tenant_allows && left > 0 && text).then(|| Self {
            path: path.clone(),
            endpoint: parsed.endpoint,
            body: parsed.upstream_body.clone(),
            headers: headers.clone(),
            profile: profile.clone(),
            strip: parsed.injected,
            deadline: super::priority::deadline_ms(
                arrived,
                profile.slo.ttft_ms,
                parsed.client_priority,
            ),
            arrived,
            left,
            splice: None,
            cut_at: None,
        })
    }

    pub fn count(&self, outcome: &str) {
        self.path
            .metrics
            .failover
            .with_label_values(&[outcome])
            .inc();
    }

    /// The profile the continuation is routed with: the streamed tokens join the
    /// prompt and leave the output budget.
    pub fn continued_profile(&self, streamed: u32) -> RequestProfile {
        let mut p = self.profile.clone();
        p.prompt_tokens = p.prompt_tokens.saturating_add(streamed);
        p.max_tokens = p.max_tokens.map(|m| m.saturating_sub(streamed).max(1));
        p.expected_output_tokens = p.expected_output_tokens.saturating_sub(streamed).max(1);
        p
    }
}

/// A continuation that answered with its first frame.
pub struct Resumed {
    pub resp: Response<Incoming>,
    pub first: Option<Bytes>,
    pub track: Tracking,
}

/// Routes and sends a continuation to any replica but `failed` (the attempts are
/// booked, bounded by the node's retry budget and jittered, as before a first byte).
pub async fn resume(
    path: Arc<RequestPath>,
    failed: u64,
    endpoint: Endpoint,
    body: Bytes,
    headers: HeaderMap,
    mut profile: RequestProfile,
    (arrived, deadline): (Instant, Option<i64>),
) -> Result<Resumed, &'static str> {
    // The continuation is not a decision record of its own (the request's record has the
    // first placement).
    // Planned as a fresh arrival: the client already has its first token, so the
    // continuation's own first token is what the TTFT objective now bounds.
    let (targets, _) = super::plan(&path, &mut profile, Instant::now(), None)
        .await
        .map_err(|_| "no_replica")?;
    for (tried, target) in targets
        .iter()
        .filter(|t| t.replica.key != failed)
        .enumerate()
    {
        if tried > 0 {
            let base = path.cfg.proxy.retry_backoff_ms.max(1);
            let jitter = rand::rng().random_range(base..=base * 3);
            tokio::time::sleep(std::time::Duration::from_millis(jitter)).await;
        }
        let r = &target.replica;
        let booking = lifecycle::book(r.as_ref(), &profile, &target.routed, clock::now_s());
        let sent_body = super::priority::body_for(r, &path.cfg.proxy, &body, deadline);
        let req =
            super::upstream_request(r, endpoint, &sent_body, &headers).map_err(|_| "request")?;
        let dispatched = Instant::now();
        let sent = tokio::time::timeout(
            path.cfg.proxy.first_byte_timeout(),
            path.fleet.client.request(req),
        )
        .await;
        let why = match sent {
            Err(_) => "first_byte_timeout",
            Ok(Err(e)) => crate::upstream::connect_failure(&e),
            Ok(Ok(mut resp)) if resp.status().is_success() => {
                match super::first_frame(&mut resp, &path).await {
                    Ok(first) => {
                        path.remember_prefix(r, &profile, &target.routed);
                        path.outcomes.placed(r, &profile.blocks);
                        let track = Tracking {
                            outcomes: path.outcomes.clone(),
                            replica: r.clone(),
                            model: profile.model.clone(),
                            arrived,
                            dispatched,
                            booking,
                            prompt_bytes: None,
                            prompt_messages: 0,
                            // The continuation's latency is not a request's: not learned.
                            learn: None,
                            ttft_learned: false,
                            decision: None,
                            // The request's trace is carried over by the body.
                            trace: None,
                        };
                        return Ok(Resumed { resp, first, track });
                    }
                    Err(why) => why,
                }
            }
            Ok(Ok(resp)) if resp.status() == StatusCode::TOO_MANY_REQUESTS => "429",
            Ok(Ok(resp)) if resp.status().is_server_error() => "5xx",
            // The continuation itself was refused (e.g. it no longer fits the context).
            Ok(Ok(_)) => return Err("refused"),
        };
        drop(booking);
        super::attempt_failed(&path, r, why);
    }
    Err("no_replica")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript(events: &[&str]) -> Transcript {
        let mut t = Transcript::default();
        for e in events {
            t.note(e.as_bytes());
        }
        t
    }

    fn body(c: &Cut) -> Value {
        match c {
            Cut::Resume(b) => serde_json::from_slice(b).unwrap(),
            other => panic!("not resumed: {other:?}"),
        }
    }

    /// The plain-form reader notes exactly what the parser notes, for the engines'
    /// chunks and for choices built from members in random order, values and repeats.
    #[test]
    fn the_flat_reader_notes_what_the_parser_notes() {
        use proptest::prelude::*;
        let header =
            r#"{"id":"c","object":"text_completion","created":1,"model":"m","choices":[]}"#;
        let check = |events: &[String]| {
            let (mut a, mut b) = (Transcript::default(), Transcript::default());
            for e in std::iter::once(header.to_string()).chain(events.iter().cloned()) {
                let at = choices_end(e.as_bytes());
                a.note_with(e.as_bytes(), at, true);
                b.note_with(e.as_bytes(), at, false);
            }
            assert_eq!(
                (&a.text, a.finished, a.opaque(), a.header()),
                (&b.text, b.finished, b.opaque(), b.header()),
                "{events:?}"
            );
        };
        for fixture in [
            "completion-stream-usage.sse",
            "chat-stream-usage.sse",
            "completion-stream-chunk-usage.sse",
            "chat-stream-chunk-usage.sse",
        ] {
            let path = format!(
                "{}/../scripts/vllm/fixtures/{fixture}",
                env!("CARGO_MANIFEST_DIR")
            );
            let sse = std::fs::read_to_string(path).expect("fixture");
            let events: Vec<String> = sse
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|d| *d != "[DONE]")
                .map(str::to_string)
                .collect();
            assert!(events.len() > 3);
            check(&events);
        }
        let string = prop_oneof![
            Just(r#""plain text""#.to_string()),
            Just(r#""""#.to_string()),
            Just(r#""a \"quoted\" b""#.to_string()),
            Just(r#""tab\tand \u00e9""#.to_string()),
            Just("\"raw\u{1}control\"".to_string()),
            Just(r#""ünïcödé 字""#.to_string()),
            Just("null".to_string()),
            Just("7".to_string()),
        ];
        let member = prop_oneof![
            Just(r#""index":0"#.to_string()),
            Just(r#""index":1"#.to_string()),
            string.clone().prop_map(|s| format!(r#""text":{s}"#)),
            string
                .clone()
                .prop_map(|s| format!(r#""delta":{{"content":{s}}}"#)),
            Just(r#""delta":{"role":"assistant","content":"hi"}"#.to_string()),
            Just(r#""delta":{"tool_calls":[{"id":"t"}]}"#.to_string()),
            Just(r#""finish_reason":null"#.to_string()),
            Just(r#""finish_reason":"stop""#.to_string()),
            Just(r#""finish_reason":"length""#.to_string()),
            Just(r#""finish_reason":"""#.to_string()),
            Just(r#""finish_reason":"a"b""#.to_string()),
            Just(r#""finish_reason":7"#.to_string()),
            Just(r#""logprobs":null"#.to_string()),
            Just(r#""logprobs":{"tokens":["a"]}"#.to_string()),
            Just(r#""stop_reason":null"#.to_string()),
            Just(r#""token_ids":null"#.to_string()),
            Just(r#""token_ids":[1,2]"#.to_string()),
            Just(r#""seed":null"#.to_string()),
            Just(r#" "index":0"#.to_string()),
        ];
        let choice =
            proptest::collection::vec(member, 0..6).prop_map(|m| format!("{{{}}}", m.join(",")));
        let chunk =
            (proptest::collection::vec(choice, 0..3), any::<bool>()).prop_map(|(cs, usage)| {
                let tail = if usage {
                    r#","usage":{"completion_tokens":1}}"#
                } else {
                    "}"
                };
                format!(
                    r#"{{"id":"c","created":1,"choices":[{}]{tail}"#,
                    cs.join(",")
                )
            });
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
            cases: 2000,
            ..ProptestConfig::default()
        });
        runner
            .run(&proptest::collection::vec(chunk, 1..4), |events| {
                check(&events);
                Ok(())
            })
            .expect("the flat reader agrees with the parser");
    }

    /// The header is the first chunk's, parsed when a continuation asks for it; a first
    /// chunk whose choice reads but whose whole does not is opaque, as when the parser
    /// read every first chunk.
    #[test]
    fn the_header_is_the_first_chunks_read_when_asked() {
        let t = transcript(&[
            r#"{"id":"cmpl-9","object":"text_completion","created":3,"model":"m","choices":[{"index":0,"text":"a","finish_reason":null}],"usage":null}"#,
            r#"{"id":"other","created":4,"choices":[{"index":0,"text":"b"}]}"#,
        ]);
        assert_eq!(
            t.header(),
            Some(&Header {
                id: Some("cmpl-9".into()),
                created: Some(3),
                object: Some("text_completion".into()),
                model: Some("m".into()),
            })
        );
        assert_eq!(t.text, "ab");
        assert!(!t.opaque());
        for bad in [
            r#"{"id":"c","created":"soon","choices":[{"index":0,"text":"a"}]}"#,
            r#"{"id":"c","choices":[{"index":0,"text":"a"}],"usage":}"#,
        ] {
            let t = transcript(&[bad]);
            assert!(t.opaque(), "{bad}");
            assert_eq!(
                continuation(
                    Endpoint::Completions,
                    br#"{"model":"m","prompt":"p"}"#,
                    &t,
                    1
                ),
                Cut::Ineligible("opaque_stream")
            );
        }
        assert_eq!(Transcript::default().header(), None);
    }

    #[test]
    fn a_completion_continues_with_the_streamed_text_and_the_remaining_budget() {
        let t = transcript(&[
            r#"{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":" Hello","finish_reason":null}]}"#,
            r#"{"id":"cmpl-1","created":7,"choices":[{"index":0,"text":" \"world\"","logprobs":null,"finish_reason":null}]}"#,
        ]);
        assert_eq!(t.text, " Hello \"world\"");
        let h = t.header().expect("header");
        assert_eq!((h.id.as_deref(), h.created), (Some("cmpl-1"), Some(7)));
        let c = continuation(
            Endpoint::Completions,
            br#"{"model":"m","prompt":"Say:","max_tokens":10,"min_tokens":3,"stream":true}"#,
            &t,
            4,
        );
        let b = body(&c);
        assert_eq!(b["prompt"], "Say: Hello \"world\"");
        assert_eq!(b["max_tokens"], 6);
        assert_eq!(b["min_tokens"], 0);
        assert_eq!(b["stream"], true);
    }

    #[test]
    fn a_chat_continues_its_assistant_message() {
        let t = transcript(&[
            r#"{"id":"chatcmpl-9","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"id":"chatcmpl-9","choices":[{"index":0,"delta":{"content":"Once upon"}}]}"#,
        ]);
        let c = continuation(
            Endpoint::ChatCompletions,
            br#"{"model":"m","messages":[{"role":"user","content":"a story"}],"max_completion_tokens":50,"stream":true}"#,
            &t,
            2,
        );
        let b = body(&c);
        assert_eq!(b["messages"][1]["role"], "assistant");
        assert_eq!(b["messages"][1]["content"], "Once upon");
        assert_eq!(b["continue_final_message"], true);
        assert_eq!(b["add_generation_prompt"], false);
        assert_eq!(b["max_completion_tokens"], 48);
    }

    #[test]
    fn what_the_text_does_not_capture_is_never_continued() {
        let plain = transcript(&[r#"{"id":"x","choices":[{"index":0,"text":"a"}]}"#]);
        for (req, why) in [
            (r#"{"prompt":"p","n":2}"#, "several_choices"),
            (r#"{"prompt":"p","echo":true}"#, "echo"),
            (r#"{"prompt":"p","logprobs":1}"#, "logprobs"),
            (
                r#"{"prompt":"p","guided_json":{"type":"object"}}"#,
                "structured_output",
            ),
            (r#"{"prompt":[1,2,3]}"#, "prompt_not_text"),
            (r#"{"prompt":["a","b"]}"#, "prompt_not_text"),
        ] {
            assert_eq!(
                continuation(Endpoint::Completions, req.as_bytes(), &plain, 1),
                Cut::Ineligible(why),
                "{req}"
            );
        }
        let chat = br#"{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}"#;
        assert_eq!(
            continuation(Endpoint::ChatCompletions, chat, &plain, 1),
            Cut::Ineligible("tools")
        );
        let tool = transcript(&[
            r#"{"id":"x","choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}"#,
        ]);
        assert_eq!(
            continuation(Endpoint::ChatCompletions, br#"{"messages":[]}"#, &tool, 1),
            Cut::Ineligible("opaque_stream")
        );
        let two = transcript(&[r#"{"id":"x","choices":[{"index":1,"text":"a"}]}"#]);
        assert!(two.opaque());
        assert!(transcript(&["not json"]).opaque());
    }

    #[test]
    fn a_generation_already_over_is_finished_not_continued() {
        let done = transcript(&[
            r#"{"id":"x","choices":[{"index":0,"text":"a","finish_reason":"stop"}]}"#,
        ]);
        assert_eq!(
            continuation(Endpoint::Completions, br#"{"prompt":"p"}"#, &done, 1),
            Cut::Finished
        );
        let open = transcript(&[r#"{"id":"x","choices":[{"index":0,"text":"a"}]}"#]);
        assert_eq!(
            continuation(
                Endpoint::Completions,
                br#"{"prompt":"p","max_tokens":3}"#,
                &open,
                3
            ),
            Cut::Finished
        );
    }

    #[test]
    fn spliced_events_keep_the_clients_id_and_count_usage_over_the_whole_stream() {
        let s = Splice {
            id: Some("chatcmpl-9".into()),
            created: Some(1),
            tokens_before: 5,
            prompt_tokens: Some(12),
        };
        let input = concat!(
            "data: {\"id\":\"chatcmpl-77\",\"created\":99,\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"id\":\"chatcmpl-77\",\"created\":99,\"choices\":[{\"index\":0,\"delta\":{\"content\":\" time\"}}],\"usage\":{\"prompt_tokens\":17,\"completion_tokens\":1,\"total_tokens\":18}}\n\n",
            "data: [DONE]\n\n"
        );
        let out = splice(input.as_bytes(), &s);
        let text = std::str::from_utf8(&out).unwrap();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 3, "{text}");
        let first: Value = serde_json::from_str(&events[0][6..]).unwrap();
        assert_eq!(first["id"], "chatcmpl-9");
        assert_eq!(first["created"], 1);
        assert!(first["choices"][0]["delta"].get("role").is_none());
        let second: Value = serde_json::from_str(&events[1][6..]).unwrap();
        assert_eq!(second["choices"][0]["delta"]["content"], " time");
        assert_eq!(second["usage"]["completion_tokens"], 6);
        assert_eq!(second["usage"]["prompt_tokens"], 12);
        assert_eq!(second["usage"]["total_tokens"], 18);
        assert_eq!(events[2], "data: [DONE]");
    }
}
