//! The prefill queue as this node sees it on one replica, and how far the engine has got
//! into its head.
//!
//! Counting every queued request's uncached tokens in full overstates the work ahead
//! while a long prompt is half prefilled: a chat request behind a 20k-token prompt that
//! has been in service for a second waits for far less than 20k tokens. vLLM serves its
//! queue first come, first served, so the head has been in service since it reached the
//! head: since it was booked onto an empty queue, or since the request before it got its
//! first token. When the head came with a forecast of its first token (a warm predictor's),
//! progress is the share of that service window already elapsed; otherwise it is the
//! service time times the replica's measured prefill rate (uncached tokens over service
//! time of past heads; tokens-weighted, decayed). Either way it stays below the head's
//! own size: a head is done only when its first token says so.
//!
//! Invariants: entries are in booking order; `head_since_s` is meaningful only while the
//! queue is non-empty; the rate is `None` until one head was served.

use std::collections::VecDeque;

/// Weight of the newest served head in the decayed rate sums (tokens and seconds).
const RATE_ALPHA: f64 = 0.2;
/// Service times below this are clock noise, not a rate sample (seconds).
const MIN_SERVICE_S: f64 = 1e-4;
/// The most of a head counted as done before its first token arrives.
const MAX_DONE: f64 = 0.95;

/// One queued request.
#[derive(Clone, Copy, Debug)]
struct Entry {
    id: u64,
    uncached: f64,
    cached: f64,
    booked_s: f64,
    /// Forecast first-token time (0 when none).
    expected_first_s: f64,
    /// Streamed: its first token ends its wait where this node sees it. A non-streamed
    /// one stays queued until it ends, so its age says nothing about the queue.
    stream: bool,
}

/// Why a booking left the queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Leave {
    /// Its first token arrived at this time.
    Served(f64),
    /// It was dropped before one, at an unknown time.
    Dropped,
}

/// How much of the queue's head the engine has served at an instant.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HeadProgress {
    /// Uncached tokens of the head already prefilled (estimate).
    pub tokens: f64,
    /// Attention pairs of those tokens: Σ over served tokens of their context.
    pub pairs: f64,
}

/// What readers need to estimate progress without taking the lock.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HeadView {
    pub uncached: f64,
    pub cached: f64,
    pub since_s: f64,
    /// Uncached tokens per second of service; 0 when unknown.
    pub rate_tps: f64,
    /// The head's forecast first-token time; 0 when none.
    pub expected_first_s: f64,
    /// When the oldest streamed request still waiting for its first token was booked.
    pub oldest_stream_booked_s: Option<f64>,
}

impl HeadView {
    /// Progress into the head at `now_s`.
    pub fn progress(&self, now_s: f64) -> HeadProgress {
        let elapsed = (now_s - self.since_s).max(0.0);
        let window = self.expected_first_s - self.since_s;
        let done = if window >= MIN_SERVICE_S {
            self.uncached * (elapsed / window)
        } else {
            self.rate_tps * elapsed
        };
        let p = done.clamp(0.0, MAX_DONE * self.uncached.max(0.0));
        // Token i of the prompt (0-based among uncached) attends to cached + i tokens.
        HeadProgress {
            tokens: p,
            pairs: p * self.cached + 0.5 * p * p,
        }
    }
}

/// FIFO of queued bookings with the head's service start and the measured prefill rate.
#[derive(Debug, Default)]
pub struct PrefillQueue {
    entries: VecDeque<Entry>,
    head_since_s: f64,
    rate_tokens: f64,
    rate_secs: f64,
}

impl PrefillQueue {
    /// A booking joined the queue at `now_s`, its first token forecast at
    /// `expected_first_s` (0 when there is no trusted forecast).
    pub fn push(
        &mut self,
        id: u64,
        uncached: f64,
        cached: f64,
        now_s: f64,
        expected_first_s: f64,
        stream: bool,
    ) {
        if self.entries.is_empty() {
            self.head_since_s = now_s;
        }
        self.entries.push_back(Entry {
            id,
            uncached,
            cached,
            booked_s: now_s,
            expected_first_s,
            stream,
        });
    }

    /// A booking left the queue.
    pub fn remove(&mut self, id: u64, how: Leave) {
        let Some(pos) = self.entries.iter().position(|e| e.id == id) else {
            return;
        };
        let Some(e) = self.entries.remove(pos) else {
            return;
        };
        if pos != 0 {
            return;
        }
        match how {
            Leave::Served(now_s) => {
                let service = now_s - self.head_since_s;
                if e.uncached > 0.0 && service >= MIN_SERVICE_S {
                    self.rate_tokens =
                        (1.0 - RATE_ALPHA) * self.rate_tokens + RATE_ALPHA * e.uncached;
                    self.rate_secs = (1.0 - RATE_ALPHA) * self.rate_secs + RATE_ALPHA * service;
                }
                self.head_since_s = now_s;
            }
            // Not knowing when the engine let go of it, the next head is taken to have
            // been in service since it was booked or since the dropped one started.
            Leave::Dropped => {
                if let Some(next) = self.entries.front() {
                    self.head_since_s = self.head_since_s.max(next.booked_s);
                }
            }
        }
    }

    /// The head and rate as readers use them (all zero when the queue is empty).
    pub fn view(&self) -> HeadView {
        let rate_tps = if self.rate_secs > 0.0 {
            self.rate_tokens / self.rate_secs
        } else {
            0.0
        };
        // Entries are in booking order; streams leave at their first token, so the scan
        // stops at once unless non-streamed requests sit ahead.
        let oldest_stream_booked_s = self.entries.iter().find(|e| e.stream).map(|e| e.booked_s);
        match self.entries.front() {
            Some(h) => HeadView {
                uncached: h.uncached,
                cached: h.cached,
                since_s: self.head_since_s,
                rate_tps,
                expected_first_s: h.expected_first_s,
                oldest_stream_booked_s,
            },
            None => HeadView {
                rate_tps,
                ..HeadView::default()
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_progress_before_a_rate_is_measured() {
        let mut q = PrefillQueue::default();
        q.push(1, 8000.0, 0.0, 0.0, 0.0, true);
        assert_eq!(q.view().progress(5.0), HeadProgress::default());
    }

    #[test]
    fn progress_follows_the_measured_rate_and_stops_at_the_head() {
        let mut q = PrefillQueue::default();
        // A 1000-token head served in 0.1 s: 10k tokens/s.
        q.push(1, 1000.0, 0.0, 0.0, 0.0, true);
        q.remove(1, Leave::Served(0.1));
        q.push(2, 20_000.0, 100.0, 1.0, 0.0, true);
        q.push(3, 300.0, 0.0, 1.2, 0.0, true);
        let v = q.view();
        assert!((v.rate_tps - 10_000.0).abs() < 1e-6);
        let p = v.progress(1.5);
        assert!((p.tokens - 5000.0).abs() < 1e-6, "{p:?}");
        assert!((p.pairs - (5000.0 * 100.0 + 0.5 * 5000.0 * 5000.0)).abs() < 1e-3);
        assert_eq!(v.progress(10.0).tokens, 0.95 * 20_000.0);
    }

    #[test]
    fn a_forecast_first_token_sets_the_pace() {
        let mut q = PrefillQueue::default();
        // Booked at 1.0 behind nothing, first token forecast at 3.0.
        q.push(1, 10_000.0, 0.0, 1.0, 3.0, true);
        assert!((q.view().progress(1.5).tokens - 2500.0).abs() < 1e-9);
        assert_eq!(q.view().progress(9.0).tokens, 9500.0);
    }

    #[test]
    fn the_next_head_is_in_service_from_when_the_previous_one_left() {
        let mut q = PrefillQueue::default();
        q.push(1, 1000.0, 0.0, 0.0, 0.0, true);
        q.remove(1, Leave::Served(0.1));
        q.push(2, 4000.0, 0.0, 1.0, 0.0, true);
        q.push(3, 4000.0, 0.0, 1.1, 0.0, true);
        q.remove(2, Leave::Served(1.4));
        assert_eq!(q.view().since_s, 1.4);
        assert_eq!(q.view().uncached, 4000.0);
        // A non-head leaving (dropped, or served out of order) changes nothing ahead.
        q.push(4, 50.0, 0.0, 1.5, 0.0, true);
        q.remove(4, Leave::Dropped);
        assert_eq!(q.view().since_s, 1.4);
    }

    /// The queue's age is its oldest waiting stream's: a non-streamed request ahead
    /// (queued until it ends) does not count, and a served stream stops counting.
    #[test]
    fn the_oldest_waiting_stream_dates_the_queue() {
        let mut q = PrefillQueue::default();
        assert_eq!(q.view().oldest_stream_booked_s, None);
        q.push(1, 100.0, 0.0, 1.0, 0.0, false);
        q.push(2, 100.0, 0.0, 2.0, 0.0, true);
        q.push(3, 100.0, 0.0, 3.0, 0.0, true);
        assert_eq!(q.view().oldest_stream_booked_s, Some(2.0));
        q.remove(2, Leave::Served(3.5));
        assert_eq!(q.view().oldest_stream_booked_s, Some(3.0));
        q.remove(3, Leave::Dropped);
        assert_eq!(q.view().oldest_stream_booked_s, None);
    }

    #[test]
    fn a_dropped_head_is_no_rate_sample() {
        let mut q = PrefillQueue::default();
        q.push(1, 1000.0, 0.0, 0.0, 0.0, true);
        q.remove(1, Leave::Dropped);
        assert_eq!(q.view().rate_tps, 0.0);
        assert_eq!(q.view().uncached, 0.0);
    }
}
