//! One live node per node id.
//!
//! Peers key placements by node id, so two live nodes with one id overwrite each
//! other's in-flight vectors and one node's load vanishes. Each node therefore checks:
//! - at start, before publishing anything: a member with its id at another address
//!   whose heartbeat advances while it watches is a live twin, and the newcomer refuses
//!   to start. A member at its own address is its own previous incarnation (restart);
//!   one whose heartbeat never moves is a dead one (a rescheduled pod) and is ignored.
//! - while running: a member with its id and a later generation (a newcomer) that
//!   gossip reports live is logged as an error once and counted in
//!   `headroom_mesh_duplicate_node_id_total`.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    time::{Duration, Instant},
};

use headroom_gossip::{MemberInfo, Mesh};
use parking_lot::Mutex;
use prometheus::{IntCounter, Registry};

/// Heartbeat movement smaller than this is jitter of the age arithmetic.
const MOVED: Duration = Duration::from_millis(10);
/// Heartbeat steps seen before a twin counts as live.
const LIVE_MOVES: u32 = 3;

/// A live twin found at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Twin {
    pub addr: SocketAddr,
    pub generation: u64,
}

fn twins<'a>(
    members: &'a [MemberInfo],
    id: &'a str,
    own_addr: SocketAddr,
) -> impl Iterator<Item = &'a MemberInfo> + 'a {
    members
        .iter()
        .filter(move |m| !m.is_self && m.live && &*m.node_id == id && m.addr != own_addr)
}

/// Watches the mesh for up to `window` for a live twin of `id`. Returns early once
/// peers have been heard for `settle` with no twin among them.
pub async fn check_at_start(
    mesh: &Mesh,
    id: &str,
    own_addr: SocketAddr,
    window: Duration,
    settle: Duration,
) -> Option<Twin> {
    let start = Instant::now();
    let mut contact: Option<Instant> = None;
    // (addr, generation) → (when its heartbeat last changed, times seen to change).
    let mut seen_moving: HashMap<(SocketAddr, u64), (Instant, u32)> = HashMap::new();
    while start.elapsed() < window {
        let now = Instant::now();
        let members = mesh.members().await;
        if contact.is_none() && members.iter().any(|m| !m.is_self && m.live) {
            contact = Some(now);
        }
        let mut candidates = 0;
        for m in twins(&members, id, own_addr) {
            candidates += 1;
            let beat = now.checked_sub(m.last_seen_age).unwrap_or(now);
            let e = seen_moving
                .entry((m.addr, m.generation))
                .or_insert((beat, 0));
            if beat > e.0 + MOVED {
                *e = (beat, e.1 + 1);
            }
            // A dead incarnation's heartbeat can step once or twice while views from
            // different seeds converge; a live one keeps stepping every gossip round.
            if e.1 >= LIVE_MOVES {
                return Some(Twin {
                    addr: m.addr,
                    generation: m.generation,
                });
            }
        }
        if candidates == 0 && contact.is_some_and(|c| c.elapsed() >= settle) {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    None
}

/// The running side: reports newcomers that share this node's id.
pub struct DuplicateWatch {
    counter: IntCounter,
    reported: Mutex<HashSet<(SocketAddr, u64)>>,
}

impl DuplicateWatch {
    pub fn new(registry: &Registry) -> Self {
        let counter = IntCounter::new(
            "headroom_mesh_duplicate_node_id_total",
            "Other live nodes seen presenting this node's id (each is refused or must be stopped).",
        )
        .expect("static counter options are valid");
        // Several nodes in one process (tests) share nothing: a failed second
        // registration only means this counter is not exported twice.
        let _ = registry.register(Box::new(counter.clone()));
        Self {
            counter,
            reported: Mutex::new(HashSet::new()),
        }
    }

    /// Checks one membership snapshot; returns how many new twins it reported.
    pub fn check(
        &self,
        members: &[MemberInfo],
        id: &str,
        own_addr: SocketAddr,
        own_generation: u64,
    ) -> usize {
        let mut n = 0;
        for m in twins(members, id, own_addr).filter(|m| m.generation > own_generation) {
            if self.reported.lock().insert((m.addr, m.generation)) {
                self.counter.inc();
                n += 1;
                tracing::error!(
                    node = %id, twin_addr = %m.addr, twin_generation = m.generation,
                    "another live node presents this node's id: peers will lose one of the two nodes' placements; stop it"
                );
            }
        }
        n
    }

    pub fn total(&self) -> u64 {
        self.counter.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use headroom_gossip::Scope;
    use std::sync::Arc;

    fn member(id: &str, addr: &str, generation: u64, is_self: bool) -> MemberInfo {
        MemberInfo {
            node_id: Arc::from(id),
            scope: Scope::Region,
            region: None,
            live: true,
            last_seen_age: Duration::ZERO,
            keys: vec![],
            addr: addr.parse().unwrap(),
            generation,
            is_self,
        }
    }

    #[test]
    fn newcomers_with_my_id_are_reported_once() {
        let w = DuplicateWatch::new(&Registry::new());
        let me: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let ms = vec![
            member("a", "127.0.0.1:1", 10, true),
            member("b", "127.0.0.1:2", 20, false),
            // My own previous incarnation lingering: older, ignored.
            member("a", "127.0.0.1:3", 5, false),
            member("a", "127.0.0.1:4", 30, false),
        ];
        assert_eq!(w.check(&ms, "a", me, 10), 1);
        assert_eq!(w.check(&ms, "a", me, 10), 0, "reported once");
        assert_eq!(w.total(), 1);
    }
}
