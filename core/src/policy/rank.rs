//! Ranking helpers shared by policies: sort by a cost with random tie-breaks, so
//! equal candidates are spread instead of always hitting the first.

use rand::Rng;

/// Indices `0..costs.len()` ordered by ascending cost; exact ties in random order.
///
/// One draw from `rng` seeds a splitmix64 sequence for the tie-break keys: a draw per
/// candidate through `dyn RngCore` was a tenth of a 64-candidate decision.
pub fn by_cost(costs: &[f64], rng: &mut dyn rand::RngCore) -> Vec<usize> {
    by_cost_top(costs, rng, usize::MAX)
}

/// As [`by_cost`], with only the first `top` in order; the rest follow in no particular
/// (but deterministic) order. The first `top` and the draws from `rng` are exactly
/// [`by_cost`]'s: a decision reads only its choice and retry targets, and sorting a
/// 1,024-candidate fleet to read three of them was a tenth of its cost.
pub fn by_cost_top(costs: &[f64], rng: &mut dyn rand::RngCore, top: usize) -> Vec<usize> {
    let seed = rng.random::<u64>();
    if (1..=SMALL_TOP).contains(&top) && top < costs.len() {
        return small_top(costs, seed, top);
    }
    let mut keyed: Vec<(f64, u64, u32)> = costs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                if c.is_nan() { f64::INFINITY } else { *c },
                mix64(seed.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))),
                i as u32,
            )
        })
        .collect();
    // The keys are distinct (the index is last), so an unstable sort is deterministic.
    let cmp = |a: &(f64, u64, u32), b: &(f64, u64, u32)| {
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
    };
    if top < keyed.len() {
        // The `top` least go first (O(n)), then only they are sorted.
        keyed.select_nth_unstable_by(top, cmp);
        keyed[..top].sort_unstable_by(cmp);
    } else {
        keyed.sort_unstable_by(cmp);
    }
    keyed.into_iter().map(|(_, _, i)| i as usize).collect()
}

/// Most `top` read in one pass ([`small_top`]); a decision reads its choice and retries.
const SMALL_TOP: usize = 8;

/// [`by_cost_top`] for a small `top` (1 ≤ `top` < `costs.len()`): the `top` least by
/// the same total order (cost, tie key, index), found in one pass that computes a tie
/// key only for a cost that could enter, then the rest in index order. At 1,024
/// candidates keying and partitioning every one was ≈ 5% of a decision.
fn small_top(costs: &[f64], seed: u64, top: usize) -> Vec<usize> {
    let key = |i: usize, c: f64| {
        (
            c,
            mix64(seed.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))),
            i as u32,
        )
    };
    let cmp = |a: &(f64, u64, u32), b: &(f64, u64, u32)| {
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
    };
    // Ascending; `len` of them filled.
    let mut best = [(f64::INFINITY, 0u64, 0u32); SMALL_TOP];
    let mut len = 0usize;
    for (i, &c) in costs.iter().enumerate() {
        let c = if c.is_nan() { f64::INFINITY } else { c };
        if len == top && c.total_cmp(&best[top - 1].0).is_gt() {
            continue;
        }
        let k = key(i, c);
        if len == top && cmp(&k, &best[top - 1]).is_ge() {
            continue;
        }
        // Insert in order, dropping the last when full.
        let mut j = if len == top { top - 1 } else { len };
        while j > 0 && cmp(&k, &best[j - 1]).is_lt() {
            best[j] = best[j - 1];
            j -= 1;
        }
        best[j] = k;
        len = (len + 1).min(top);
    }
    let mut order: Vec<usize> = Vec::with_capacity(costs.len());
    order.extend(best[..len].iter().map(|&(_, _, i)| i as usize));
    // The rest in index order: the chosen indices sorted, skipped by one moving
    // pointer rather than a search of all of them per candidate.
    let mut chosen = [0usize; SMALL_TOP];
    chosen[..len].copy_from_slice(&order[..len]);
    let chosen = &mut chosen[..len];
    chosen.sort_unstable();
    let mut from = 0;
    for &c in chosen.iter() {
        order.extend(from..c);
        from = c + 1;
    }
    order.extend(from..costs.len());
    order
}

/// splitmix64's finaliser: a bijection of u64 that scrambles neighbouring inputs.
#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    #[test]
    fn orders_by_cost_and_spreads_ties() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        assert_eq!(super::by_cost(&[3.0, 1.0, 2.0], &mut rng), vec![1, 2, 0]);
        let mut firsts = [0usize; 3];
        for _ in 0..300 {
            firsts[super::by_cost(&[1.0, 1.0, 1.0], &mut rng)[0]] += 1;
        }
        assert!(firsts.iter().all(|&n| n > 50), "{firsts:?}");
        assert_eq!(super::by_cost(&[f64::NAN, 0.0], &mut rng), vec![1, 0]);
    }

    /// The partial order's head is the full order's, on random costs with many ties, and
    /// it draws from the rng as the full order does.
    #[test]
    fn the_top_of_a_partial_order_is_the_full_orders() {
        use rand::Rng;
        let mut g = rand::rngs::SmallRng::seed_from_u64(7);
        for round in 0..500 {
            let n = g.random_range(0..80);
            let costs: Vec<f64> = (0..n)
                .map(|_| match g.random_range(0..8) {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    k => {
                        (k % 3) as f64
                            + if round % 2 == 0 {
                                g.random::<f64>()
                            } else {
                                0.0
                            }
                    }
                })
                .collect();
            let top = g.random_range(0..6);
            let (mut a, mut b) = (
                rand::rngs::SmallRng::seed_from_u64(round),
                rand::rngs::SmallRng::seed_from_u64(round),
            );
            let full = super::by_cost(&costs, &mut a);
            let part = super::by_cost_top(&costs, &mut b, top);
            assert_eq!(
                part[..top.min(n)],
                full[..top.min(n)],
                "{costs:?} top {top}"
            );
            let mut sorted = part.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "a permutation");
            assert_eq!(a.random::<u64>(), b.random::<u64>(), "same draws");
        }
    }
}
