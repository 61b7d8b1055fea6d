//! `sglang-cache-aware`: the SGLang model gateway's `cache_aware` policy.
//!
//! Reference: `peer-routers.md` §3 "SGLang gateway / SMG" (imbalance rule and CLI
//! defaults; per-worker in-flight counts are router-local, never shared) and §1
//! (approximate trees); the SMG docs page `concepts/routing/cache-aware.md` and the
//! policy's module header in `model_gateway/src/policies/cache_aware.rs`.
//!
//! With `Lᵢ` the requests this node has in flight on candidate `i` (count):
//! 1. **Imbalanced** when `max L − min L > balance_abs_threshold` **and**
//!    `max L > balance_rel_threshold × min L`: shortest queue, i.e. argmin `L`.
//! 2. Otherwise, with match rate `mᵢ` = cached prompt tokens / prompt tokens (0..=1,
//!    SGLang's matched characters / request characters): if `max m > cache_threshold`,
//!    the best-matching candidate (ties by lower `L` — the tie-break SGLang documents
//!    for its event-driven flavour — then at random).
//! 3. Otherwise the candidate with the **smallest tree** ("most cache capacity").
//!
//! Defaults are the gateway's CLI defaults, `cache_threshold` 0.3, `balance_abs_threshold`
//! 64, `balance_rel_threshold` 1.5 (the library's `CacheAwareConfig::default()` differs:
//! 0.5 / 32 / 1.1; a gateway started from the command line runs the former).
//!
//! Approximation: SGLang's tree size is the content routed to a worker that its tree
//! still holds; with the CLI `max_tree_size` of 2²⁶ characters it practically never
//! evicts, so it is the cumulative unique prefix content routed there. Our analogue is
//! the replica's prefix-index insertion cursor: the prefix blocks this node sent it that
//! it did not already hold. Like SGLang's per-gateway tree it counts only this node's
//! placements. Equal trees (say, all zero on a fresh node) are broken at random.
//! The retry order after the choice follows the same branch's key.

use std::sync::atomic::Ordering::Relaxed;

use super::{finite_or, prefix_score, rank_lex};
use crate::policy::{Candidate, DecideCtx, Decision, Policy, RequestProfile, rank};

/// Thresholds of `cache_aware` (SGLang gateway CLI defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct SglangCacheAware {
    /// Minimum match rate (exclusive, 0..1) for cache-affinity routing.
    pub cache_threshold: f64,
    /// Load spread (requests) above which the fleet may be imbalanced.
    pub balance_abs_threshold: f64,
    /// Load ratio above which the fleet may be imbalanced.
    pub balance_rel_threshold: f64,
}

impl Default for SglangCacheAware {
    fn default() -> Self {
        Self {
            cache_threshold: 0.3,
            balance_abs_threshold: 64.0,
            balance_rel_threshold: 1.5,
        }
    }
}

/// Which of the three rules decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Branch {
    Imbalanced,
    CacheMatch,
    SmallestTree,
}

impl SglangCacheAware {
    /// Both imbalance conditions, on router-local in-flight counts.
    pub fn is_imbalanced(&self, loads: &[f64]) -> bool {
        let min = loads.iter().copied().fold(f64::INFINITY, f64::min);
        let max = loads.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        max - min > self.balance_abs_threshold && max > self.balance_rel_threshold * min
    }

    /// The ranking and the rule that produced it.
    pub fn rank(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        rng: &mut dyn rand::RngCore,
    ) -> (Vec<usize>, Branch) {
        // Router-local counts: SGLang gateways never share in-flight load.
        let loads: Vec<f64> = cands
            .iter()
            .map(|c| finite_or(c.own.requests, 0.0).max(0.0))
            .collect();
        if self.is_imbalanced(&loads) {
            return (rank::by_cost(&loads, rng), Branch::Imbalanced);
        }
        let rates: Vec<f64> = cands.iter().map(|c| prefix_score(req, c)).collect();
        let best = rates.iter().copied().fold(0.0, f64::max);
        if best > self.cache_threshold {
            let keys: Vec<(f64, f64)> = rates.iter().zip(&loads).map(|(&m, &l)| (-m, l)).collect();
            return (rank_lex(&keys, rng), Branch::CacheMatch);
        }
        let trees: Vec<f64> = cands
            .iter()
            .map(|c| c.replica.prefix_cursor().load(Relaxed) as f64)
            .collect();
        (rank::by_cost(&trees, rng), Branch::SmallestTree)
    }
}

impl Policy for SglangCacheAware {
    fn name(&self) -> &'static str {
        "sglang-cache-aware"
    }

    fn decide(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision {
        let (order, branch) = self.rank(req, cands, ctx.rng);
        let mut d = Decision::route(order);
        if branch == Branch::Imbalanced {
            d.fallback = Some("load-imbalanced");
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use crate::ledger::Load;
    use rand::SeedableRng;

    fn branch(cands: &[Candidate<'_>], prompt: u32) -> (usize, Branch) {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(11);
        let (o, b) = SglangCacheAware::default().rank(&req(prompt), cands, &mut rng);
        (o[0], b)
    }

    #[test]
    fn imbalance_needs_both_conditions() {
        let p = SglangCacheAware::default();
        assert!(
            p.is_imbalanced(&[100.0, 10.0]),
            "spread 90 > 64 and 100 > 15"
        );
        assert!(!p.is_imbalanced(&[60.0, 0.0]), "spread 60 ≤ 64");
        assert!(!p.is_imbalanced(&[300.0, 210.0]), "300 ≤ 1.5 × 210");
        assert!(
            p.is_imbalanced(&[300.0, 199.0]),
            "300 > 298.5 and spread 101"
        );
        assert!(p.is_imbalanced(&[65.0, 0.0]), "any load beats 1.5 × 0");
    }

    #[test]
    fn imbalanced_fleet_goes_to_the_shortest_queue() {
        let rs = replicas(3);
        let cs = vec![
            cand(&rs[0], 1000, requests(100.0)),
            cand(&rs[1], 0, requests(30.0)),
            cand(&rs[2], 0, requests(10.0)),
        ];
        assert_eq!(branch(&cs, 1000), (2, Branch::Imbalanced));
        assert_eq!(
            ranking(&SglangCacheAware::default(), &req(1000), &cs, 0),
            vec![2, 1, 0]
        );
    }

    #[test]
    fn balanced_fleet_follows_the_best_match() {
        let rs = replicas(3);
        let cs = vec![
            cand(&rs[0], 500, requests(300.0)),
            cand(&rs[1], 800, requests(210.0)),
            cand(&rs[2], 0, requests(250.0)),
        ];
        assert_eq!(branch(&cs, 1000), (1, Branch::CacheMatch));
        // Equal best matches: the less loaded one.
        let cs = vec![
            cand(&rs[0], 800, requests(9.0)),
            cand(&rs[1], 800, requests(3.0)),
            cand(&rs[2], 100, requests(0.0)),
        ];
        assert_eq!(branch(&cs, 1000), (1, Branch::CacheMatch));
    }

    #[test]
    fn weak_match_goes_to_the_smallest_tree() {
        let rs = replicas(3);
        rs[0].prefix_cursor.store(500, Relaxed);
        rs[1].prefix_cursor.store(100, Relaxed);
        rs[2].prefix_cursor.store(300, Relaxed);
        // 0.3 is not above the threshold; replica 1 is the busiest but has the smallest tree.
        let cs = vec![
            cand(&rs[0], 300, requests(1.0)),
            cand(&rs[1], 0, requests(20.0)),
            cand(&rs[2], 200, requests(0.0)),
        ];
        assert_eq!(branch(&cs, 1000), (1, Branch::SmallestTree));
        assert_eq!(
            ranking(&SglangCacheAware::default(), &req(1000), &cs, 4),
            vec![1, 2, 0]
        );
    }

    /// Peers' load is invisible to an SGLang gateway: it cannot trigger the imbalance rule.
    #[test]
    fn only_router_local_load_counts() {
        let rs = replicas(2);
        let mut hot = cand(&rs[0], 900, requests(2.0));
        hot.peers = requests(500.0);
        let cs = vec![hot, cand(&rs[1], 0, requests(0.0))];
        assert_eq!(branch(&cs, 1000), (0, Branch::CacheMatch));
    }

    #[test]
    fn equal_trees_are_random_and_seeded() {
        let rs = replicas(3);
        let cs: Vec<_> = rs.iter().map(|r| cand(r, 0, Load::default())).collect();
        let p = SglangCacheAware::default();
        let counts = first_counts(&p, &req(100), &cs, 600);
        assert!(counts.iter().all(|&n| n > 120), "{counts:?}");
        assert_eq!(
            ranking(&p, &req(100), &cs, 77),
            ranking(&p, &req(100), &cs, 77)
        );
    }

    #[test]
    fn survives_nan_loads_and_empty_prompts() {
        let rs = replicas(2);
        let cs = vec![
            cand(&rs[0], 5, requests(f64::NAN)),
            cand(&rs[1], 0, requests(f64::INFINITY)),
        ];
        ranking(&SglangCacheAware::default(), &req(0), &cs, 1);
    }
}
