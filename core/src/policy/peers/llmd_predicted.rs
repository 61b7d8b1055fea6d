//! `llmd-predicted`: llm-d's predicted-latency routing, fed by our predictor.
//!
//! Reference: `llm-d.md` §1.4 (the pipeline the chart wires up when the latency
//! predictor is on) and §1.6 (headroom, `slo-headroom-tier-filter`, `latency-scorer`,
//! `latency-slo-admitter`); §1.2 (`weighted-random-picker`, A-Res). It reads the same
//! predictor snapshot as our `slo` policy, with observations from [`features`], but
//! decides by llm-d's rules: point predictions only — no calibrated bound, no
//! recent-error guard, no cold/warm distinction (llm-d has none; a snapshot's prior is
//! used as it stands).
//!
//! Per candidate `i` (times in ms; TPOT in ms per output token):
//! - `ttft_headroomᵢ = ttft_slo − predicted_ttftᵢ`;
//! - `tpot_headroomᵢ = buffered − predicted_tpotᵢ` with
//!   `buffered = tpot_slo·sloBufferFactor`, capped at `podMinTPOTSLO·sloBufferFactor` —
//!   the tightest TPOT objective of requests already in flight there — so a placement
//!   does not break them. Outside streaming mode TPOT is neutral (headroom 0). A missing
//!   or bad objective reads 0, so headroom is then `−predicted`.
//! - Positive when both headrooms are ≥ 0.
//!
//! Pipeline, in llm-d's order: strict prefix-affinity filter (score ≥ 0.99) →
//! headroom-tier filter (keep the positive tier with probability 0.99, else the negative
//! one) → loose prefix-affinity filter (≥ 0.80) → latency scorer → weighted-random
//! picker. An affinity filter keeps only the "sticky" candidates (prefix score ≥ its
//! threshold) unless none is sticky or the best sticky predicted TTFT exceeds the best
//! non-sticky one by more than `maxTTFTPenaltyMs` (5 000 ms in the chart).
//!
//! Latency scorer, over the candidates left: if any is positive only those are scored;
//! otherwise idle ones (nothing in flight) if any; otherwise the best non-empty deficit
//! bucket — only TPOT negative, then only TTFT negative, then both. Within the scored
//! set, `|headroom|` is min-max normalised per dimension (`n = ½` when a dimension has no
//! range, and its weight then moves to the other), blended `c = 0.8·n_ttft + 0.2·n_tpot`,
//! and mapped to a weight `(⌊(1 − c)·100⌋ + 1)/100` for strategy `least` (the tightest
//! fit, or the smallest deficit, wins) or `(⌊c·100⌋ + 1)/100` for `most` (positive tier
//! only; the negative tier is always `least`). Unscored candidates weigh 0.
//!
//! The picker draws A-Res keys over those weights; candidates the filters dropped follow
//! as retry targets, ranked by the same scorer among themselves. If any prediction is not
//! finite the request has none (llm-d's predictions are all-or-nothing) and the scorer's
//! composite fallback applies: `(1 − kv) + (maxQ − q)/maxQ + prefix`, weights normalised.
//! A sheddable request (priority < 0) is rejected when no candidate is positive, idle or
//! cold (KV usage < 2%). Load-derived inputs (in flight, tightest TPOT objective) are
//! this node's plus its peers', the same view the predictor's observations use.

use std::sync::Arc;

use headroom_predictor::{Prediction, SharedPredictor};
use rand::Rng;
use serde::{Deserialize, Serialize};

use super::{a_res, prefix_score, scraped_kv_usage, scraped_waiting};
use crate::policy::{
    Candidate, Choice, DecideCtx, Decision, NoFit, Policy, RequestProfile, Slo, features,
};

/// How positive headroom maps to a score.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Smallest headroom wins: bin-packing, keeps idle capacity for later requests.
    Least,
    /// Largest headroom wins.
    Most,
}

/// llm-d's knobs, at the chart defaults of its predicted-latency pipeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LlmdPredictedConfig {
    pub ttft_weight: f64,
    pub tpot_weight: f64,
    pub strategy: Strategy,
    /// Probability of keeping the negative tier when both tiers exist.
    pub epsilon_explore_neg: f64,
    /// Multiplies the TPOT objective (and the running requests' tightest one).
    pub slo_buffer_factor: f64,
    /// TPOT is predicted and judged only in streaming mode (the SLO guide's setting).
    pub streaming_mode: bool,
    /// Run the strict and loose prefix-affinity filters.
    pub affinity_filters: bool,
    pub strict_affinity_threshold: f64,
    pub loose_affinity_threshold: f64,
    /// Stickiness breaks past this predicted-TTFT penalty (ms); 0 = always stick.
    pub max_ttft_penalty_ms: f64,
    pub composite_kv_weight: f64,
    pub composite_queue_weight: f64,
    pub composite_prefix_weight: f64,
}

impl Default for LlmdPredictedConfig {
    fn default() -> Self {
        Self {
            ttft_weight: 0.8,
            tpot_weight: 0.2,
            strategy: Strategy::Least,
            epsilon_explore_neg: 0.01,
            slo_buffer_factor: 1.0,
            streaming_mode: true,
            affinity_filters: true,
            strict_affinity_threshold: 0.99,
            loose_affinity_threshold: 0.80,
            max_ttft_penalty_ms: 5_000.0,
            composite_kv_weight: 1.0,
            composite_queue_weight: 1.0,
            composite_prefix_weight: 1.0,
        }
    }
}

/// One candidate as llm-d's producer describes it (`LatencyPredictionInfo`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Info {
    pub ttft_ms: f64,
    pub tpot_ms: f64,
    pub ttft_headroom_ms: f64,
    pub tpot_headroom_ms: f64,
    /// Requests in flight there (llm-d's `DispatchedRequestCount`).
    pub dispatched: f64,
}

impl Info {
    pub fn positive(&self) -> bool {
        self.ttft_headroom_ms >= 0.0 && self.tpot_headroom_ms >= 0.0
    }
    fn idle(&self) -> bool {
        self.dispatched == 0.0
    }
}

/// Weight resolution of the scorer (llm-d's `wMax`).
const W_MAX: f64 = 100.0;
const EPS: f64 = 1e-9;
/// KV usage below which a replica is "cold" for admission.
const COLD_KV: f64 = 0.02;

/// An objective as llm-d parses it: anything but a positive finite number is 0.
fn objective(ms: f64) -> f64 {
    if ms.is_finite() && ms > 0.0 { ms } else { 0.0 }
}

pub struct LlmdPredicted {
    predictor: Arc<SharedPredictor>,
    cfg: LlmdPredictedConfig,
}

impl LlmdPredicted {
    pub fn new(predictor: Arc<SharedPredictor>, cfg: LlmdPredictedConfig) -> Self {
        Self { predictor, cfg }
    }

    /// Headroom against `slo`, given point predictions, the tightest TPOT objective
    /// in flight on the replica and how many requests are there.
    pub fn info(
        &self,
        ttft_ms: f64,
        tpot_ms: f64,
        slo: Slo,
        pod_min_tpot_ms: Option<f64>,
        dispatched: f64,
    ) -> Info {
        let tpot_headroom_ms = if self.cfg.streaming_mode {
            let f = self.cfg.slo_buffer_factor;
            let mut buffered = objective(slo.tpot_ms) * f;
            if dispatched > 0.0
                && let Some(m) = pod_min_tpot_ms.filter(|m| m.is_finite())
            {
                buffered = buffered.min(m * f);
            }
            buffered - tpot_ms
        } else {
            0.0
        };
        Info {
            ttft_ms,
            tpot_ms,
            ttft_headroom_ms: objective(slo.ttft_ms) - ttft_ms,
            tpot_headroom_ms,
            dispatched,
        }
    }

    /// `prefix-cache-affinity-filter` with a predicted-TTFT load gate.
    fn affinity(
        &self,
        kept: Vec<usize>,
        prefix: &[f64],
        infos: &[Info],
        threshold: f64,
    ) -> Vec<usize> {
        if kept.len() <= 1 || threshold <= 0.0 {
            return kept;
        }
        let (sticky, loose): (Vec<usize>, Vec<usize>) =
            kept.iter().partition(|&&i| prefix[i] >= threshold);
        if sticky.is_empty() {
            return kept;
        }
        if self.cfg.max_ttft_penalty_ms > 0.0 && !loose.is_empty() {
            let best = |set: &[usize]| {
                set.iter()
                    .map(|&i| infos[i].ttft_ms)
                    .fold(f64::INFINITY, f64::min)
            };
            if best(&sticky) - best(&loose) > self.cfg.max_ttft_penalty_ms {
                return kept;
            }
        }
        sticky
    }

    /// `slo-headroom-tier-filter`; also says whether it explored the negative tier.
    fn tier(
        &self,
        kept: Vec<usize>,
        infos: &[Info],
        rng: &mut dyn rand::RngCore,
    ) -> (Vec<usize>, bool) {
        if kept.len() <= 1 {
            return (kept, false);
        }
        let (pos, neg): (Vec<usize>, Vec<usize>) = kept.iter().partition(|&&i| infos[i].positive());
        if pos.is_empty() || neg.is_empty() {
            return (kept, false);
        }
        if rng.random::<f64>() < self.cfg.epsilon_explore_neg {
            (neg, true)
        } else {
            (pos, false)
        }
    }

    /// `latency-scorer` over `set`: a weight per candidate (same indices as `infos`),
    /// 0 for those outside `set` or not scored.
    pub fn score(&self, infos: &[Info], set: &[usize]) -> Vec<f64> {
        let mut out = vec![0.0; infos.len()];
        let positive: Vec<usize> = set
            .iter()
            .copied()
            .filter(|&i| infos[i].positive())
            .collect();
        if !positive.is_empty() {
            self.score_bucket(infos, &positive, self.cfg.strategy, &mut out);
            return out;
        }
        let idle: Vec<usize> = set.iter().copied().filter(|&i| infos[i].idle()).collect();
        if !idle.is_empty() {
            self.score_bucket(infos, &idle, Strategy::Least, &mut out);
            return out;
        }
        // Deficit buckets, least severe first: TTFT misses hurt more than TPOT misses.
        let bucket_of = |i: &usize| {
            let e = &infos[*i];
            match (e.ttft_headroom_ms < 0.0, e.tpot_headroom_ms < 0.0) {
                (false, true) => 0,
                (true, false) => 1,
                _ => 2,
            }
        };
        for b in 0..3 {
            let bucket: Vec<usize> = set.iter().copied().filter(|i| bucket_of(i) == b).collect();
            if !bucket.is_empty() {
                self.score_bucket(infos, &bucket, Strategy::Least, &mut out);
                break;
            }
        }
        out
    }

    fn score_bucket(&self, infos: &[Info], bucket: &[usize], strategy: Strategy, out: &mut [f64]) {
        let (mut a, mut b) = {
            let sum = self.cfg.ttft_weight + self.cfg.tpot_weight;
            if sum > 0.0 {
                (self.cfg.ttft_weight / sum, self.cfg.tpot_weight / sum)
            } else {
                (1.0, 0.0)
            }
        };
        let range = |f: fn(&Info) -> f64| {
            bucket
                .iter()
                .map(|&i| f(&infos[i]).abs())
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                    (lo.min(v), hi.max(v))
                })
        };
        let (t_lo, t_hi) = range(|e| e.ttft_headroom_ms);
        let (p_lo, p_hi) = range(|e| e.tpot_headroom_ms);
        let (t_range, p_range) = (t_hi - t_lo, p_hi - p_lo);
        // A dimension without spread would only compress the scores: its weight moves.
        if t_range <= EPS && p_range > EPS {
            (a, b) = (0.0, 1.0);
        } else if p_range <= EPS && t_range > EPS {
            (a, b) = (1.0, 0.0);
        }
        let norm = |v: f64, lo: f64, r: f64| if r > EPS { (v.abs() - lo) / r } else { 0.5 };
        for &i in bucket {
            let e = &infos[i];
            let c = a * norm(e.ttft_headroom_ms, t_lo, t_range)
                + b * norm(e.tpot_headroom_ms, p_lo, p_range);
            let x = match strategy {
                Strategy::Least => 1.0 - c,
                Strategy::Most => c,
            };
            out[i] = ((x * W_MAX).floor() + 1.0) / W_MAX;
        }
    }

    /// The scorer's fallback without predictions: KV headroom, relative queue, prefix.
    pub fn composite(&self, req: &RequestProfile, cands: &[Candidate<'_>]) -> Vec<f64> {
        let c = &self.cfg;
        let (mut wk, mut wq, mut wp) = (
            c.composite_kv_weight,
            c.composite_queue_weight,
            c.composite_prefix_weight,
        );
        let sum = wk + wq + wp;
        if sum > 0.0 {
            (wk, wq, wp) = (wk / sum, wq / sum, wp / sum);
        } else {
            (wk, wq, wp) = (1.0, 0.0, 0.0);
        }
        let max_q = cands.iter().map(scraped_waiting).fold(0.0, f64::max);
        cands
            .iter()
            .map(|cand| {
                let rel_q = if max_q > 0.0 {
                    (max_q - scraped_waiting(cand)) / max_q
                } else {
                    1.0
                };
                let s =
                    wk * (1.0 - scraped_kv_usage(cand)) + wq * rel_q + wp * prefix_score(req, cand);
                (s * W_MAX).round() / W_MAX
            })
            .collect()
    }
}

impl Policy for LlmdPredicted {
    fn name(&self) -> &'static str {
        "llmd-predicted"
    }

    fn decide(
        &self,
        req: &RequestProfile,
        cands: &[Candidate<'_>],
        ctx: &mut DecideCtx<'_>,
    ) -> Decision {
        let snap = self.predictor.load();
        let preds: Vec<Prediction> = cands
            .iter()
            .map(|c| snap.predict(features::key(c), &features::observation(req, c)))
            .collect();
        let all: Vec<usize> = (0..cands.len()).collect();
        if !preds
            .iter()
            .all(|p| p.ttft_ms.is_finite() && p.tpot_ms.is_finite())
        {
            let w = self.composite(req, cands);
            return Decision {
                choice: Choice::Route(a_res(&all, &w, ctx.rng)),
                predictions: preds,
                evals: Vec::new(),
                fallback: Some("no-prediction"),
            };
        }
        let infos: Vec<Info> = cands
            .iter()
            .zip(&preds)
            .map(|(c, p)| {
                let load = c.load();
                self.info(
                    p.ttft_ms,
                    p.tpot_ms,
                    req.slo,
                    load.min_tpot_slo_ms,
                    load.requests,
                )
            })
            .collect();
        let prefix: Vec<f64> = cands.iter().map(|c| prefix_score(req, c)).collect();

        let mut kept = all.clone();
        if self.cfg.affinity_filters {
            kept = self.affinity(kept, &prefix, &infos, self.cfg.strict_affinity_threshold);
        }
        let (mut kept, explored) = self.tier(kept, &infos, ctx.rng);
        if self.cfg.affinity_filters {
            kept = self.affinity(kept, &prefix, &infos, self.cfg.loose_affinity_threshold);
        }
        let mut order = a_res(&kept, &self.score(&infos, &kept), ctx.rng);
        let mut in_kept = vec![false; cands.len()];
        kept.iter().for_each(|&i| in_kept[i] = true);
        let rest: Vec<usize> = all.iter().copied().filter(|&i| !in_kept[i]).collect();
        if !rest.is_empty() {
            order.extend(a_res(&rest, &self.score(&infos, &rest), ctx.rng));
        }

        let any_fit = infos.iter().any(Info::positive);
        let admissible = any_fit
            || infos.iter().any(Info::idle)
            || cands.iter().any(|c| scraped_kv_usage(c) < COLD_KV);
        let choice = if req.priority < 0 && !admissible {
            Choice::Reject(NoFit::new(
                format!(
                    "sheddable request: no replica is predicted to meet TTFT ≤ {:.0} ms and TPOT ≤ {:.0} ms, and none is idle or cold",
                    req.slo.ttft_ms, req.slo.tpot_ms
                ),
                NoFit::MIN_RETRY_S,
            ))
        } else {
            Choice::Route(order)
        };
        let fallback = if !any_fit {
            Some("no-fit")
        } else if explored {
            Some("explore-negative")
        } else {
            None
        };
        Decision {
            choice,
            predictions: preds,
            evals: Vec::new(),
            fallback,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;
    use crate::ledger::Load;
    use rand::SeedableRng;

    fn policy(cfg: LlmdPredictedConfig) -> LlmdPredicted {
        LlmdPredicted::new(Arc::new(SharedPredictor::default()), cfg)
    }

    fn info(ttft_h: f64, tpot_h: f64, dispatched: f64) -> Info {
        Info {
            ttft_ms: 1000.0 - ttft_h,
            tpot_ms: 50.0 - tpot_h,
            ttft_headroom_ms: ttft_h,
            tpot_headroom_ms: tpot_h,
            dispatched,
        }
    }

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    const SLO: Slo = Slo {
        ttft_ms: 800.0,
        tpot_ms: 50.0,
    };

    #[test]
    fn headroom_uses_points_buffer_and_running_guard() {
        let p = policy(LlmdPredictedConfig::default());
        let e = p.info(500.0, 40.0, SLO, None, 0.0);
        assert_eq!((e.ttft_headroom_ms, e.tpot_headroom_ms), (300.0, 10.0));
        assert!(e.positive());
        // A request in flight there needs ≤ 30 ms per token.
        let e = p.info(500.0, 40.0, SLO, Some(30.0), 2.0);
        assert_eq!(e.tpot_headroom_ms, -10.0);
        assert!(!e.positive());
        let buffered = policy(LlmdPredictedConfig {
            slo_buffer_factor: 0.9,
            ..LlmdPredictedConfig::default()
        });
        assert!((buffered.info(500.0, 40.0, SLO, None, 0.0).tpot_headroom_ms - 5.0).abs() < 1e-9);
        let quiet = policy(LlmdPredictedConfig {
            streaming_mode: false,
            ..LlmdPredictedConfig::default()
        });
        assert_eq!(
            quiet
                .info(500.0, 400.0, SLO, Some(1.0), 3.0)
                .tpot_headroom_ms,
            0.0
        );
        // No (or a nonsense) objective reads 0: headroom is minus the prediction.
        let none = Slo {
            ttft_ms: f64::NAN,
            tpot_ms: -5.0,
        };
        let e = p.info(500.0, 40.0, none, None, 0.0);
        assert_eq!((e.ttft_headroom_ms, e.tpot_headroom_ms), (-500.0, -40.0));
    }

    /// `least`: the tightest positive fit gets the largest weight.
    #[test]
    fn least_prefers_the_tightest_fit_and_most_the_loosest() {
        // TPOT headroom equal: TTFT takes all the weight. |h| 100, 500, 900 → n 0, ½, 1.
        let infos = [
            info(100.0, 10.0, 1.0),
            info(500.0, 10.0, 1.0),
            info(900.0, 10.0, 1.0),
        ];
        let least = policy(LlmdPredictedConfig::default());
        assert!(close(&least.score(&infos, &[0, 1, 2]), &[1.01, 0.51, 0.01]));
        let most = policy(LlmdPredictedConfig {
            strategy: Strategy::Most,
            ..LlmdPredictedConfig::default()
        });
        assert!(close(&most.score(&infos, &[0, 1, 2]), &[0.01, 0.51, 1.01]));
        // Both spread: c = 0.8·n_ttft + 0.2·n_tpot. The middle one has n_ttft ⅓ and
        // n_tpot 7/30: c ≈ 0.313, weight (⌊68.7⌋ + 1)/100 (TTFT alone would give 0.67).
        let infos = [
            info(100.0, 0.0, 1.0),
            info(200.0, 7.0, 1.0),
            info(400.0, 30.0, 1.0),
        ];
        assert!(close(&least.score(&infos, &[0, 1, 2]), &[1.01, 0.69, 0.01]));
    }

    /// If one dimension has no spread, the other decides alone.
    #[test]
    fn weight_moves_off_a_flat_dimension() {
        let p = policy(LlmdPredictedConfig::default());
        let infos = [info(200.0, 5.0, 1.0), info(200.0, 25.0, 1.0)];
        assert!(close(&p.score(&infos, &[0, 1]), &[1.01, 0.01]));
        // Neither has spread: all equal.
        let infos = [info(200.0, 5.0, 1.0), info(200.0, 5.0, 1.0)];
        assert!(close(&p.score(&infos, &[0, 1]), &[0.51, 0.51]));
    }

    #[test]
    fn only_positive_candidates_score_in_a_mixed_set() {
        let p = policy(LlmdPredictedConfig::default());
        let infos = [info(-10.0, 5.0, 0.0), info(300.0, 5.0, 4.0)];
        assert!(close(&p.score(&infos, &[0, 1]), &[0.0, 0.51]));
    }

    /// Negative tier: idle pods first, even with the larger deficit.
    #[test]
    fn idle_pods_first_in_the_negative_tier() {
        let p = policy(LlmdPredictedConfig::default());
        let infos = [
            info(-10.0, -1.0, 3.0),
            info(-900.0, -30.0, 0.0),
            info(-5.0, 2.0, 1.0),
        ];
        let s = p.score(&infos, &[0, 1, 2]);
        assert!(s[1] > 0.0 && s[0] == 0.0 && s[2] == 0.0, "{s:?}");
    }

    /// Busy and all negative: only-TPOT misses, then only-TTFT misses, then both.
    #[test]
    fn deficit_buckets_in_order() {
        let p = policy(LlmdPredictedConfig::default());
        let infos = [
            info(-1.0, -1.0, 2.0),
            info(-50.0, 3.0, 2.0),
            info(40.0, -20.0, 2.0),
            info(10.0, -2.0, 2.0),
        ];
        let s = p.score(&infos, &[0, 1, 2, 3]);
        // The first bucket (only TPOT missed) holds 2 and 3; the smaller |headroom| wins.
        assert!(s[0] == 0.0 && s[1] == 0.0, "{s:?}");
        assert!(s[3] > s[2] && s[2] > 0.0, "{s:?}");
        let s = p.score(&infos, &[0, 1]);
        assert!(s[1] > 0.0 && s[0] == 0.0, "{s:?}");
    }

    #[test]
    fn positive_tier_kept_but_negative_explored() {
        let p = policy(LlmdPredictedConfig::default());
        let infos = [
            info(100.0, 5.0, 1.0),
            info(-100.0, 5.0, 1.0),
            info(50.0, 1.0, 1.0),
        ];
        let mut rng = rand::rngs::SmallRng::seed_from_u64(9);
        let mut explored = 0;
        for _ in 0..4000 {
            let (kept, e) = p.tier(vec![0, 1, 2], &infos, &mut rng);
            if e {
                assert_eq!(kept, vec![1]);
                explored += 1;
            } else {
                assert_eq!(kept, vec![0, 2]);
            }
        }
        // Expected 40 of 4000 (σ ≈ 6.3).
        assert!((15..=70).contains(&explored), "{explored}");
        // One tier only: kept as is, nothing drawn.
        let (kept, e) = p.tier(vec![1], &infos, &mut rng);
        assert_eq!((kept, e), (vec![1], false));
    }

    #[test]
    fn affinity_sticks_unless_too_slow() {
        let p = policy(LlmdPredictedConfig::default());
        let prefix = [1.0, 0.85, 0.0];
        let fast = [
            info(100.0, 1.0, 1.0),
            info(100.0, 1.0, 1.0),
            info(700.0, 1.0, 1.0),
        ];
        assert_eq!(p.affinity(vec![0, 1, 2], &prefix, &fast, 0.99), vec![0]);
        assert_eq!(p.affinity(vec![0, 1, 2], &prefix, &fast, 0.80), vec![0, 1]);
        // The sticky one is predicted 6 s slower than the best other: release.
        let mut slow = fast;
        slow[0].ttft_ms = 6_500.0;
        assert_eq!(p.affinity(vec![0, 2], &prefix, &slow, 0.99), vec![0, 2]);
        assert_eq!(
            p.affinity(vec![1, 2], &prefix, &fast, 0.99),
            vec![1, 2],
            "none sticky"
        );
    }

    #[test]
    fn composite_fallback_follows_the_formula() {
        let rs = replicas(2);
        let cs = vec![
            cand_s(&rs[0], 500, Load::default(), scraped(4.0, 1.0, 0.5)),
            cand_s(&rs[1], 0, Load::default(), scraped(0.0, 1.0, 0.2)),
        ];
        let s = policy(LlmdPredictedConfig::default()).composite(&req(1000), &cs);
        // (0.5 + 0 + 0.5)/3 and (0.8 + 1 + 0)/3, at 1/100 resolution.
        assert!(close(&s, &[0.33, 0.6]), "{s:?}");
    }

    // End to end through the shared predictor. Its prior predicts TTFT from the queued
    // prefill work: ≈ 50 ms idle, ≈ 2 s behind 50 000 queued tokens.
    fn queued(tokens: f64) -> Load {
        Load {
            requests: 1.0,
            queued_requests: 1.0,
            queued_prefill_tokens: tokens,
            ..Load::default()
        }
    }

    fn with_slo(ttft_ms: f64, tpot_ms: f64) -> RequestProfile {
        RequestProfile {
            slo: Slo { ttft_ms, tpot_ms },
            ..req(1000)
        }
    }

    #[test]
    fn end_to_end_least_packs_and_tiers_protect() {
        let rs = replicas(2);
        let cs = vec![
            cand(&rs[0], 0, Load::default()),
            cand(&rs[1], 0, queued(50_000.0)),
        ];
        let p = policy(LlmdPredictedConfig::default());
        // Both fit a loose objective: the tighter fit (the busy one) is preferred.
        let n = first_counts(&p, &with_slo(60_000.0, 1_000.0), &cs, 300);
        assert!(n[1] >= 270, "{n:?}");
        // Only the idle one fits 500 ms: the positive tier wins (≈ 99%).
        let n = first_counts(&p, &with_slo(500.0, 1_000.0), &cs, 300);
        assert!(n[0] >= 285, "{n:?}");
    }

    #[test]
    fn end_to_end_is_deterministic_and_total() {
        let rs = replicas(4);
        let cs = vec![
            cand(&rs[0], 900, queued(2_000.0)),
            cand(&rs[1], 0, Load::default()),
            cand_s(&rs[2], 300, queued(30_000.0), scraped(3.0, 2.0, 0.6)),
            cand(
                &rs[3],
                0,
                Load {
                    requests: f64::NAN,
                    decode_context_tokens: f64::INFINITY,
                    ..Load::default()
                },
            ),
        ];
        let p = policy(LlmdPredictedConfig::default());
        for seed in 0..50 {
            let r = with_slo(300.0, 20.0);
            assert_eq!(ranking(&p, &r, &cs, seed), ranking(&p, &r, &cs, seed));
        }
    }

    #[test]
    fn sheddable_requests_are_refused_when_nothing_fits_idles_or_is_cold() {
        let rs = replicas(2);
        let busy = |r| cand_s(r, 0, queued(40_000.0), scraped(5.0, 8.0, 0.7));
        let cs = vec![busy(&rs[0]), busy(&rs[1])];
        let p = policy(LlmdPredictedConfig::default());
        let mut r = with_slo(10.0, 1.0);
        r.priority = -1;
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let mut ctx = DecideCtx {
            now_s: 0.0,
            rng: &mut rng,
            top: usize::MAX,
        };
        let d = p.decide(&r, &cs, &mut ctx);
        assert!(matches!(d.choice, Choice::Reject(_)), "{:?}", d.choice);
        assert_eq!(d.predictions.len(), 2);
        // Not sheddable: routed least-bad, flagged.
        r.priority = 0;
        let d = p.decide(&r, &cs, &mut ctx);
        assert!(matches!(d.choice, Choice::Route(_)));
        assert_eq!(d.fallback, Some("no-fit"));
        // An idle replica admits it.
        r.priority = -1;
        let cs = vec![
            busy(&rs[0]),
            cand_s(&rs[1], 0, Load::default(), scraped(0.0, 0.0, 0.7)),
        ];
        assert!(matches!(
            p.decide(&r, &cs, &mut ctx).choice,
            Choice::Route(_)
        ));
    }
}
