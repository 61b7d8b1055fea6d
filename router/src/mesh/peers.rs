//! What the node knows of its peers' placements, folded into each replica's
//! `peer_load`.
//!
//! Invariants: a peer's load on a replica is its latest report (datagram or gossip,
//! newest `seq`/time wins); reports older than the TTL count as nothing, so a dead or
//! partitioned peer's placements expire; a replica's `peer_load` is the sum over
//! peers other than this node, stamped with the oldest contributing report's time.

use std::{collections::HashMap, sync::Arc};

use super::schema::{InflightVector, ReplicaLoad};

use crate::{
    fleet::{PeerLoad, Replica},
    ledger::Load,
};

/// One peer's latest load on one replica.
#[derive(Clone, Copy, Debug)]
struct Report {
    load: ReplicaLoad,
    seq: u64,
    at_s: f64,
}

#[derive(Debug, Default)]
pub struct PeerTable {
    /// peer → replica key → report.
    peers: HashMap<Arc<str>, HashMap<u64, Report>>,
}

/// Converts our ledger's load to its wire form (counts and token sums as integers,
/// rates as f32; `queued_streams` and `step_residual_s` stay local). The wire form
/// survives `from_wire` then `to_wire` unchanged (tested).
pub fn to_wire(replica: u64, l: &Load) -> ReplicaLoad {
    let u = |x: f64| x.clamp(0.0, u32::MAX as f64) as u32;
    ReplicaLoad {
        replica,
        requests: u(l.requests),
        queued_prefill_tokens: u(l.queued_prefill_tokens),
        decoding_requests: u(l.decoding_requests),
        decode_context_tokens: u(l.decode_context_tokens),
        prefill_inflow_tps: l.prefill_inflow_tps.max(0.0) as f32,
        queued_requests: u(l.queued_requests),
        queued_attention_pairs: l.queued_attention_pairs.max(0.0) as f32,
        decode_remaining_tokens: u(l.decode_remaining_tokens),
        min_tpot_slo_ms: l.min_tpot_slo_ms.unwrap_or(0.0) as f32,
    }
}

fn from_wire(w: &ReplicaLoad) -> Load {
    Load {
        requests: w.requests as f64,
        queued_requests: w.queued_requests as f64,
        // Not on the wire: the slack hold sees this node's queued streams only.
        queued_streams: 0.0,
        queued_prefill_tokens: w.queued_prefill_tokens as f64,
        queued_attention_pairs: w.queued_attention_pairs as f64,
        decoding_requests: w.decoding_requests as f64,
        decode_context_tokens: w.decode_context_tokens as f64,
        decode_remaining_tokens: w.decode_remaining_tokens as f64,
        prefill_inflow_tps: w.prefill_inflow_tps as f64,
        min_tpot_slo_ms: (w.min_tpot_slo_ms > 0.0).then_some(w.min_tpot_slo_ms as f64),
        // A peer's step phase is stale by the time it arrives: never gossiped.
        step_residual_s: 0.0,
        // Nor a peer's queue age: its clock and its streams are its own.
        queue_age_s: 0.0,
    }
}

impl PeerTable {
    /// Takes a peer's (possibly partial) vector received at `now_s`, `age_s` after it
    /// was made. Returns whether anything changed.
    pub fn update(&mut self, peer: &Arc<str>, v: &InflightVector, now_s: f64, age_s: f64) -> bool {
        let table = self.peers.entry(peer.clone()).or_default();
        let at_s = now_s - age_s.max(0.0);
        let mut changed = false;
        for l in &v.loads {
            let newer = table
                .get(&l.replica)
                .is_none_or(|r| (v.seq, at_s) > (r.seq, r.at_s));
            if newer {
                table.insert(
                    l.replica,
                    Report {
                        load: *l,
                        seq: v.seq,
                        at_s,
                    },
                );
                changed = true;
            }
        }
        changed
    }

    /// Forgets a peer (it left the mesh).
    pub fn remove(&mut self, peer: &str) -> bool {
        self.peers.remove(peer).is_some()
    }

    /// Drops reports older than `ttl_s`.
    pub fn expire(&mut self, now_s: f64, ttl_s: f64) {
        for t in self.peers.values_mut() {
            t.retain(|_, r| now_s - r.at_s <= ttl_s);
        }
        self.peers.retain(|_, t| !t.is_empty());
    }

    /// Peers with at least one live report.
    pub fn peers(&self) -> Vec<(Arc<str>, usize, f64)> {
        self.peers
            .iter()
            .map(|(p, t)| {
                (
                    p.clone(),
                    t.len(),
                    t.values().map(|r| r.at_s).fold(f64::NEG_INFINITY, f64::max),
                )
            })
            .collect()
    }

    /// Writes every replica's summed peer load.
    pub fn publish(&self, replicas: &[Arc<Replica>], now_s: f64) {
        for r in replicas {
            let mut sum = Load::default();
            let mut oldest = now_s;
            for t in self.peers.values() {
                if let Some(rep) = t.get(&r.key) {
                    sum = sum.plus(&from_wire(&rep.load));
                    oldest = oldest.min(rep.at_s);
                }
            }
            r.peer_load.store(PeerLoad {
                load: sum,
                updated_s: oldest,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ReplicaConfig;

    fn replica(url: &str) -> Arc<Replica> {
        Arc::new(
            Replica::new(
                0,
                &ReplicaConfig {
                    url: url.into(),
                    name: None,
                    class: None,
                    region: None,
                    max_batched_tokens: None,
                    ..Default::default()
                },
                "local",
                &Default::default(),
            )
            .unwrap(),
        )
    }

    fn vector(seq: u64, replica: u64, requests: u32) -> InflightVector {
        let l = Load {
            requests: requests as f64,
            queued_prefill_tokens: 100.0,
            min_tpot_slo_ms: Some(40.0),
            ..Load::default()
        };
        InflightVector {
            seq,
            at_ms: 0,
            loads: vec![to_wire(replica, &l)],
        }
    }

    #[test]
    fn the_wire_form_round_trips_through_the_ledgers_load() {
        let w = ReplicaLoad {
            replica: 9,
            requests: 3,
            queued_prefill_tokens: 4096,
            decoding_requests: 2,
            decode_context_tokens: 70_000,
            prefill_inflow_tps: 1234.5,
            queued_requests: 1,
            queued_attention_pairs: 9.5e6,
            decode_remaining_tokens: 800,
            min_tpot_slo_ms: 42.25,
        };
        assert_eq!(to_wire(9, &from_wire(&w)), w);
        let none = ReplicaLoad {
            min_tpot_slo_ms: 0.0,
            ..w
        };
        assert_eq!(from_wire(&none).min_tpot_slo_ms, None);
        assert_eq!(to_wire(9, &from_wire(&none)), none);
    }

    #[test]
    fn sums_peers_newest_wins_and_expires() {
        let r = replica("http://127.0.0.1:9000");
        let rs = vec![r.clone()];
        let mut t = PeerTable::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        assert!(t.update(&a, &vector(1, r.key, 3), 10.0, 0.0));
        assert!(t.update(&b, &vector(1, r.key, 4), 10.0, 0.0));
        assert!(
            !t.update(&a, &vector(0, r.key, 99), 10.0, 0.0),
            "older seq ignored"
        );
        t.publish(&rs, 10.0);
        let p = r.peer_load.load();
        assert_eq!(p.load.requests, 7.0);
        assert_eq!(p.load.queued_prefill_tokens, 200.0);
        assert_eq!(p.load.min_tpot_slo_ms, Some(40.0));
        t.update(&a, &vector(2, r.key, 1), 11.0, 0.0);
        t.expire(12.5, 2.0); // b's report (t=10) is too old; a's (t=11) survives
        t.publish(&rs, 12.5);
        assert_eq!(r.peer_load.load().load.requests, 1.0);
        assert!(t.remove("a"));
        t.publish(&rs, 12.5);
        assert_eq!(r.peer_load.load().load.requests, 0.0);
    }
}
