//! Turning a request's token deliveries into an SSE stream or one JSON body.
//!
//! Invariant: while a request is in the engine, its [`AbortGuard`] is armed; if the
//! response is dropped before the last token (client gone, mid-stream fault), the
//! guard tells the driver to abort it, freeing its KV.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use tokio::sync::mpsc;

use super::api_error::ApiError;
use super::driver::{Command, Delivery};
use super::generation::filler_word;
use super::request::Endpoint;
use super::response::{
    Meta, Usage, full_response, push_chunk, push_done, push_event, push_usage_chunk,
};

/// Aborts the engine request when dropped while armed.
pub struct AbortGuard {
    pub id: u64,
    pub commands: mpsc::Sender<Command>,
    pub armed: bool,
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.armed {
            // If the queue is full the driver still notices: its next token send to
            // this request fails and it aborts then.
            let _ = self.commands.try_send(Command::Abort(self.id));
        }
    }
}

/// How one request's output is produced.
pub struct Generation {
    pub meta: Meta,
    pub rx: mpsc::Receiver<Delivery>,
    pub guard: AbortGuard,
    /// Seed of the filler text.
    pub seed: u64,
    /// Fail (mid-stream fault) once this many tokens were delivered.
    pub fail_after: Option<u32>,
}

fn midstream_error() -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "injected fault: the replica failed mid-generation",
    )
}

fn rejected(msg: String) -> ApiError {
    ApiError::bad_request(msg)
}

fn shut_down() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the engine shut down before the request finished",
    )
}

struct SseState {
    g: Generation,
    sent: u32,
    done: bool,
    /// A non-chunk delivery read while merging chunks, handled next.
    pending: Option<Delivery>,
}

/// The filler text of tokens `from..from + n` of a request seeded with `seed`.
fn words(seed: u64, from: u32, n: u32) -> String {
    (from..from.saturating_add(n))
        .map(|i| filler_word(seed, i))
        .collect()
}

impl SseState {
    /// The next delivery, with every chunk already queued behind it merged in: a
    /// stream that was not polled meanwhile (its task busy, the runtime loaded) then
    /// sends one event with all their tokens, as vLLM's per-request output collector
    /// merges outputs its stream has not yet taken.
    async fn next_delivery(&mut self) -> Option<Delivery> {
        let first = match self.pending.take() {
            Some(d) => Some(d),
            None => self.g.rx.recv().await,
        };
        let Some(Delivery::Chunk {
            mut tokens,
            mut finish,
        }) = first
        else {
            return first;
        };
        while finish.is_none() {
            match self.g.rx.try_recv() {
                Ok(Delivery::Chunk {
                    tokens: more,
                    finish: f,
                }) => {
                    tokens += more;
                    finish = f;
                }
                Ok(other) => {
                    self.pending = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        Some(Delivery::Chunk { tokens, finish })
    }

    /// Text for the next delivery; sets `done` after the terminator.
    fn next_chunk(&mut self, delivery: Option<Delivery>) -> String {
        let mut out = String::new();
        let fail = |out: &mut String, e: ApiError| {
            push_event(out, &e.body());
            push_done(out);
        };
        match delivery {
            Some(Delivery::Chunk { tokens, finish }) => {
                let meta = &self.g.meta;
                let index = self.sent;
                // A mid-stream fault fires after exactly `fail_after` tokens.
                let fail_at = self.g.fail_after.filter(|&k| index + tokens > k);
                let sends = fail_at.map_or(tokens, |k| k - index);
                if index == 0 && sends > 0 && meta.endpoint == Endpoint::Chat {
                    push_chunk(&mut out, meta, true, "", None, 0);
                }
                if let Some(k) = fail_at {
                    if sends > 0 {
                        let text = words(self.g.seed, index, sends);
                        push_chunk(&mut out, meta, false, &text, None, k);
                    }
                    fail(&mut out, midstream_error());
                    self.done = true;
                    return out; // the guard aborts the engine request
                }
                self.sent += tokens;
                let text = words(self.g.seed, index, tokens);
                let reason = finish.map(|f| f.reason.as_str());
                push_chunk(&mut out, meta, false, &text, reason, self.sent);
                if let Some(f) = finish {
                    if meta.include_usage {
                        push_usage_chunk(
                            &mut out,
                            meta,
                            Usage {
                                prompt_tokens: f.prompt_tokens,
                                completion_tokens: f.output_tokens,
                                cached_tokens: f.cached_tokens,
                            },
                        );
                    }
                    push_done(&mut out);
                    self.g.guard.armed = false;
                    self.done = true;
                }
            }
            Some(Delivery::Rejected(msg)) => {
                fail(&mut out, rejected(msg));
                self.g.guard.armed = false;
                self.done = true;
            }
            None => {
                fail(&mut out, shut_down());
                self.g.guard.armed = false;
                self.done = true;
            }
        }
        out
    }
}

/// A `text/event-stream` response fed by the driver.
pub fn sse_response(g: Generation) -> Response {
    let state = SseState {
        g,
        sent: 0,
        done: false,
        pending: None,
    };
    let body = stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let delivery = s.next_delivery().await;
        let chunk = s.next_chunk(delivery);
        Some((Ok::<_, Infallible>(Bytes::from(chunk)), s))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// Waits for the whole output and returns one JSON response.
pub async fn collect(mut g: Generation) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut sent = 0u32;
    loop {
        match g.rx.recv().await {
            Some(Delivery::Chunk { tokens, finish }) => {
                if g.fail_after.is_some_and(|k| sent + tokens > k) {
                    return Err(midstream_error());
                }
                text.push_str(&words(g.seed, sent, tokens));
                sent += tokens;
                if let Some(f) = finish {
                    g.guard.armed = false;
                    let usage = Usage {
                        prompt_tokens: f.prompt_tokens,
                        completion_tokens: f.output_tokens,
                        cached_tokens: f.cached_tokens,
                    };
                    let body = full_response(&g.meta, &text, f.reason.as_str(), usage);
                    return Ok((
                        [(header::CONTENT_TYPE, "application/json")],
                        body.to_string(),
                    )
                        .into_response());
                }
            }
            Some(Delivery::Rejected(msg)) => {
                g.guard.armed = false;
                return Err(rejected(msg));
            }
            None => {
                g.guard.armed = false;
                return Err(shut_down());
            }
        }
    }
}
