//! The per-replica subscriber task: a ZMQ SUB socket on the engine's publisher, a
//! DEALER for replays, and a [`Feed`] that applies what arrives to the shared index.
//!
//! Invariants:
//! - One task per replica; it ends when its `CancellationToken` fires (every await
//!   in it races the token), dropping its sockets (which stops their reconnect tasks).
//! - On `Disconnected` the SUB socket is dropped and a new one connects, retrying
//!   every 100 ms doubling to 1 s (the socket's own reconnect backs off to 30 s,
//!   too slow to see an engine restart); every `Connected` (the first one included)
//!   makes the feed verify the publisher through the replay endpoint, so a restart
//!   or events missed while away are noticed before the next live frame; it waits
//!   [`JOIN_SETTLE`] first, so batches published before the publisher had the
//!   subscription (ZMQ's slow joiner) are covered by that replay.
//! - Silence while events were expected (see [`SubscriberHandle::expect_events`])
//!   marks the feed stale and asks the replay endpoint for what was missed: a lost
//!   last frame would otherwise go unseen until the engine's next batch.
//! - A replay is bounded: `replay_timeout` per reply, at most [`MAX_REPLAY_ENTRIES`]
//!   entries; otherwise it counts as failed (the feed resyncs).
//! - Malformed frames (wrong frame count, sequence frame not 8 bytes) are counted
//!   and skipped; nothing here panics or unwraps on input.
//! - The index is locked for writing for one batch at a time; readers never wait
//!   on a socket.
//! - A subscriber owns its replica's bits in the index: it clears them when it
//!   starts (a previous subscriber's view may be stale), then only its feed writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::{Mutex, RwLock};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use zeromq::{
    DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage,
};

use crate::feed::{Action, Feed, FeedStatus};
use crate::index::{BlockIndex, ReplicaId};
use crate::replica_blocks::ReplicaBlocks;
use crate::wire::{END_SEQ, split_frames};

/// The index every subscriber of a model writes into.
pub type SharedIndex = Arc<RwLock<BlockIndex>>;

/// A new empty index of at most `cap` blocks, for subscribers to share.
pub fn shared_index(cap: usize) -> SharedIndex {
    Arc::new(RwLock::new(BlockIndex::new(cap)))
}

/// Wait after a connect before verifying through the replay endpoint.
pub const JOIN_SETTLE: Duration = Duration::from_millis(200);

/// Entries one replay may return (vLLM buffers 10,000 batches by default).
pub const MAX_REPLAY_ENTRIES: usize = 1_000_000;

/// Where and how to follow one replica's events.
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    pub replica: ReplicaId,
    /// The publisher to connect to, e.g. `tcp://10.0.0.5:5557` (vLLM's
    /// `"endpoint": "tcp://*:5557"` binds; see [`crate::discovery`]).
    pub endpoint: String,
    /// vLLM's `replay_endpoint` (a ROUTER), if configured.
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to (vLLM's `topic`; `""` = all).
    pub topic: String,
    /// The engine's block size (events of another size are ignored).
    pub block_size: u32,
    /// The most blocks this replica can hold (its `num_gpu_blocks` is enough).
    pub max_blocks: usize,
    /// Silence after [`SubscriberHandle::expect_events`] that marks the feed stale.
    pub silence_timeout: Duration,
    /// Wait for each replay reply before the replay counts as failed.
    pub replay_timeout: Duration,
    /// Per connection attempt.
    pub connect_timeout: Duration,
}

impl SubscriberConfig {
    /// Defaults: topic `""`, 4M blocks, 5 s silence, 2 s replay, 2 s connect.
    pub fn new(replica: ReplicaId, endpoint: impl Into<String>, block_size: u32) -> Self {
        SubscriberConfig {
            replica,
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            block_size,
            max_blocks: 4 << 20,
            silence_timeout: Duration::from_secs(5),
            replay_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

/// Frames the socket layer rejected or could not read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SocketCounters {
    pub malformed_frames: u64,
    pub recv_errors: u64,
    pub connects: u64,
    pub disconnects: u64,
}

struct Shared {
    status: Mutex<(FeedStatus, SocketCounters)>,
    /// Milliseconds since `epoch` + 1 of the oldest unmet expectation; 0 = none.
    expect_ms: AtomicU64,
    /// Milliseconds since `epoch` + 1 of the newest frame; 0 = none yet.
    last_frame_ms: AtomicU64,
    epoch: Instant,
}

/// The running subscriber of one replica.
pub struct SubscriberHandle {
    shared: Arc<Shared>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl SubscriberHandle {
    /// The feed's state and counters as of its last frame or tick (≤ 200 ms old).
    pub fn status(&self) -> FeedStatus {
        self.shared.status.lock().0
    }

    pub fn socket_counters(&self) -> SocketCounters {
        self.shared.status.lock().1
    }

    /// Tells the subscriber the engine must publish soon: call when a request went
    /// to this replica with full prompt blocks the index says it lacks. No frame
    /// within `silence_timeout` then marks the replica `approximate`.
    pub fn expect_events(&self) {
        self.expect_events_since(Instant::now());
    }

    /// [`Self::expect_events`] for a request sent at `at`: the host learns what the
    /// request needs only once its first byte is back, and by then the engine may have
    /// published already. A frame since `at` meets the expectation; without this, the
    /// router armed the check after the events had come, and the feed went
    /// `approximate` for no loss at all.
    pub fn expect_events_since(&self, at: Instant) {
        let at_ms = at.saturating_duration_since(self.shared.epoch).as_millis() as u64 + 1;
        if self.shared.last_frame_ms.load(Ordering::Relaxed) >= at_ms {
            return;
        }
        let _ =
            self.shared
                .expect_ms
                .compare_exchange(0, at_ms, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Stops the task and waits for it.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// Starts following one replica; the task stops when `cancel` (or the handle's
/// [`SubscriberHandle::shutdown`]) fires.
pub fn spawn_subscriber(
    config: SubscriberConfig,
    index: SharedIndex,
    cancel: CancellationToken,
) -> SubscriberHandle {
    index.write().remove_replica(config.replica);
    let blocks = ReplicaBlocks::new(config.replica, config.block_size, config.max_blocks);
    let feed = Feed::new(blocks, config.replay_endpoint.is_some());
    let shared = Arc::new(Shared {
        status: Mutex::new((feed.status(), SocketCounters::default())),
        expect_ms: AtomicU64::new(0),
        last_frame_ms: AtomicU64::new(0),
        epoch: Instant::now(),
    });
    let cancel = cancel.child_token();
    let task = tokio::spawn(
        Task {
            config,
            index,
            feed,
            shared: shared.clone(),
            cancel: cancel.clone(),
            counters: SocketCounters::default(),
        }
        .run(),
    );
    SubscriberHandle {
        shared,
        cancel,
        task,
    }
}

struct Task {
    config: SubscriberConfig,
    index: SharedIndex,
    feed: Feed,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    counters: SocketCounters,
}

enum Reply {
    Entry(u64, Bytes),
    End,
}

impl Task {
    fn publish(&self) {
        *self.shared.status.lock() = (self.feed.status(), self.counters);
    }

    async fn run(mut self) {
        let mut backoff = Duration::from_millis(100);
        while !self.cancel.is_cancelled() {
            let mut opts = SocketOptions::default();
            opts.connect_timeout(self.config.connect_timeout);
            let mut sub = SubSocket::with_options(opts);
            let monitor = sub.monitor();
            let connected = tokio::select! {
                _ = self.cancel.cancelled() => return,
                r = tokio::time::timeout(
                    self.config.connect_timeout + Duration::from_millis(100),
                    sub.connect(&self.config.endpoint),
                ) => matches!(r, Ok(Ok(()))),
            };
            let subscribed = connected
                && tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    r = tokio::time::timeout(
                        self.config.connect_timeout,
                        sub.subscribe(&self.config.topic),
                    ) => matches!(r, Ok(Ok(()))),
                };
            if !subscribed {
                self.feed.mark_stale();
                self.publish();
                tokio::select! {
                    _ = self.cancel.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
            backoff = Duration::from_millis(100);
            self.follow(sub, monitor).await;
        }
    }

    /// Reads live frames until cancelled (the socket reconnects by itself).
    async fn follow<M>(&mut self, mut sub: SubSocket, mut monitor: M)
    where
        M: futures_util::Stream<Item = SocketEvent> + Unpin,
    {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        let mut monitor_open = true;
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                msg = sub.recv() => match msg {
                    Ok(m) => self.on_message(m).await,
                    Err(e) => {
                        self.counters.recv_errors += 1;
                        tracing::debug!("replica {}: recv: {e}", self.config.replica.index());
                        tokio::select! {
                            _ = self.cancel.cancelled() => return,
                            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                        }
                    }
                },
                ev = monitor.next(), if monitor_open => match ev {
                    Some(SocketEvent::Connected(..)) => {
                        self.counters.connects += 1;
                        // ZMQ's slow joiner: batches published before the publisher
                        // has our subscription are lost. Replay only once it has it,
                        // so the replay covers them.
                        tokio::select! {
                            _ = self.cancel.cancelled() => return,
                            _ = tokio::time::sleep(JOIN_SETTLE) => {}
                        }
                        let a = self.feed.connected(&mut self.index.write());
                        self.execute(a).await;
                    }
                    Some(SocketEvent::Disconnected(_)) => {
                        self.counters.disconnects += 1;
                        self.feed.mark_stale();
                        self.publish();
                        return;
                    }
                    Some(_) => {}
                    None => monitor_open = false,
                },
                _ = tick.tick() => self.check_silence().await,
            }
            self.publish();
        }
    }

    async fn check_silence(&mut self) {
        let since = self.shared.expect_ms.load(Ordering::Relaxed);
        if since == 0 {
            return;
        }
        if self.shared.last_frame_ms.load(Ordering::Relaxed) >= since {
            // A frame came after the request was sent (the expectation raced it).
            self.shared.expect_ms.store(0, Ordering::Relaxed);
            return;
        }
        let now = self.shared.epoch.elapsed().as_millis() as u64 + 1;
        if now.saturating_sub(since) > self.config.silence_timeout.as_millis() as u64 {
            self.shared.expect_ms.store(0, Ordering::Relaxed);
            let a = self.feed.silent();
            self.publish();
            self.execute(a).await;
        }
    }

    async fn on_message(&mut self, m: ZmqMessage) {
        let frames = m.into_vec();
        let (seq, payload) = match split_frames(&frames) {
            Ok((seq, _)) => (seq, frames.last().cloned().unwrap_or_default()),
            Err(e) => {
                self.counters.malformed_frames += 1;
                tracing::debug!("replica {}: {e}", self.config.replica.index());
                return;
            }
        };
        let now = self.shared.epoch.elapsed().as_millis() as u64 + 1;
        self.shared.last_frame_ms.store(now, Ordering::Relaxed);
        self.shared.expect_ms.store(0, Ordering::Relaxed);
        let a = self.feed.live(&mut self.index.write(), seq, payload);
        self.execute(a).await;
    }

    /// Runs replays until the feed needs none.
    async fn execute(&mut self, mut action: Action) {
        while let Action::Replay { from } = action {
            let Some(ep) = self.config.replay_endpoint.clone() else {
                action = self.feed.replay_failed(&mut self.index.write());
                continue;
            };
            let cancel = self.cancel.clone();
            let ok = tokio::select! {
                _ = cancel.cancelled() => return,
                ok = self.replay(&ep, from) => ok,
            };
            action = if ok {
                self.feed.replay_end(&mut self.index.write())
            } else {
                self.feed.replay_failed(&mut self.index.write())
            };
            self.publish();
        }
    }

    /// One replay request; true when the end marker arrived.
    async fn replay(&mut self, endpoint: &str, from: u64) -> bool {
        let t = self.config.replay_timeout;
        let mut dealer = DealerSocket::new();
        if !matches!(
            tokio::time::timeout(t, dealer.connect(endpoint)).await,
            Ok(Ok(()))
        ) {
            return false;
        }
        let req = vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())];
        let Ok(req) = ZmqMessage::try_from(req) else {
            return false;
        };
        if !matches!(tokio::time::timeout(t, dealer.send(req)).await, Ok(Ok(()))) {
            return false;
        }
        for _ in 0..MAX_REPLAY_ENTRIES {
            let m = match tokio::time::timeout(t, dealer.recv()).await {
                Ok(Ok(m)) => m,
                _ => return false,
            };
            match parse_reply(m) {
                Some(Reply::End) => return true,
                Some(Reply::Entry(seq, payload)) => {
                    self.feed
                        .replay_entry(&mut self.index.write(), seq, &payload);
                }
                None => self.counters.malformed_frames += 1,
            }
        }
        false
    }
}

/// A replay reply: `["", topic?, seq, payload]`, the end marker's seq being -1.
fn parse_reply(m: ZmqMessage) -> Option<Reply> {
    let mut frames = m.into_vec();
    if frames.first().is_some_and(|f| f.is_empty()) && frames.len() > 2 {
        frames.remove(0);
    }
    let seq_frame = match frames.len() {
        3 => &frames[1],
        2 => &frames[0],
        _ => return None,
    };
    if seq_frame.as_ref() == END_SEQ {
        return Some(Reply::End);
    }
    let (seq, _) = split_frames(&frames).ok()?;
    Some(Reply::Entry(seq, frames.pop()?))
}
