//! The engine driver: one task that owns the [`Engine`] and paces it in real time.
//!
//! Invariants:
//! - Only this task touches the engine; handlers talk to it through a bounded
//!   command channel and receive tokens on a per-request channel sized for the whole
//!   request (`max_tokens + 2` messages), so delivery never blocks the driver.
//! - A step's tokens are delivered at the END of the step: the driver computes the
//!   step, sleeps until its deadline (`duration × time_scale` after the previous
//!   one; deadline-based, so timer overshoot is caught up rather than accumulated),
//!   then delivers. Commands that arrive meanwhile join the next step, as in vLLM.
//! - While busy, the engine clock advances only by step durations; after an idle or
//!   stalled period it jumps to wall time / time_scale, so engine TTFTs include
//!   queueing and stalls.
//! - A closed token channel (client gone) or an explicit abort removes the request
//!   from the engine; shutdown drops every sender, ending all streams.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::faults::Faults;
use super::metrics::ReplicaMetrics;
use crate::engine::{Engine, EngineRequest, EngineStats, Event, FinishReason};

/// Why and how a request ended, sent with its last token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: u32,
    pub output_tokens: u32,
    pub cached_tokens: u32,
}

/// One message to a request's handler.
#[derive(Clone, Debug, PartialEq)]
pub enum Delivery {
    /// One output token; the last one carries how the request finished.
    Token { finish: Option<Finish> },
    /// The engine refused the request.
    Rejected(String),
}

/// Work for the driver.
#[derive(Debug)]
pub enum Command {
    Submit {
        req: EngineRequest,
        tx: mpsc::Sender<Delivery>,
    },
    Abort(u64),
}

/// Everything the driver task owns.
pub struct Driver {
    pub engine: Engine,
    pub commands: mpsc::Receiver<Command>,
    pub faults: watch::Receiver<Faults>,
    pub metrics: Arc<ReplicaMetrics>,
    pub time_scale: f64,
    pub cancel: CancellationToken,
}

struct State {
    engine: Engine,
    senders: HashMap<u64, mpsc::Sender<Delivery>>,
    metrics: Arc<ReplicaMetrics>,
    last: EngineStats,
    time_scale: f64,
    start: Instant,
}

impl State {
    fn model_now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() / self.time_scale
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit { req, tx } => {
                let id = req.id;
                match self.engine.submit(req) {
                    Ok(()) => {
                        self.senders.insert(id, tx);
                    }
                    Err(e) => {
                        let _ = tx.try_send(Delivery::Rejected(e.to_string()));
                    }
                }
            }
            Command::Abort(id) => {
                if self.senders.remove(&id).is_some() {
                    self.engine.abort(id);
                }
            }
        }
    }

    fn publish(&mut self) {
        let now = self.engine.stats();
        self.metrics.publish(&now, &self.last);
        self.last = now;
    }

    /// Sends a step's events to their handlers (merging each request's last token
    /// with its `Finished`), records latencies, aborts requests whose client left.
    fn deliver(&mut self, events: &[Event]) {
        let ts = self.time_scale;
        let mut gone = Vec::new();
        for (i, ev) in events.iter().enumerate() {
            let (id, finish) = match *ev {
                Event::FirstToken { id, ttft_s } => {
                    self.metrics.observe_ttft(ttft_s * ts);
                    (id, finish_after(events, i, id))
                }
                Event::Token { id, itl_s } => {
                    self.metrics.observe_itl(itl_s * ts);
                    (id, finish_after(events, i, id))
                }
                Event::Finished { e2e_s, .. } => {
                    self.metrics.observe_e2e(e2e_s * ts);
                    continue;
                }
                Event::Preempted { .. } => continue,
            };
            let Some(tx) = self.senders.get(&id) else {
                continue;
            };
            let sent = tx.try_send(Delivery::Token { finish }).is_ok();
            if finish.is_some() {
                self.senders.remove(&id);
            } else if !sent {
                gone.push(id);
            }
        }
        for id in gone {
            self.senders.remove(&id);
            self.engine.abort(id);
        }
    }
}

fn finish_after(events: &[Event], i: usize, id: u64) -> Option<Finish> {
    match events.get(i + 1) {
        Some(&Event::Finished {
            id: fid,
            reason,
            prompt_tokens,
            output_tokens,
            cached_tokens,
            ..
        }) if fid == id => Some(Finish {
            reason,
            prompt_tokens,
            output_tokens,
            cached_tokens,
        }),
        _ => None,
    }
}

impl Driver {
    /// Runs until cancelled or every command sender is gone.
    pub async fn run(self) {
        let Driver {
            engine,
            mut commands,
            mut faults,
            metrics,
            time_scale,
            cancel,
        } = self;
        let mut st = State {
            engine,
            senders: HashMap::new(),
            metrics,
            last: EngineStats::default(),
            time_scale,
            start: Instant::now(),
        };
        let mut deadline = Instant::now();
        let mut events: Vec<Event> = Vec::new();
        st.publish();
        loop {
            // Read every iteration: `changed()` below marks versions seen, so a
            // `has_changed()` check here would miss them.
            let f = *faults.borrow_and_update();
            if f.slowdown != st.engine.slowdown() {
                // Validated by the admin endpoint; a bad value keeps the old factor.
                let _ = st.engine.set_slowdown(f.slowdown);
            }
            let stalled = f.stall;
            while let Ok(cmd) = commands.try_recv() {
                st.handle(cmd);
            }
            if stalled || st.engine.is_idle() {
                st.publish();
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    cmd = commands.recv() => match cmd {
                        Some(cmd) => {
                            let now = st.model_now();
                            st.engine.advance_to(now);
                            st.handle(cmd);
                        }
                        None => break,
                    },
                    changed = faults.changed() => if changed.is_err() { break },
                }
                let now = st.model_now();
                st.engine.advance_to(now);
                deadline = Instant::now();
                continue;
            }
            let step = st.engine.step();
            events.clear();
            events.extend_from_slice(st.engine.events());
            deadline += Duration::from_secs_f64(step.duration_s * time_scale);
            if deadline > Instant::now() {
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                }
            } else {
                // Behind schedule (timer granularity is 1 ms): catch up without a
                // timer round-trip, yielding so handlers still run.
                tokio::task::yield_now().await;
                if cancel.is_cancelled() {
                    break;
                }
            }
            st.deliver(&events);
            st.publish();
        }
        // Dropping `st` drops every token sender: open streams end.
    }
}
