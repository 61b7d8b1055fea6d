//! What the relay does to one datagram: the network faults between router nodes as a
//! pure decision (`NetFaults::fate`), so the rules are tested without sockets.
//!
//! Invariants: a datagram between nodes of different partition groups is always
//! dropped (before any other fault is drawn); every other fault is an independent draw
//! from the relay's seeded rng; a delivered datagram leaves after
//! `delay ± jitter` (never negative), a reordered one 10–40 ms later still, so the
//! ones behind it overtake; a duplicate is a second, independently delayed copy.

use rand::Rng;
use serde::Serialize;

/// The faults applied to datagrams between nodes (all off by default).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NetFaults {
    /// Partition group of each node (by node index); datagrams between different
    /// groups are dropped. Empty: no partition.
    pub groups: Vec<u8>,
    /// Probability a datagram is lost.
    pub loss: f64,
    /// Mean one-way delay (ms) and the half-width of its uniform jitter (ms).
    pub delay_ms: f64,
    pub jitter_ms: f64,
    /// Probability a datagram is delivered twice.
    pub duplicate: f64,
    /// Probability a datagram is held back 10–40 ms extra (overtaken by later ones).
    pub reorder: f64,
    /// Probability a delivered copy has a few of its bytes flipped.
    pub corrupt: f64,
    /// Junk datagrams of 1.3–60 KB sent to each node's gossip port per second (not
    /// relayed traffic: they come from a socket of their own).
    pub oversized_per_s: f64,
}

/// One copy to deliver.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Delivery {
    pub delay_ms: f64,
    pub corrupt: bool,
    pub reordered: bool,
}

/// What happens to a datagram.
#[derive(Clone, Debug, PartialEq)]
pub enum Fate {
    Partitioned,
    Lost,
    Deliver(Vec<Delivery>),
}

impl NetFaults {
    /// Whether nodes `a` and `b` can reach each other.
    pub fn connected(&self, a: usize, b: usize) -> bool {
        match (self.groups.get(a), self.groups.get(b)) {
            (Some(x), Some(y)) => x == y,
            _ => true,
        }
    }

    /// The fate of one datagram from node `from` to node `to`.
    pub fn fate(&self, from: usize, to: usize, rng: &mut impl Rng) -> Fate {
        if !self.connected(from, to) {
            return Fate::Partitioned;
        }
        if self.loss > 0.0 && rng.random::<f64>() < self.loss {
            return Fate::Lost;
        }
        let copies = if self.duplicate > 0.0 && rng.random::<f64>() < self.duplicate {
            2
        } else {
            1
        };
        let out = (0..copies)
            .map(|_| {
                let jitter = if self.jitter_ms > 0.0 {
                    rng.random_range(-self.jitter_ms..=self.jitter_ms)
                } else {
                    0.0
                };
                let reordered = self.reorder > 0.0 && rng.random::<f64>() < self.reorder;
                let extra = if reordered {
                    rng.random_range(10.0..=40.0)
                } else {
                    0.0
                };
                Delivery {
                    delay_ms: (self.delay_ms + jitter).max(0.0) + extra,
                    corrupt: self.corrupt > 0.0 && rng.random::<f64>() < self.corrupt,
                    reordered,
                }
            })
            .collect();
        Fate::Deliver(out)
    }
}

/// Flips 1–4 random bytes of `buf` (each to a different value).
pub fn corrupt(buf: &mut [u8], rng: &mut impl Rng) {
    if buf.is_empty() {
        return;
    }
    for _ in 0..rng.random_range(1..=4) {
        let i = rng.random_range(0..buf.len());
        buf[i] ^= rng.random_range(1..=255u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn draws(f: &NetFaults, n: usize) -> Vec<Fate> {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        (0..n).map(|_| f.fate(0, 1, &mut rng)).collect()
    }

    #[test]
    fn partition_drops_only_across_groups() {
        let f = NetFaults {
            groups: vec![0, 0, 1],
            ..NetFaults::default()
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        assert_eq!(f.fate(0, 2, &mut rng), Fate::Partitioned);
        assert_eq!(f.fate(2, 1, &mut rng), Fate::Partitioned);
        assert!(matches!(f.fate(0, 1, &mut rng), Fate::Deliver(c) if c.len() == 1));
        // 1+1+1: nobody reaches anybody.
        let all = NetFaults {
            groups: vec![0, 1, 2],
            ..NetFaults::default()
        };
        assert!(!all.connected(0, 1) && !all.connected(1, 2) && !all.connected(0, 2));
    }

    #[test]
    fn no_faults_delivers_each_datagram_once_at_once() {
        for fate in draws(&NetFaults::default(), 100) {
            assert_eq!(
                fate,
                Fate::Deliver(vec![Delivery {
                    delay_ms: 0.0,
                    corrupt: false,
                    reordered: false
                }])
            );
        }
    }

    #[test]
    fn rates_are_drawn_at_their_probabilities() {
        let f = NetFaults {
            loss: 0.2,
            duplicate: 0.1,
            corrupt: 0.05,
            delay_ms: 20.0,
            jitter_ms: 10.0,
            reorder: 0.1,
            ..NetFaults::default()
        };
        let n = 20_000;
        let fates = draws(&f, n);
        let lost = fates.iter().filter(|x| **x == Fate::Lost).count() as f64 / n as f64;
        let copies: Vec<&Delivery> = fates
            .iter()
            .filter_map(|x| match x {
                Fate::Deliver(c) => Some(c),
                _ => None,
            })
            .flatten()
            .collect();
        let delivered = fates.len() - fates.iter().filter(|x| **x == Fate::Lost).count();
        let dup = (copies.len() - delivered) as f64 / delivered as f64;
        let bad = copies.iter().filter(|c| c.corrupt).count() as f64 / copies.len() as f64;
        assert!((lost - 0.2).abs() < 0.015, "loss {lost}");
        assert!((dup - 0.1).abs() < 0.015, "duplicates {dup}");
        assert!((bad - 0.05).abs() < 0.01, "corrupt {bad}");
        for c in copies {
            let base = if c.reordered { 10.0 } else { 0.0 };
            assert!(c.delay_ms >= 10.0 + base - 1e-9, "{c:?}");
            assert!(c.delay_ms <= 30.0 + base + 30.0 + 1e-9, "{c:?}");
        }
    }

    #[test]
    fn corruption_changes_the_bytes() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let orig = vec![7u8; 64];
        for _ in 0..100 {
            let mut b = orig.clone();
            corrupt(&mut b, &mut rng);
            assert_ne!(b, orig);
            assert_eq!(b.len(), orig.len());
        }
    }
}
