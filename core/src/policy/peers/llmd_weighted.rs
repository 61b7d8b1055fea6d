//! `llmd-weighted`: llm-d's default scorer mix when the latency predictor is off.
//!
//! Reference: `llm-d.md` §1.4 ("When the predictor is disabled, the chart default is
//! instead `queue-scorer`(2) + `kv-cache-utilization-scorer`(2) +
//! `prefix-cache-scorer`(3)") and §1.2 (the scorers' formulas, `max-score-picker`).
//!
//! Per candidate `i` (all scores dimensionless, 0..=1):
//! - prefix `pᵢ = matchBlocks/totalBlocks` (`prefix-cache-scorer` with its default
//!   `matchLengthWeight` 0), here cached prompt tokens / prompt tokens from our
//!   approximate prefix index — the analogue of the EPP's `approx-prefix-cache-producer`;
//! - queue `qᵢ = (maxQ − Qᵢ)/(maxQ − minQ)` over the scraped waiting-queue lengths `Q`
//!   (requests), 1 for every candidate when all are equal;
//! - KV `kᵢ = 1 − KVᵢ`, the scraped KV-cache usage fraction.
//!
//! Total `sᵢ = 3·pᵢ + 2·qᵢ + 2·kᵢ` (0..=7); highest first, exact ties in random order
//! (llm-d's picker shuffles, then sorts descending). Like a real EPP it reads only engine
//! scrapes and its own prefix index — never our in-flight ledger. A candidate without a
//! fresh scrape reads zero queue and zero KV, as an llm-d endpoint does before its first
//! scrape.

use super::{prefix_score, scraped_kv_usage, scraped_waiting};
use crate::policy::{Candidate, DecideCtx, Decision, Policy, RequestProfile, rank};

/// Scorer weights (llm-d chart defaults 3 / 2 / 2).
#[derive(Clone, Debug, PartialEq)]
pub struct LlmdWeighted {
    pub prefix_weight: f64,
    pub queue_weight: f64,
    pub kv_weight: f64,
}

impl Default for LlmdWeighted {
    fn default() -> Self {
        Self {
            prefix_weight: 3.0,
            queue_weight: 2.0,
            kv_weight: 2.0,
        }
    }
}

impl LlmdWeighted {
    /// The weighted total per candidate (same indices).
    pub fn scores(&self, req: &RequestProfile, cands: &[Candidate<'_>]) -> Vec<f64> {
        let queues: Vec<f64> = cands.iter().map(scraped_waiting).collect();
        let min_q = queues.iter().copied().fold(f64::INFINITY, f64::min);
        let max_q = queues.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        cands
            .iter()
            .zip(&queues)
            .map(|(c, &q)| {
                let queue = if max_q > min_q {
                    (max_q - q) / (max_q - min_q)
                } else {
                    1.0
                };
                self.prefix_weight * prefix_score(req, c)
                    + self.queue_weight * queue
                    + self.kv_weight * (1.0 - scraped_kv_usage(c))
            })
            .collect()
    }
}

impl Policy for LlmdWeighted {
    fn name(&self) -> &'static str {
        "llmd-weighted"
    }

    fn decide(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision {
        let costs: Vec<f64> = self.scores(req, cands).into_iter().map(|s| -s).collect();
        Decision::route(rank::by_cost(&costs, ctx.rng))
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use crate::ledger::Load;

    #[test]
    fn scores_follow_the_formula() {
        let rs = replicas(3);
        let cs = vec![
            cand_s(&rs[0], 500, Load::default(), scraped(0.0, 4.0, 0.5)),
            cand_s(&rs[1], 0, Load::default(), scraped(5.0, 4.0, 0.25)),
            cand_s(&rs[2], 1000, Load::default(), scraped(10.0, 4.0, 1.0)),
        ];
        let s = LlmdWeighted::default().scores(&req(1000), &cs);
        // 3·0.5 + 2·1 + 2·0.5; 3·0 + 2·0.5 + 2·0.75; 3·1 + 2·0 + 2·0.
        let want = [4.5, 2.5, 3.0];
        for (got, want) in s.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{s:?}");
        }
        assert_eq!(
            ranking(&LlmdWeighted::default(), &req(1000), &cs, 1),
            vec![0, 2, 1]
        );
    }

    #[test]
    fn equal_queues_score_one_and_prefix_breaks_the_tie() {
        let rs = replicas(2);
        let cs = vec![
            cand_s(&rs[0], 0, Load::default(), scraped(3.0, 1.0, 0.2)),
            cand_s(&rs[1], 400, Load::default(), scraped(3.0, 1.0, 0.2)),
        ];
        let s = LlmdWeighted::default().scores(&req(1000), &cs);
        assert!((s[0] - (2.0 + 1.6)).abs() < 1e-12, "{s:?}");
        assert!((s[1] - (1.2 + 2.0 + 1.6)).abs() < 1e-12, "{s:?}");
        assert_eq!(ranking(&LlmdWeighted::default(), &req(1000), &cs, 3)[0], 1);
    }

    /// A full prefix hit (3) loses to an empty queue and an empty cache (2 + 2).
    #[test]
    fn load_can_outweigh_a_full_prefix_hit() {
        let rs = replicas(2);
        let cs = vec![
            cand_s(&rs[0], 1000, Load::default(), scraped(10.0, 8.0, 0.9)),
            cand_s(&rs[1], 0, Load::default(), scraped(0.0, 0.0, 0.0)),
        ];
        assert_eq!(ranking(&LlmdWeighted::default(), &req(1000), &cs, 0)[0], 1);
    }

    /// The EPP does not see our ledger: a replica this node knows to be swamped still
    /// wins on identical scrapes if it holds the prefix.
    #[test]
    fn ignores_the_ledger() {
        let rs = replicas(2);
        let swamped = Load {
            requests: 500.0,
            queued_prefill_tokens: 1e6,
            ..Load::default()
        };
        let cs = vec![
            cand_s(&rs[0], 0, Load::default(), scraped(1.0, 1.0, 0.1)),
            cand_s(&rs[1], 800, swamped, scraped(1.0, 1.0, 0.1)),
        ];
        assert_eq!(ranking(&LlmdWeighted::default(), &req(1000), &cs, 0)[0], 1);
    }

    #[test]
    fn ties_are_random_and_seeded() {
        let rs = replicas(3);
        let cs: Vec<_> = rs
            .iter()
            .map(|r| cand_s(r, 0, Load::default(), scraped(2.0, 1.0, 0.3)))
            .collect();
        let p = LlmdWeighted::default();
        let counts = first_counts(&p, &req(100), &cs, 600);
        assert!(counts.iter().all(|&n| n > 120), "{counts:?}");
        for seed in 0..20 {
            assert_eq!(
                ranking(&p, &req(100), &cs, seed),
                ranking(&p, &req(100), &cs, seed)
            );
        }
    }

    #[test]
    fn survives_missing_and_nonsense_scrapes() {
        let rs = replicas(3);
        let cs = vec![
            cand(&rs[0], 10, Load::default()),
            cand_s(&rs[1], 0, Load::default(), scraped(f64::NAN, 0.0, f64::NAN)),
            cand_s(&rs[2], 0, Load::default(), scraped(4.0, 0.0, 0.5)),
        ];
        let s = LlmdWeighted::default().scores(&req(0), &cs);
        assert!(s.iter().all(|x| x.is_finite()), "{s:?}");
        ranking(&LlmdWeighted::default(), &req(0), &cs, 9);
    }
}
