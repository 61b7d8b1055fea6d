//! Fault injection for tests and chaos drills: a shared partition table.
//!
//! Nodes are named by their advertise address. While a partition is set, traffic between
//! two nodes placed in different groups is dropped in both directions (outgoing gossip
//! frames and datagrams are not sent; incoming ones are discarded). Nodes in no group are
//! unaffected. One `FaultInjector` is shared (cheap clone) by all meshes of a test.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::RwLock;

/// A shared partition table. `Default` is "no faults".
#[derive(Clone, Default, Debug)]
pub struct FaultInjector {
    groups: Arc<RwLock<HashMap<SocketAddr, usize>>>,
}

impl FaultInjector {
    pub fn new() -> Self {
        Self::default()
    }

    /// Splits nodes into groups that cannot talk to each other. Replaces any prior split.
    pub fn partition(&self, groups: &[&[SocketAddr]]) {
        let mut map = HashMap::new();
        for (i, g) in groups.iter().enumerate() {
            for a in *g {
                map.insert(*a, i);
            }
        }
        *self.groups.write() = map;
    }

    /// Removes every partition.
    pub fn heal(&self) {
        self.groups.write().clear();
    }

    /// Whether traffic between `a` and `b` is currently dropped.
    pub fn blocked(&self, a: SocketAddr, b: SocketAddr) -> bool {
        let g = self.groups.read();
        match (g.get(&a), g.get(&b)) {
            (Some(x), Some(y)) => x != y,
            _ => false,
        }
    }
}
