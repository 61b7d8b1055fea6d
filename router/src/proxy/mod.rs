//! Forwarding: decide, book, send, retry before the first byte, stream back.
//!
//! A request is retried on another candidate (bounded, jittered) when the replica
//! refuses the connection, answers 5xx or 429, or sends nothing before the first-byte
//! timeout — always before the client has seen a byte. After that, a broken stream
//! continues on another replica where that is well defined (`failover`), else ends
//! with an SSE error event (see `body`), never with duplicated output.

pub mod body;
pub mod failover;
mod flat_choice;
mod flat_usage;
pub mod pd;
pub mod priority;
pub mod sse;

use std::{sync::Arc, time::Instant};

use axum::body::Body as AxumBody;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use rand::Rng;

use headroom_core::lifecycle::{self, Admission, Admit, DeferLimits};

use crate::{
    CACHED_SOURCE_HEADER, CACHED_TOKENS_HEADER, PROMPT_TOKENS_HEADER, REPLICA_HEADER, clock,
    decide::{self, RouteInputs, RoutedTarget},
    error::ApiError,
    fleet::{Replica, Signal},
    node::RequestPath,
    otel::RequestTrace,
    policy::{CandidateError, RequestProfile, candidates::CandidateParams},
    request::{Endpoint, ParsedRequest},
    upstream,
};
use body::{TrackedBody, Tracking};

/// Hop-by-hop headers never forwarded.
const HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
];

/// The replica list one decision was made over (targets index into it).
type Replicas = Arc<Vec<Arc<Replica>>>;

/// One target chosen by the policy.
pub(crate) struct Target {
    replica: Arc<Replica>,
    routed: RoutedTarget,
}

impl From<CandidateError> for ApiError {
    fn from(e: CandidateError) -> Self {
        match &e {
            CandidateError::UnknownModel(m) => ApiError::unknown_model(m),
            CandidateError::NoHealthy(m) => ApiError::no_replica(m),
            CandidateError::ContextTooLong { .. } => {
                ApiError::bad_request(e.to_string()).with_param("prompt")
            }
        }
    }
}

/// What a decision reads from the node: its policy, predictor, prefix index and these
/// replicas, with the retry budget. One place, so the unified and P/D paths agree.
pub(crate) fn route_inputs<'a>(
    path: &'a RequestPath,
    replicas: &'a [Arc<Replica>],
) -> RouteInputs<'a, Arc<Replica>> {
    RouteInputs {
        policy: path.policy.as_ref(),
        predictor: &path.predictor,
        prefix: &path.prefix,
        replicas,
        params: CandidateParams {
            block_tokens: path.cfg.prefix.block_tokens,
            stale_after_s: path.cfg.scrape.stale_after_ms as f64 / 1e3,
        },
        max_targets: 1 + path.cfg.proxy.retries as usize,
    }
}

/// One decision now: the policy's ranking, cut to the retry budget, through the
/// request's admission (go, wait or reject).
fn choose(
    path: &RequestPath,
    profile: &RequestProfile,
    admission: &mut Admission,
    record: Option<u64>,
) -> Result<(Admit, Replicas), ApiError> {
    let replicas = path.fleet.replicas();
    let inputs = route_inputs(path, &replicas);
    let mut rng = path.decision_rng();
    let now_s = clock::now_s();
    let routed = match record {
        Some(_) => decide::route_explained(&inputs, profile, now_s, &mut rng)?,
        None => decide::route(&inputs, profile, now_s, &mut rng)?,
    };
    path.records()
        .note_decision(record, path.policy.name(), &routed, &replicas);
    path.metrics
        .decision_seconds
        .with_label_values(&[path.policy.name()])
        .observe(routed.decision_ns as f64 / 1e9);
    if let Some(kind) = routed.fallback {
        path.metrics.fallbacks.with_label_values(&[kind]).inc();
    }
    let admit = admission.admit(routed, now_s);
    path.records().note_admit(record, &admit);
    match &admit {
        Admit::Go {
            fallback: Some(kind @ (lifecycle::DEFER_FULL | lifecycle::DEFER_EXPIRED)),
            ..
        } => path.metrics.fallbacks.with_label_values(&[kind]).inc(),
        Admit::Reject(_) => path.metrics.rejected.with_label_values(&["no_fit"]).inc(),
        _ => {}
    }
    Ok((admit, replicas))
}

/// Decides, deferring (bounded, within the request's deadline) while nothing fits.
/// Each decision is asked for the TTFT objective that is left since arrival
/// ([`Admission::remaining`]); `profile` holds the tenant's own objectives again after.
async fn plan(
    path: &RequestPath,
    profile: &mut RequestProfile,
    arrived: Instant,
    record: Option<u64>,
) -> Result<(Vec<Target>, Option<&'static str>), ApiError> {
    let asked = profile.slo;
    let planned = plan_within(path, profile, arrived, record).await;
    profile.slo = asked;
    planned
}

async fn plan_within(
    path: &RequestPath,
    profile: &mut RequestProfile,
    arrived: Instant,
    record: Option<u64>,
) -> Result<(Vec<Target>, Option<&'static str>), ApiError> {
    let asked = profile.slo;
    let limits = DeferLimits {
        budget: path.cfg.slo.defer_budget,
        max_deferred: path.cfg.slo.max_deferred,
        max_wait_s: path.cfg.admission.max_wait_ms as f64 / 1e3,
    };
    let mut admission = Admission::new(
        profile,
        clock::now_s() - arrived.elapsed().as_secs_f64(),
        limits,
        path.deferred.clone(),
    );
    loop {
        profile.slo = admission.remaining(asked, clock::now_s());
        match choose(path, profile, &mut admission, record)? {
            (Admit::Go { targets, fallback }, replicas) => {
                let targets = targets
                    .into_iter()
                    .map(|t| Target {
                        replica: replicas[t.index].clone(),
                        routed: t,
                    })
                    .collect();
                return Ok((targets, fallback));
            }
            (Admit::Wait(after_s), _) => {
                tokio::time::sleep(std::time::Duration::from_secs_f64(after_s)).await;
            }
            (Admit::Reject(no), _) => return Err(ApiError::no_fit(&no)),
        }
    }
}

fn upstream_request(
    target: &Replica,
    endpoint: Endpoint,
    body: &Bytes,
    headers: &HeaderMap,
) -> Result<Request<Full<Bytes>>, ApiError> {
    let uri = upstream::join_static(&target.base, endpoint.path()).map_err(ApiError::upstream)?;
    let mut req = Request::post(uri);
    for (k, v) in headers {
        let name = k.as_str();
        if HOP.contains(&name) || name == "host" || name == "content-length" {
            continue;
        }
        req = req.header(k, v);
    }
    req.header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body.clone()))
        .map_err(|e| ApiError::upstream(e.to_string()))
}

/// Why an attempt did not produce a response to stream back.
enum AttemptError {
    /// Try the next candidate.
    Retry(&'static str, Option<Response<Incoming>>),
}

/// Reads the first frame so a stream that dies before its first byte can be retried.
async fn first_frame(
    resp: &mut Response<Incoming>,
    path: &RequestPath,
) -> Result<Option<Bytes>, &'static str> {
    let body = resp.body_mut();
    let wait = async {
        loop {
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data()
                        && !d.is_empty()
                    {
                        return Ok(Some(d));
                    }
                }
                Some(Err(_)) => return Err("reset_before_first_byte"),
                None => return Ok(None),
            }
        }
    };
    tokio::time::timeout(path.cfg.proxy.first_byte_timeout(), wait)
        .await
        .map_err(|_| "first_byte_timeout")?
}

/// Routes and forwards one parsed request; `failover`: the tenant lets a stream cut
/// mid-way continue on another replica (`failover.rs`).
pub async fn forward(
    path: Arc<RequestPath>,
    parsed: ParsedRequest,
    mut profile: RequestProfile,
    headers: HeaderMap,
    arrived: Instant,
    failover: bool,
    (record, trace): (Option<u64>, &mut Option<Box<RequestTrace>>),
) -> Result<Response<AxumBody>, ApiError> {
    if let Some((plan, replicas)) = pd::choose(&path, &profile)? {
        return pd::forward(
            path,
            (parsed, profile, headers),
            (arrived, failover, record),
            plan,
            replicas,
            trace,
        )
        .await;
    }
    let span = trace.as_deref().map(RequestTrace::decide);
    let planned = plan(&path, &mut profile, arrived, record).await;
    if let (Some(s), Some(t)) = (span, trace.as_deref()) {
        let (chosen, n, fb) = match &planned {
            Ok((targets, fb)) => (
                targets.first().map(|x| (x.replica.as_ref(), &x.routed)),
                targets.len(),
                *fb,
            ),
            Err(_) => (None, 0, None),
        };
        t.decided(s, path.policy.name(), chosen, n, fb, &profile);
    }
    let (targets, fallback) = planned?;
    let how = Send {
        body: &parsed.upstream_body,
        headers: &headers,
        arrived,
        failover,
        record,
        fallback,
        ttft_learned: false,
        deadline: priority::deadline_ms(arrived, profile.slo.ttft_ms, parsed.client_priority),
    };
    match send(&path, &parsed, &profile, &targets, &how, trace).await? {
        Sent::Response(r) => Ok(r),
        Sent::Failed { reason, last_error } => {
            all_failed(&path, record, reason, last_error, targets.last())
        }
    }
}

/// How one stage is sent: its body and headers, and what its tracking records.
pub(crate) struct Send<'a> {
    pub body: &'a Bytes,
    pub headers: &'a HeaderMap,
    pub arrived: Instant,
    pub failover: bool,
    pub record: Option<u64>,
    pub fallback: Option<&'static str>,
    /// Learn no TTFT from this stage (a decode after a remote prefill: its first
    /// token's wait is the transfer's, learned per link instead).
    pub ttft_learned: bool,
    /// The request's deadline priority, for replicas that take one (`priority`).
    pub deadline: Option<i64>,
}

/// What became of sending to a list of targets.
pub(crate) enum Sent {
    /// One answered: its response, streaming back.
    Response(Response<AxumBody>),
    /// Every target failed before its first byte.
    Failed {
        reason: &'static str,
        last_error: Option<Response<Incoming>>,
    },
}

/// One attempt at `r` failed before its first byte (`why`: the retry label): counted,
/// and held against the replica's health — except a 429, which is backpressure and
/// never ejects. Every stage that retries (unified, prefill, failover) reports here.
pub(crate) fn attempt_failed(path: &RequestPath, r: &Replica, why: &str) {
    path.metrics
        .upstream_errors
        .with_label_values(&[&r.name, why])
        .inc();
    if why == "429" {
        r.health.on_backpressure(clock::now_ms());
    } else if why == upstream::LOCAL_EXHAUSTED {
        // This node ran out of descriptors or ports and never reached the replica:
        // ejecting healthy replicas would turn a local overload into an outage.
    } else if r
        .health
        .on_failure(Signal::Request, clock::now_ms(), &path.cfg.health)
    {
        path.metrics.ejection(&r.name);
        tracing::warn!(replica = %r.name, "replica ejected after failures ({why})");
    }
}

/// The answer when every attempt failed before the first byte: the last replica's
/// own error response where it sent one, else a 502 naming it.
pub(crate) fn all_failed(
    path: &RequestPath,
    record: Option<u64>,
    reason: &'static str,
    last_error: Option<Response<Incoming>>,
    last: Option<&Target>,
) -> Result<Response<AxumBody>, ApiError> {
    path.records()
        .note_end(record, format!("every attempt failed ({reason})"));
    if let (Some(resp), Some(t)) = (last_error, last) {
        return Ok(passthrough(resp, &t.replica));
    }
    if reason == upstream::LOCAL_EXHAUSTED {
        // The node is overloaded, not the replicas: 503 so the client retries (here
        // once descriptors free up, or at another node).
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "This router node is out of descriptors or local ports; retry shortly.",
        )
        .with_retry_after(1));
    }
    let mut e = ApiError::upstream(format!("every replica tried failed ({reason})"));
    e.replica = last.map(|t| t.replica.name.to_string());
    Err(e)
}

/// Sends `parsed` to `targets` in order until one answers (retrying before the first
/// byte), and streams that one back.
pub(crate) async fn send(
    path: &Arc<RequestPath>,
    parsed: &ParsedRequest,
    profile: &RequestProfile,
    targets: &[Target],
    how: &Send<'_>,
    trace: &mut Option<Box<RequestTrace>>,
) -> Result<Sent, ApiError> {
    let Send {
        body,
        headers,
        arrived,
        failover,
        record,
        fallback,
        ttft_learned,
        deadline,
    } = *how;
    let mut last_error: Option<Response<Incoming>> = None;
    let mut last_reason = "no attempt";
    for (attempt, target) in targets.iter().enumerate() {
        if attempt > 0 {
            path.metrics.retries.with_label_values(&[last_reason]).inc();
            let base = path.cfg.proxy.retry_backoff_ms.max(1);
            let jitter = rand::rng().random_range(base..=base * 3);
            tokio::time::sleep(std::time::Duration::from_millis(jitter)).await;
        }
        let r = &target.replica;
        let booking = lifecycle::book(r.as_ref(), profile, &target.routed, clock::now_s());
        let body = &priority::body_for(r, &path.cfg.proxy, body, deadline);
        let req = match trace.as_deref_mut() {
            Some(t) => {
                t.upstream(r, attempt, profile.stream);
                let mut h = headers.clone();
                t.inject(&mut h);
                upstream_request(r, parsed.endpoint, body, &h)?
            }
            None => upstream_request(r, parsed.endpoint, body, headers)?,
        };
        let dispatched = Instant::now();
        let sent = tokio::time::timeout(
            path.cfg.proxy.first_byte_timeout(),
            path.fleet.client.request(req),
        )
        .await;
        let outcome = match sent {
            Err(_) => Err(AttemptError::Retry("first_byte_timeout", None)),
            Ok(Err(e)) => {
                tracing::debug!(replica = %r.name, "upstream request failed: {e}");
                Err(AttemptError::Retry(upstream::connect_failure(&e), None))
            }
            Ok(Ok(mut resp)) => {
                let status = resp.status();
                if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
                    Err(AttemptError::Retry(
                        if status == StatusCode::TOO_MANY_REQUESTS {
                            "429"
                        } else {
                            "5xx"
                        },
                        Some(resp),
                    ))
                } else if !status.is_success() {
                    // The client's mistake (4xx): pass it through, not the replica's fault.
                    drop(booking);
                    path.records()
                        .note_end(record, format!("{status} from {}", r.name));
                    return Ok(Sent::Response(passthrough(resp, r)));
                } else {
                    match first_frame(&mut resp, path).await {
                        Ok(first) => Ok((resp, first)),
                        Err(why) => Err(AttemptError::Retry(why, None)),
                    }
                }
            }
        };
        match outcome {
            Ok((resp, first)) => {
                path.remember_prefix(r, profile, &target.routed);
                // Peers learn it too, so a repeat through another node finds it here.
                path.outcomes.placed(r, &profile.blocks);
                path.kv.sent(
                    r.id,
                    profile.prompt_tokens,
                    target.routed.cached_tokens,
                    dispatched,
                );
                let track = Tracking {
                    outcomes: path.outcomes.clone(),
                    replica: r.clone(),
                    model: profile.model.clone(),
                    arrived,
                    dispatched,
                    booking,
                    prompt_bytes: match &parsed.prompt {
                        crate::request::PromptInput::Text(t) => Some(t.len()),
                        crate::request::PromptInput::Ids(_) => None,
                    },
                    prompt_messages: parsed.messages as u32,
                    learn: Some(target.routed.learn),
                    ttft_learned,
                    decision: record,
                    trace: trace.take(),
                };
                let failover =
                    failover::Failover::new(path, parsed, profile, headers, arrived, failover);
                let mut out = respond(
                    path,
                    resp,
                    first,
                    parsed,
                    (track, failover),
                    fallback,
                    profile.prompt_tokens,
                );
                if path.cfg.prediction_headers {
                    cached_headers(out.headers_mut(), profile, r.id, &target.routed);
                }
                return Ok(Sent::Response(out));
            }
            Err(AttemptError::Retry(why, resp)) => {
                drop(booking);
                last_reason = why;
                if let Some(t) = trace.as_deref_mut() {
                    t.attempt_failed(why, resp.as_ref().map(|r| r.status().as_u16()));
                }
                path.records()
                    .update(record, |d| d.retries.push((r.name.clone(), why)));
                attempt_failed(path, r, why);
                if let Some(resp) = resp {
                    last_error = Some(resp);
                }
            }
        }
    }
    Ok(Sent::Failed {
        reason: last_reason,
        last_error,
    })
}

/// What the router believed the chosen replica had cached, and from what source.
fn cached_headers(h: &mut HeaderMap, profile: &RequestProfile, id: u32, t: &RoutedTarget) {
    let source = match profile.exact_cached.iter().find(|e| e.replica == id) {
        Some(e) if e.complete => "precise",
        Some(_) => "recovering",
        None => "approximate",
    };
    h.insert(CACHED_TOKENS_HEADER, HeaderValue::from(t.cached_tokens));
    h.insert(CACHED_SOURCE_HEADER, HeaderValue::from_static(source));
}

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap, drop_length: bool) {
    for (k, v) in from {
        let name = k.as_str();
        if HOP.contains(&name) || (drop_length && name == "content-length") {
            continue;
        }
        to.append(k.clone(), v.clone());
    }
}

fn replica_header(r: &Replica) -> HeaderValue {
    HeaderValue::from_str(&r.name).unwrap_or_else(|_| HeaderValue::from_static("unnamed"))
}

/// An upstream response passed through untouched (errors from the replica).
fn passthrough(resp: Response<Incoming>, r: &Replica) -> Response<AxumBody> {
    let (parts, body) = resp.into_parts();
    let mut out = Response::new(AxumBody::new(body));
    *out.status_mut() = parts.status;
    copy_headers(&parts.headers, out.headers_mut(), false);
    out.headers_mut().insert(REPLICA_HEADER, replica_header(r));
    out
}

fn respond(
    path: &RequestPath,
    resp: Response<Incoming>,
    first: Option<Bytes>,
    parsed: &ParsedRequest,
    (track, failover): (Tracking, Option<failover::Failover>),
    fallback: Option<&'static str>,
    prompt_tokens: u32,
) -> Response<AxumBody> {
    let r = track.replica.clone();
    let forecast = track.learn.map(|l| l.prediction);
    // The headers forecast what the client sees: the router's own wait is spent already.
    let waited_ms = track
        .dispatched
        .saturating_duration_since(track.arrived)
        .as_secs_f64()
        * 1e3;
    let (parts, body) = resp.into_parts();
    let is_sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let stream = (parsed.stream && is_sse).then_some(parsed.injected);
    let mut tracked = TrackedBody::new(body, first, stream, track, path.cfg.proxy.idle_timeout());
    if stream.is_some()
        && let Some(f) = failover
    {
        tracked = tracked.with_failover(f);
    }
    let mut out = Response::new(AxumBody::new(tracked));
    *out.status_mut() = parts.status;
    copy_headers(&parts.headers, out.headers_mut(), parsed.injected.any());
    let h = out.headers_mut();
    h.insert(REPLICA_HEADER, replica_header(&r));
    if path.cfg.prediction_headers {
        if let Some(f) = forecast {
            let put = |h: &mut HeaderMap, k: &'static str, v: f64| {
                if let Some(v) = tenths(v) {
                    h.insert(k, v);
                }
            };
            put(h, "x-headroom-predicted-ttft-ms", waited_ms + f.ttft_ms);
            put(
                h,
                "x-headroom-predicted-ttft-upper-ms",
                waited_ms + f.ttft_upper_ms,
            );
            put(h, "x-headroom-predicted-tpot-ms", f.tpot_ms);
            put(h, "x-headroom-predicted-tpot-upper-ms", f.tpot_upper_ms);
        }
        if let Some(fb) = fallback {
            h.insert("x-headroom-fallback", HeaderValue::from_static(fb));
        }
        // The router's own prompt count (what it routed on), to compare with the
        // engine's `usage.prompt_tokens`.
        h.insert(PROMPT_TOKENS_HEADER, HeaderValue::from(prompt_tokens));
    }
    // Never let a cache or proxy buffer a token stream.
    if stream.is_some() {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    out
}

/// `v` with one decimal as a header value. `format!("{v:.1}")` costs ≈ 2k
/// instructions (an exact decimal expansion), four times a request; the forecasts are
/// non-negative milliseconds, so their tenths as an integer (a tie rounded away from
/// zero where `format!` rounds it to even: at most 0.1 apart) take a few dozen. Other
/// values go through `format!`.
fn tenths(v: f64) -> Option<HeaderValue> {
    if !(0.0..1e12).contains(&v) {
        return HeaderValue::from_str(&format!("{v:.1}")).ok();
    }
    let t = (v * 10.0).round() as u64;
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    // The tenths digit, the point, then the integer part (at least one digit).
    at -= 1;
    buf[at] = b'0' + (t % 10) as u8;
    at -= 1;
    buf[at] = b'.';
    let mut n = t / 10;
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    HeaderValue::from_bytes(&buf[at..]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ReplicaConfig, RouterConfig};

    #[test]
    fn tenths_write_what_format_writes_but_for_ties() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mut values = vec![0.0, 0.04, 0.05, 0.96, 9.95, 10.0, 99.99, 123.45, 1e14 + 0.3];
        values.extend((0..20_000).map(|_| 10f64.powf(rng.random_range(-3.0..12.0))));
        for v in values {
            let got = tenths(v).expect("a header value");
            let want = format!("{v:.1}");
            let tie = ((v * 10.0).fract() - 0.5).abs() < 1e-6;
            if tie {
                let (g, w): (f64, f64) = (
                    got.to_str().unwrap().parse().unwrap(),
                    want.parse().unwrap(),
                );
                assert!((g - w).abs() <= 0.1 + 1e-9, "{v}: {g} against {w}");
            } else {
                assert_eq!(got.to_str().unwrap(), want, "{v}");
            }
        }
        for v in [-1.5, f64::INFINITY, 2e15] {
            assert_eq!(
                tenths(v).map(|h| h.to_str().unwrap().to_string()),
                Some(format!("{v:.1}"))
            );
        }
        assert!(tenths(f64::NAN).is_some_and(|h| h == "NaN"));
    }

    #[tokio::test]
    async fn running_out_of_descriptors_never_ejects_a_replica_and_answers_503() {
        let mut cfg = RouterConfig::default();
        // No probe during the test: only the request streak counts.
        cfg.health.probe_interval_ms = 600_000;
        cfg.replicas.push(ReplicaConfig {
            url: "http://127.0.0.1:9".into(),
            ..Default::default()
        });
        let cancel = tokio_util::sync::CancellationToken::new();
        let node = crate::node::Node::start(cfg, cancel.clone())
            .await
            .expect("node");
        let path = &node.path;
        let r = path.fleet.replicas()[0].clone();
        let eject_after = path.cfg.health.eject_after_failures;
        for _ in 0..3 * eject_after {
            attempt_failed(path, &r, upstream::LOCAL_EXHAUSTED);
        }
        assert_eq!(r.health.total_ejections(), 0, "held against the replica");
        for _ in 0..eject_after {
            attempt_failed(path, &r, "connect");
        }
        assert_eq!(
            r.health.total_ejections(),
            1,
            "a real connect failure still counts"
        );
        let e = all_failed(path, None, upstream::LOCAL_EXHAUSTED, None, None)
            .expect_err("no response to pass through");
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(1));
        let e = all_failed(path, None, "connect", None, None).expect_err("no response");
        assert_eq!(e.status, StatusCode::BAD_GATEWAY);
        cancel.cancel();
    }
}
