//! The response body handed to the client: upstream bytes passed through as they
//! arrive, watched on the way (first token, usage, errors) and closed out exactly once
//! with an [`Outcome`].
//!
//! Invariants: nothing is ever sent twice; once a stream has started, every failure
//! becomes one SSE error event followed by `data: [DONE]`; dropping the body (client
//! gone) releases the booking and closes the upstream connection, which makes the
//! engine abort the request.

use std::{
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
    outcome::{Outcome, OutcomeStatus},
    sse::{SseScanner, Usage},
};
use crate::request::InjectedUsage;
use crate::{decide::Learn, error::ApiError, fleet::Replica, ledger::Booking, node::Node};

/// Largest non-streaming body kept to read its usage.
const KEEP_NONSTREAM_BYTES: usize = 1 << 20;

/// Everything needed to close out a request.
pub struct Tracking {
    pub node: Arc<Node>,
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
}

enum Mode {
    Stream(SseScanner),
    Whole(BytesMut),
}

pub struct TrackedBody {
    upstream: Incoming,
    first: Option<Bytes>,
    mode: Mode,
    track: Option<Tracking>,
    idle: Pin<Box<Sleep>>,
    idle_timeout: Duration,
    done: bool,
    /// Tokens already counted into the booking.
    content_seen: u32,
    first_seen: bool,
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
            Some(injected) => Mode::Stream(SseScanner::new(injected)),
            None => Mode::Whole(BytesMut::new()),
        };
        Self {
            upstream,
            first,
            mode,
            track: Some(track),
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
            idle_timeout,
            done: false,
            content_seen: 0,
            first_seen: false,
        }
    }

    fn process(&mut self, data: Bytes) -> Bytes {
        match &mut self.mode {
            Mode::Stream(sc) => {
                let out = sc.feed(&data, Instant::now());
                if let Some(t) = self.track.as_mut() {
                    let now_s = crate::clock::now_s();
                    if let Some(first) = sc.first_content
                        && !self.first_seen
                    {
                        self.first_seen = true;
                        t.booking.first_token(now_s);
                        // The TTFT label is known now: learn it without waiting for the
                        // stream to end (long outputs would delay it by seconds).
                        if let Some(l) = &t.learn {
                            let ttft_s = first.duration_since(t.dispatched).as_secs_f64();
                            let reported = super::outcome::Reported {
                                prompt_tokens: sc.chunk_prompt_tokens,
                                cached_tokens: sc.chunk_cached_tokens,
                            };
                            t.node.learn_first_token(l, ttft_s, reported);
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
        let t = self.track.take()?;
        let now = Instant::now();
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
                    e.replica = Some(t.replica.name.clone());
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
            output_tokens: usage.map(|u| u.completion_tokens),
            prompt_tokens: usage.map(|u| u.prompt_tokens).filter(|n| *n > 0),
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
        if outcome.status == OutcomeStatus::Ok {
            t.booking.complete();
        } else {
            drop(t.booking);
        }
        t.node.observe(outcome);
        tail
    }
}

impl TrackedBody {
    /// The upstream ended: closes out (cleanly only if a stream saw `[DONE]`) and
    /// returns whatever must still be sent after `out`.
    fn end(&mut self, out: Bytes) -> Bytes {
        self.done = true;
        let clean = match &mut self.mode {
            Mode::Stream(sc) => sc.done,
            Mode::Whole(_) => true,
        };
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

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(first) = this.first.take() {
            if let Some(out) = this.forward(first) {
                return Poll::Ready(Some(Ok(Frame::data(out))));
            }
            if this.done {
                return Poll::Ready(None);
            }
        }
        loop {
            match Pin::new(&mut this.upstream).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let deadline = tokio::time::Instant::now() + this.idle_timeout;
                    this.idle.as_mut().reset(deadline);
                    if let Ok(data) = frame.into_data()
                        && let Some(out) = this.forward(data)
                    {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    if this.done {
                        return Poll::Ready(None);
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    this.done = true;
                    tracing::debug!("upstream body failed: {e}");
                    return match this.finish(OutcomeStatus::UpstreamFailed) {
                        Some(tail) => Poll::Ready(Some(Ok(Frame::data(tail)))),
                        // Not a stream: nothing honest to append; abort the response.
                        None => Poll::Ready(Some(Err(e))),
                    };
                }
                Poll::Ready(None) => {
                    let rest = this.end(Bytes::new());
                    return if rest.is_empty() {
                        Poll::Ready(None)
                    } else {
                        Poll::Ready(Some(Ok(Frame::data(rest))))
                    };
                }
                Poll::Pending => {
                    if this.idle.as_mut().poll(cx).is_ready() {
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
