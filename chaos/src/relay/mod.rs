//! A fault-injecting UDP relay between router nodes, owned by the harness: every
//! node's gossip and QUIC-datagram traffic goes through it, so a scenario can
//! partition the mesh, lose, delay, duplicate, reorder and corrupt datagrams, and
//! throw oversized junk at the nodes — on real processes, without root or `tc`.
//!
//! Wiring: node `i` listens on its real gossip address `G_i` and advertises the
//! relay's front address `F_i` (`--gossip-advertise`); its seeds are the other
//! nodes' fronts. A datagram from source `s` arriving at `F_i` is forwarded to `G_i`
//! from a back socket dedicated to `(s, i)` (created on first sight, like a NAT
//! mapping); what `G_i` answers on that back socket goes out of `F_i` to `s`. A
//! source is node `j` when `s == G_j` (quinn sends from its one socket); datagrams
//! from any other source pass without faults.
//!
//! Invariants: the faults in force ([`NetFaults`]) are read per datagram, so a change
//! applies to the next one; delayed copies are bounded (`MAX_DELAYED`, beyond it a
//! copy is dropped and counted); back sockets are bounded per front (`MAX_SOURCES`);
//! every task is tracked and ends on [`Relay::stop`]; undelayed copies leave in
//! arrival order. Cost: one `recv` + one `send` syscall per copy, and a timer task per
//! delayed copy.

pub mod faults;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use faults::{Fate, NetFaults};

use crate::ChaosError;

/// Most delayed copies waiting at once.
const MAX_DELAYED: usize = 8192;
/// Most distinct sources (back sockets) per front.
const MAX_SOURCES: usize = 64;
/// Largest datagram read (UDP's maximum payload).
const MAX_DATAGRAM: usize = 65_535;

/// What the relay did, summed over all nodes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RelayCounts {
    pub forwarded: u64,
    pub partitioned: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    pub oversized_sent: u64,
    /// Copies dropped because `MAX_DELAYED` were already waiting.
    pub overflow: u64,
    /// Send errors (a node not running: its port refuses).
    pub send_errors: u64,
}

#[derive(Default)]
struct Counters {
    forwarded: AtomicU64,
    partitioned: AtomicU64,
    lost: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    corrupted: AtomicU64,
    oversized_sent: AtomicU64,
    overflow: AtomicU64,
    send_errors: AtomicU64,
}

struct Shared {
    faults: Mutex<NetFaults>,
    rng: Mutex<ChaCha8Rng>,
    counts: Counters,
    delayed: AtomicUsize,
    /// UDP payload bytes each node sent into the relay (before any fault).
    sent_bytes: Vec<AtomicU64>,
    /// Real gossip address of each node.
    nodes: Vec<SocketAddr>,
    cancel: CancellationToken,
    tracker: TaskTracker,
}

/// The running relay.
pub struct Relay {
    fronts: Vec<SocketAddr>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("fronts", &self.fronts)
            .finish()
    }
}

impl Relay {
    /// Binds one front per node (`nodes[i]` = node `i`'s real gossip address) and
    /// starts relaying with no faults.
    pub async fn start(nodes: &[SocketAddr], seed: u64) -> Result<Relay, ChaosError> {
        let shared = Arc::new(Shared {
            faults: Mutex::new(NetFaults::default()),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
            counts: Counters::default(),
            delayed: AtomicUsize::new(0),
            sent_bytes: nodes.iter().map(|_| AtomicU64::new(0)).collect(),
            nodes: nodes.to_vec(),
            cancel: CancellationToken::new(),
            tracker: TaskTracker::new(),
        });
        let mut fronts = Vec::new();
        for i in 0..nodes.len() {
            let sock = UdpSocket::bind("127.0.0.1:0")
                .await
                .map_err(|e| ChaosError::io("binding a relay front", e))?;
            fronts.push(
                sock.local_addr()
                    .map_err(|e| ChaosError::io("relay front address", e))?,
            );
            let sh = shared.clone();
            shared.tracker.spawn(front_loop(sh, i, Arc::new(sock)));
        }
        let sh = shared.clone();
        shared.tracker.spawn(junk_loop(sh));
        Ok(Relay { fronts, shared })
    }

    /// The address node `i` advertises and its peers dial.
    pub fn front(&self, i: usize) -> Option<SocketAddr> {
        self.fronts.get(i).copied()
    }

    /// Puts `f` in force from the next datagram on.
    pub fn set(&self, f: NetFaults) {
        *self.shared.faults.lock() = f;
    }

    pub fn faults(&self) -> NetFaults {
        self.shared.faults.lock().clone()
    }

    pub fn counts(&self) -> RelayCounts {
        let c = &self.shared.counts;
        RelayCounts {
            forwarded: c.forwarded.load(Relaxed),
            partitioned: c.partitioned.load(Relaxed),
            lost: c.lost.load(Relaxed),
            duplicated: c.duplicated.load(Relaxed),
            reordered: c.reordered.load(Relaxed),
            corrupted: c.corrupted.load(Relaxed),
            oversized_sent: c.oversized_sent.load(Relaxed),
            overflow: c.overflow.load(Relaxed),
            send_errors: c.send_errors.load(Relaxed),
        }
    }

    /// UDP payload bytes each node has sent to its peers (by node index): all of its
    /// gossip and QUIC traffic, measured outside the process.
    pub fn sent_bytes(&self) -> Vec<u64> {
        self.shared
            .sent_bytes
            .iter()
            .map(|b| b.load(Relaxed))
            .collect()
    }

    /// Stops every task (delayed copies are dropped) and waits for them.
    pub async fn stop(&self) {
        self.shared.cancel.cancel();
        self.shared.tracker.close();
        self.shared.tracker.wait().await;
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
    }
}

/// Reads what arrives at node `to`'s front and forwards it through the source's back
/// socket.
async fn front_loop(sh: Arc<Shared>, to: usize, front: Arc<UdpSocket>) {
    let mut backs: HashMap<SocketAddr, Arc<UdpSocket>> = HashMap::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let (n, src) = tokio::select! {
            r = front.recv_from(&mut buf) => match r {
                Ok(x) => x,
                // ICMP errors from an earlier send surface here on Linux: keep going.
                Err(_) => continue,
            },
            _ = sh.cancel.cancelled() => return,
        };
        let back = match backs.get(&src) {
            Some(b) => b.clone(),
            None => {
                if backs.len() >= MAX_SOURCES {
                    continue;
                }
                let Ok(b) = UdpSocket::bind("127.0.0.1:0").await else {
                    continue;
                };
                let b = Arc::new(b);
                backs.insert(src, b.clone());
                let sh2 = sh.clone();
                sh.tracker
                    .spawn(back_loop(sh2, to, src, b.clone(), front.clone()));
                b
            }
        };
        let Some(&dst) = sh.nodes.get(to) else {
            continue;
        };
        let from = sh.nodes.iter().position(|a| *a == src);
        deliver(&sh, from, to, &buf[..n], back, dst).await;
    }
}

/// Relays node `from_node`'s answers to `peer` (who reached it through its front).
async fn back_loop(
    sh: Arc<Shared>,
    from_node: usize,
    peer: SocketAddr,
    back: Arc<UdpSocket>,
    front: Arc<UdpSocket>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let to = sh.nodes.iter().position(|a| *a == peer);
    loop {
        let n = tokio::select! {
            r = back.recv_from(&mut buf) => match r {
                Ok((n, _)) => n,
                Err(_) => continue,
            },
            _ = sh.cancel.cancelled() => return,
        };
        match to {
            Some(t) => deliver(&sh, Some(from_node), t, &buf[..n], front.clone(), peer).await,
            None => deliver(&sh, None, from_node, &buf[..n], front.clone(), peer).await,
        }
    }
}

/// Applies the faults in force to one datagram and sends its copies from `via` to
/// `dst`. `from` is None for a source that is not a node (no faults apply).
async fn deliver(
    sh: &Arc<Shared>,
    from: Option<usize>,
    to: usize,
    data: &[u8],
    via: Arc<UdpSocket>,
    dst: SocketAddr,
) {
    let c = &sh.counts;
    if let Some(b) = from.and_then(|f| sh.sent_bytes.get(f)) {
        b.fetch_add(data.len() as u64, Relaxed);
    }
    let fate = match from {
        Some(f) => {
            let faults = sh.faults.lock();
            let mut rng = sh.rng.lock();
            faults.fate(f, to, &mut *rng)
        }
        None => Fate::Deliver(vec![faults::Delivery {
            delay_ms: 0.0,
            corrupt: false,
            reordered: false,
        }]),
    };
    let copies = match fate {
        Fate::Partitioned => {
            c.partitioned.fetch_add(1, Relaxed);
            return;
        }
        Fate::Lost => {
            c.lost.fetch_add(1, Relaxed);
            return;
        }
        Fate::Deliver(copies) => copies,
    };
    if copies.len() > 1 {
        c.duplicated.fetch_add(1, Relaxed);
    }
    for copy in copies {
        let mut bytes = data.to_vec();
        if copy.corrupt {
            faults::corrupt(&mut bytes, &mut *sh.rng.lock());
            c.corrupted.fetch_add(1, Relaxed);
        }
        if copy.reordered {
            c.reordered.fetch_add(1, Relaxed);
        }
        if copy.delay_ms <= 0.0 {
            send_now(sh, &via, &bytes, dst).await;
            continue;
        }
        if sh.delayed.fetch_add(1, Relaxed) >= MAX_DELAYED {
            sh.delayed.fetch_sub(1, Relaxed);
            c.overflow.fetch_add(1, Relaxed);
            continue;
        }
        let (sh2, via2) = (sh.clone(), via.clone());
        let wait = Duration::from_secs_f64(copy.delay_ms / 1e3);
        sh.tracker.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(wait) => send_now(&sh2, &via2, &bytes, dst).await,
                _ = sh2.cancel.cancelled() => {}
            }
            sh2.delayed.fetch_sub(1, Relaxed);
        });
    }
}

async fn send_now(sh: &Shared, via: &UdpSocket, bytes: &[u8], dst: SocketAddr) {
    // In order, waiting out a full socket buffer (rare on loopback).
    match via.send_to(bytes, dst).await {
        Ok(_) => sh.counts.forwarded.fetch_add(1, Relaxed),
        Err(_) => sh.counts.send_errors.fetch_add(1, Relaxed),
    };
}

/// Sends oversized junk datagrams (1.3–60 KB of random bytes) straight to every
/// node's gossip port at `oversized_per_s` each, from a socket of its own.
async fn junk_loop(sh: Arc<Shared>) {
    let Ok(sock) = UdpSocket::bind("127.0.0.1:0").await else {
        return;
    };
    let tick = Duration::from_millis(20);
    let mut owed = 0.0f64;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(tick) => {}
            _ = sh.cancel.cancelled() => return,
        }
        let rate = sh.faults.lock().oversized_per_s;
        if rate <= 0.0 {
            owed = 0.0;
            continue;
        }
        owed += rate * tick.as_secs_f64();
        while owed >= 1.0 {
            owed -= 1.0;
            for dst in &sh.nodes {
                let junk: Vec<u8> = {
                    let mut rng = sh.rng.lock();
                    let len = rng.random_range(1_300..=60_000);
                    (0..len).map(|_| rng.random()).collect()
                };
                if sock.send_to(&junk, *dst).await.is_ok() {
                    sh.counts.oversized_sent.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two plain UDP "nodes" talk through the relay: datagrams pass both ways with
    /// their source rewritten to the relay, and a partition stops them.
    #[tokio::test]
    async fn relays_both_ways_and_partitions() {
        let a = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let (ga, gb) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let relay = Relay::start(&[ga, gb], 1).await.unwrap();
        let fb = relay.front(1).unwrap();
        a.send_to(b"ping", fb).await.unwrap();
        let mut buf = [0u8; 64];
        let (n, via) = tokio::time::timeout(Duration::from_secs(2), b.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"ping");
        b.send_to(b"pong", via).await.unwrap();
        let (n, from) = tokio::time::timeout(Duration::from_secs(2), a.recv_from(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((&buf[..n], from), (&b"pong"[..], fb));

        relay.set(NetFaults {
            groups: vec![0, 1],
            ..NetFaults::default()
        });
        a.send_to(b"lost", fb).await.unwrap();
        let got = tokio::time::timeout(Duration::from_millis(300), b.recv_from(&mut buf)).await;
        assert!(got.is_err(), "a partitioned datagram arrived");
        assert_eq!(relay.counts().partitioned, 1);

        relay.set(NetFaults {
            duplicate: 1.0,
            delay_ms: 5.0,
            ..NetFaults::default()
        });
        a.send_to(b"twice", fb).await.unwrap();
        for _ in 0..2 {
            let (n, _) = tokio::time::timeout(Duration::from_secs(2), b.recv_from(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(&buf[..n], b"twice");
        }
        relay.stop().await;
    }
}
