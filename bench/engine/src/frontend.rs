//! The API server between the engine and the client: how a step's tokens become
//! streamed chunks, and when.
//!
//! Real vLLM does not send one token per step per SSE event:
//! - `--stream-interval N` (vLLM's default 1) holds a request's tokens until `N` have
//!   accumulated since its last chunk; the first token and the last are sent at once.
//! - The API server is one Python process: its output handler processes every engine
//!   step's outputs and each stream's generator serialises and sends a chunk, at a CPU
//!   cost per step and per chunk. When it is still busy as the next step ends, that
//!   step's outputs wait in the per-request collectors, which merge them: the client
//!   then gets one chunk carrying several steps' tokens, and a burst of chunks together.
//!
//! The model: a single server in engine-model seconds. Work (a step's token events)
//! arriving while it is idle starts a service at once; work arriving while it is busy
//! waits and is merged per request with everything else waiting. A service costs
//! `step_ms` per engine step it covers plus `chunk_ms` per chunk it sends; its chunks
//! are delivered when it ends. With both costs 0 and interval 1 every step's tokens are
//! delivered at the step's end, one chunk per request per step (the old behaviour).
//!
//! Invariants: every token is delivered exactly once, in order for its request; a
//! request's finish travels with its last chunk; a service's delivery time is ≥ the end
//! of every step it covers; the model is a pure function of its inputs (no clock, no
//! randomness), so simulations stay deterministic.

use super::block_pool::MixMap;
use super::error::EngineError;
use super::types::{Event, FinishReason};

/// CPU cost of the front end, in engine-model milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FrontendCost {
    /// Per engine step whose outputs a service processes (the output handler's loop).
    pub step_ms: f64,
    /// Per chunk sent (detokenize, serialise, write one SSE event).
    pub chunk_ms: f64,
}

impl FrontendCost {
    /// No cost: every step's tokens are delivered at the step's end.
    pub const FREE: FrontendCost = FrontendCost {
        step_ms: 0.0,
        chunk_ms: 0.0,
    };

    /// Both costs finite and in [0, 1000] ms.
    pub fn validate(&self) -> Result<(), EngineError> {
        for (name, v) in [
            ("frontend_step_ms", self.step_ms),
            ("frontend_chunk_ms", self.chunk_ms),
        ] {
            if !v.is_finite() || !(0.0..=1000.0).contains(&v) {
                return Err(EngineError::InvalidConfig(format!(
                    "{name} {v} not in [0, 1000]"
                )));
            }
        }
        Ok(())
    }

    fn is_free(&self) -> bool {
        self.step_ms == 0.0 && self.chunk_ms == 0.0
    }
}

/// How a request ended, delivered with its last chunk.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub cached_tokens: u32,
}

/// One streamed chunk: `tokens` new output tokens of request `id`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Chunk {
    pub id: u64,
    /// New tokens in this chunk (≥ 1).
    pub tokens: u32,
    /// This chunk carries the request's first token.
    pub first: bool,
    /// Set on the request's last chunk.
    pub finish: Option<Finish>,
}

/// A request's tokens produced and not yet sent.
#[derive(Clone, Copy, Debug, Default)]
struct Held {
    tokens: u32,
    first_sent: bool,
    has_first: bool,
    finish: Option<Finish>,
    queued: bool,
}

/// The front-end model of one replica; see the module docs.
#[derive(Clone, Debug)]
pub struct Frontend {
    interval: u32,
    cost: FrontendCost,
    held: MixMap<u64, Held>,
    /// Requests with tokens or a finish accepted since the last service began, in the
    /// order they first appeared (the order chunks are sent in).
    waiting: Vec<u64>,
    /// Engine steps accepted since the last service began.
    waiting_steps: u32,
    /// The service in progress: its end (model seconds) and its chunks.
    in_service: Option<(f64, Vec<Chunk>)>,
    busy_until: f64,
}

impl Frontend {
    /// A front end sending every `interval` tokens, at `cost`.
    pub fn new(interval: u32, cost: FrontendCost) -> Result<Frontend, EngineError> {
        if interval == 0 || interval > 4096 {
            return Err(EngineError::InvalidConfig(format!(
                "stream_interval {interval} not in 1..=4096"
            )));
        }
        cost.validate()?;
        Ok(Frontend {
            interval,
            cost,
            held: MixMap::default(),
            waiting: Vec::new(),
            waiting_steps: 0,
            in_service: None,
            busy_until: 0.0,
        })
    }

    /// Takes the token and finish events of a step that ended at `t` (model seconds).
    /// If the front end is idle a service starts at `t`: returns its end time (the
    /// caller calls [`Frontend::complete`] then). `None`: busy, or nothing to do.
    pub fn accept(&mut self, t: f64, events: &[Event]) -> Option<f64> {
        let mut any = false;
        for ev in events {
            let (id, first, finish) = match *ev {
                Event::FirstToken { id, .. } => (id, true, None),
                Event::Token { id, .. } => (id, false, None),
                Event::Finished {
                    id,
                    reason,
                    prompt_tokens,
                    output_tokens,
                    cached_tokens,
                    ..
                } => (
                    id,
                    false,
                    Some(Finish {
                        reason,
                        prompt_tokens,
                        output_tokens,
                        cached_tokens,
                    }),
                ),
                Event::Preempted { .. } => continue,
            };
            any = true;
            let h = self.held.entry(id).or_default();
            match finish {
                Some(f) => h.finish = Some(f),
                None => {
                    h.tokens += 1;
                    h.has_first |= first;
                }
            }
            if !h.queued {
                h.queued = true;
                self.waiting.push(id);
            }
        }
        if !any {
            return None;
        }
        self.waiting_steps += 1;
        if self.in_service.is_some() {
            return None;
        }
        self.start(t.max(self.busy_until))
    }

    /// The end time of the service in progress, if any.
    pub fn busy_until(&self) -> Option<f64> {
        self.in_service.as_ref().map(|(t, _)| *t)
    }

    /// Ends the service in progress: its chunks, and the end time of the next
    /// service if work waited meanwhile (it starts at once).
    pub fn complete(&mut self) -> (Vec<Chunk>, Option<f64>) {
        let Some((end, chunks)) = self.in_service.take() else {
            return (Vec::new(), None);
        };
        self.busy_until = end;
        let next = if self.waiting.is_empty() {
            None
        } else {
            self.start(end)
        };
        (chunks, next)
    }

    /// Drops whatever is held for `id` (the request was aborted; nothing more is sent).
    pub fn forget(&mut self, id: u64) {
        self.held.remove(&id);
        self.waiting.retain(|&w| w != id);
        if let Some((_, chunks)) = self.in_service.as_mut() {
            chunks.retain(|c| c.id != id);
        }
    }

    /// Nothing held, waiting or in service.
    pub fn is_idle(&self) -> bool {
        self.in_service.is_none() && self.held.is_empty()
    }

    /// Starts a service at `t` over everything waiting; returns its end.
    fn start(&mut self, t: f64) -> Option<f64> {
        let mut chunks = Vec::new();
        for id in std::mem::take(&mut self.waiting) {
            let Some(h) = self.held.get_mut(&id) else {
                continue;
            };
            h.queued = false;
            let first = h.has_first && !h.first_sent;
            let send = h.finish.is_some() || first || h.tokens >= self.interval;
            if !send || (h.tokens == 0 && h.finish.is_none()) {
                continue;
            }
            chunks.push(Chunk {
                id,
                tokens: h.tokens,
                first,
                finish: h.finish,
            });
            if h.finish.is_some() {
                self.held.remove(&id);
            } else {
                h.tokens = 0;
                h.first_sent = true;
            }
        }
        let steps = std::mem::take(&mut self.waiting_steps);
        let ms = if self.cost.is_free() {
            0.0
        } else {
            self.cost.step_ms * f64::from(steps) + self.cost.chunk_ms * chunks.len() as f64
        };
        let end = t + ms / 1000.0;
        self.in_service = Some((end, chunks));
        Some(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(id: u64) -> Event {
        Event::Token { id, itl_s: 0.0 }
    }
    fn first(id: u64) -> Event {
        Event::FirstToken { id, ttft_s: 0.0 }
    }
    fn fin(id: u64, n: u32) -> Event {
        Event::Finished {
            id,
            reason: FinishReason::Length,
            prompt_tokens: 10,
            output_tokens: n,
            cached_tokens: 0,
            e2e_s: 0.0,
        }
    }

    /// Runs steps ending at `ends` (each producing `events(i)`) and returns every
    /// delivered chunk with its delivery time.
    fn drive(fe: &mut Frontend, steps: &[(f64, Vec<Event>)]) -> Vec<(f64, Chunk)> {
        let mut out = Vec::new();
        let mut due: Option<f64> = None;
        for (t, evs) in steps {
            while let Some(d) = due.filter(|d| d <= t) {
                let (chunks, next) = fe.complete();
                out.extend(chunks.into_iter().map(|c| (d, c)));
                due = next;
            }
            if let Some(d) = fe.accept(*t, evs) {
                due = Some(d);
            }
        }
        while let Some(d) = due {
            let (chunks, next) = fe.complete();
            out.extend(chunks.into_iter().map(|c| (d, c)));
            due = next;
        }
        out
    }

    #[test]
    fn free_front_end_with_interval_one_sends_each_step_at_its_end() {
        let mut fe = Frontend::new(1, FrontendCost::FREE).expect("valid");
        let got = drive(
            &mut fe,
            &[
                (0.01, vec![first(1)]),
                (0.02, vec![tok(1)]),
                (0.03, vec![tok(1), fin(1, 3)]),
            ],
        );
        let times: Vec<f64> = got.iter().map(|(t, _)| *t).collect();
        assert_eq!(times, vec![0.01, 0.02, 0.03]);
        assert!(got.iter().all(|(_, c)| c.tokens == 1));
        assert!(got[0].1.first && !got[1].1.first);
        assert_eq!(got[2].1.finish.map(|f| f.output_tokens), Some(3));
        assert!(fe.is_idle());
    }

    #[test]
    fn stream_interval_packs_tokens_but_sends_first_and_last_at_once() {
        let mut fe = Frontend::new(4, FrontendCost::FREE).expect("valid");
        let mut steps = vec![(0.01, vec![first(7)])];
        for i in 2..=9 {
            steps.push((0.01 * i as f64, vec![tok(7)]));
        }
        steps.push((0.1, vec![tok(7), fin(7, 10)]));
        let got = drive(&mut fe, &steps);
        let sizes: Vec<u32> = got.iter().map(|(_, c)| c.tokens).collect();
        assert_eq!(
            sizes,
            vec![1, 4, 4, 1],
            "first alone, then 4s, the rest at the end"
        );
        assert_eq!(sizes.iter().sum::<u32>(), 10);
        assert!(got.last().and_then(|(_, c)| c.finish).is_some());
    }

    #[test]
    fn a_busy_front_end_merges_steps_into_bursts() {
        // 3 ms per chunk, 2 streams: a service takes 6 ms, steps end every 2 ms.
        let cost = FrontendCost {
            step_ms: 0.0,
            chunk_ms: 3.0,
        };
        let mut fe = Frontend::new(1, cost).expect("valid");
        let mut steps = vec![(0.002, vec![first(1), first(2)])];
        for i in 2..=10 {
            steps.push((0.002 * i as f64, vec![tok(1), tok(2)]));
        }
        let got = drive(&mut fe, &steps);
        let for1: Vec<&(f64, Chunk)> = got.iter().filter(|(_, c)| c.id == 1).collect();
        assert_eq!(for1.iter().map(|(_, c)| c.tokens).sum::<u32>(), 10);
        assert!(for1.len() < 10, "steps merged: {} chunks", for1.len());
        assert!(for1.iter().skip(1).any(|(_, c)| c.tokens >= 2));
        // Both streams' chunks of one service arrive together (a burst).
        assert_eq!(got[0].0, got[1].0);
        assert!(
            (got[0].0 - 0.008).abs() < 1e-12,
            "first service ends 6 ms after 2 ms"
        );
        // Delivery never precedes production and is in order.
        assert!(got.windows(2).all(|w| w[0].0 <= w[1].0));
    }

    #[test]
    fn aborted_requests_are_forgotten() {
        let mut fe = Frontend::new(8, FrontendCost::FREE).expect("valid");
        let _ = fe.accept(0.0, &[first(1)]);
        let _ = fe.complete();
        let _ = fe.accept(0.1, &[tok(1)]);
        let _ = fe.complete();
        assert!(!fe.is_idle(), "one token held by the interval");
        fe.forget(1);
        assert!(fe.is_idle());
    }

    #[test]
    fn bad_settings_are_refused() {
        assert!(Frontend::new(0, FrontendCost::FREE).is_err());
        let nan = FrontendCost {
            step_ms: f64::NAN,
            chunk_ms: 0.0,
        };
        assert!(Frontend::new(1, nan).is_err());
        let neg = FrontendCost {
            step_ms: 0.0,
            chunk_ms: -1.0,
        };
        assert!(Frontend::new(1, neg).is_err());
    }
}
