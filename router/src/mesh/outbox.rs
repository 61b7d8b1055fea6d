//! What this node tells its peers of its own placements, and when: the sender's side of
//! the in-flight exchange (the receiver's is `peers.rs`).
//!
//! Bandwidth is the constraint. A node's vector lists every replica of the fleet, and a
//! datagram goes to each of the N − 1 peers, so sending the whole vector on every change
//! costs `changes/s × (N − 1) × replicas × 48 B`: 180 KB/s per node at 16 nodes and 4
//! replicas, most of it entries that had not changed or were zero. Instead:
//! - a datagram carries only the entries that changed **materially** since they were last
//!   sent (a request booked, started decoding or finished; a token sum moved by more than
//!   `max(64, 25 %)`), including an entry that went to zero;
//! - every `heartbeat` it carries every non-zero entry and every entry that went to zero
//!   since the last heartbeat, so a peer's copy never ages past its TTL and a lost
//!   datagram is repaired within one heartbeat;
//! - the reliable gossip copy carries the non-zero entries and those zeroed within the
//!   last `keep_zero_s` (a chitchat reader may skip versions, so a zero must stay in every
//!   version for as long as a peer could still hold the old value: the peers' TTL).
//!
//! Receivers keep the newest report per replica and drop reports older than the TTL, so
//! an entry that is never sent again (zero) or whose zero was lost expires at the TTL.
//! Cost per node: `3 × its placements/s × (N − 1) × (48 B + ~60 B of framing)` plus one
//! heartbeat datagram per peer per second sized by its busy replicas only.

use std::collections::{HashMap, HashSet};

use super::schema::ReplicaLoad;

/// Token sums that move by less than this (tokens) or this share are not news.
const DRIFT_TOKENS: u32 = 64;
const DRIFT_SHARE: f64 = 0.25;

/// The sender's memory of what it told its peers.
#[derive(Debug, Default)]
pub struct Outbox {
    /// Last value sent by datagram per replica (absent: never sent, or zero and
    /// repeated at a heartbeat).
    sent: HashMap<u64, ReplicaLoad>,
    /// Replicas whose datagram entry went to zero since the last heartbeat.
    beat_zeros: HashSet<u64>,
    last_beat_s: Option<f64>,
    /// Replicas busy at the last snapshot, and when others went to zero (`now_s` axis).
    busy: HashSet<u64>,
    zeroed: HashMap<u64, f64>,
}

/// Whether no request of this node is on the replica.
pub fn is_zero(l: &ReplicaLoad) -> bool {
    l.requests == 0 && l.queued_requests == 0 && l.decoding_requests == 0
}

fn drifted(a: u32, b: u32) -> bool {
    let d = a.abs_diff(b);
    d > DRIFT_TOKENS && f64::from(d) > DRIFT_SHARE * f64::from(a.max(b))
}

/// Whether `now` differs from `before` enough for a peer's decision to change.
pub fn material(now: &ReplicaLoad, before: &ReplicaLoad) -> bool {
    (now.requests, now.queued_requests, now.decoding_requests)
        != (
            before.requests,
            before.queued_requests,
            before.decoding_requests,
        )
        || now.min_tpot_slo_ms != before.min_tpot_slo_ms
        || drifted(now.queued_prefill_tokens, before.queued_prefill_tokens)
        || drifted(now.decode_context_tokens, before.decode_context_tokens)
        || drifted(now.decode_remaining_tokens, before.decode_remaining_tokens)
}

impl Outbox {
    /// The entries the next datagram carries given the node's current `loads` (one per
    /// replica), or nothing to send. Remembers them as sent.
    pub fn datagram(
        &mut self,
        loads: &[ReplicaLoad],
        now_s: f64,
        heartbeat_s: f64,
    ) -> Vec<ReplicaLoad> {
        let beat = self.last_beat_s.is_none_or(|t| now_s - t >= heartbeat_s);
        let mut out = Vec::new();
        for l in loads {
            let prev = self.sent.get(&l.replica);
            let zero = is_zero(l);
            let news = match prev {
                Some(p) => material(l, p),
                None => !zero,
            };
            if zero && prev.is_some_and(|p| !is_zero(p)) {
                self.beat_zeros.insert(l.replica);
            }
            if news || (beat && (!zero || self.beat_zeros.contains(&l.replica))) {
                out.push(*l);
                self.sent.insert(l.replica, *l);
            }
        }
        if beat {
            self.last_beat_s = Some(now_s);
            // A zero has now been sent twice (when it happened and at this beat).
            self.beat_zeros.clear();
            self.sent.retain(|_, l| !is_zero(l));
        }
        out
    }

    /// The gossip copy: every non-zero entry and every entry zeroed within
    /// `keep_zero_s`. Forgets older zeros.
    pub fn snapshot(
        &mut self,
        loads: &[ReplicaLoad],
        now_s: f64,
        keep_zero_s: f64,
    ) -> Vec<ReplicaLoad> {
        for l in loads {
            if is_zero(l) {
                if self.busy.remove(&l.replica) {
                    self.zeroed.insert(l.replica, now_s);
                }
            } else if self.busy.insert(l.replica) {
                self.zeroed.remove(&l.replica);
            }
        }
        self.zeroed.retain(|_, t| now_s - *t <= keep_zero_s);
        loads
            .iter()
            .filter(|l| !is_zero(l) || self.zeroed.contains_key(&l.replica))
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(replica: u64, requests: u32, remaining: u32) -> ReplicaLoad {
        ReplicaLoad {
            replica,
            requests,
            queued_prefill_tokens: 0,
            decoding_requests: requests,
            decode_context_tokens: 0,
            prefill_inflow_tps: 0.0,
            queued_requests: 0,
            queued_attention_pairs: 0.0,
            decode_remaining_tokens: remaining,
            min_tpot_slo_ms: 0.0,
        }
    }

    fn keys(v: &[ReplicaLoad]) -> Vec<(u64, u32)> {
        v.iter().map(|l| (l.replica, l.requests)).collect()
    }

    #[test]
    fn only_news_is_sent_and_a_heartbeat_repeats_what_is_busy() {
        let mut o = Outbox::default();
        let idle: Vec<ReplicaLoad> = (0..256).map(|r| load(r, 0, 0)).collect();
        // First beat with an idle fleet: nothing to say.
        assert!(o.datagram(&idle, 0.0, 1.0).is_empty());
        let mut v = idle.clone();
        v[7] = load(7, 1, 200);
        assert_eq!(keys(&o.datagram(&v, 0.1, 1.0)), vec![(7, 1)]);
        // Tokens streaming out (200 → 180) is not news; a second request is.
        v[7] = load(7, 1, 180);
        assert!(o.datagram(&v, 0.2, 1.0).is_empty());
        v[7] = load(7, 2, 400);
        assert_eq!(keys(&o.datagram(&v, 0.3, 1.0)), vec![(7, 2)]);
        // A token sum that halves is news.
        v[7] = load(7, 2, 150);
        assert_eq!(keys(&o.datagram(&v, 0.4, 1.0)), vec![(7, 2)]);
        // Finishing is news, and the zero goes out once more at the next heartbeat.
        v[7] = load(7, 0, 0);
        v[9] = load(9, 1, 50);
        assert_eq!(keys(&o.datagram(&v, 0.5, 1.0)), vec![(7, 0), (9, 1)]);
        assert!(o.datagram(&v, 0.6, 1.0).is_empty());
        assert_eq!(keys(&o.datagram(&v, 1.0, 1.0)), vec![(7, 0), (9, 1)]);
        // After that only the busy replica is repeated.
        assert!(o.datagram(&v, 1.5, 1.0).is_empty());
        assert_eq!(keys(&o.datagram(&v, 2.0, 1.0)), vec![(9, 1)]);
    }

    #[test]
    fn the_gossip_copy_keeps_a_zero_for_the_peers_ttl() {
        let mut o = Outbox::default();
        let mut v: Vec<ReplicaLoad> = (0..4).map(|r| load(r, 0, 0)).collect();
        v[1] = load(1, 3, 10);
        assert_eq!(keys(&o.snapshot(&v, 0.0, 3.0)), vec![(1, 3)]);
        v[1] = load(1, 0, 0);
        assert_eq!(keys(&o.snapshot(&v, 0.5, 3.0)), vec![(1, 0)]);
        assert_eq!(keys(&o.snapshot(&v, 2.0, 3.0)), vec![(1, 0)]);
        assert!(
            o.snapshot(&v, 3.6, 3.0).is_empty(),
            "zero kept past the TTL"
        );
    }

    #[test]
    fn a_replica_that_goes_busy_again_is_news_at_once() {
        let mut o = Outbox::default();
        let mut v = vec![load(1, 1, 10)];
        o.datagram(&v, 0.0, 1.0);
        v[0] = load(1, 0, 0);
        o.datagram(&v, 0.1, 1.0);
        o.datagram(&v, 1.0, 1.0); // the zero repeated and forgotten
        v[0] = load(1, 1, 10);
        assert_eq!(keys(&o.datagram(&v, 1.1, 1.0)), vec![(1, 1)]);
    }
}
