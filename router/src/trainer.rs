//! The trainer: one thread that owns the predictor's [`Learner`], fed by a bounded
//! channel from the request path, publishing frozen snapshots the hot path reads
//! without locks. A full channel drops (and counts) samples rather than block a request.
//!
//! The learner's time axis is wall-clock seconds, so statistics from different nodes
//! share a landmark and merge exactly.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering::Relaxed},
    },
    thread::JoinHandle,
    time::Duration,
};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};
use headroom_predictor::{
    FederationSlot, JournalEntry, Learner, PredictorConfig, ReplicaKey, Sample, SharedPredictor,
};
use parking_lot::Mutex;

/// Queue length between the request path and the trainer.
const QUEUE: usize = 8192;
/// Entries a journal holds at most (~0.8 KB each): it stops growing there, and says so.
const JOURNAL_MAX_ENTRIES: u64 = 2_000_000;

/// The learner's inputs written as they arrive (see `headroom_predictor::journal`), on
/// the trainer thread, never on the request path.
struct Journal {
    out: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
    written: u64,
    failed: bool,
}

impl Journal {
    fn open(path: PathBuf) -> anyhow::Result<Journal> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| anyhow::anyhow!("predictor_journal {path:?}: {e}"))?;
        Ok(Journal {
            out: std::io::BufWriter::new(f),
            path,
            written: 0,
            failed: false,
        })
    }

    fn write(&mut self, e: &JournalEntry) {
        if self.failed {
            return;
        }
        if self.written >= JOURNAL_MAX_ENTRIES {
            tracing::warn!(
                "predictor journal {:?} is full ({JOURNAL_MAX_ENTRIES} entries); no more written",
                self.path
            );
            self.failed = true;
            return;
        }
        if let Err(err) = e.write_line(&mut self.out) {
            tracing::warn!("predictor journal {:?}: {err}; no more written", self.path);
            self.failed = true;
        }
        self.written += 1;
    }

    fn flush(&mut self) {
        use std::io::Write;
        if !self.failed && self.out.flush().is_err() {
            self.failed = true;
        }
    }
}

pub fn wall_s() -> f64 {
    crate::clock::unix_ms() as f64 / 1e3
}

enum Msg {
    Sample(Box<Sample>),
    /// What the router measures of a replica between labels: its engine step time
    /// (ms, when known) and how many requests decode there now.
    Replica {
        key: ReplicaKey,
        at_s: f64,
        step_ms: Option<f64>,
        decoding: f64,
    },
    PeerSlot(Box<FederationSlot>),
    ForgetPeer(String),
    Export(Sender<FederationSlot>),
}

pub struct Trainer {
    tx: Mutex<Option<Sender<Msg>>>,
    pub shared: Arc<SharedPredictor>,
    pub dropped: AtomicU64,
    pub learned: Arc<AtomicU64>,
    handle: Mutex<Option<JoinHandle<()>>>,
    node_id: String,
}

impl Trainer {
    /// Starts the trainer thread. With `state_file`, the learner warm-starts from it
    /// (if present and valid) and saves to it on shutdown; with `journal`, every input
    /// the learner receives is appended there (an unopenable file is an error).
    pub fn start(
        cfg: PredictorConfig,
        node_id: &str,
        publish_every: Duration,
        state_file: Option<PathBuf>,
        journal: Option<PathBuf>,
    ) -> anyhow::Result<Arc<Trainer>> {
        let journal = journal.map(Journal::open).transpose()?;
        let mut learner = match state_file.as_ref().and_then(|p| std::fs::read(p).ok()) {
            Some(bytes) => match Learner::load_state(cfg.clone(), &bytes) {
                Ok(l) => {
                    tracing::info!("predictor warm-started from {:?}", state_file);
                    l
                }
                Err(e) => {
                    tracing::warn!("ignoring predictor state {:?}: {e}", state_file);
                    Learner::new(cfg)
                }
            },
            None => Learner::new(cfg),
        };
        learner.set_node_id(node_id);
        let shared = Arc::new(SharedPredictor::new(learner.snapshot(wall_s())));
        let (tx, rx) = bounded(QUEUE);
        let learned = Arc::new(AtomicU64::new(0));
        let handle = {
            let shared = shared.clone();
            let learned = learned.clone();
            let node_id = node_id.to_string();
            std::thread::Builder::new()
                .name("headroom-trainer".into())
                .spawn(move || {
                    run(
                        learner,
                        rx,
                        shared,
                        publish_every,
                        state_file,
                        learned,
                        node_id,
                        journal,
                    )
                })
                .expect("spawning the trainer thread")
        };
        Ok(Arc::new(Trainer {
            tx: Mutex::new(Some(tx)),
            shared,
            dropped: AtomicU64::new(0),
            learned,
            handle: Mutex::new(Some(handle)),
            node_id: node_id.to_string(),
        }))
    }

    fn send(&self, m: Msg) -> bool {
        match self.tx.lock().as_ref() {
            Some(tx) => tx.try_send(m).is_ok(),
            None => false,
        }
    }

    /// Hands an outcome to the trainer; never blocks.
    pub fn submit(&self, s: Sample) {
        if !self.send(Msg::Sample(Box::new(s))) {
            self.dropped.fetch_add(1, Relaxed);
        }
    }

    /// The replica's measured step time and decoding count; never blocks (dropped when
    /// the queue is full: the next one carries the same news).
    pub fn replica_state(&self, key: ReplicaKey, step_ms: Option<f64>, decoding: f64) {
        self.send(Msg::Replica {
            key,
            at_s: wall_s(),
            step_ms,
            decoding,
        });
    }

    /// A peer's federation slot arrived.
    pub fn merge_peer(&self, slot: FederationSlot) {
        self.send(Msg::PeerSlot(Box::new(slot)));
    }

    pub fn forget_peer(&self, node: &str) {
        self.send(Msg::ForgetPeer(node.to_string()));
    }

    /// This node's slot for gossip (waits briefly for the trainer).
    pub fn export_slot(&self) -> Option<FederationSlot> {
        let (tx, rx) = bounded(1);
        if !self.send(Msg::Export(tx)) {
            return None;
        }
        rx.recv_timeout(Duration::from_secs(1)).ok()
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Stops the thread (saving state if configured) and waits for it.
    pub fn shutdown(&self) {
        self.tx.lock().take();
        if let Some(h) = self.handle.lock().take() {
            let _ = h.join();
        }
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// How long the trainer lets its queue fill after a batch before it reads again: one
/// wake-up per batch instead of one per message. Waking per message cost the router a
/// futex wake and a few `sched_yield`s (the channel's spin before it parks) for each of
/// the ~3 messages a request sends: ≈ 0.9 yields per request at 16k requests/s.
const BATCH_WAIT: Duration = Duration::from_millis(2);

#[allow(clippy::too_many_arguments)]
fn run(
    mut learner: Learner,
    rx: Receiver<Msg>,
    shared: Arc<SharedPredictor>,
    publish_every: Duration,
    state_file: Option<PathBuf>,
    learned: Arc<AtomicU64>,
    node_id: String,
    mut journal: Option<Journal>,
) {
    let mut dirty = false;
    let mut last_publish = std::time::Instant::now();
    let handle = |m: Msg, learner: &mut Learner, journal: &mut Option<Journal>| match m {
        Msg::Sample(s) => {
            if let Some(j) = journal.as_mut() {
                j.write(&JournalEntry::of_sample(&s));
            }
            learner.observe(&s);
            learned.fetch_add(1, Relaxed);
            true
        }
        Msg::Replica {
            key,
            at_s,
            step_ms,
            decoding,
        } => {
            if let Some(ms) = step_ms {
                if let Some(j) = journal.as_mut() {
                    j.write(&JournalEntry::StepTime {
                        key,
                        at_s,
                        step_ms: ms,
                    });
                }
                learner.observe_step_time(key, at_s, ms);
            }
            if let Some(j) = journal.as_mut() {
                j.write(&JournalEntry::Running {
                    key,
                    at_s,
                    decoding,
                });
            }
            learner.observe_running(key, at_s, decoding);
            true
        }
        Msg::PeerSlot(slot) => {
            if let Err(e) = learner.merge_peer_slot(*slot) {
                tracing::debug!("peer predictor slot refused: {e}");
            }
            true
        }
        Msg::ForgetPeer(n) => learner.forget_peer(&n),
        Msg::Export(reply) => {
            let _ = reply.try_send(learner.export_slot(&node_id, wall_s()));
            false
        }
    };
    loop {
        let mut got = false;
        match rx.recv_timeout(publish_every) {
            Ok(m) => {
                got = true;
                dirty |= handle(m, &mut learner, &mut journal);
                // Whatever else is queued, without parking in between.
                while let Ok(m) = rx.try_recv() {
                    dirty |= handle(m, &mut learner, &mut journal);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if dirty && last_publish.elapsed() >= publish_every {
            let now = wall_s();
            learner.tick(now);
            shared.store(learner.snapshot(now));
            if let Some(j) = journal.as_mut() {
                j.write(&JournalEntry::Tick { at_s: now });
                j.flush();
            }
            dirty = false;
            last_publish = std::time::Instant::now();
        }
        if got {
            std::thread::sleep(BATCH_WAIT);
        }
    }
    if let Some(j) = journal.as_mut() {
        j.flush();
    }
    if let Some(p) = state_file {
        match learner.save_state() {
            Ok(bytes) => {
                if let Err(e) = std::fs::write(&p, bytes) {
                    tracing::warn!("cannot save predictor state to {p:?}: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot encode predictor state: {e}"),
        }
    }
}
