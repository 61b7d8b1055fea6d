//! In-flight accounting: the work this node has placed on one replica.
//!
//! Invariants: every counter is the sum over live [`Booking`]s of that booking's
//! current contribution; a booking contributes to exactly one stage (queued before its
//! first token, decoding after), and dropping it removes its contribution, so a lost
//! stream can never pin phantom load. Reads are lock-free atomics; writers of the
//! inflow rate and of the TPOT-objective multiset take short locks and publish what
//! readers need as atomics.
//!
//! Two estimates refine the raw counters (see their modules): queued prefill work net
//! of the head's progress ([`prefill_queue`]), and the time left in the replica's step
//! in progress ([`step_clock`]). Both come only from what this node observes.

mod prefill_queue;
mod step_clock;

use prefill_queue::{HeadView, Leave, PrefillQueue};
use step_clock::StepClock;

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering::Relaxed},
    },
};

use parking_lot::Mutex;

/// Time constant of the prefill inflow rate (seconds).
const INFLOW_TAU_S: f64 = 2.0;

/// A point-in-time read of the load on one replica (this node's, or a sum).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    pub requests: f64,
    pub queued_requests: f64,
    /// Of those, the streamed ones: their first token ends their wait where this node
    /// sees it. A non-streamed request stays counted as queued until it ends.
    pub queued_streams: f64,
    /// Uncached prompt tokens not yet prefilled (requests before their first token),
    /// net of the estimated progress into the head of the queue.
    pub queued_prefill_tokens: f64,
    /// Σ (u·k + u²/2) over queued requests: their prefill attention work.
    pub queued_attention_pairs: f64,
    pub decoding_requests: f64,
    /// Σ current context (prompt + generated) of decoding requests.
    pub decode_context_tokens: f64,
    /// Σ expected remaining output tokens of decoding requests.
    pub decode_remaining_tokens: f64,
    /// Uncached prompt tokens dispatched per second (exponentially decayed).
    pub prefill_inflow_tps: f64,
    /// Tightest TPOT objective among requests in flight (ms), if any.
    pub min_tpot_slo_ms: Option<f64>,
    /// Expected time left in the engine step in progress (s); 0 when unknown. Only this
    /// node's streams show it: it is not additive and not gossiped.
    pub step_residual_s: f64,
    /// How long the oldest stream this node placed here has waited for its first
    /// token (s; 0 when none waits): a queue that stands rather than drains. Local like
    /// the step residual.
    pub queue_age_s: f64,
}

impl Load {
    /// Sum of two loads (e.g. this node's plus its peers').
    pub fn plus(&self, o: &Load) -> Load {
        Load {
            requests: self.requests + o.requests,
            queued_requests: self.queued_requests + o.queued_requests,
            queued_streams: self.queued_streams + o.queued_streams,
            queued_prefill_tokens: self.queued_prefill_tokens + o.queued_prefill_tokens,
            queued_attention_pairs: self.queued_attention_pairs + o.queued_attention_pairs,
            decoding_requests: self.decoding_requests + o.decoding_requests,
            decode_context_tokens: self.decode_context_tokens + o.decode_context_tokens,
            decode_remaining_tokens: self.decode_remaining_tokens + o.decode_remaining_tokens,
            prefill_inflow_tps: self.prefill_inflow_tps + o.prefill_inflow_tps,
            min_tpot_slo_ms: match (self.min_tpot_slo_ms, o.min_tpot_slo_ms) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            step_residual_s: self.step_residual_s.max(o.step_residual_s),
            queue_age_s: self.queue_age_s.max(o.queue_age_s),
        }
    }

    /// Outstanding tokens: prefill still to do plus decode still to come.
    pub fn outstanding_tokens(&self) -> f64 {
        self.queued_prefill_tokens + self.decode_remaining_tokens
    }
}

/// Decayed sum of dispatched prefill tokens.
#[derive(Debug, Default)]
struct Inflow {
    acc: f64,
    at_s: f64,
}

impl Inflow {
    fn rate(&self, now_s: f64) -> f64 {
        let x = (now_s - self.at_s).max(0.0) / INFLOW_TAU_S;
        // Read on every candidate of every decision: skip the exp when nothing flowed
        // or it has long decayed (e^-40 ≈ 4e-18; deeper arguments take libm's slow
        // underflow path).
        if self.acc == 0.0 || x > 40.0 {
            return 0.0;
        }
        self.acc * (-x).exp() / INFLOW_TAU_S
    }
    fn add(&mut self, tokens: f64, now_s: f64) {
        let dt = (now_s - self.at_s).max(0.0);
        self.acc = self.acc * (-dt / INFLOW_TAU_S).exp() + tokens;
        self.at_s = self.at_s.max(now_s);
    }
}

/// One replica's in-flight ledger for this node.
#[derive(Debug, Default)]
pub struct Ledger {
    requests: AtomicI64,
    queued_requests: AtomicI64,
    queued_streams: AtomicI64,
    queued_prefill_tokens: AtomicI64,
    queued_attention_pairs: AtomicI64,
    decoding_requests: AtomicI64,
    decode_context_tokens: AtomicI64,
    decode_remaining_tokens: AtomicI64,
    completed: AtomicU64,
    inflow: Mutex<Inflow>,
    /// The inflow state as readers see it: decayed sum and its time (f64 bits).
    inflow_acc: AtomicU64,
    inflow_at: AtomicU64,
    /// TPOT objective (ms, rounded) → number of in-flight requests holding it.
    tpot_slos: Mutex<BTreeMap<u32, u32>>,
    /// The smallest key of `tpot_slos` plus one, or 0 when empty.
    min_tpot_slo: std::sync::atomic::AtomicU32,
    next_booking: AtomicU64,
    queue: Mutex<PrefillQueue>,
    /// `queue.view()` as readers see it (f64 bits: uncached, cached, since, rate,
    /// expected first token).
    head: [AtomicU64; 5],
    /// The view's oldest waiting stream's booking time.
    oldest_stream: OptionalF64,
    steps: StepClock,
}

/// An `Option<f64>` readers take without a lock: NaN bits stand for `None`, and so
/// does a new one.
#[derive(Debug)]
struct OptionalF64(AtomicU64);

impl Default for OptionalF64 {
    fn default() -> Self {
        Self(AtomicU64::new(f64::NAN.to_bits()))
    }
}

impl OptionalF64 {
    fn get(&self) -> Option<f64> {
        Some(f64::from_bits(self.0.load(Relaxed))).filter(|x| !x.is_nan())
    }
    fn set(&self, x: Option<f64>) {
        self.0.store(x.unwrap_or(f64::NAN).to_bits(), Relaxed);
    }
}

fn f(a: &AtomicI64) -> f64 {
    a.load(Relaxed).max(0) as f64
}

impl Ledger {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Current load at `now_s`.
    pub fn load(&self, now_s: f64) -> Load {
        let head = self.head_view();
        let done = head.progress(now_s);
        let decoding = f(&self.decoding_requests);
        Load {
            requests: f(&self.requests),
            queued_requests: f(&self.queued_requests),
            queued_streams: f(&self.queued_streams),
            queued_prefill_tokens: (f(&self.queued_prefill_tokens) - done.tokens).max(0.0),
            queued_attention_pairs: (f(&self.queued_attention_pairs) - done.pairs).max(0.0),
            decoding_requests: decoding,
            decode_context_tokens: f(&self.decode_context_tokens),
            decode_remaining_tokens: f(&self.decode_remaining_tokens),
            prefill_inflow_tps: Inflow {
                acc: f64::from_bits(self.inflow_acc.load(Relaxed)),
                at_s: f64::from_bits(self.inflow_at.load(Relaxed)),
            }
            .rate(now_s),
            min_tpot_slo_ms: match self.min_tpot_slo.load(Relaxed) {
                0 => None,
                k => Some((k - 1) as f64),
            },
            step_residual_s: if decoding > 0.0 {
                self.steps.residual_s(now_s)
            } else {
                0.0
            },
            queue_age_s: head
                .oldest_stream_booked_s
                .map_or(0.0, |b| (now_s - b).max(0.0)),
        }
    }

    /// The two terms of `load(now_s).outstanding_tokens()` (prefill still queued, decode
    /// still expected), computed as `load` computes them but without the rest of the
    /// load (no inflow decay `exp`): what a shortlist ranks a large fleet by.
    pub fn outstanding(&self, now_s: f64) -> (f64, f64) {
        let done = self.head_view().progress(now_s);
        (
            (f(&self.queued_prefill_tokens) - done.tokens).max(0.0),
            f(&self.decode_remaining_tokens),
        )
    }

    fn head_view(&self) -> HeadView {
        let g = |i: usize| f64::from_bits(self.head[i].load(Relaxed));
        HeadView {
            uncached: g(0),
            cached: g(1),
            since_s: g(2),
            rate_tps: g(3),
            expected_first_s: g(4),
            oldest_stream_booked_s: self.oldest_stream.get(),
        }
    }

    /// Changes the prefill queue and republishes its head for lock-free readers.
    fn with_queue(&self, change: impl FnOnce(&mut PrefillQueue)) {
        let mut q = self.queue.lock();
        change(&mut q);
        let v = q.view();
        let xs = [
            v.uncached,
            v.cached,
            v.since_s,
            v.rate_tps,
            v.expected_first_s,
        ];
        for (slot, x) in self.head.iter().zip(xs) {
            slot.store(x.to_bits(), Relaxed);
        }
        self.oldest_stream.set(v.oldest_stream_booked_s);
    }

    /// When this node last booked a request here (`now_s` axis; 0 if never).
    /// The replica's engine step time as its streams show it (s; 0 when unknown).
    pub fn step_s(&self) -> f64 {
        self.steps.gap_s()
    }

    pub fn last_booked_s(&self) -> f64 {
        f64::from_bits(self.inflow_at.load(Relaxed))
    }

    /// Requests completed through this ledger.
    pub fn completed(&self) -> u64 {
        self.completed.load(Relaxed)
    }

    /// Books a request placed at `now_s`; the returned booking releases on drop.
    pub fn book(self: &Arc<Self>, spec: BookingSpec, now_s: f64) -> Booking {
        let uncached = spec.prompt_tokens.saturating_sub(spec.cached_tokens) as i64;
        let k = spec.cached_tokens as f64;
        let u = uncached as f64;
        let pairs = (u * k + u * u / 2.0) as i64;
        self.requests.fetch_add(1, Relaxed);
        self.queued_requests.fetch_add(1, Relaxed);
        if spec.stream {
            self.queued_streams.fetch_add(1, Relaxed);
        }
        self.queued_prefill_tokens.fetch_add(uncached, Relaxed);
        self.queued_attention_pairs.fetch_add(pairs, Relaxed);
        let id = self.next_booking.fetch_add(1, Relaxed);
        let first = spec
            .expected_ttft_s
            .filter(|t| t.is_finite() && *t > 0.0)
            .map_or(0.0, |t| now_s + t);
        self.with_queue(|q| q.push(id, u, k, now_s, first, spec.stream));
        {
            let mut inflow = self.inflow.lock();
            inflow.add(u, now_s);
            self.inflow_acc.store(inflow.acc.to_bits(), Relaxed);
            self.inflow_at.store(inflow.at_s.to_bits(), Relaxed);
        }
        let slo_key = spec
            .tpot_slo_ms
            .map(|ms| ms.round().clamp(0.0, u32::MAX as f64) as u32);
        if let Some(k) = slo_key {
            let mut m = self.tpot_slos.lock();
            *m.entry(k).or_insert(0) += 1;
            self.min_tpot_slo
                .store(m.keys().next().map_or(0, |k| k.saturating_add(1)), Relaxed);
        }
        Booking {
            ledger: self.clone(),
            id,
            last_token_s: None,
            uncached,
            pairs,
            prompt: spec.prompt_tokens as i64,
            expected_output: spec.expected_output_tokens as i64,
            generated: 0,
            decoding: false,
            stream: spec.stream,
            slo_key,
        }
    }
}

/// What a booking needs to know about its request.
#[derive(Clone, Copy, Debug, Default)]
pub struct BookingSpec {
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub expected_output_tokens: u32,
    pub tpot_slo_ms: Option<f64>,
    /// A trusted forecast of the time to first token (s): paces the queue's progress.
    pub expected_ttft_s: Option<f64>,
    /// The response streams, so its first token will be seen.
    pub stream: bool,
}

/// A live placement; moves from queued to decoding at the first token.
#[derive(Debug)]
pub struct Booking {
    ledger: Arc<Ledger>,
    id: u64,
    last_token_s: Option<f64>,
    uncached: i64,
    pairs: i64,
    prompt: i64,
    expected_output: i64,
    generated: i64,
    decoding: bool,
    stream: bool,
    slo_key: Option<u32>,
}

impl Booking {
    fn remaining(&self) -> i64 {
        (self.expected_output - self.generated).max(0)
    }

    /// The first token arrived at `now_s`: the request leaves the prefill queue.
    pub fn first_token(&mut self, now_s: f64) {
        if self.decoding {
            return;
        }
        self.decoding = true;
        let l = &self.ledger;
        l.with_queue(|q| q.remove(self.id, Leave::Served(now_s)));
        l.queued_requests.fetch_sub(1, Relaxed);
        if self.stream {
            l.queued_streams.fetch_sub(1, Relaxed);
        }
        l.queued_prefill_tokens.fetch_sub(self.uncached, Relaxed);
        l.queued_attention_pairs.fetch_sub(self.pairs, Relaxed);
        l.decoding_requests.fetch_add(1, Relaxed);
        l.decode_context_tokens
            .fetch_add(self.prompt + self.generated, Relaxed);
        l.decode_remaining_tokens
            .fetch_add(self.remaining(), Relaxed);
    }

    /// `n` more output tokens arrived at `now_s`.
    pub fn generated(&mut self, n: u32, now_s: f64) {
        self.ledger.steps.tokens(n, self.last_token_s, now_s);
        if n > 0 {
            self.last_token_s = Some(now_s);
        }
        let before = self.remaining();
        self.generated += n as i64;
        if self.decoding {
            let l = &self.ledger;
            l.decode_context_tokens.fetch_add(n as i64, Relaxed);
            l.decode_remaining_tokens
                .fetch_sub(before - self.remaining(), Relaxed);
        }
    }

    /// Output tokens seen so far.
    pub fn tokens_generated(&self) -> u32 {
        self.generated.clamp(0, u32::MAX as i64) as u32
    }

    /// Marks a normal completion (counted), then releases like a drop.
    pub fn complete(self) {
        self.ledger.completed.fetch_add(1, Relaxed);
    }
}

impl Drop for Booking {
    fn drop(&mut self) {
        let l = &self.ledger;
        l.requests.fetch_sub(1, Relaxed);
        if self.decoding {
            l.decoding_requests.fetch_sub(1, Relaxed);
            l.decode_context_tokens
                .fetch_sub(self.prompt + self.generated, Relaxed);
            l.decode_remaining_tokens
                .fetch_sub(self.remaining(), Relaxed);
        } else {
            l.queued_requests.fetch_sub(1, Relaxed);
            if self.stream {
                l.queued_streams.fetch_sub(1, Relaxed);
            }
            l.queued_prefill_tokens.fetch_sub(self.uncached, Relaxed);
            l.queued_attention_pairs.fetch_sub(self.pairs, Relaxed);
            l.with_queue(|q| q.remove(self.id, Leave::Dropped));
        }
        if let Some(k) = self.slo_key {
            let mut m = l.tpot_slos.lock();
            if let Some(c) = m.get_mut(&k) {
                *c -= 1;
                if *c == 0 {
                    m.remove(&k);
                }
            }
            l.min_tpot_slo
                .store(m.keys().next().map_or(0, |k| k.saturating_add(1)), Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(p: u32, c: u32, o: u32) -> BookingSpec {
        BookingSpec {
            prompt_tokens: p,
            cached_tokens: c,
            expected_output_tokens: o,
            tpot_slo_ms: Some(50.0),
            expected_ttft_s: None,
            stream: true,
        }
    }

    /// A stream waits until its first token; a non-streamed request shows none, so it
    /// is queued until it ends but never counted among the queued streams.
    #[test]
    fn queued_streams_count_only_what_will_show_a_first_token() {
        let l = Ledger::new();
        let mut s = l.book(spec(100, 0, 10), 0.0);
        let n = l.book(
            BookingSpec {
                stream: false,
                ..spec(100, 0, 10)
            },
            0.0,
        );
        let q = l.load(0.0);
        assert_eq!((q.queued_requests, q.queued_streams), (2.0, 1.0));
        s.first_token(0.1);
        let q = l.load(0.1);
        assert_eq!((q.queued_requests, q.queued_streams), (1.0, 0.0));
        drop(n);
        let u = l.book(spec(100, 0, 10), 0.2);
        assert_eq!(l.load(0.2).queued_streams, 1.0);
        drop(u);
        drop(s);
        let q = l.load(0.3);
        assert_eq!(
            (q.requests, q.queued_requests, q.queued_streams),
            (0.0, 0.0, 0.0)
        );
    }

    /// The queue's age is how long its oldest waiting stream has waited: none on a new
    /// ledger (also at time 0), and it restarts from the next stream once one is served.
    #[test]
    fn queue_age_is_the_oldest_waiting_streams_wait() {
        let l = Ledger::new();
        assert_eq!(l.load(5.0).queue_age_s, 0.0);
        let mut a = l.book(spec(100, 0, 10), 0.0);
        let b = l.book(spec(100, 0, 10), 1.0);
        assert_eq!(l.load(2.5).queue_age_s, 2.5);
        a.first_token(3.0);
        assert_eq!(l.load(3.5).queue_age_s, 2.5);
        drop(b);
        assert_eq!(l.load(4.0).queue_age_s, 0.0);
    }

    /// The shortlist's cheap read is the full load's, term for term, as the head of
    /// the queue is served.
    #[test]
    fn outstanding_is_the_loads_outstanding_tokens() {
        let l = Ledger::new();
        let mut a = l.book(spec(4000, 500, 300), 0.0);
        let _b = l.book(spec(2000, 0, 100), 0.1);
        for t in [0.0, 0.05, 0.2, 0.7, 3.0] {
            let load = l.load(t);
            let (q, d) = l.outstanding(t);
            assert_eq!(
                (q, d),
                (load.queued_prefill_tokens, load.decode_remaining_tokens)
            );
            assert_eq!(q + d, load.outstanding_tokens());
        }
        a.first_token(0.4);
        let (q, d) = l.outstanding(0.5);
        assert_eq!((q, d), {
            let load = l.load(0.5);
            (load.queued_prefill_tokens, load.decode_remaining_tokens)
        });
        assert!(d > 0.0, "decoding after its first token");
    }

    #[test]
    fn stages_move_and_release() {
        let l = Ledger::new();
        let mut b = l.book(spec(1000, 200, 100), 0.0);
        let s = l.load(0.0);
        assert_eq!(s.queued_prefill_tokens, 800.0);
        assert_eq!(
            s.queued_attention_pairs,
            800.0 * 200.0 + 800.0 * 800.0 / 2.0
        );
        assert_eq!(s.min_tpot_slo_ms, Some(50.0));
        b.first_token(0.0);
        b.generated(10, 0.0);
        let s = l.load(0.0);
        assert_eq!(s.queued_prefill_tokens, 0.0);
        assert_eq!(s.decoding_requests, 1.0);
        assert_eq!(s.decode_context_tokens, 1010.0);
        assert_eq!(s.decode_remaining_tokens, 90.0);
        b.complete();
        assert_eq!(
            l.load(0.0),
            Load {
                prefill_inflow_tps: l.load(0.0).prefill_inflow_tps,
                ..Load::default()
            }
        );
        assert_eq!(l.completed(), 1);
    }

    #[test]
    fn queued_work_shrinks_as_the_head_is_served() {
        let l = Ledger::new();
        // The first prompt (2000 tokens) took 0.2 s: 10k tokens/s.
        let mut a = l.book(spec(2000, 0, 10), 0.0);
        a.first_token(0.2);
        let _b = l.book(spec(8000, 0, 10), 1.0);
        let _c = l.book(spec(500, 0, 10), 1.1);
        assert_eq!(l.load(1.0).queued_prefill_tokens, 8500.0);
        assert!((l.load(1.5).queued_prefill_tokens - 3500.0).abs() < 1e-6);
        // The head is never taken as done before its first token (at most 95%).
        let late = l.load(9.0);
        assert!((late.queued_prefill_tokens - (400.0 + 500.0)).abs() < 1e-6);
        let head_left = 8000.0 * 8000.0 / 2.0 - 7600.0 * 7600.0 / 2.0;
        let pairs = head_left + 500.0 * 500.0 / 2.0;
        assert!((late.queued_attention_pairs - pairs).abs() < 1.0);
    }

    #[test]
    fn a_warm_forecast_paces_the_head() {
        let l = Ledger::new();
        let _a = l.book(
            BookingSpec {
                expected_ttft_s: Some(2.0),
                stream: true,
                ..spec(10_000, 0, 10)
            },
            1.0,
        );
        assert!((l.load(2.0).queued_prefill_tokens - 5000.0).abs() < 1e-6);
    }

    #[test]
    fn step_residual_comes_from_streamed_tokens_while_decoding() {
        let l = Ledger::new();
        let mut a = l.book(spec(100, 0, 100), 0.0);
        assert_eq!(l.load(0.0).step_residual_s, 0.0);
        a.first_token(0.05);
        a.generated(1, 0.05);
        a.generated(1, 0.07);
        assert!((l.load(0.075).step_residual_s - 0.015).abs() < 1e-9);
        a.complete();
        assert_eq!(l.load(0.075).step_residual_s, 0.0);
    }

    #[test]
    fn inflow_rate_decays() {
        let l = Ledger::new();
        drop(l.book(spec(2000, 0, 1), 10.0));
        let now = l.load(10.0).prefill_inflow_tps;
        let later = l.load(14.0).prefill_inflow_tps;
        assert!((now - 1000.0).abs() < 1e-6, "{now}");
        assert!(later < now * 0.2);
        // Long idle: nothing left, and no NaN or denormal from the decay.
        assert_eq!(l.load(10.0 + 100.0 * INFLOW_TAU_S).prefill_inflow_tps, 0.0);
        assert_eq!(Ledger::new().load(5.0).prefill_inflow_tps, 0.0);
    }

    proptest! {
        /// Whatever order bookings progress and drop in, the ledger returns to zero.
        #[test]
        fn always_returns_to_zero(ops in proptest::collection::vec((0u32..5000, 0u32..5000, 0u32..500, 0u8..3, 0u32..50), 1..40)) {
            let l = Ledger::new();
            let mut live = Vec::new();
            for (p, c, o, stage, g) in ops {
                let mut b = l.book(spec(p, c.min(p), o), 1.0);
                if stage >= 1 { b.first_token(1.0); }
                if stage >= 2 { b.generated(g, 1.0); }
                live.push(b);
            }
            let s = l.load(1.0);
            prop_assert!(s.requests > 0.0);
            drop(live);
            let s = l.load(1.0);
            prop_assert_eq!(s.requests, 0.0);
            prop_assert_eq!(s.queued_prefill_tokens, 0.0);
            prop_assert_eq!(s.decode_context_tokens, 0.0);
            prop_assert_eq!(s.decode_remaining_tokens, 0.0);
            prop_assert_eq!(s.min_tpot_slo_ms, None);
        }
    }
}
