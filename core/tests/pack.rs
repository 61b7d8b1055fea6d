//! `[slo] pack` (best fit): among placements that meet both objectives about equally
//! surely, the one that leaves the least headroom, so the fast replica stays free for
//! requests only it can serve in time. Off, the cheapest (fastest) wins.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use headroom_core::{
    Fallback, PlainReplica, RequestProfile, RouteInputs, Slo,
    policy::{PolicyName, PolicySettings, build, candidates::CandidateParams},
    prefix::PrefixIndex,
    route,
};
use headroom_predictor::{Learner, Observation, PredictorConfig, Sample, SharedPredictor};
use rand::{SeedableRng, rngs::SmallRng};

const PROMPT: u32 = 512;

fn profile(ttft_ms: f64) -> RequestProfile {
    RequestProfile {
        model: "m".into(),
        prompt_tokens: PROMPT,
        blocks: Vec::new(),
        max_tokens: Some(64),
        expected_output_tokens: 64,
        slo: Slo {
            ttft_ms,
            tpot_ms: 100.0,
        },
        priority: 0,
        fallback: Fallback::LeastBad,
        stream: true,
        exact_cached: Vec::new(),
    }
}

/// Replica 0 of class `slow` (TTFT 900 ms), replica 1 of class `fast` (100 ms), both
/// idle, with models warmed on idle placements.
fn fleet() -> (Vec<PlainReplica>, Arc<SharedPredictor>) {
    let mut slow = PlainReplica::new(0, "slow-0", "slow", "m", Some(8192));
    let mut fast = PlainReplica::new(1, "fast-0", "fast", "m", Some(8192));
    slow.max_batched_tokens = Some(2048);
    fast.max_batched_tokens = Some(2048);
    let mut learner = Learner::new(PredictorConfig::default());
    for i in 0..400 {
        for (r, ttft) in [(&slow, 900.0), (&fast, 100.0)] {
            let prompt = f64::from(PROMPT) + f64::from(i % 9) * 16.0 - 64.0;
            learner.observe(&Sample {
                key: r.key,
                obs: Observation {
                    prompt_tokens: prompt,
                    expected_output_tokens: 64.0,
                    ..Observation::default()
                },
                at_s: i as f64 * 0.1,
                ttft_ms: Some(ttft * prompt / f64::from(PROMPT)),
                tpot_ms: Some(20.0),
                output_tokens: 64,
                censored: false,
                predicted: None,
            });
        }
    }
    learner.tick(40.0);
    let predictor = Arc::new(SharedPredictor::new(learner.snapshot(40.0)));
    (vec![slow, fast], predictor)
}

/// The replica index `slo` (with `pack` as given) chooses for a TTFT objective, over
/// 30 seeds; panics unless every seed agrees and the choice fits.
fn choice(pack: bool, ttft_ms: f64) -> usize {
    let (rs, predictor) = fleet();
    let mut settings = PolicySettings::default();
    settings.slo.pack = pack;
    settings.slo.explore = 0.0;
    // Both replicas are idle and unused: no idle probe, only the ranking.
    settings.slo.probe_idle_s = 0.0;
    let policy = build(PolicyName::Slo, predictor.clone(), &settings);
    let prefix = PrefixIndex::new(64);
    let inputs = RouteInputs {
        policy: policy.as_ref(),
        predictor: &predictor,
        prefix: &prefix,
        replicas: &rs,
        params: CandidateParams {
            block_tokens: 16,
            stale_after_s: 1.0,
        },
        max_targets: 2,
    };
    let picks: Vec<usize> = (0..30)
        .map(|seed| {
            let r = route(
                &inputs,
                &profile(ttft_ms),
                40.0,
                &mut SmallRng::seed_from_u64(seed),
            )
            .unwrap();
            assert!(r.fallback.is_none(), "{:?}", r.fallback);
            r.targets[0].index
        })
        .collect();
    assert!(picks.iter().all(|&p| p == picks[0]), "{picks:?}");
    picks[0]
}

#[test]
fn a_loose_objective_goes_to_the_slow_replica_only_when_packing() {
    // 5 s: both replicas meet it surely. The cheapest is the fast one; best fit leaves
    // it free.
    assert_eq!(choice(false, 5000.0), 1);
    assert_eq!(choice(true, 5000.0), 0);
}

#[test]
fn a_tight_objective_goes_to_the_replica_that_meets_it_either_way() {
    // 500 ms: only the fast replica meets it.
    assert_eq!(choice(false, 500.0), 1);
    assert_eq!(choice(true, 500.0), 1);
}
