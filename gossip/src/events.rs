//! What the mesh tells its users, and the fan-out to subscribers.
//!
//! Invariants: the gossip machinery never waits on a subscriber — each subscriber has a
//! bounded queue, an event that does not fit is dropped and counted
//! (`MeshStats::dropped_events`); closed subscribers are forgotten.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::skew::Skew;
use crate::stats::Counters;
use crate::wire::Value;

/// Which chitchat cluster a value or member belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// This node's region: full state.
    Region,
    /// The cross-region cluster: only kinds whose policy lets them cross regions.
    Global,
}

/// Something that happened in the mesh.
#[derive(Debug, Clone, PartialEq)]
pub enum MeshEvent {
    /// A peer published (or refreshed) `key`. `age` is local time minus the publisher's
    /// timestamp, less the publisher's clock skew as estimated from its datagrams
    /// (`skew.rs`; before its first datagram the raw difference, zero if it is ahead).
    Value {
        node: Arc<str>,
        scope: Scope,
        key: String,
        value: Value,
        age: Duration,
    },
    /// A peer's key was deleted or expired (TTL).
    ValueRemoved {
        node: Arc<str>,
        scope: Scope,
        key: String,
    },
    /// A peer became live. Its current values follow as `Value` events.
    MemberJoined {
        node: Arc<str>,
        scope: Scope,
        region: Option<String>,
        addr: SocketAddr,
    },
    /// A peer was declared dead (failure detector) or forgotten. Drop all of its values:
    /// no `Value` event for it follows until it joins again.
    MemberLeft { node: Arc<str>, scope: Scope },
    /// A QUIC datagram from a peer (fast, loss-tolerant path; see `Mesh::broadcast_datagram`).
    Datagram {
        node: Arc<str>,
        value: Value,
        /// Time in flight beyond the fastest datagram from this peer (skew removed).
        age: Duration,
    },
}

/// Fan-out to bounded subscriber queues.
pub(crate) struct EventHub {
    subs: Mutex<Vec<mpsc::Sender<MeshEvent>>>,
    counters: Arc<Counters>,
    /// Peers' clock skew, for the ages of what they publish.
    pub skew: Skew,
}

impl EventHub {
    pub fn new(counters: Arc<Counters>) -> Self {
        Self {
            subs: Mutex::new(Vec::new()),
            counters,
            skew: Skew::default(),
        }
    }

    pub fn add(&self, tx: mpsc::Sender<MeshEvent>) {
        self.subs.lock().push(tx);
    }

    pub fn emit(&self, ev: MeshEvent) {
        if let MeshEvent::MemberLeft { node, .. } = &ev {
            self.skew.forget(node);
        }
        let mut subs = self.subs.lock();
        subs.retain(|tx| !tx.is_closed());
        for tx in subs.iter() {
            try_send(tx, ev.clone(), &self.counters);
        }
    }
}

/// Sends without waiting; counts a drop when the queue is full.
pub(crate) fn try_send(tx: &mpsc::Sender<MeshEvent>, ev: MeshEvent, counters: &Counters) {
    if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(ev) {
        Counters::add(&counters.dropped_events, 1);
    }
}

/// A member of the mesh as this node sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberInfo {
    pub node_id: Arc<str>,
    pub scope: Scope,
    /// From the member's reserved `hr.region` key (None until it arrived).
    pub region: Option<String>,
    pub live: bool,
    /// Time since this node last saw the member's heartbeat advance.
    pub last_seen_age: Duration,
    /// The member's visible keys (reserved `hr.*` keys excluded).
    pub keys: Vec<String>,
    /// Gossip address (QUIC endpoint).
    pub addr: SocketAddr,
    /// Incarnation; grows on every restart.
    pub generation: u64,
    /// True for this node itself.
    pub is_self: bool,
}

/// Member snapshot held by the observer; ages are computed when read.
#[derive(Debug, Clone)]
pub(crate) struct MemberSnap {
    pub info: MemberInfo,
    pub last_seen: Instant,
}
