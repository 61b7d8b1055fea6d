//! The response body handed to the client: upstream bytes passed through as they
//! arrive, watched on the way (first token, usage, errors) and closed out exactly once
//! with an [`Outcome`].
//!
//! Invariants: nothing is ever sent twice; once a stream has started, a failure either
//! hands the stream to a continuation on another replica (`failover`, where allowed and
//! well defined) or becomes one SSE error event followed by `data: [DONE]`; dropping the
//! body (client gone) releases the booking and closes the upstream connection, which
//! makes the engine abort the request (a continuation being sought is dropped with it).

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::Sleep;

use super::{
    failover::{self, Cut, Failover, Resumed, Splice},
    sse::{SseScanner, Usage},
};
use crate::{
    decide::Learn,
    error::ApiError,
    fleet::Replica,
    ledger::Booking,
    node::{Outcome, OutcomeStatus, Outcomes, outcomes::Reported},
};
use crate::{otel::RequestTrace, request::InjectedUsage};

/// Largest non-streaming body kept to read its usage.
const KEEP_NONSTREAM_BYTES: usize = 1 << 20;

/// Everything needed to close out a request.
pub struct Tracking {
    /// Where the request's outcome goes.
    pub outcomes: Arc<Outcomes>,
    pub replica: Arc<Replica>,
    pub model: String,
    pub arrived: Instant,
    pub dispatched: Instant,
    pub booking: Booking,
    /// Text prompt bytes and chat messages (None for token-id prompts).
    pub prompt_bytes: Option<usize>,
    pub prompt_messages: u32,
    pub learn: Option<Learn>,
    /// The TTFT label already went to the trainer (at the first token).
    pub ttft_learned: bool,
    /// Its decision record, where records are on.
    pub decision: Option<u64>,
    /// Its spans, where tracing is on.
    pub trace: Option<Box<RequestTrace>>,
}

enum Mode {
    Stream(Box<SseScanner>),
    Whole(BytesMut),
}

/// A continuation being sought (routing, connecting, waiting for its first byte).
type Resuming = Pin<Box<dyn Future<Output = Result<Resumed, &'static str>> + Send>>;

/// What became of a cut stream.
enum AfterCut {
    /// A continuation is being sought.
    Resuming,
    /// The stream ends cleanly with these bytes.
    Ended(Bytes),
    /// No failover: end as a failure.
    No,
}

pub struct TrackedBody {
    upstream: Incoming,
    failover: Option<Box<Failover>>,
    resuming: Option<Resuming>,
    first: Option<Bytes>,
    mode: Mode,
    track: Option<Tracking>,
    /// Fires no earlier than `idle_timeout` after the last frame: armed for a deadline
    /// that frames since have moved on, it is re-armed when it fires rather than reset
    /// per frame (a reset moves the entry in the runtime's timer wheel: ≈ 170
    /// instructions a frame; a frame now costs a clock read).
    idle: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    last_frame: tokio::time::Instant,
    done: bool,
    /// Tokens already counted into the booking.
    content_seen: u32,
    first_seen: bool,
    /// The request's trace while a continuation is sought (the cut attempt's
    /// `Tracking` is closed out, the continuation's has none of its own).
    carried: Option<Box<RequestTrace>>,
}

impl TrackedBody {
    /// `first` is a frame already read from `upstream` (the router reads one before
    /// answering, so a replica that dies before its first byte can still be retried).
    /// `stream` is set for an SSE response, with what the router injected into it.
    pub fn new(
        upstream: Incoming,
        first: Option<Bytes>,
        stream: Option<InjectedUsage>,
        track: Tracking,
        idle_timeout: Duration,
    ) -> Self {
        let mode = match stream {
            Some(injected) => Mode::Stream(Box::new(SseScanner::new(injected))),
            None => Mode::Whole(BytesMut::new()),
        };
        Self {
            upstream,
            failover: None,
            resuming: None,
            first,
            mode,
            track: Some(track),
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
            idle_timeout,
            last_frame: tokio::time::Instant::now(),
            done: false,
            content_seen: 0,
            first_seen: false,
            carried: None,
        }
    }

    /// Lets a cut stream continue on another replica (see `failover`).
    pub fn with_failover(mut self, f: Failover) -> Self {
        if let Mode::Stream(sc) = &mut self.mode {
            sc.transcript = Some(Box::default());
            self.failover = Some(Box::new(f));
        }
        self
    }

    fn splice(&self) -> Option<&Splice> {
        self.failover.as_ref().and_then(|f| f.splice.as_ref())
    }

    fn process(&mut self, data: Bytes) -> Bytes {
        let splice = self.failover.as_ref().and_then(|f| f.splice.clone());
        match &mut self.mode {
            Mode::Stream(sc) => {
                let out = sc.feed(&data, Instant::now());
                let out = match &splice {
                    Some(s) if !out.is_empty() => failover::splice(&out, s),
                    _ => out,
                };
                if let Some(t) = self.track.as_mut() {
                    let now_s = crate::clock::now_s();
                    if let Some(first) = sc.first_content
                        && !self.first_seen
                    {
                        self.first_seen = true;
                        t.booking.first_token(now_s);
                        if let Some(tr) = t.trace.as_mut() {
                            tr.first_token(first.duration_since(t.dispatched).as_secs_f64());
                        }
                        // The TTFT label is known now: learn it without waiting for the
                        // stream to end (long outputs would delay it by seconds).
                        if let Some(l) = t.learn.as_ref().filter(|_| !t.ttft_learned) {
                            let ttft_s = first.duration_since(t.dispatched).as_secs_f64();
                            let reported = Reported {
                                prompt_tokens: sc.chunk_prompt_tokens,
                                cached_tokens: sc.chunk_cached_tokens,
                            };
                            t.outcomes.learn_first_token(l, ttft_s, reported);
                            t.ttft_learned = true;
                        }
                    }
                    // Tokens, not events: one chunk may carry several.
                    let new = sc.tokens.saturating_sub(self.content_seen);
                    if new > 0 {
                        t.booking.generated(new, now_s);
                    }
                }
                self.content_seen = sc.tokens;
                out
            }
            Mode::Whole(keep) => {
                if keep.len() + data.len() <= KEEP_NONSTREAM_BYTES {
                    keep.extend_from_slice(&data);
                }
                data
            }
        }
    }

    /// Closes the request out once; returns the bytes that end the stream, if any.
    fn finish(&mut self, status: OutcomeStatus) -> Option<Bytes> {
        let mut t = self.track.take()?;
        let trace = t.trace.take();
        let now = Instant::now();
        // A continuation's timings are not the client's, and its counts start at the cut.
        let before = self.splice().map(|s| s.tokens_before);
        let (ttft_s, tpot_s, tpot_label_s, usage, tail) = match &mut self.mode {
            Mode::Stream(sc) => {
                let usage = sc.usage.or_else(|| {
                    // A stream cut short has no final usage; its chunks' counts stand in.
                    sc.chunk_usage.then_some(Usage {
                        prompt_tokens: sc.chunk_prompt_tokens.unwrap_or(0),
                        completion_tokens: sc.tokens,
                        prompt_tokens_details: None,
                    })
                });
                let first = sc
                    .first_content
                    .map(|f| f.duration_since(t.dispatched).as_secs_f64());
                let ok = status == OutcomeStatus::Ok;
                let tpot = sc.client_tpot_s().filter(|_| ok);
                let label = sc.tpot_label_s().filter(|_| ok);
                let tail = if status == OutcomeStatus::Cancelled || sc.done {
                    None
                } else {
                    let msg = match status {
                        OutcomeStatus::TimedOut => "the replica stopped sending tokens",
                        _ => "the replica failed mid-stream",
                    };
                    let mut e = ApiError::upstream(msg);
                    e.replica = Some(t.replica.name.to_string());
                    Some(e.sse_bytes())
                };
                (first, tpot, label, usage, tail)
            }
            Mode::Whole(keep) => {
                #[derive(serde::Deserialize)]
                struct U {
                    usage: Option<Usage>,
                }
                let usage = serde_json::from_slice::<U>(keep).ok().and_then(|u| u.usage);
                (None, None, None, usage, None)
            }
        };
        let upstream_failed = matches!(
            status,
            OutcomeStatus::UpstreamFailed | OutcomeStatus::TimedOut
        ) || matches!(&self.mode, Mode::Stream(sc) if sc.upstream_error);
        let (ttft_s, tpot_s, tpot_label_s) = match before {
            Some(_) => (None, None, None),
            None => (ttft_s, tpot_s, tpot_label_s),
        };
        let output_tokens = usage.map(|u| u.completion_tokens + before.unwrap_or(0));
        let outcome = Outcome {
            model: t.model.clone(),
            replica: t.replica.clone(),
            status: if upstream_failed && status == OutcomeStatus::Ok {
                OutcomeStatus::UpstreamFailed
            } else {
                status
            },
            dispatched: t.dispatched,
            arrived: t.arrived,
            ttft_s,
            tpot_s,
            tpot_stream_s: tpot_label_s,
            engine_itl_ms: match &self.mode {
                Mode::Stream(sc) => sc.engine.and_then(|e| e.mean_itl_ms),
                Mode::Whole(_) => None,
            },
            e2e_s: now.duration_since(t.arrived).as_secs_f64(),
            upstream_s: now.duration_since(t.dispatched).as_secs_f64(),
            output_tokens,
            prompt_tokens: usage
                .map(|u| u.prompt_tokens)
                .filter(|n| *n > 0 && before.is_none()),
            prompt_bytes: t.prompt_bytes,
            prompt_messages: t.prompt_messages,
            cached_tokens: usage.and_then(|u| u.cached_tokens()).or(match &self.mode {
                Mode::Stream(sc) => sc.chunk_cached_tokens,
                Mode::Whole(_) => None,
            }),
            learn: t.learn,
            ttft_learned: t.ttft_learned,
            decision: t.decision,
        };
        if let Some(tr) = trace {
            tr.end(&crate::otel::span::Measured {
                outcome: outcome.status.label(),
                ttft_s: outcome.ttft_s,
                tpot_s: outcome.tpot_s,
                output_tokens: outcome.output_tokens,
                cached_tokens: outcome.cached_tokens,
            });
        }
        if outcome.status == OutcomeStatus::Ok {
            t.booking.complete();
        } else {
            drop(t.booking);
        }
        t.outcomes.observe(outcome);
        tail
    }
}

impl TrackedBody {
    /// The upstream ended: closes out (cleanly only if a stream saw `[DONE]`) and
    /// returns whatever must still be sent after `out`.
    fn end(&mut self, out: Bytes) -> Bytes {
        let clean = match &mut self.mode {
            Mode::Stream(sc) => sc.done,
            Mode::Whole(_) => true,
        };
        if !clean {
            // A partial event at the cut is dropped: a continuation regenerates it.
            match self.after_cut(OutcomeStatus::UpstreamFailed) {
                AfterCut::Resuming => return out,
                AfterCut::Ended(tail) => return join(out, &tail),
                AfterCut::No => {}
            }
        }
        self.done = true;
        let rest = match &mut self.mode {
            Mode::Stream(sc) => sc.leftover(),
            Mode::Whole(_) => Bytes::new(),
        };
        let status = if clean {
            OutcomeStatus::Ok
        } else {
            OutcomeStatus::UpstreamFailed
        };
        let tail = self.finish(status).unwrap_or_default();
        if rest.is_empty() && tail.is_empty() {
            return out;
        }
        let mut b = BytesMut::from(&out[..]);
        b.extend_from_slice(&rest);
        b.extend_from_slice(&tail);
        b.freeze()
    }

    /// Passes one upstream chunk on; ends the request when the upstream says it has
    /// nothing more (a whole response's last byte is its end: the server may not be
    /// polled again after it).
    fn forward(&mut self, data: Bytes) -> Option<Bytes> {
        let out = self.process(data);
        let out = if self.upstream.is_end_stream() {
            self.end(out)
        } else {
            out
        };
        (!out.is_empty()).then_some(out)
    }
}

fn join(a: Bytes, b: &[u8]) -> Bytes {
    if b.is_empty() {
        return a;
    }
    let mut out = BytesMut::from(&a[..]);
    out.extend_from_slice(b);
    out.freeze()
}

impl TrackedBody {
    /// The upstream broke the stream (`status`): continue it elsewhere where allowed,
    /// end it cleanly if its generation was already over, or leave it to fail.
    fn after_cut(&mut self, status: OutcomeStatus) -> AfterCut {
        let (Some(f), Mode::Stream(sc)) = (self.failover.as_mut(), &mut self.mode) else {
            return AfterCut::No;
        };
        // A stream that already ended (`[DONE]` passed) has nothing to continue: its
        // connection merely failed to close.
        let Some(t) = sc.transcript.as_ref().filter(|_| !sc.done) else {
            return AfterCut::No;
        };
        let before = f.splice.as_ref().map_or(0, |s| s.tokens_before);
        let streamed = before + sc.tokens;
        let prompt_tokens = match &f.splice {
            Some(s) => s.prompt_tokens,
            None => sc.chunk_prompt_tokens,
        };
        let cut = if f.left == 0 {
            Cut::Ineligible("attempts_spent")
        } else {
            failover::continuation(f.endpoint, &f.body, t, streamed)
        };
        match cut {
            Cut::Ineligible(why) => {
                tracing::debug!("stream cut, no failover: {why}");
                f.count("ineligible");
                AfterCut::No
            }
            Cut::Finished => {
                f.count("finished");
                let usage = (!f.strip.final_chunk)
                    .then(|| failover::final_usage(t, prompt_tokens, streamed));
                let mut tail = BytesMut::new();
                if let Some(u) = usage {
                    tail.extend_from_slice(&u);
                }
                tail.extend_from_slice(b"data: [DONE]\n\n");
                // The replica still failed to finish its response.
                self.finish(status);
                self.done = true;
                AfterCut::Ended(tail.freeze())
            }
            Cut::Resume(body) => {
                f.left -= 1;
                f.cut_at = Some(Instant::now());
                let id = t.header().and_then(|h| h.id.clone());
                let created = t.header().and_then(|h| h.created);
                let profile = f.continued_profile(streamed);
                let failed = self.track.as_ref().map_or(0, |t| t.replica.key);
                let fut = failover::resume(
                    f.path.clone(),
                    failed,
                    f.endpoint,
                    body,
                    f.headers.clone(),
                    profile,
                    (f.arrived, f.deadline),
                );
                let next = Splice {
                    id,
                    created,
                    tokens_before: streamed,
                    prompt_tokens,
                };
                // Close out the broken attempt (counted against its replica) with its
                // own counts, quietly: the continuation will write the rest.
                self.carried = self.track.as_mut().and_then(|t| t.trace.take());
                if let Some(tr) = self.carried.as_mut() {
                    tr.cut(status.label());
                }
                self.finish(status);
                if let Some(f) = self.failover.as_mut() {
                    f.splice = Some(next);
                }
                self.resuming = Some(Box::pin(fut));
                AfterCut::Resuming
            }
        }
    }

    /// A continuation answered: its stream takes over.
    fn install(&mut self, r: Resumed) {
        let transcript = match &mut self.mode {
            Mode::Stream(sc) => sc.transcript.take(),
            Mode::Whole(_) => None,
        };
        let Some(f) = self.failover.as_ref() else {
            return;
        };
        let mut sc = SseScanner::new(f.strip);
        sc.transcript = transcript;
        f.count("resumed");
        if let Some(at) = f.cut_at {
            f.path
                .metrics
                .failover_seconds
                .with_label_values::<&str>(&[])
                .observe(at.elapsed().as_secs_f64());
        }
        self.mode = Mode::Stream(Box::new(sc));
        self.upstream = r.resp.into_body();
        self.first = r.first;
        let mut track = r.track;
        track.trace = self.carried.take();
        if let Some(tr) = track.trace.as_mut() {
            tr.resumed(&track.replica);
        }
        self.track = Some(track);
        self.content_seen = 0;
        self.first_seen = false;
        self.last_frame = tokio::time::Instant::now();
    }

    /// Whether `idle_timeout` has passed since the last frame; re-arms the timer for
    /// the true deadline where it fired for an earlier one (and registers `cx`).
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.idle.as_mut().poll(cx).is_pending() {
            return false;
        }
        let due = self.last_frame + self.idle_timeout;
        if due <= tokio::time::Instant::now() {
            return true;
        }
        self.idle.as_mut().reset(due);
        self.idle.as_mut().poll(cx).is_ready()
    }

    /// No continuation could be started: the stream ends as a failure.
    fn unresumed(&mut self, why: &'static str) -> Bytes {
        self.done = true;
        if let Some(f) = self.failover.as_ref() {
            f.count("failed");
        }
        tracing::debug!("no continuation for a cut stream: {why}");
        if let Some(tr) = self.carried.take() {
            tr.end(&crate::otel::span::Measured {
                outcome: OutcomeStatus::UpstreamFailed.label(),
                ttft_s: None,
                tpot_s: None,
                output_tokens: None,
                cached_tokens: None,
            });
        }
        ApiError::upstream("the replica failed mid-stream and no other replica could continue it")
            .sse_bytes()
    }
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(fut) = this.resuming.as_mut() {
                match fut.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(r)) => {
                        this.resuming = None;
                        this.install(r);
                    }
                    Poll::Ready(Err(why)) => {
                        this.resuming = None;
                        let tail = this.unresumed(why);
                        return Poll::Ready(Some(Ok(Frame::data(tail))));
                    }
                }
            }
            if let Some(first) = this.first.take() {
                if let Some(out) = this.forward(first) {
                    return Poll::Ready(Some(Ok(Frame::data(out))));
                }
                continue;
            }
            match Pin::new(&mut this.upstream).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    this.last_frame = tokio::time::Instant::now();
                    if let Ok(data) = frame.into_data()
                        && let Some(out) = this.forward(data)
                    {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::debug!("upstream body failed: {e}");
                    match this.after_cut(OutcomeStatus::UpstreamFailed) {
                        AfterCut::Resuming => continue,
                        AfterCut::Ended(tail) => return Poll::Ready(Some(Ok(Frame::data(tail)))),
                        AfterCut::No => {}
                    }
                    this.done = true;
                    return match this.finish(OutcomeStatus::UpstreamFailed) {
                        Some(tail) => Poll::Ready(Some(Ok(Frame::data(tail)))),
                        // Not a stream: nothing honest to append; abort the response.
                        None => Poll::Ready(Some(Err(e))),
                    };
                }
                Poll::Ready(None) => {
                    let rest = this.end(Bytes::new());
                    if !rest.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                }
                Poll::Pending => {
                    if this.idle_expired(cx) {
                        match this.after_cut(OutcomeStatus::TimedOut) {
                            AfterCut::Resuming => continue,
                            AfterCut::Ended(tail) => {
                                return Poll::Ready(Some(Ok(Frame::data(tail))));
                            }
                            AfterCut::No => {}
                        }
                        this.done = true;
                        return match this.finish(OutcomeStatus::TimedOut) {
                            Some(tail) => Poll::Ready(Some(Ok(Frame::data(tail)))),
                            None => Poll::Ready(None),
                        };
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        // Still tracking means the client left before the end.
        self.finish(OutcomeStatus::Cancelled);
    }
}
