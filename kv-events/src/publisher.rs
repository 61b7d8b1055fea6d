//! The engine side: a PUB socket and a ROUTER replay endpoint that behave like
//! vLLM's `ZmqEventPublisher` (same frames, same replay protocol), for the emulator.
//!
//! Invariants:
//! - Sequence numbers count from 0 per publisher; each batch gets the next one.
//! - The last `buffer_steps` `(seq, payload)` pairs are kept for replay; a replay
//!   request `["", seq(8, BE)]` from a DEALER is answered with every buffered batch
//!   with seq ≥ it as `["", topic, seq, payload]`, then `["", "", -1, ""]`.
//! - [`Publisher::try_publish`] never blocks the caller: the queue is bounded and a
//!   batch that does not fit is dropped and counted (vLLM's queue also has a cap).
//! - The task ends when the token fires or the publisher is dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::wire::{END_SEQ, EventBatch, encode_batch};

/// Where to publish and how much to keep.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// Bind address of the PUB socket, e.g. `tcp://127.0.0.1:5557` (port 0 = any).
    pub endpoint: String,
    /// Bind address of the ROUTER replay socket, if any.
    pub replay_endpoint: Option<String>,
    pub topic: String,
    /// Batches kept for replay (vLLM's default 10,000).
    pub buffer_steps: usize,
    /// Batches queued between the engine and the socket task.
    pub queue: usize,
}

impl PublisherConfig {
    pub fn new(endpoint: impl Into<String>) -> Self {
        PublisherConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: 10_000,
            queue: 4096,
        }
    }
}

/// Why the publisher could not start.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("bind {0}: {1}")]
    Bind(String, zeromq::ZmqError),
}

/// A running publisher.
pub struct Publisher {
    tx: mpsc::Sender<EventBatch>,
    endpoint: String,
    replay_endpoint: Option<String>,
    dropped: Arc<AtomicU64>,
    skip_live: Arc<AtomicU64>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Publisher {
    /// Binds the sockets and starts the task.
    pub async fn start(
        config: PublisherConfig,
        cancel: CancellationToken,
    ) -> Result<Publisher, PublishError> {
        let mut pub_sock = PubSocket::new();
        let ep = pub_sock
            .bind(&config.endpoint)
            .await
            .map_err(|e| PublishError::Bind(config.endpoint.clone(), e))?;
        let mut replay = None;
        let mut replay_endpoint = None;
        if let Some(r) = &config.replay_endpoint {
            let mut router = RouterSocket::new();
            let rep = router
                .bind(r)
                .await
                .map_err(|e| PublishError::Bind(r.clone(), e))?;
            replay_endpoint = Some(rep.to_string());
            replay = Some(router);
        }
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let cancel = cancel.child_token();
        let skip_live = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(
            Task {
                pub_sock,
                replay,
                rx,
                topic: Bytes::from(config.topic.clone().into_bytes()),
                buffer: VecDeque::new(),
                buffer_steps: config.buffer_steps,
                next_seq: 0,
                skip_live: skip_live.clone(),
                cancel: cancel.clone(),
            }
            .run(),
        );
        Ok(Publisher {
            tx,
            endpoint: ep.to_string(),
            replay_endpoint,
            dropped: Arc::new(AtomicU64::new(0)),
            skip_live,
            cancel,
            task,
        })
    }

    /// The bound PUB address (with the chosen port).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Queues a batch; false (and counted) when the queue is full or closed.
    pub fn try_publish(&self, batch: EventBatch) -> bool {
        let ok = self.tx.try_send(batch).is_ok();
        if !ok {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Batches dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Fault injection: the next `n` batches get a seq and enter the replay buffer
    /// but are not sent live (a lossy network, as subscribers see it).
    pub fn skip_live(&self, n: u64) {
        self.skip_live.store(n, Ordering::Relaxed);
    }

    /// Stops the task and waits for it (sockets close).
    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

struct Task {
    pub_sock: PubSocket,
    replay: Option<RouterSocket>,
    rx: mpsc::Receiver<EventBatch>,
    topic: Bytes,
    buffer: VecDeque<(u64, Bytes)>,
    buffer_steps: usize,
    next_seq: u64,
    skip_live: Arc<AtomicU64>,
    cancel: CancellationToken,
}

impl Task {
    async fn run(mut self) {
        loop {
            let replay_req = async {
                match self.replay.as_mut() {
                    Some(r) => r.recv().await.ok(),
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = self.cancel.cancelled() => break,
                batch = self.rx.recv() => match batch {
                    Some(b) => self.send(b).await,
                    None => break,
                },
                req = replay_req => {
                    if let Some(req) = req {
                        self.serve_replay(req).await;
                    }
                }
            }
        }
    }

    async fn send(&mut self, batch: EventBatch) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = Bytes::from(encode_batch(&batch));
        if self.buffer_steps > 0 {
            if self.buffer.len() >= self.buffer_steps {
                self.buffer.pop_front();
            }
            self.buffer.push_back((seq, payload.clone()));
        }
        let skip = self.skip_live.load(Ordering::Relaxed);
        if skip > 0 {
            self.skip_live.store(skip - 1, Ordering::Relaxed);
            return;
        }
        let frames = vec![
            self.topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ];
        if let Ok(m) = ZmqMessage::try_from(frames)
            && let Err(e) = self.pub_sock.send(m).await
        {
            tracing::debug!("kv-events publish: {e}");
        }
    }

    async fn serve_replay(&mut self, req: ZmqMessage) {
        let frames = req.into_vec();
        // ROUTER prepends the peer identity: [id, "", seq].
        let [id, _, start] = frames.as_slice() else {
            return;
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()) else {
            return;
        };
        let start = u64::from_be_bytes(start);
        let Some(router) = self.replay.as_mut() else {
            return;
        };
        for (seq, payload) in self.buffer.iter().filter(|(s, _)| *s >= start) {
            let frames = vec![
                id.clone(),
                Bytes::new(),
                self.topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload.clone(),
            ];
            if let Ok(m) = ZmqMessage::try_from(frames)
                && router.send(m).await.is_err()
            {
                return;
            }
        }
        let end = vec![
            id.clone(),
            Bytes::new(),
            Bytes::new(),
            Bytes::copy_from_slice(&END_SEQ),
            Bytes::new(),
        ];
        if let Ok(m) = ZmqMessage::try_from(end) {
            let _ = router.send(m).await;
        }
    }
}
