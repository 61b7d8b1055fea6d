//! Which nodes scrape which replica: rendezvous (highest-random-weight) hashing over
//! the live members of the region, `k` owners per replica. Every node computes the
//! same owners from the same member list, and a member joining or leaving moves only
//! the replicas it owned, so scrape load per replica stays at `k` however many nodes
//! there are.

use xxhash_rust::xxh3::xxh3_64_with_seed;

#[derive(Clone, Debug, Default)]
pub struct Owners {
    /// This node's id.
    pub me: String,
    /// Live members of the region (this node included), sorted.
    pub members: Vec<String>,
    /// Owners per replica.
    pub k: usize,
}

impl Owners {
    pub fn new(me: &str, mut members: Vec<String>, k: usize) -> Self {
        if !members.iter().any(|m| m == me) {
            members.push(me.to_string());
        }
        members.sort();
        members.dedup();
        Self {
            me: me.to_string(),
            members,
            k: k.max(1),
        }
    }

    fn weight(node: &str, replica: u64) -> u64 {
        xxh3_64_with_seed(node.as_bytes(), replica)
    }

    /// The owners of `replica`, highest weight first.
    pub fn owners(&self, replica: u64) -> Vec<&str> {
        let mut w: Vec<(u64, &str)> = self
            .members
            .iter()
            .map(|m| (Self::weight(m, replica), m.as_str()))
            .collect();
        w.sort_unstable_by(|a, b| b.cmp(a));
        w.into_iter().take(self.k).map(|(_, m)| m).collect()
    }

    /// Whether this node ranks first among `replica`'s owners.
    pub fn first(&self, replica: u64) -> bool {
        self.members
            .iter()
            .max_by_key(|m| Self::weight(m, replica))
            .is_some_and(|m| *m == self.me)
    }

    /// Whether this node is among `replica`'s owners.
    pub fn owns(&self, replica: u64) -> bool {
        self.owners(replica).contains(&self.me.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Owners;

    #[test]
    fn every_replica_has_k_owners_and_load_spreads() {
        let members: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let views: Vec<Owners> = members
            .iter()
            .map(|m| Owners::new(m, members.clone(), 2))
            .collect();
        let mut per_node = vec![0usize; 8];
        for r in 0..400u64 {
            let owners: Vec<usize> = (0..8).filter(|&i| views[i].owns(r)).collect();
            assert_eq!(owners.len(), 2, "replica {r}");
            let firsts: Vec<usize> = (0..8).filter(|&i| views[i].first(r)).collect();
            assert_eq!(firsts.len(), 1, "one first owner of replica {r}");
            assert!(owners.contains(&firsts[0]), "the first owner owns {r}");
            for o in owners {
                per_node[o] += 1;
            }
        }
        // 800 ownerships over 8 nodes: each near 100.
        assert!(
            per_node.iter().all(|&n| (60..=140).contains(&n)),
            "{per_node:?}"
        );
    }

    #[test]
    fn a_leaving_member_moves_only_its_replicas() {
        let all: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
        let before = Owners::new("n0", all.clone(), 1);
        let after = Owners::new("n0", all[..5].to_vec(), 1);
        for r in 0..300u64 {
            let (b, a) = (before.owners(r)[0], after.owners(r)[0]);
            if b != "n5" {
                assert_eq!(a, b, "replica {r} moved needlessly");
            }
        }
    }

    #[test]
    fn alone_a_node_owns_everything() {
        let o = Owners::new("solo", vec![], 2);
        assert!((0..50).all(|r| o.owns(r)));
    }
}
