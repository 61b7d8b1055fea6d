//! The shortlist: which of a large fleet's eligible candidates a forecasting policy
//! evaluates in full.
//!
//! The `slo` policy's evaluation of one candidate (observation, two model
//! evaluations, the interference guard, the tail bound) costs ≈ 150 ns on a 2-core
//! Xeon VM, so evaluating all of 1,024 replicas costs ≈ 180 µs per decision: more than
//! everything else the proxy does for the request. Most of a large fleet cannot win:
//! a placement's forecast grows with the work queued ahead of it, so within one
//! hardware class the replicas with the most outstanding tokens rank last.
//!
//! Of `n > size` candidates the shortlist keeps, in this order, until `size` are kept:
//! 1. the policy's previous pick ([`Shortlist::keep`]), which its hysteresis needs
//!    among the evaluated;
//! 2. the `size / 4` holding the most of the prompt's prefix (more cached tokens
//!    first, then fewer outstanding tokens), so a hit whose holder is busy is still
//!    weighed against the idle misses;
//! 3. in each group of the same predictor class and side of the region line (local or
//!    remote), the least loaded by `token-load`'s key — outstanding tokens with this
//!    request there, `uncached prompt + expected output + in flight` — the remaining
//!    places shared evenly between the groups (a group smaller than its share gives
//!    the rest to the others). Per group, because a faster class's least-loaded
//!    replica can beat a slower class's idle one, and a local fit must stay in view
//!    of the local-first rule. Ties fall at random (`ctx.rng`), so an idle fleet's
//!    probes and two-choices draws are not pinned to its first indices.
//!
//! The kept rows stay in candidate order. With `n ≤ size` nothing is dropped and no
//! random number is drawn: the decision is exactly the full evaluation's.
//! Cost: one pass for the keys (O(n)), one pass per rule and group keeping its k
//! least by bounded insertion (O(n) comparisons with the current k-th, plus
//! O(k log k) per insertion, k ≤ `size`), one move of the kept rows; no sort of the
//! fleet. Against one `select_nth_unstable` per group it cut the decision's
//! instructions at 100 candidates by 3% and its median at 1,024 from ≈ 51 to ≈ 41 µs,
//! with the same decisions (the k least of a strict order are one set).

use super::RequestProfile;
#[cfg(test)]
use super::{Candidate, features};
use rand::Rng;

/// What a policy asks to be shortlisted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shortlist {
    /// Most candidates evaluated (at least 1).
    pub size: usize,
    /// A replica id ([`crate::view::ReplicaView::id`]) kept whatever its load.
    pub keep: Option<u32>,
}

/// What the shortlist reads of one eligible replica.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub id: u32,
    /// Outstanding tokens there, this node's and its peers' (`Load::outstanding_tokens`).
    pub outstanding: f64,
    /// The request's prompt tokens cached there.
    pub cached: u32,
    /// Predictor class and whether it is in this node's region.
    pub group: (u64, bool),
}

/// A candidate's standing for rule 3: fewer outstanding tokens first, then a random
/// tie-break.
#[derive(Clone, Copy)]
struct Ranked {
    tokens: f64,
    tie: u32,
    index: usize,
}

fn by_load(a: &Ranked, b: &Ranked) -> std::cmp::Ordering {
    a.tokens.total_cmp(&b.tokens).then(a.tie.cmp(&b.tie))
}

/// The candidates of `cands` the policy evaluates for `req` (see the module docs), in
/// candidate order: the reference the shortlisted build is tested against, which ranks
/// from light reads and never builds the dropped rows.
#[cfg(test)]
pub(crate) fn select<'a>(
    req: &RequestProfile,
    cands: Vec<Candidate<'a>>,
    s: Shortlist,
    rng: &mut dyn rand::RngCore,
) -> Vec<Candidate<'a>> {
    if cands.len() <= s.size.max(1) {
        return cands;
    }
    let entries: Vec<Entry> = cands
        .iter()
        .map(|c| Entry {
            id: c.replica.id(),
            outstanding: c.load().outstanding_tokens(),
            cached: c.cached_tokens,
            group: (features::key(c).class, c.replica.remote_rtt_ms().is_none()),
        })
        .collect();
    let kept = choose(req, &entries, s, rng);
    // In place: only the kept rows move (a collect through an iterator would read
    // every ~390-byte row out and back).
    let mut cands = cands;
    let mut at = 0;
    cands.retain(|_| {
        at += 1;
        kept[at - 1]
    });
    cands
}

/// Which of `entries` are kept for `req`: all of them when they are at most
/// `s.size`, without drawing a random number.
pub fn choose(
    req: &RequestProfile,
    entries: &[Entry],
    s: Shortlist,
    rng: &mut dyn rand::RngCore,
) -> Vec<bool> {
    let size = s.size.max(1);
    let n = entries.len();
    if n <= size {
        return vec![true; n];
    }
    let mut kept = vec![false; n];
    let mut count = 0usize;
    if let Some(id) = s.keep
        && let Some(i) = entries.iter().position(|e| e.id == id)
    {
        kept[i] = true;
        count += 1;
    }
    // `token-load`'s key: the outstanding tokens there with this request added.
    let ranked: Vec<Ranked> = entries
        .iter()
        .enumerate()
        .map(|(index, e)| Ranked {
            tokens: e.outstanding
                + (req.prompt_tokens.saturating_sub(e.cached) as f64
                    + req.expected_output_tokens as f64),
            tie: rng.random(),
            index,
        })
        .collect();
    // 2: the largest prefix holders.
    let by_hold = |a: &Ranked, b: &Ranked| {
        entries[b.index]
            .cached
            .cmp(&entries[a.index].cached)
            .then(by_load(a, b))
    };
    let mut best = Vec::with_capacity(size);
    let holders = ranked
        .iter()
        .filter(|r| !kept[r.index] && entries[r.index].cached > 0);
    least(holders, (size / 4).min(size - count), by_hold, &mut best);
    for r in &best {
        kept[r.index] = true;
    }
    count += best.len();
    // 3: per class and side, the least loaded, the places shared evenly.
    let mut groups: Vec<((u64, bool), usize)> = Vec::new();
    for r in ranked.iter().filter(|r| !kept[r.index]) {
        let g = entries[r.index].group;
        match groups.iter_mut().find(|(k, _)| *k == g) {
            Some((_, len)) => *len += 1,
            None => groups.push((g, 1)),
        }
    }
    // Smallest first, so what a small group cannot use passes to the larger ones.
    groups.sort_by_key(|&(_, len)| len);
    let mut left = groups.len();
    for (g, len) in groups {
        let share = (size - count).div_ceil(left).min(len);
        left -= 1;
        let members = ranked
            .iter()
            .filter(|r| entries[r.index].group == g && !kept[r.index]);
        least(members, share, by_load, &mut best);
        for r in &best {
            kept[r.index] = true;
        }
        count += best.len();
    }
    kept
}

/// The `k` least of `items` under `cmp` (a strict order on distinct items: the set is
/// unique, whatever the method) into `out`, by a bounded insertion: with `k` a few
/// and the items tens, most cost one comparison with the current `k`-th, where a
/// selection partitions every item several times.
fn least<'a>(
    items: impl Iterator<Item = &'a Ranked>,
    k: usize,
    cmp: impl Fn(&Ranked, &Ranked) -> std::cmp::Ordering,
    out: &mut Vec<Ranked>,
) {
    out.clear();
    if k == 0 {
        return;
    }
    for r in items {
        if out.len() == k {
            if cmp(r, &out[k - 1]).is_ge() {
                continue;
            }
            out.pop();
        }
        let at = out.partition_point(|o| cmp(o, r).is_lt());
        out.insert(at, *r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ledger::Load, policy::peers::testkit, view::PlainReplica};
    use rand::{SeedableRng, rngs::SmallRng};

    fn loaded(tokens: f64) -> Load {
        Load {
            requests: 1.0,
            queued_prefill_tokens: tokens,
            ..Default::default()
        }
    }

    /// `n` replicas of one hardware class.
    fn fleet(n: u32) -> Vec<PlainReplica> {
        let mut rs = testkit::replicas(n);
        for r in &mut rs {
            r.key.class = 1;
        }
        rs
    }

    fn cands<'a>(rs: &'a [PlainReplica], loads: &[f64]) -> Vec<Candidate<'a>> {
        rs.iter()
            .zip(loads)
            .map(|(r, &t)| testkit::cand(r, 0, loaded(t)))
            .collect()
    }

    fn ids(cs: &[Candidate<'_>]) -> Vec<u32> {
        cs.iter().map(|c| c.replica.id()).collect()
    }

    #[test]
    fn the_bounded_insertion_keeps_the_k_least() {
        let mut rng = SmallRng::seed_from_u64(5);
        let mut out = Vec::new();
        for round in 0..500 {
            let n = round % 60;
            // Few distinct loads, so ties on load fall to the random tie-break.
            let items: Vec<Ranked> = (0..n)
                .map(|index| Ranked {
                    tokens: f64::from(rng.random_range(0..8u32)) * 100.0,
                    tie: rng.random(),
                    index,
                })
                .collect();
            let k = rng.random_range(0..=n + 2);
            least(items.iter(), k, by_load, &mut out);
            let mut want = items.clone();
            want.sort_by(by_load);
            want.truncate(k);
            let ids = |v: &[Ranked]| v.iter().map(|r| r.index).collect::<Vec<_>>();
            assert_eq!(ids(&out), ids(&want), "n {n}, k {k}");
        }
    }

    #[test]
    fn a_fleet_within_the_size_is_evaluated_whole_without_drawing() {
        let rs = fleet(4);
        let req = testkit::req(100);
        let mut rng = SmallRng::seed_from_u64(7);
        let before = rng.clone().random::<u64>();
        let out = select(
            &req,
            cands(&rs, &[4.0, 3.0, 2.0, 1.0]),
            Shortlist {
                size: 4,
                keep: None,
            },
            &mut rng,
        );
        assert_eq!(ids(&out), vec![0, 1, 2, 3]);
        assert_eq!(rng.random::<u64>(), before, "no random number drawn");
    }

    #[test]
    fn keeps_the_least_loaded_the_previous_pick_and_the_largest_holder_in_candidate_order() {
        let rs = fleet(10);
        let req = testkit::req(1000);
        // Replica 9 is the least loaded; 0 the most; 5 holds most of the prompt but is
        // busy; 2 was the previous pick.
        let loads = [9e4, 8e4, 7e4, 6e4, 5e4, 8.5e4, 3e4, 2e4, 1e4, 0.0];
        let mut cs = cands(&rs, &loads);
        cs[5].cached_tokens = 900;
        cs[3].cached_tokens = 100;
        let mut rng = SmallRng::seed_from_u64(1);
        let out = select(
            &req,
            cs,
            Shortlist {
                size: 5,
                keep: Some(2),
            },
            &mut rng,
        );
        // keep 2; size/4 = 1 holder: 5 (900 cached beats 3's 100); then the three least
        // loaded: 9, 8, 7.
        assert_eq!(ids(&out), vec![2, 5, 7, 8, 9]);
    }

    #[test]
    fn each_hardware_class_keeps_its_least_loaded_share() {
        // Six fast replicas, all busier than every one of six slow ones: load alone would
        // keep only slow ones, and the forecast could never weigh the fast hardware.
        let mut rs = fleet(12);
        for r in rs.iter_mut().take(6) {
            r.key.class = 11;
        }
        let loads = [
            9e3, 8e3, 7e3, 6e3, 5e3, 4e3, // fast
            3e3, 2.5e3, 2e3, 1.5e3, 1e3, 5e2, // slow
        ];
        let req = testkit::req(100);
        let mut rng = SmallRng::seed_from_u64(3);
        let out = select(
            &req,
            cands(&rs, &loads),
            Shortlist {
                size: 4,
                keep: None,
            },
            &mut rng,
        );
        assert_eq!(ids(&out), vec![4, 5, 10, 11]);
        assert_eq!(
            out.iter()
                .filter(|c| c.replica.predictor_key().class == 11)
                .count(),
            2
        );
    }

    #[test]
    fn a_small_group_gives_its_unused_share_to_the_others() {
        let mut rs = fleet(9);
        rs[0].key.class = 5;
        let req = testkit::req(100);
        let loads = [1e5, 8e3, 7e3, 6e3, 5e3, 4e3, 3e3, 2e3, 1e3];
        let mut rng = SmallRng::seed_from_u64(3);
        let out = select(
            &req,
            cands(&rs, &loads),
            Shortlist {
                size: 5,
                keep: None,
            },
            &mut rng,
        );
        // The lone class-5 replica is kept (its group's share), the other four places
        // go to the other group's least loaded.
        assert_eq!(ids(&out), vec![0, 5, 6, 7, 8]);
    }

    #[test]
    fn ties_fall_at_random_not_to_the_first_indices() {
        let rs = fleet(40);
        let req = testkit::req(100);
        let mut seen = [false; 40];
        let mut rng = SmallRng::seed_from_u64(9);
        for _ in 0..50 {
            let out = select(
                &req,
                cands(&rs, &[0.0; 40]),
                Shortlist {
                    size: 4,
                    keep: None,
                },
                &mut rng,
            );
            assert_eq!(out.len(), 4);
            for c in &out {
                seen[c.replica.id() as usize] = true;
            }
        }
        assert!(
            seen.iter().filter(|&&s| s).count() > 30,
            "an idle fleet's shortlist covers it over many decisions"
        );
    }
}
