//! The classic policies: fallbacks for the SLO policy and the yardsticks it must beat.
//!
//! Loads are this node's in-flight work plus what peers gossiped, so a mesh of nodes
//! running a baseline sees the same load a single node would.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::{Candidate, DecideCtx, Decision, Policy, RequestProfile, rank};

/// Cycles through the candidates.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }
    fn decide(
        &self,
        _: &RequestProfile,
        cands: &[Candidate<'_>],
        _: &mut DecideCtx<'_>,
    ) -> Decision {
        let n = cands.len();
        let start = self.next.fetch_add(1, Relaxed) % n;
        Decision::route((0..n).map(|i| (start + i) % n).collect())
    }
}

/// Fewest requests in flight (this node's plus peers'), ties at random.
#[derive(Debug, Default)]
pub struct LeastRequest;

impl Policy for LeastRequest {
    fn name(&self) -> &'static str {
        "least-request"
    }
    fn decide(
        &self,
        _: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision {
        let costs: Vec<f64> = cands.iter().map(|c| c.load().requests).collect();
        Decision::route(rank::by_cost_top(&costs, ctx.rng, ctx.top))
    }
}

/// Fewest outstanding tokens: prefill not yet done plus decode still expected.
#[derive(Debug, Default)]
pub struct TokenLoad;

/// Outstanding tokens on a candidate if this request went there.
fn tokens_with(req: &RequestProfile, c: &Candidate<'_>) -> f64 {
    let own = req.prompt_tokens.saturating_sub(c.cached_tokens) as f64
        + req.expected_output_tokens as f64;
    c.load().outstanding_tokens() + own
}

impl Policy for TokenLoad {
    fn name(&self) -> &'static str {
        "token-load"
    }
    fn decide(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision {
        let costs: Vec<f64> = cands.iter().map(|c| tokens_with(req, c)).collect();
        Decision::route(rank::by_cost_top(&costs, ctx.rng, ctx.top))
    }
}

/// Longest prefix match with a load release, after llm-d's token-aware default:
/// keep candidates whose prefix score (cached / prompt) is at least
/// `affinity_threshold`, unless the best sticky candidate is overloaded — its
/// estimated queueing TTFT exceeds the best non-sticky one's by more than
/// `max_ttft_penalty_ms` (llm-d's gate), or it has more than `max_request_excess`
/// more requests in flight than the least-loaded one (a request-count gate, since
/// cached prefills are cheap in tokens but still occupy the engine); among those kept,
/// fewest outstanding tokens wins.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefixAffinity {
    /// Minimum prefix score (0..1) to count as sticky.
    pub affinity_threshold: f64,
    /// Prefill throughput used to turn queued tokens into a TTFT estimate (tokens/s).
    pub peak_prefill_tps: f64,
    /// Allowed TTFT penalty for stickiness (ms).
    pub max_ttft_penalty_ms: f64,
    /// Allowed excess of in-flight requests on the sticky candidate over the least
    /// loaded one before stickiness is released.
    pub max_request_excess: f64,
}

impl Default for PrefixAffinity {
    fn default() -> Self {
        // llm-d's chart values: 0.80, 15,928 tok/s, 5,000 ms; the request gate after
        // SGLang's balance threshold scale.
        Self {
            affinity_threshold: 0.80,
            peak_prefill_tps: 15_928.0,
            max_ttft_penalty_ms: 5_000.0,
            max_request_excess: 8.0,
        }
    }
}

impl PrefixAffinity {
    fn est_ttft_ms(&self, req: &RequestProfile, c: &Candidate<'_>) -> f64 {
        let own = req.prompt_tokens.saturating_sub(c.cached_tokens) as f64;
        (c.load().queued_prefill_tokens + own) / self.peak_prefill_tps * 1e3
    }
}

impl Policy for PrefixAffinity {
    fn name(&self) -> &'static str {
        "prefix-affinity"
    }
    fn decide(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision {
        let prompt = req.prompt_tokens.max(1) as f64;
        let sticky: Vec<bool> = cands
            .iter()
            .map(|c| {
                c.cached_tokens > 0 && c.cached_tokens as f64 / prompt >= self.affinity_threshold
            })
            .collect();
        let best = |want: bool| {
            cands
                .iter()
                .zip(&sticky)
                .filter(|(_, s)| **s == want)
                .map(|(c, _)| self.est_ttft_ms(req, c))
                .fold(f64::INFINITY, f64::min)
        };
        let (best_sticky, best_loose) = (best(true), best(false));
        let fewest = |want: Option<bool>| {
            cands
                .iter()
                .zip(&sticky)
                .filter(|(_, s)| want.is_none_or(|w| **s == w))
                .map(|(c, _)| c.load().requests)
                .fold(f64::INFINITY, f64::min)
        };
        let request_excess = fewest(Some(true)) - fewest(None);
        let release = best_sticky.is_finite()
            && ((best_loose.is_finite() && best_sticky - best_loose > self.max_ttft_penalty_ms)
                || request_excess > self.max_request_excess);
        let keep_sticky = best_sticky.is_finite() && !release;
        // Kept candidates first (by token load), the rest after them as retry targets;
        // once released, the least-loaded by requests, then tokens.
        let costs: Vec<f64> = cands
            .iter()
            .zip(&sticky)
            .map(|(c, s)| {
                if release {
                    c.load().requests * 1e9 + tokens_with(req, c)
                } else {
                    let tier = if keep_sticky && !*s { 1e18 } else { 0.0 };
                    tier + tokens_with(req, c) - c.cached_tokens as f64
                }
            })
            .collect();
        let mut d = Decision::route(rank::by_cost_top(&costs, ctx.rng, ctx.top));
        if release {
            d.fallback = Some("affinity-released");
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        ledger::Load,
        policy::{Slo, peers::testkit::replica},
        view::PlainReplica,
    };
    use rand::SeedableRng;

    fn cand(r: &PlainReplica, cached: u32, load: Load) -> Candidate<'_> {
        crate::policy::peers::testkit::cand(r, cached, load)
    }

    fn req(prompt: u32) -> RequestProfile {
        RequestProfile {
            model: "m".into(),
            prompt_tokens: prompt,
            blocks: vec![],
            max_tokens: Some(100),
            expected_output_tokens: 100,
            slo: Slo {
                ttft_ms: 1000.0,
                tpot_ms: 50.0,
            },
            priority: 0,
            fallback: Default::default(),
            stream: true,
            exact_cached: Vec::new(),
        }
    }

    fn first(p: &dyn Policy, r: &RequestProfile, c: &[Candidate<'_>]) -> usize {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut ctx = DecideCtx {
            now_s: 0.0,
            rng: &mut rng,
            top: usize::MAX,
        };
        match p.decide(r, c, &mut ctx).choice {
            super::super::Choice::Route(o) => {
                assert_eq!(o.len(), c.len());
                o[0]
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn round_robin_cycles() {
        let rs: Vec<_> = (0..3).map(replica).collect();
        let cs: Vec<_> = rs.iter().map(|r| cand(r, 0, Load::default())).collect();
        let p = RoundRobin::default();
        let picks: Vec<_> = (0..6).map(|_| first(&p, &req(10), &cs)).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn least_request_and_token_load_follow_their_measures() {
        let rs: Vec<_> = (0..2).map(replica).collect();
        let busy_few = Load {
            requests: 1.0,
            queued_prefill_tokens: 50_000.0,
            ..Load::default()
        };
        let idle_many = Load {
            requests: 5.0,
            decode_remaining_tokens: 500.0,
            ..Load::default()
        };
        let cs = vec![cand(&rs[0], 0, busy_few), cand(&rs[1], 0, idle_many)];
        assert_eq!(first(&LeastRequest, &req(10), &cs), 0);
        assert_eq!(first(&TokenLoad, &req(10), &cs), 1);
    }

    #[test]
    fn prefix_affinity_sticks_then_releases_under_load() {
        let rs: Vec<_> = (0..2).map(replica).collect();
        let p = PrefixAffinity::default();
        // Replica 0 holds the prefix and is somewhat busier: stick.
        let cs = vec![
            cand(
                &rs[0],
                900,
                Load {
                    queued_prefill_tokens: 2_000.0,
                    ..Load::default()
                },
            ),
            cand(&rs[1], 0, Load::default()),
        ];
        assert_eq!(first(&p, &req(1000), &cs), 0);
        // Replica 0 holds many more requests than replica 1: release.
        let cs = vec![
            cand(
                &rs[0],
                900,
                Load {
                    requests: 12.0,
                    ..Load::default()
                },
            ),
            cand(
                &rs[1],
                0,
                Load {
                    requests: 1.0,
                    ..Load::default()
                },
            ),
        ];
        assert_eq!(first(&p, &req(1000), &cs), 1);
        // Replica 0 is buried under 200k queued tokens (≈12.5 s): release.
        let cs = vec![
            cand(
                &rs[0],
                900,
                Load {
                    queued_prefill_tokens: 200_000.0,
                    ..Load::default()
                },
            ),
            cand(&rs[1], 0, Load::default()),
        ];
        assert_eq!(first(&p, &req(1000), &cs), 1);
    }
}
