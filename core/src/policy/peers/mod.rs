//! The peer routers' policies — llm-d, SGLang's gateway and NVIDIA Dynamo — re-built
//! on our [`Policy`](super::Policy) trait, so they run side by side with ours on the
//! same inputs, in the binary (`headroom serve --policy <name>`) and in the fleet
//! simulator alike, under the names of [`PolicyName`](super::PolicyName).
//!
//! Each file follows one published policy and states its formula, its units and the
//! reference passage (`/work/shared/reference/…`) it follows, including where our
//! inputs only approximate theirs.
//!
//! Invariants, for every policy here: the decision ranks every candidate exactly once
//! (the choice first, the rest as retry targets); no input (NaN loads, missing scrapes,
//! zero-length prompts) makes it panic; all randomness comes from `ctx.rng`, so a seeded
//! rng gives the same ranking every time.

pub mod dynamo_kv;
pub mod llmd_predicted;
pub mod llmd_weighted;
pub mod sglang_cache_aware;

#[cfg(test)]
pub(crate) mod testkit;

use rand::Rng;

use super::{Candidate, RequestProfile, rank};

pub use dynamo_kv::DynamoKv;
pub use llmd_predicted::{LlmdPredicted, LlmdPredictedConfig};
pub use llmd_weighted::LlmdWeighted;
pub use sglang_cache_aware::SglangCacheAware;

/// Share of the prompt the candidate holds (0..=1): llm-d's `matchBlocks/totalBlocks`
/// and SGLang's match rate, from our approximate prefix index. An empty prompt has 0.
pub(crate) fn prefix_score(req: &RequestProfile, c: &Candidate<'_>) -> f64 {
    if req.prompt_tokens == 0 {
        return 0.0;
    }
    c.cached_tokens.min(req.prompt_tokens) as f64 / req.prompt_tokens as f64
}

/// Scraped waiting-queue length; 0 without a fresh scrape (an llm-d endpoint's metrics
/// read zero until its first scrape) or for a nonsense value.
pub(crate) fn scraped_waiting(c: &Candidate<'_>) -> f64 {
    c.scraped
        .as_ref()
        .map(|s| s.waiting)
        .filter(|w| w.is_finite() && *w >= 0.0)
        .unwrap_or(0.0)
}

/// Scraped KV-cache usage (0..=1); 0 without a fresh scrape, as above.
pub(crate) fn scraped_kv_usage(c: &Candidate<'_>) -> f64 {
    c.scraped
        .as_ref()
        .and_then(|s| s.kv_usage)
        .filter(|k| k.is_finite())
        .map_or(0.0, |k| k.clamp(0.0, 1.0))
}

/// A finite value or `fallback` (loads are sums of gossip and may be garbage).
pub(crate) fn finite_or(x: f64, fallback: f64) -> f64 {
    if x.is_finite() { x } else { fallback }
}

/// Indices ordered by ascending `(primary, secondary)` keys, exact ties in random
/// order; NaN sorts as +∞.
pub(crate) fn rank_lex(keys: &[(f64, f64)], rng: &mut dyn rand::RngCore) -> Vec<usize> {
    let clean = |x: f64| if x.is_nan() { f64::INFINITY } else { x };
    let mut keyed: Vec<(f64, f64, u32, usize)> = keys
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| (clean(a), clean(b), rng.random::<u32>(), i))
        .collect();
    keyed.sort_by(|x, y| {
        x.0.total_cmp(&y.0)
            .then(x.1.total_cmp(&y.1))
            .then(x.2.cmp(&y.2))
    });
    keyed.into_iter().map(|k| k.3).collect()
}

/// llm-d's `weighted-random-picker` extended to a full ranking: A-Res (Efraimidis &
/// Spirakis) keys `U^(1/w)` with `U` uniform in (0,1), largest first — a weighted
/// sample without replacement. Compared as `ln U / w` so tiny weights cannot underflow.
/// Weights ≤ 0 or NaN get key 0 and follow in random order; all of them ≤ 0 gives a
/// uniform random order (llm-d hands that case to its random picker).
/// Returns the entries of `indices`, reordered; `weights` is indexed by those entries.
pub fn a_res(indices: &[usize], weights: &[f64], rng: &mut dyn rand::RngCore) -> Vec<usize> {
    let costs: Vec<f64> = indices
        .iter()
        .map(|&i| {
            let w = weights[i];
            if w > 0.0 {
                let u = rng.random::<f64>().max(1e-10);
                -(u.ln() / w)
            } else {
                f64::INFINITY
            }
        })
        .collect();
    rank::by_cost(&costs, rng)
        .into_iter()
        .map(|k| indices[k])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_res_follows_weights() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let w = [3.0, 1.0, 0.0];
        let mut firsts = [0u32; 3];
        for _ in 0..4000 {
            let o = a_res(&[0, 1, 2], &w, &mut rng);
            assert_eq!(o.len(), 3);
            assert_eq!(o[2], 2, "a zero weight is never ahead of a positive one");
            firsts[o[0]] += 1;
        }
        // P(first = 0) = 3/4.
        let share = firsts[0] as f64 / 4000.0;
        assert!((share - 0.75).abs() < 0.03, "{firsts:?}");
        // All zero: uniform.
        let mut firsts = [0u32; 3];
        for _ in 0..3000 {
            firsts[a_res(&[0, 1, 2], &[0.0, f64::NAN, -1.0], &mut rng)[0]] += 1;
        }
        assert!(firsts.iter().all(|&n| n > 850), "{firsts:?}");
    }

    #[test]
    fn rank_lex_orders_by_both_keys() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let o = rank_lex(
            &[(1.0, 5.0), (0.0, 9.0), (1.0, 2.0), (f64::NAN, 0.0)],
            &mut rng,
        );
        assert_eq!(o, vec![1, 2, 0, 3]);
    }

    fn wild(x: u8) -> f64 {
        match x % 6 {
            0 => 0.0,
            1 => f64::NAN,
            2 => f64::INFINITY,
            3 => -5.0,
            4 => 1e12,
            _ => x as f64 * 37.0,
        }
    }

    proptest::proptest! {
        /// Any candidates, however garbled their loads and scrapes: every peer policy
        /// routes every candidate exactly once, the same way for the same seed.
        #[test]
        fn every_policy_ranks_all_candidates(
            cs in proptest::collection::vec((0u32..5000, proptest::prelude::any::<[u8; 5]>(), proptest::prelude::any::<bool>()), 1..7),
            prompt in 0u32..4000,
            slo in proptest::prelude::any::<[u8; 2]>(),
            seed in proptest::prelude::any::<u64>(),
        ) {
            let rs = testkit::replicas(cs.len() as u32);
            let cands: Vec<_> = cs
                .iter()
                .zip(&rs)
                .map(|((cached, w, has_scrape), r)| {
                    let load = crate::ledger::Load {
                        requests: wild(w[0]),
                        queued_prefill_tokens: wild(w[1]),
                        decode_context_tokens: wild(w[2]),
                        min_tpot_slo_ms: Some(wild(w[3])),
                        ..Default::default()
                    };
                    if *has_scrape {
                        testkit::cand_s(r, *cached, load, testkit::scraped(wild(w[4]), 1.0, wild(w[4]) / 100.0))
                    } else {
                        testkit::cand(r, *cached, load)
                    }
                })
                .collect();
            let mut req = testkit::req(prompt);
            req.slo = crate::policy::Slo { ttft_ms: wild(slo[0]), tpot_ms: wild(slo[1]) };
            let predictor = std::sync::Arc::new(headroom_predictor::SharedPredictor::default());
            for p in crate::policy::PolicyName::PEERS {
                let policy = crate::policy::build(p, predictor.clone(), &Default::default());
                let a = testkit::ranking(policy.as_ref(), &req, &cands, seed);
                proptest::prop_assert_eq!(a, testkit::ranking(policy.as_ref(), &req, &cands, seed));
            }
        }
    }
}
