//! One replica's event feed: sequence tracking, replay on gaps, resync, and the
//! replica's state. Pure and synchronous; [`crate::subscriber`] drives it with
//! sockets and timers, tests drive it directly.
//!
//! Invariants:
//! - Batches are applied in sequence order, each at most once: a frame whose
//!   `(seq, digest)` is among the last [`RECENT`] applied is a duplicate and dropped.
//! - A frame with a sequence number below the next expected one that is not such a
//!   duplicate means the engine restarted (vLLM counts from 0 per process): the
//!   replica's blocks are cleared and history is fetched from seq 0.
//! - A gap (frame above the next expected) asks for a replay from the last applied
//!   seq; the replay's first entry must be that seq with the same payload digest, or
//!   the publisher is not the one we followed (restart) and a replay from 0 follows.
//!   A replay from 0 clears the replica first; it restores `precise` only if it
//!   starts at seq 0 (the engine's whole history), else the state is `recovering`.
//! - Live frames that arrive during a replay wait in a queue of at most
//!   [`PENDING_CAP`]; past that they are dropped, which the next gap check sees.
//!   After the replay, waiting frames below the next expected seq are dropped as
//!   covered (a restart among them shows on the next live frame).
//! - At most [`MAX_REPLAYS`] replays in a row without progress; then, or when no
//!   replay endpoint exists or a replay fails, the replica is cleared and followed
//!   from the next live frame as `recovering` (the index holds a subset of the
//!   engine's blocks: chains whose roots were stored before are orphaned).
//! - `recovering` → `precise` on `AllBlocksCleared` or a replay from seq 0.
//! - A payload that does not decode loses its events: counted, and the replica is
//!   resynced as above (the index could otherwise keep evicted blocks).
//! - `approximate` when the subscriber marks the feed stale (disconnected, or
//!   silent while requests were sent); the next applied frame un-marks it.
//! - Silence while events were expected also asks the replay endpoint for what
//!   followed the last applied batch (a lost tail frame is otherwise invisible
//!   until the next one): `precise` again only if the replay brought new batches;
//!   a failed or empty silence check leaves the feed `approximate` and resyncs
//!   nothing (nothing is known to be lost). It does not count toward
//!   [`MAX_REPLAYS`].

use std::collections::VecDeque;

use bytes::Bytes;
use xxhash_rust::xxh3::xxh3_64;

use crate::index::BlockIndex;
use crate::replica_blocks::{ApplyStats, ReplicaBlocks};
use crate::wire::decode_batch;

/// Applied `(seq, digest)` pairs remembered for duplicate detection.
pub const RECENT: usize = 4096;
/// Live frames held while a replay runs.
pub const PENDING_CAP: usize = 16_384;
/// Replays in a row before giving up and resyncing from live frames.
pub const MAX_REPLAYS: u32 = 3;

/// How much to trust the index's view of one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeedState {
    /// Every event since the engine started was applied: the index is exact.
    Precise,
    /// Following live events after a loss: the index holds a subset.
    Recovering,
    /// No events arrive (or none yet): use the approximate index for this replica.
    Approximate,
}

impl FeedState {
    pub fn as_str(self) -> &'static str {
        match self {
            FeedState::Precise => "precise",
            FeedState::Recovering => "recovering",
            FeedState::Approximate => "approximate",
        }
    }
}

/// What the driver must do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    /// Ask the replay endpoint for every buffered batch with seq ≥ `from`, feed them
    /// to [`Feed::replay_entry`], then call [`Feed::replay_end`] (or
    /// [`Feed::replay_failed`]).
    Replay {
        from: u64,
    },
}

/// Counters since creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedCounters {
    pub batches_applied: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub restarts: u64,
    pub replays: u64,
    pub replayed_batches: u64,
    pub replay_failures: u64,
    pub resyncs: u64,
    pub undecodable: u64,
    pub pending_dropped: u64,
}

/// A snapshot for `/debug` and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeedStatus {
    pub state: FeedState,
    pub next_seq: Option<u64>,
    pub blocks: usize,
    pub counters: FeedCounters,
    pub apply: ApplyStats,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Verify `from` carries `digest`, then continue after it.
    Continue { digest: u64 },
    /// Replace everything with the buffer's contents.
    Fresh,
}

#[derive(Clone, Copy, Debug)]
struct Run {
    from: u64,
    mode: Mode,
    first: Option<u64>,
    /// The verify failed: ignore the rest and replay from 0.
    mismatch: bool,
    /// Started by silence: `Some(batches applied when it started)`.
    silence: Option<u64>,
}

/// See the module docs.
pub struct Feed {
    blocks: ReplicaBlocks,
    has_replay: bool,
    next_seq: Option<u64>,
    recent: VecDeque<(u64, u64)>,
    subset: bool,
    stale: bool,
    run: Option<Run>,
    pending: VecDeque<(u64, Bytes)>,
    replays_in_row: u32,
    /// After a resync: take the next live frame as the new start, no replay.
    follow_next: bool,
    counters: FeedCounters,
}

impl Feed {
    /// A feed for `blocks`; `has_replay` when the engine has a replay endpoint.
    /// Starts `approximate` until the first frame.
    pub fn new(blocks: ReplicaBlocks, has_replay: bool) -> Self {
        Feed {
            blocks,
            has_replay,
            next_seq: None,
            recent: VecDeque::with_capacity(RECENT),
            subset: false,
            stale: true,
            run: None,
            pending: VecDeque::new(),
            replays_in_row: 0,
            follow_next: false,
            counters: FeedCounters::default(),
        }
    }

    pub fn state(&self) -> FeedState {
        if self.stale {
            FeedState::Approximate
        } else if self.subset {
            FeedState::Recovering
        } else {
            FeedState::Precise
        }
    }

    pub fn status(&self) -> FeedStatus {
        FeedStatus {
            state: self.state(),
            next_seq: self.next_seq,
            blocks: self.blocks.len(),
            counters: self.counters,
            apply: self.blocks.stats(),
        }
    }

    pub fn blocks(&self) -> &ReplicaBlocks {
        &self.blocks
    }

    pub fn replaying(&self) -> bool {
        self.run.is_some()
    }

    /// Events stopped (disconnected, or silent while the engine was busy).
    pub fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// Events were expected and none came: stale, and (with a replay endpoint) a
    /// replay of whatever followed the last applied batch.
    pub fn silent(&mut self) -> Action {
        self.stale = true;
        if !self.has_replay || self.run.is_some() {
            return Action::None;
        }
        self.counters.replays += 1;
        let run = self.resume_from_last(Some(self.counters.batches_applied));
        self.run = Some(run);
        Action::Replay { from: run.from }
    }

    /// The SUB socket (re)connected: events may have been missed meanwhile, so
    /// check the publisher is the same one and fetch what was missed.
    pub fn connected(&mut self, index: &mut BlockIndex) -> Action {
        if self.run.is_some() {
            return Action::None;
        }
        if !self.has_replay {
            if self.next_seq.is_some() {
                // Whatever happened while away is unknowable: start over.
                self.resync(index);
            }
            return Action::None;
        }
        self.start_replay(index)
    }

    fn start_replay(&mut self, index: &mut BlockIndex) -> Action {
        if self.replays_in_row >= MAX_REPLAYS {
            self.resync(index);
            return self.drain_pending(index);
        }
        self.replays_in_row += 1;
        self.counters.replays += 1;
        let run = self.resume_from_last(None);
        self.run = Some(run);
        Action::Replay { from: run.from }
    }

    /// A replay continuing after the last applied batch when it is known, else
    /// the engine's whole buffer.
    fn resume_from_last(&self, silence: Option<u64>) -> Run {
        let mode = match (self.next_seq, self.recent.back()) {
            (Some(n), Some(&(last, digest))) if n > 0 && last == n - 1 => {
                (last, Mode::Continue { digest })
            }
            _ => (0, Mode::Fresh),
        };
        Run {
            from: mode.0,
            mode: mode.1,
            first: None,
            mismatch: false,
            silence,
        }
    }

    /// A live frame from the SUB socket.
    pub fn live(&mut self, index: &mut BlockIndex, seq: u64, payload: Bytes) -> Action {
        if self.run.is_some() {
            if self.pending.len() >= PENDING_CAP {
                self.counters.pending_dropped += 1;
            } else {
                self.pending.push_back((seq, payload));
            }
            return Action::None;
        }
        let Some(next) = self.next_seq else {
            // The first frame ever (or after a resync without replay).
            if seq == 0 || !self.has_replay || self.follow_next {
                self.follow_next = false;
                // Seq 0 is the engine's first batch: from it on, nothing is missed.
                self.subset = seq != 0;
                self.apply(index, seq, &payload);
                return Action::None;
            }
            self.pending.push_back((seq, payload));
            return self.start_replay(index);
        };
        if seq == next {
            self.apply(index, seq, &payload);
            return Action::None;
        }
        if seq < next {
            let d = xxh3_64(&payload);
            if self.recent.iter().any(|&(s, dd)| s == seq && dd == d) {
                self.counters.duplicates += 1;
                return Action::None;
            }
            self.counters.restarts += 1;
            self.blocks.clear(index);
            self.next_seq = None;
            self.recent.clear();
            self.replays_in_row = 0;
            return self.live(index, seq, payload);
        }
        self.counters.gaps += 1;
        if !self.has_replay {
            self.resync(index);
            return self.live(index, seq, payload);
        }
        self.pending.push_back((seq, payload));
        self.start_replay(index)
    }

    /// One replayed batch, in the order the endpoint sent them.
    pub fn replay_entry(&mut self, index: &mut BlockIndex, seq: u64, payload: &[u8]) {
        let Some(mut run) = self.run else {
            return;
        };
        if run.mismatch {
            return;
        }
        let first = run.first.is_none();
        run.first.get_or_insert(seq);
        match run.mode {
            Mode::Continue { digest } if first => {
                if seq != run.from || xxh3_64(payload) != digest {
                    run.mismatch = true;
                }
            }
            Mode::Fresh if first => {
                self.blocks.clear(index);
                self.next_seq = None;
                self.recent.clear();
                self.subset = seq != 0;
                self.counters.replayed_batches += 1;
                self.apply(index, seq, payload);
            }
            _ => match self.next_seq {
                Some(n) if seq == n => {
                    self.counters.replayed_batches += 1;
                    self.apply(index, seq, payload);
                }
                Some(n) if seq < n => {}
                _ => {
                    // A hole inside the replay buffer itself: what lies in it is lost.
                    self.subset = true;
                    self.counters.replayed_batches += 1;
                    self.apply(index, seq, payload);
                }
            },
        }
        self.run = Some(run);
    }

    /// The replay ended (end marker received); returns the next step.
    pub fn replay_end(&mut self, index: &mut BlockIndex) -> Action {
        let Some(run) = self.run.take() else {
            return Action::None;
        };
        match run.mode {
            Mode::Continue { .. } if run.mismatch || run.first.is_none() => {
                // Not the publisher we followed (or it lost its buffer): restart.
                self.counters.restarts += 1;
                self.blocks.clear(index);
                self.next_seq = None;
                self.recent.clear();
                self.run = None;
                return self.start_replay_fresh(index);
            }
            Mode::Fresh if run.first.is_none() => {
                // The engine has published nothing since it started: it holds nothing.
                self.blocks.clear(index);
                self.next_seq = None;
                self.recent.clear();
                self.subset = false;
                self.stale = false;
            }
            _ => {}
        }
        // The publisher answered and we are caught up with its buffer; after
        // silence, only if it had published something we lacked.
        self.stale = run
            .silence
            .is_some_and(|at| self.counters.batches_applied == at);
        self.drain_pending(index)
    }

    fn start_replay_fresh(&mut self, index: &mut BlockIndex) -> Action {
        self.recent.clear();
        self.next_seq = None;
        self.start_replay(index)
    }

    /// The replay could not be completed (timeout, connection error). What was
    /// applied from it stays; the replica is resynced unless that reached the
    /// first pending frame.
    pub fn replay_failed(&mut self, index: &mut BlockIndex) -> Action {
        let Some(run) = self.run.take() else {
            return Action::None;
        };
        self.counters.replay_failures += 1;
        if run.silence.is_some() {
            // Nothing is known to be lost: stay stale, keep what we hold.
            return self.drain_pending(index);
        }
        let caught_up = match (self.next_seq, self.pending.front()) {
            (Some(n), Some(&(s, _))) => s <= n,
            _ => false,
        };
        if !caught_up {
            self.resync(index);
        }
        self.drain_pending(index)
    }

    fn drain_pending(&mut self, index: &mut BlockIndex) -> Action {
        while let Some((seq, payload)) = self.pending.pop_front() {
            // Held during the replay and already covered (or older than the buffer
            // the replay restored from): not a restart.
            if self.next_seq.is_some_and(|n| seq < n) {
                self.counters.duplicates += 1;
                continue;
            }
            if let a @ Action::Replay { .. } = self.live(index, seq, payload) {
                return a;
            }
        }
        Action::None
    }

    /// Clears the replica and follows from the next frame as `recovering`.
    fn resync(&mut self, index: &mut BlockIndex) {
        self.counters.resyncs += 1;
        self.blocks.clear(index);
        self.next_seq = None;
        self.recent.clear();
        self.subset = true;
        self.replays_in_row = 0;
        self.follow_next = true;
    }

    fn apply(&mut self, index: &mut BlockIndex, seq: u64, payload: &[u8]) {
        self.next_seq = Some(seq.wrapping_add(1));
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, xxh3_64(payload)));
        self.stale = false;
        let batch = match decode_batch(payload) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(
                    "replica {}: undecodable batch {seq}: {e}",
                    self.blocks.id().index()
                );
                self.counters.undecodable += 1;
                self.counters.resyncs += 1;
                self.blocks.clear(index);
                self.subset = true;
                return;
            }
        };
        for ev in &batch.events {
            if let Err(e) = self.blocks.apply(index, ev) {
                tracing::warn!("replica {}: {e}; resyncing", self.blocks.id().index());
                self.counters.resyncs += 1;
                self.blocks.clear(index);
                self.subset = true;
                return;
            }
            if matches!(ev, crate::wire::KvEvent::AllCleared) {
                self.subset = false;
            }
        }
        self.counters.batches_applied += 1;
        if self.run.is_none() {
            self.replays_in_row = 0;
        }
    }
}

#[cfg(test)]
mod tests;
