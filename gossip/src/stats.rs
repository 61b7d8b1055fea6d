//! Counters of the mesh. Lock-free: every field is an atomic bumped on the data path and
//! read as a consistent-enough snapshot by [`crate::Mesh::stats`].

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::wire::RejectReason;

#[derive(Default, Debug)]
pub(crate) struct Counters {
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    pub messages_sent: AtomicU64,
    pub messages_received: AtomicU64,
    pub datagrams_sent: AtomicU64,
    pub datagrams_received: AtomicU64,
    pub datagram_bytes_sent: AtomicU64,
    pub datagram_bytes_received: AtomicU64,
    pub rejected: [AtomicU64; RejectReason::ALL.len()],
    pub rejected_peers: AtomicU64,
    pub rejected_frames: AtomicU64,
    pub dropped_events: AtomicU64,
    pub dropped_messages: AtomicU64,
    pub connects: AtomicU64,
    pub connect_failures: AtomicU64,
    pub silent_connections: AtomicU64,
    pub fault_dropped: AtomicU64,
    pub udp_bytes_sent_closed: AtomicU64,
    pub udp_bytes_received_closed: AtomicU64,
}

impl Counters {
    pub fn reject(&self, reason: RejectReason) {
        let i = RejectReason::ALL
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(0);
        self.rejected[i].fetch_add(1, Relaxed);
    }

    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }
}

/// A snapshot of the mesh's counters (monotone since start).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MeshStats {
    /// Gossip frame bytes written to QUIC streams (both clusters).
    pub bytes_sent: u64,
    /// Gossip frame bytes read from QUIC streams.
    pub bytes_received: u64,
    /// Gossip messages (Syn/SynAck/Ack/BadCluster) sent.
    pub messages_sent: u64,
    /// Gossip messages accepted from peers.
    pub messages_received: u64,
    pub datagrams_sent: u64,
    pub datagrams_received: u64,
    pub datagram_bytes_sent: u64,
    pub datagram_bytes_received: u64,
    /// UDP payload bytes sent by QUIC (handshakes, acks, keep-alives, all streams).
    pub udp_bytes_sent: u64,
    /// UDP payload bytes received by QUIC.
    pub udp_bytes_received: u64,
    /// Values (chitchat keys or datagrams) whose frame was refused, all reasons (their
    /// payloads are the user's to validate and count).
    pub rejected_values: u64,
    /// The same, per reason ([`RejectReason::as_str`] names).
    pub rejected_by_reason: Vec<(&'static str, u64)>,
    /// Peers refused: bad or missing certificate, or an identity that does not match.
    pub rejected_peers: u64,
    /// Gossip frames refused (bad header, oversized, undecodable message).
    pub rejected_frames: u64,
    /// Events not delivered because a subscriber's queue was full.
    pub dropped_events: u64,
    /// Outgoing messages dropped (per-peer queue full or peer unreachable).
    pub dropped_messages: u64,
    /// QUIC connections established (both directions).
    pub connects: u64,
    /// Outgoing connection attempts that failed.
    pub connect_failures: u64,
    /// Connections dropped and redialled because the peer answered nothing for
    /// `silent_after` after we sent (a black-holed path, e.g. a network partition).
    pub silent_connections: u64,
    /// Messages dropped by a [`crate::FaultInjector`] partition.
    pub fault_dropped: u64,
}

impl Counters {
    pub fn snapshot(&self, udp_live: (u64, u64)) -> MeshStats {
        let g = |c: &AtomicU64| c.load(Relaxed);
        let by_reason: Vec<_> = RejectReason::ALL
            .iter()
            .zip(&self.rejected)
            .map(|(r, c)| (r.as_str(), g(c)))
            .collect();
        MeshStats {
            bytes_sent: g(&self.bytes_sent),
            bytes_received: g(&self.bytes_received),
            messages_sent: g(&self.messages_sent),
            messages_received: g(&self.messages_received),
            datagrams_sent: g(&self.datagrams_sent),
            datagrams_received: g(&self.datagrams_received),
            datagram_bytes_sent: g(&self.datagram_bytes_sent),
            datagram_bytes_received: g(&self.datagram_bytes_received),
            udp_bytes_sent: g(&self.udp_bytes_sent_closed) + udp_live.0,
            udp_bytes_received: g(&self.udp_bytes_received_closed) + udp_live.1,
            rejected_values: by_reason.iter().map(|(_, n)| n).sum(),
            rejected_by_reason: by_reason,
            rejected_peers: g(&self.rejected_peers),
            rejected_frames: g(&self.rejected_frames),
            dropped_events: g(&self.dropped_events),
            dropped_messages: g(&self.dropped_messages),
            connects: g(&self.connects),
            connect_failures: g(&self.connect_failures),
            silent_connections: g(&self.silent_connections),
            fault_dropped: g(&self.fault_dropped),
        }
    }
}
