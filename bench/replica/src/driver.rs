//! The engine driver: one task that owns the [`Engine`] and paces it in real time.
//!
//! Invariants:
//! - Only this task touches the engine; handlers talk to it through a bounded
//!   command channel and receive tokens on a per-request channel sized for the whole
//!   request (`max_tokens + 2` messages), so delivery never blocks the driver.
//! - A step's tokens leave the engine at the END of the step: the driver computes the
//!   step, sleeps until its deadline (`duration × time_scale` after the previous
//!   one; deadline-based, so timer overshoot is caught up rather than accumulated),
//!   then hands them to the front-end model ([`Frontend`]: stream interval, API-server
//!   cost, merging while busy), whose services end on their own deadlines, also while
//!   the next step runs; each service's chunks are sent when it ends. Commands that
//!   arrive meanwhile join the next step, as in vLLM.
//! - While busy, the engine clock advances only by step durations; after an idle or
//!   stalled period it jumps to wall time / time_scale, so engine TTFTs include
//!   queueing and stalls.
//! - A closed token channel (client gone) or an explicit abort removes the request
//!   from the engine; shutdown drops every sender, ending all streams.
//! - With KV events on, each step's prefix-cache changes are published right after
//!   the step is computed ([`super::kv_events`]); a request's prompt is kept for
//!   that until it finishes or is aborted.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use headroom_engine::Finish;
use headroom_engine::{Chunk, Engine, EngineRequest, EngineStats, Event, Frontend};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::faults::Faults;
use super::kv_events::{KvPrompt, KvPublish};
use super::metrics::ReplicaMetrics;

/// One message to a request's handler.
#[derive(Clone, Debug, PartialEq)]
pub enum Delivery {
    /// `tokens` new output tokens in one chunk; the last chunk carries how the
    /// request finished.
    Chunk { tokens: u32, finish: Option<Finish> },
    /// The engine refused the request.
    Rejected(String),
}

/// Work for the driver.
#[derive(Debug)]
pub enum Command {
    Submit {
        req: EngineRequest,
        tx: mpsc::Sender<Delivery>,
        /// The prompt's token ids, when KV events are published.
        kv: Option<KvPrompt>,
    },
    Abort(u64),
    /// A KV transfer from a remote prefill arrived: these prompt blocks enter the
    /// prefix cache; the reply says how many were not already held.
    Import {
        block_hashes: Vec<u64>,
        reply: tokio::sync::oneshot::Sender<u32>,
    },
}

/// Everything the driver task owns.
pub struct Driver {
    pub engine: Engine,
    /// The API server's delivery model (from the profile's stream settings).
    pub frontend: Frontend,
    pub commands: mpsc::Receiver<Command>,
    pub faults: watch::Receiver<Faults>,
    pub metrics: Arc<ReplicaMetrics>,
    pub time_scale: f64,
    pub cancel: CancellationToken,
    /// KV-event publishing, when enabled.
    pub kv: Option<KvPublish>,
}

struct State {
    engine: Engine,
    frontend: Frontend,
    /// The front-end service in progress: when it ends (wall) and (model seconds).
    fe_due: Option<(Instant, f64)>,
    senders: HashMap<u64, mpsc::Sender<Delivery>>,
    metrics: Arc<ReplicaMetrics>,
    last: EngineStats,
    time_scale: f64,
    start: Instant,
    kv: Option<KvPublish>,
}

impl State {
    fn model_now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() / self.time_scale
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit { req, tx, kv } => {
                let id = req.id;
                match self.engine.submit(req) {
                    Ok(()) => {
                        self.senders.insert(id, tx);
                        if let (Some(p), Some(k)) = (self.kv.as_mut(), kv) {
                            p.track(id, k);
                        }
                    }
                    Err(e) => {
                        let _ = tx.try_send(Delivery::Rejected(e.to_string()));
                    }
                }
            }
            Command::Import {
                block_hashes,
                reply,
            } => {
                let _ = reply.send(self.engine.import_blocks(&block_hashes));
            }
            Command::Abort(id) => {
                if self.senders.remove(&id).is_some() {
                    self.engine.abort(id);
                    self.frontend.forget(id);
                    self.forget_prompt(id);
                }
            }
        }
    }

    fn forget_prompt(&mut self, id: u64) {
        if let Some(k) = self.kv.as_mut() {
            k.forget(id);
        }
    }

    /// Publishes the step's prefix-cache changes (KV events), if enabled.
    fn flush_kv(&mut self) {
        if let Some(k) = self.kv.as_mut() {
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            k.flush(&mut self.engine, ts);
        }
    }

    fn publish(&mut self) {
        let now = self.engine.stats();
        self.metrics.publish(&now, &self.last);
        self.last = now;
    }

    /// Records a step's latencies (engine-side, as vLLM's metrics are) and hands its
    /// tokens to the front end; a service that starts now ends `at` + its cost.
    fn accept(&mut self, at: Instant, events: &[Event]) {
        let ts = self.time_scale;
        for ev in events {
            match *ev {
                Event::FirstToken { ttft_s, .. } => self.metrics.observe_ttft(ttft_s * ts),
                Event::Token { itl_s, .. } => self.metrics.observe_itl(itl_s * ts),
                Event::Finished { id, e2e_s, .. } => {
                    self.metrics.observe_e2e(e2e_s * ts);
                    if let Some(k) = self.kv.as_mut() {
                        k.forget(id);
                    }
                }
                Event::Preempted { .. } => {}
            }
        }
        let t = self.engine.now_s();
        if let Some(end) = self.frontend.accept(t, events) {
            self.schedule(at, t, end);
        }
    }

    /// A service started at model time `start` (wall `at`) and ends at model `end`.
    fn schedule(&mut self, at: Instant, start: f64, end: f64) {
        if end <= start {
            self.complete(at, end);
        } else {
            let wall = Duration::from_secs_f64((end - start) * self.time_scale);
            self.fe_due = Some((at + wall, end));
        }
    }

    /// Ends the front-end service that ended at `at` (model `end`): sends its chunks
    /// and starts the next one if work waited.
    fn complete(&mut self, at: Instant, end: f64) {
        self.fe_due = None;
        let (chunks, next) = self.frontend.complete();
        self.send(&chunks);
        if let Some(next_end) = next {
            self.schedule(at, end, next_end);
        }
    }

    /// Sends chunks to their handlers; aborts requests whose client left.
    fn send(&mut self, chunks: &[Chunk]) {
        let mut gone = Vec::new();
        for c in chunks {
            let Some(tx) = self.senders.get(&c.id) else {
                continue;
            };
            let sent = tx
                .try_send(Delivery::Chunk {
                    tokens: c.tokens,
                    finish: c.finish,
                })
                .is_ok();
            if c.finish.is_some() {
                self.senders.remove(&c.id);
            } else if !sent {
                gone.push(c.id);
            }
        }
        for id in gone {
            self.senders.remove(&id);
            self.engine.abort(id);
            self.frontend.forget(id);
            self.forget_prompt(id);
        }
    }
}

impl Driver {
    /// Runs until cancelled or every command sender is gone.
    pub async fn run(self) {
        let Driver {
            engine,
            frontend,
            mut commands,
            mut faults,
            metrics,
            time_scale,
            cancel,
            kv,
        } = self;
        let mut st = State {
            engine,
            frontend,
            fe_due: None,
            senders: HashMap::new(),
            metrics,
            last: EngineStats::default(),
            time_scale,
            start: Instant::now(),
            kv,
        };
        let mut deadline = Instant::now();
        let mut events: Vec<Event> = Vec::new();
        st.publish();
        'run: loop {
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
                let fe = st.fe_due;
                let fe_at = fe.map_or_else(Instant::now, |(at, _)| at);
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep_until(fe_at.into()), if fe.is_some() => {
                        if let Some((at, end)) = fe {
                            st.complete(at, end);
                        }
                        continue;
                    }
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
            st.flush_kv();
            events.clear();
            events.extend_from_slice(st.engine.events());
            deadline += Duration::from_secs_f64(step.duration_s * time_scale);
            // Front-end services that end while this step runs deliver on time.
            while let Some((at, end)) = st.fe_due.filter(|(at, _)| *at < deadline) {
                if at > Instant::now() {
                    tokio::select! {
                        _ = cancel.cancelled() => break 'run,
                        _ = tokio::time::sleep_until(at.into()) => {}
                    }
                }
                st.complete(at, end);
            }
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
            st.accept(deadline, &events);
            st.publish();
        }
        // Dropping `st` drops every token sender: open streams end.
    }
}
