//! `dynamo-kv`: NVIDIA Dynamo's KV router cost, argmin or softmax-sampled.
//!
//! Reference: `peer-routers.md` §3 "Dynamo" (booked load shared between router
//! replicas, `router_temperature` softmax over min-max-normalised costs, random ties) and
//! §6 ("Dynamo `cost = w·prefill_blocks + decode_blocks`"); Dynamo's router docs
//! ("Routing Concepts": cost formula; "Router Design": potential active blocks and
//! potential new prefill blocks). Defaults `--router-kv-overlap-score-weight` 1.0,
//! `--router-temperature` 0.0.
//!
//! For candidate `i`, in KV blocks of `B` tokens (`B` = the engine's block size from the
//! scrape, else 16, vLLM's default; Dynamo's `--kv-cache-block-size` must match it):
//! - `prefill_blocksᵢ = (Pᵢ + uᵢ) / B`: tokens still to prefill there — `Pᵢ` the worker's
//!   booked prompt tokens not yet prefilled (our ledger's queued prefill tokens; Dynamo's
//!   "active prefill tokens", cleared at the first token) plus `uᵢ` this request's
//!   uncached prompt tokens there (prompt − overlap);
//! - `decode_blocksᵢ = (Cᵢ + prompt) / B`: potential active blocks — the worker's active
//!   sequences plus this request's. `Cᵢ` is our ledger's context of decoding requests
//!   plus the uncached prompt tokens of queued ones (the ledger does not hold a queued
//!   request's cached part, and it counts generated tokens Dynamo only tracks with
//!   `--router-track-output-blocks`; no block is deduplicated across sequences);
//! - `costᵢ = overlap_score_weight × prefill_blocksᵢ + decode_blocksᵢ` (blocks).
//!
//! Temperature 0: argmin, exact ties at random. Temperature `T > 0`: costs are min-max
//! normalised to `nᵢ ∈ [0, 1]` and the choice is sampled with `P(i) ∝ exp(−nᵢ / T)`.
//! The retry order after the choice is by ascending cost. Loads are this node's plus its
//! peers' bookings, as Dynamo routers share them with `--router-replica-sync`.

use rand::Rng;

use crate::policy::{Candidate, DecideCtx, Decision, Policy, RequestProfile, rank};

/// vLLM's default KV block size, used when the scrape does not say.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

/// Knobs of Dynamo's KV router (its defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct DynamoKv {
    /// Weight of prefill blocks against decode blocks.
    pub overlap_score_weight: f64,
    /// Softmax temperature over normalised costs; 0 = argmin.
    pub temperature: f64,
    /// Block size override (tokens); `None` = the engine's scraped block size.
    pub block_size: Option<u32>,
}

impl Default for DynamoKv {
    fn default() -> Self {
        Self {
            overlap_score_weight: 1.0,
            temperature: 0.0,
            block_size: None,
        }
    }
}

/// One candidate's cost terms (KV blocks).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cost {
    pub prefill_blocks: f64,
    pub decode_blocks: f64,
    pub cost: f64,
}

impl DynamoKv {
    /// Block size in tokens for candidate `c`.
    pub fn block_size(&self, c: &Candidate<'_>) -> f64 {
        self.block_size
            .or_else(|| c.scraped.as_ref().and_then(|s| s.block_size))
            .filter(|&b| b > 0)
            .unwrap_or(DEFAULT_BLOCK_SIZE) as f64
    }

    /// The cost of placing `req` on `c`.
    pub fn cost(&self, req: &RequestProfile, c: &Candidate<'_>) -> Cost {
        let b = self.block_size(c);
        let load = c.load();
        let prompt = req.prompt_tokens as f64;
        let uncached = req.prompt_tokens.saturating_sub(c.cached_tokens) as f64;
        let prefill_blocks = (load.queued_prefill_tokens + uncached) / b;
        let decode_blocks = (load.decode_context_tokens + load.queued_prefill_tokens + prompt) / b;
        Cost {
            prefill_blocks,
            decode_blocks,
            cost: self.overlap_score_weight * prefill_blocks + decode_blocks,
        }
    }

    /// Softmax sample over min-max-normalised costs; `None` if no cost is finite.
    fn sample(&self, costs: &[f64], rng: &mut dyn rand::RngCore) -> Option<usize> {
        let finite = || costs.iter().copied().filter(|c| c.is_finite());
        let min = finite().fold(f64::INFINITY, f64::min);
        let max = finite().fold(f64::NEG_INFINITY, f64::max);
        if !min.is_finite() {
            return None;
        }
        let range = max - min;
        let weights: Vec<f64> = costs
            .iter()
            .map(|&c| {
                if !c.is_finite() {
                    0.0
                } else if range > 0.0 {
                    (-(c - min) / range / self.temperature).exp()
                } else {
                    1.0
                }
            })
            .collect();
        let total: f64 = weights.iter().sum();
        let mut x = rng.random::<f64>() * total;
        for (i, w) in weights.iter().enumerate() {
            if *w > 0.0 && x < *w {
                return Some(i);
            }
            x -= w;
        }
        weights.iter().rposition(|w| *w > 0.0)
    }
}

impl Policy for DynamoKv {
    fn name(&self) -> &'static str {
        "dynamo-kv"
    }

    fn decide(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision {
        let costs: Vec<f64> = cands.iter().map(|c| self.cost(req, c).cost).collect();
        let mut order = rank::by_cost(&costs, ctx.rng);
        if self.temperature > 0.0
            && let Some(choice) = self.sample(&costs, ctx.rng)
        {
            order.retain(|&i| i != choice);
            order.insert(0, choice);
        }
        Decision::route(order)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use crate::ledger::Load;

    fn decoding(context: f64) -> Load {
        Load {
            requests: 1.0,
            decoding_requests: 1.0,
            decode_context_tokens: context,
            ..Load::default()
        }
    }

    #[test]
    fn cost_follows_the_formula() {
        let rs = replicas(2);
        let busy = Load {
            queued_prefill_tokens: 320.0,
            ..decoding(1600.0)
        };
        let c = cand_s(&rs[0], 640, busy, scraped(0.0, 1.0, 0.1));
        let got = DynamoKv::default().cost(&req(1600), &c);
        // prefill (320 + 960)/16 = 80; decode (1600 + 320 + 1600)/16 = 220.
        assert_eq!(
            got,
            Cost {
                prefill_blocks: 80.0,
                decode_blocks: 220.0,
                cost: 300.0
            }
        );
        let p = DynamoKv {
            block_size: Some(32),
            overlap_score_weight: 2.0,
            ..DynamoKv::default()
        };
        assert_eq!(p.cost(&req(1600), &c).cost, 2.0 * 40.0 + 110.0);
        // No scrape: vLLM's 16.
        assert_eq!(
            DynamoKv::default().block_size(&cand(&rs[1], 0, Load::default())),
            16.0
        );
    }

    /// The overlap weight trades a cache hit against decode load.
    #[test]
    fn overlap_weight_decides_between_cache_and_load() {
        let rs = replicas(2);
        // A: cold, idle: 100·w + 100. B: holds the whole prompt, 2400 tokens decoding: 250.
        let cs = vec![
            cand(&rs[0], 0, Load::default()),
            cand(&rs[1], 1600, decoding(2400.0)),
        ];
        let w1 = DynamoKv::default();
        assert_eq!(ranking(&w1, &req(1600), &cs, 0)[0], 0);
        let w2 = DynamoKv {
            overlap_score_weight: 2.0,
            ..DynamoKv::default()
        };
        assert_eq!(ranking(&w2, &req(1600), &cs, 0)[0], 1);
    }

    /// Bookings gossiped by peers count, as with Dynamo's replica sync.
    #[test]
    fn peers_bookings_count() {
        let rs = replicas(2);
        let mut a = cand(&rs[0], 0, Load::default());
        a.peers = decoding(10_000.0);
        let cs = vec![a, cand(&rs[1], 0, decoding(100.0))];
        assert_eq!(ranking(&DynamoKv::default(), &req(500), &cs, 0)[0], 1);
    }

    #[test]
    fn zero_temperature_ties_are_random_and_seeded() {
        let rs = replicas(3);
        let cs: Vec<_> = rs.iter().map(|r| cand(r, 0, decoding(800.0))).collect();
        let p = DynamoKv::default();
        let counts = first_counts(&p, &req(300), &cs, 600);
        assert!(counts.iter().all(|&n| n > 120), "{counts:?}");
        assert_eq!(
            ranking(&p, &req(300), &cs, 5),
            ranking(&p, &req(300), &cs, 5)
        );
    }

    #[test]
    fn temperature_samples_by_softmax_of_normalised_cost() {
        let rs = replicas(2);
        // Costs 100 and 110 blocks: normalised 0 and 1.
        let cs = vec![
            cand(&rs[0], 0, decoding(0.0)),
            cand(&rs[1], 0, decoding(160.0)),
        ];
        let r = req(800);
        let p = DynamoKv {
            temperature: 1.0,
            ..DynamoKv::default()
        };
        let counts = first_counts(&p, &r, &cs, 4000);
        let share = counts[0] as f64 / 4000.0;
        let want = 1.0 / (1.0 + (-1.0f64).exp());
        assert!((share - want).abs() < 0.03, "{share} vs {want}");
        let cold = DynamoKv {
            temperature: 0.05,
            ..DynamoKv::default()
        };
        assert!(first_counts(&cold, &r, &cs, 500)[0] >= 499);
    }

    #[test]
    fn survives_nan_loads() {
        let rs = replicas(3);
        let nan = Load {
            queued_prefill_tokens: f64::NAN,
            ..Load::default()
        };
        let cs = vec![
            cand(&rs[0], 0, nan),
            cand(&rs[1], 0, nan),
            cand(&rs[2], 0, Load::default()),
        ];
        for t in [0.0, 0.5] {
            let p = DynamoKv {
                temperature: t,
                ..DynamoKv::default()
            };
            assert_eq!(ranking(&p, &req(10), &cs, 2)[0], 2);
        }
        let all_nan = vec![cand(&rs[0], 0, nan), cand(&rs[1], 0, nan)];
        let p = DynamoKv {
            temperature: 0.5,
            ..DynamoKv::default()
        };
        ranking(&p, &req(10), &all_nan, 2);
    }
}
