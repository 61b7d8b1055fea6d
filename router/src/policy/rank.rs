//! Ranking helpers shared by policies: sort by a cost with random tie-breaks, so
//! equal candidates are spread instead of always hitting the first.

use rand::Rng;

/// Indices `0..costs.len()` ordered by ascending cost; exact ties in random order.
pub fn by_cost(costs: &[f64], rng: &mut dyn rand::RngCore) -> Vec<usize> {
    let mut keyed: Vec<(f64, u32, usize)> = costs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                if c.is_nan() { f64::INFINITY } else { *c },
                rng.random::<u32>(),
                i,
            )
        })
        .collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().map(|(_, _, i)| i).collect()
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
}
