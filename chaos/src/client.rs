//! One client request as a user behind DNS would make it: try a router node, and if
//! the node refuses the connection, breaks it before answering, or (when
//! `header_failover` is set) sends no response headers in time, try the next node —
//! only ever before any response byte arrived, so failover cannot duplicate output.
//! Then read the whole answer, check it ([`StreamFacts`]) and classify how it ended.
//!
//! Invariant: every call returns within `deadline` (plus scheduling noise) with one
//! [`Record`]; a request still unfinished at its deadline is recorded as `Hung`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use headroom_bench::live::client::HttpClient;
use headroom_bench::live::sse::SseScanner;
use http::{HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use serde_json::{Value, json};

use crate::stream_check::StreamFacts;

/// Most bytes of a non-streamed body kept.
const MAX_WHOLE_BODY: usize = 1 << 20;

/// Which endpoint and mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    StreamCompletion,
    StreamChat,
    /// A non-streamed completion.
    Whole,
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EndClass {
    /// The whole answer.
    Ok,
    /// An HTTP error with an OpenAI error JSON body.
    ErrorJson,
    /// A stream that ended with an error event followed by `data: [DONE]`.
    StreamError,
    /// The connection broke after the answer began, or a stream ended without
    /// `[DONE]`: not a clean end.
    Cut,
    /// No node could be reached.
    Unreachable,
    /// An answer that is neither a result nor an OpenAI error.
    Malformed,
    /// Still unfinished at the deadline.
    Hung,
    /// The client itself walked away mid-stream (as planned).
    Abandoned,
}

impl EndClass {
    /// Ends a client can handle: a result or a well-formed error.
    pub fn clean(self) -> bool {
        matches!(
            self,
            EndClass::Ok | EndClass::ErrorJson | EndClass::StreamError | EndClass::Abandoned
        )
    }
}

/// What to send.
#[derive(Clone, Debug, Serialize)]
pub struct RequestSpec {
    pub id: u64,
    pub kind: Kind,
    /// Seconds after the scenario start at which it is due.
    pub due_s: f64,
    pub max_tokens: u32,
    pub prompt_words: u32,
    /// Index of the node tried first.
    pub primary: usize,
    /// Drop the connection after this many tokens (a client that gives up).
    pub abandon_after: Option<u32>,
}

/// Client settings shared by every request of a scenario.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    pub model: String,
    /// Give up on a node that sent no headers within this (and try the next).
    pub header_failover: Option<Duration>,
    /// Longest a request may take in all.
    pub deadline: Duration,
    /// `x-slo-ttft-ms`, `x-slo-tpot-ms` (wall ms) sent with every request.
    pub slo_ms: Option<(f64, f64)>,
    /// A 503 (the node cannot serve yet, e.g. starting) moves to the next node, as
    /// the OpenAI SDKs retry a 503 (here: at the next address DNS gave).
    pub next_on_unavailable: bool,
}

/// One request's outcome, times in seconds since the scenario start.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    pub id: u64,
    pub kind: Kind,
    pub max_tokens: u32,
    pub sent_s: f64,
    pub headers_s: Option<f64>,
    pub first_token_s: Option<f64>,
    pub last_token_s: Option<f64>,
    /// Longest pause between two content events of a stream (s): where a mid-stream
    /// failover shows.
    pub max_gap_s: Option<f64>,
    pub end_s: f64,
    /// Node that answered (index into the scenario's router list).
    pub node: Option<usize>,
    /// Nodes tried.
    pub attempts: u32,
    pub replica: Option<String>,
    pub status: Option<u16>,
    pub class: EndClass,
    pub detail: Option<String>,
    pub facts: StreamFacts,
    /// Integrity violations (empty = sound).
    pub violations: Vec<String>,
}

impl Record {
    /// Time per output token after the first (wall seconds), for streams of ≥ 2 tokens.
    pub fn tpot_s(&self) -> Option<f64> {
        let (a, b) = (self.first_token_s?, self.last_token_s?);
        let n = self.facts.tokens;
        (n >= 2).then(|| (b - a) / f64::from(n - 1))
    }
}

fn body_for(spec: &RequestSpec, model: &str) -> Bytes {
    // Deterministic filler text; distinct per request so prompts do not all share a prefix.
    let mut prompt = format!("chaos request {} says", spec.id);
    for k in 0..spec.prompt_words {
        prompt.push_str(match (spec.id + u64::from(k)) % 5 {
            0 => " alpha",
            1 => " beta",
            2 => " gamma",
            3 => " delta",
            _ => " epsilon",
        });
    }
    let mut v = match spec.kind {
        Kind::StreamChat => json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": spec.max_tokens,
            "ignore_eos": true,
        }),
        _ => json!({
            "model": model,
            "prompt": prompt,
            "max_tokens": spec.max_tokens,
            "ignore_eos": true,
        }),
    };
    if spec.kind != Kind::Whole {
        v["stream"] = json!(true);
        // Per-chunk counts: a chunk may carry several tokens (see `stream_check`).
        v["stream_options"] = json!({"include_usage": true, "continuous_usage_stats": true});
    }
    Bytes::from(v.to_string())
}

fn path_of(kind: Kind) -> &'static str {
    match kind {
        Kind::StreamChat => "/v1/chat/completions",
        _ => "/v1/completions",
    }
}

fn since(t0: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(t0).as_secs_f64()
}

/// Sends `spec` to `nodes` (starting at its primary) and reads the answer.
pub async fn run_request(
    client: &HttpClient,
    nodes: &[String],
    spec: &RequestSpec,
    cfg: &ClientSettings,
    t0: Instant,
) -> Record {
    let sent = Instant::now();
    let deadline = tokio::time::Instant::from_std(sent + cfg.deadline);
    let mut rec = Record {
        id: spec.id,
        kind: spec.kind,
        max_tokens: spec.max_tokens,
        sent_s: since(t0, sent),
        headers_s: None,
        first_token_s: None,
        last_token_s: None,
        max_gap_s: None,
        end_s: 0.0,
        node: None,
        attempts: 0,
        replica: None,
        status: None,
        class: EndClass::Unreachable,
        detail: None,
        facts: StreamFacts::default(),
        violations: Vec::new(),
    };
    let body = body_for(spec, &cfg.model);
    let n = nodes.len().max(1);
    let mut answered = None;
    for k in 0..n {
        let node = (spec.primary + k) % n;
        let Some(base) = nodes.get(node) else { break };
        rec.attempts += 1;
        let req = match build(base, spec.kind, body.clone(), cfg) {
            Ok(r) => r,
            Err(e) => {
                rec.class = EndClass::Malformed;
                rec.detail = Some(e);
                break;
            }
        };
        let wait = match cfg.header_failover {
            Some(h) if k + 1 < n => tokio::time::Instant::now()
                .checked_add(h)
                .map_or(deadline, |t| t.min(deadline)),
            _ => deadline,
        };
        match tokio::time::timeout_at(wait, client.request(req)).await {
            Ok(Ok(resp))
                if cfg.next_on_unavailable
                    && resp.status() == StatusCode::SERVICE_UNAVAILABLE
                    && k + 1 < n =>
            {
                rec.detail = Some(format!("node {node}: 503, trying the next node"));
            }
            Ok(Ok(resp)) => {
                answered = Some((node, resp));
                break;
            }
            Ok(Err(e)) => {
                rec.detail = Some(format!("node {node}: {e}"));
            }
            Err(_) if wait >= deadline => {
                rec.class = EndClass::Hung;
                rec.detail = Some(format!("node {node}: no response headers by the deadline"));
                break;
            }
            Err(_) => {
                rec.detail = Some(format!("node {node}: no response headers in time"));
            }
        }
    }
    if let Some((node, resp)) = answered {
        rec.node = Some(node);
        rec.headers_s = Some(since(t0, Instant::now()));
        read_answer(resp, spec, &mut rec, deadline, t0).await;
    }
    rec.end_s = since(t0, Instant::now());
    rec
}

fn build(
    base: &str,
    kind: Kind,
    body: Bytes,
    cfg: &ClientSettings,
) -> Result<Request<Full<Bytes>>, String> {
    let uri: Uri = format!("{}{}", base.trim_end_matches('/'), path_of(kind))
        .parse()
        .map_err(|_| format!("bad node URL {base}"))?;
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some((ttft, tpot)) = cfg.slo_ms {
        let h = |v: f64| HeaderValue::from_str(&format!("{v:.3}")).map_err(|e| e.to_string());
        req = req
            .header("x-slo-ttft-ms", h(ttft)?)
            .header("x-slo-tpot-ms", h(tpot)?);
    }
    req.body(Full::new(body)).map_err(|e| e.to_string())
}

async fn read_answer(
    resp: http::Response<hyper::body::Incoming>,
    spec: &RequestSpec,
    rec: &mut Record,
    deadline: tokio::time::Instant,
    t0: Instant,
) {
    let status = resp.status();
    rec.status = Some(status.as_u16());
    rec.replica = resp
        .headers()
        .get(headroom::REPLICA_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut body = resp.into_body();
    let mut scanner = SseScanner::default();
    let mut whole: Vec<u8> = Vec::new();
    let mut broke: Option<String> = None;
    let mut abandoned = false;
    let read = async {
        while let Some(frame) = body.frame().await {
            if spec.abandon_after.is_some_and(|k| rec.facts.tokens >= k) {
                abandoned = true;
                break;
            }
            match frame {
                Ok(f) => {
                    let Some(d) = f.data_ref() else { continue };
                    if sse && status.is_success() {
                        let now = since(t0, Instant::now());
                        let facts = &mut rec.facts;
                        let (first, last) = (&mut rec.first_token_s, &mut rec.last_token_s);
                        let gap = &mut rec.max_gap_s;
                        scanner.feed(d, |ev| {
                            if facts.event(ev) {
                                first.get_or_insert(now);
                                if let Some(l) = *last {
                                    *gap = Some(gap.unwrap_or(0.0).max(now - l));
                                }
                                *last = Some(now);
                            }
                        });
                    } else {
                        let room = MAX_WHOLE_BODY.saturating_sub(whole.len());
                        whole.extend_from_slice(&d[..d.len().min(room)]);
                    }
                }
                Err(e) => {
                    broke = Some(e.to_string());
                    break;
                }
            }
        }
    };
    if tokio::time::timeout_at(deadline, read).await.is_err() {
        rec.class = EndClass::Hung;
        rec.detail = Some("answer unfinished at the deadline".into());
        rec.violations = rec.facts.violations(spec.max_tokens, false);
        return;
    }
    if abandoned {
        // Dropping the body here closes the connection mid-stream.
        rec.class = EndClass::Abandoned;
        rec.violations = rec.facts.violations(spec.max_tokens, false);
        return;
    }
    if sse && status.is_success() {
        let facts = &mut rec.facts;
        scanner.finish(|ev| {
            facts.event(ev);
        });
        (rec.class, rec.detail) = if let Some(e) = broke {
            (EndClass::Cut, Some(format!("stream broke: {e}")))
        } else if facts.done_events == 0 {
            (EndClass::Cut, Some("stream ended without [DONE]".into()))
        } else if facts.error_events > 0 {
            let clean = facts.error_then_done;
            (
                if clean {
                    EndClass::StreamError
                } else {
                    EndClass::Cut
                },
                Some("error event in stream".into()),
            )
        } else {
            (EndClass::Ok, None)
        };
        rec.violations = rec
            .facts
            .violations(spec.max_tokens, rec.class == EndClass::Ok);
        return;
    }
    if let Some(e) = broke {
        rec.class = EndClass::Cut;
        rec.detail = Some(format!("body broke: {e}"));
        return;
    }
    classify_whole(status, &whole, spec, rec);
}

/// A non-streamed answer: a completion with usage, or an OpenAI error.
fn classify_whole(status: StatusCode, body: &[u8], spec: &RequestSpec, rec: &mut Record) {
    let v: Option<Value> = serde_json::from_slice(body).ok();
    let error_ok = v
        .as_ref()
        .is_some_and(|v| v["error"]["message"].is_string() && v["error"]["type"].is_string());
    if !status.is_success() {
        (rec.class, rec.detail) = if error_ok {
            (
                EndClass::ErrorJson,
                v.as_ref()
                    .and_then(|v| v["error"]["message"].as_str())
                    .map(|m| format!("HTTP {}: {m}", status.as_u16())),
            )
        } else {
            (
                EndClass::Malformed,
                Some(format!(
                    "HTTP {} with a non-OpenAI body: {}",
                    status.as_u16(),
                    String::from_utf8_lossy(&body[..body.len().min(160)])
                )),
            )
        };
        return;
    }
    let Some(v) = v.filter(|v| v["choices"].is_array()) else {
        rec.class = EndClass::Malformed;
        rec.detail = Some("2xx body is not a completion".into());
        return;
    };
    let tokens = v["usage"]["completion_tokens"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok());
    rec.facts.usage_tokens = tokens;
    rec.facts.usage_events = u32::from(tokens.is_some());
    rec.class = EndClass::Ok;
    if tokens != Some(spec.max_tokens) {
        rec.violations.push(format!(
            "completion reports {tokens:?} tokens for max_tokens {} (ignore_eos)",
            spec.max_tokens
        ));
    }
}
