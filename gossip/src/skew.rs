//! Peers' clock skew, estimated from their datagrams, so the age of what a peer
//! published does not depend on whether its wall clock agrees with ours.
//!
//! A datagram is stamped with its publisher's wall clock when sent and arrives after a
//! one-way delay `d ≥ 0`: `raw = local_now − stamp = skew + d`. The smallest `raw`
//! over a window is `skew + d_min` — on a LAN or loopback `d_min` is well under a
//! millisecond — so `age = raw − min(raw)` is the datagram's time in flight beyond the
//! fastest one, whatever the skew. Values published through gossip take the same
//! correction (their `raw` minus the peer's estimate); until a peer's first datagram
//! the raw age is used (clamped at zero, as before).
//!
//! The minimum is kept over two alternating windows of `WINDOW` (the estimate covers
//! the last 10–20 s), so a clock stepped backwards is followed within 20 s; one stepped
//! forwards at once. Invariants: one entry per live peer (dropped when it leaves);
//! `O(1)` per datagram.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Length of one minimum window.
const WINDOW: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug)]
struct Est {
    /// Smallest raw age (ms) in the current and the previous window.
    cur: i64,
    prev: i64,
    since: Instant,
}

impl Est {
    fn offset(&self) -> i64 {
        self.cur.min(self.prev)
    }
}

/// Per-peer skew estimates.
#[derive(Default)]
pub(crate) struct Skew {
    peers: Mutex<HashMap<Arc<str>, Est>>,
}

impl Skew {
    /// The age of a datagram from `node` stamped `stamp_ms`, read at `now_ms` (`at` on
    /// the monotonic clock); updates the estimate.
    pub fn datagram_age(
        &self,
        node: &Arc<str>,
        stamp_ms: u64,
        now_ms: u64,
        at: Instant,
    ) -> Duration {
        let raw = now_ms as i64 - stamp_ms as i64;
        let mut peers = self.peers.lock();
        let e = peers.entry(node.clone()).or_insert(Est {
            cur: raw,
            prev: raw,
            since: at,
        });
        if at.saturating_duration_since(e.since) >= WINDOW {
            e.prev = e.cur;
            e.cur = raw;
            e.since = at;
        }
        e.cur = e.cur.min(raw);
        Duration::from_millis((raw - e.offset()).max(0) as u64)
    }

    /// The age of a value `node` stamped `stamp_ms`, read at `now_ms`.
    pub fn value_age(&self, node: &str, stamp_ms: u64, now_ms: u64) -> Duration {
        let raw = now_ms as i64 - stamp_ms as i64;
        let offset = self.peers.lock().get(node).map_or(0, Est::offset);
        Duration::from_millis((raw - offset).max(0) as u64)
    }

    /// The skew estimate for `node` (ms; > 0: its clock is behind ours).
    pub fn estimate_ms(&self, node: &str) -> Option<i64> {
        self.peers.lock().get(node).map(Est::offset)
    }

    pub fn forget(&self, node: &str) {
        self.peers.lock().remove(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_do_not_depend_on_the_peers_clock() {
        let s = Skew::default();
        let t0 = Instant::now();
        let now = 1_000_000u64;
        // Peer `b` runs 5 s behind, `a` 5 s ahead; datagrams take 1–3 ms.
        for (node, skew) in [("a", -5_000i64), ("b", 5_000)] {
            let n: Arc<str> = node.into();
            for (k, d) in [3i64, 1, 2].iter().enumerate() {
                let stamp = (now as i64 + k as i64 * 100 - skew - d) as u64;
                let age = s.datagram_age(&n, stamp, now + k as u64 * 100, t0);
                assert!(age <= Duration::from_millis(2), "{node}: {age:?}");
            }
            assert!((s.estimate_ms(node).unwrap() - skew).abs() <= 3);
            // A value it published 4 s ago (by its clock) is 4 s old (± the delay).
            let stamp = (now as i64 - skew - 4_000) as u64;
            let age = s.value_age(node, stamp, now).as_millis() as i64;
            assert!((age - 4_000).abs() <= 3, "{node}: {age}");
        }
        // Without an estimate the raw age is used, clamped at zero.
        assert_eq!(s.value_age("c", now + 9_000, now), Duration::ZERO);
        assert_eq!(
            s.value_age("c", now - 2_000, now),
            Duration::from_millis(2_000)
        );
        s.forget("a");
        assert!(s.estimate_ms("a").is_none());
    }

    #[test]
    fn a_clock_stepped_back_is_followed_after_the_windows() {
        let s = Skew::default();
        let n: Arc<str> = "p".into();
        let t0 = Instant::now();
        assert_eq!(s.datagram_age(&n, 1_000, 1_000, t0), Duration::ZERO);
        // The peer's clock steps back 2 s: its datagrams look 2 s old for a while...
        let later = t0 + Duration::from_secs(11);
        assert_eq!(
            s.datagram_age(&n, 9_000, 11_000, later),
            Duration::from_millis(2_000)
        );
        // ...until both windows hold only post-step datagrams.
        let much_later = t0 + Duration::from_secs(22);
        s.datagram_age(&n, 20_000, 22_000, much_later);
        assert_eq!(s.estimate_ms("p"), Some(2_000));
        assert_eq!(
            s.datagram_age(&n, 20_500, 22_500, much_later),
            Duration::ZERO
        );
    }
}
