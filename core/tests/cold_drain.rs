//! While `slo`'s models are cold it ranks by expected drain time: outstanding tokens
//! times the class's fitted ms per token of load (the gate's load baseline). On unequal
//! hardware that sends work past a slow replica that holds fewer tokens; while a
//! class has no label yet, the order is `token-load`'s.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use headroom_core::{
    Fallback, PlainReplica, RequestProfile, RouteInputs, Slo,
    ledger::Load,
    policy::{PolicyName, PolicySettings, build, candidates::CandidateParams},
    prefix::PrefixIndex,
    route,
    view::PeerLoad,
};
use headroom_predictor::{Learner, Observation, PredictorConfig, Sample, SharedPredictor};
use rand::{SeedableRng, rngs::SmallRng};

const PROMPT: u32 = 512;
const NOW_S: f64 = 40.0;

fn profile() -> RequestProfile {
    RequestProfile {
        model: "m".into(),
        prompt_tokens: PROMPT,
        blocks: Vec::new(),
        max_tokens: Some(64),
        expected_output_tokens: 64,
        slo: Slo {
            ttft_ms: 5000.0,
            tpot_ms: 100.0,
        },
        priority: 0,
        fallback: Fallback::LeastBad,
        stream: true,
        exact_cached: Vec::new(),
    }
}

/// `slow-0` (TTFT 900 ms per 512 tokens) and `fast-0` (100 ms), labelled; `queued`
/// prompt tokens reported on each by a peer node.
fn fleet(queued: [f64; 2]) -> (Vec<PlainReplica>, Arc<SharedPredictor>) {
    let mut rs = vec![
        PlainReplica::new(0, "slow-0", "slow", "m", Some(8192)),
        PlainReplica::new(1, "fast-0", "fast", "m", Some(8192)),
    ];
    let mut learner = Learner::new(PredictorConfig::default());
    for i in 0..200 {
        for (r, ttft) in [(&rs[0], 900.0), (&rs[1], 100.0)] {
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
    learner.tick(NOW_S);
    for (r, q) in rs.iter_mut().zip(queued) {
        r.peer_load = PeerLoad {
            load: Load {
                requests: 1.0,
                queued_requests: 1.0,
                queued_prefill_tokens: q,
                ..Load::default()
            },
            updated_s: NOW_S,
        };
    }
    let predictor = Arc::new(SharedPredictor::new(learner.snapshot(NOW_S)));
    (rs, predictor)
}

/// The replica `slo` chooses with its models held cold, over 30 seeds (all must agree).
fn cold_choice(rs: &[PlainReplica], predictor: &Arc<SharedPredictor>) -> usize {
    let mut settings = PolicySettings::default();
    // Above 1: never enough warm candidates, so the cold ranking decides.
    settings.slo.min_warm_fraction = 2.0;
    let policy = build(PolicyName::Slo, predictor.clone(), &settings);
    let prefix = PrefixIndex::new(64);
    let inputs = RouteInputs {
        policy: policy.as_ref(),
        predictor,
        prefix: &prefix,
        replicas: rs,
        params: CandidateParams {
            block_tokens: 16,
            stale_after_s: 1.0,
        },
        max_targets: 3,
    };
    let picks: Vec<usize> = (0..30)
        .map(|seed| {
            let r = route(
                &inputs,
                &profile(),
                NOW_S,
                &mut SmallRng::seed_from_u64(seed),
            )
            .unwrap();
            assert_eq!(r.fallback, Some("cold-model"));
            r.targets[0].index
        })
        .collect();
    assert!(picks.iter().all(|&p| p == picks[0]), "{picks:?}");
    picks[0]
}

#[test]
fn a_cold_model_sends_work_past_a_slow_replica_that_holds_fewer_tokens() {
    // Slow: 1,000 tokens queued × ~1.8 ms; fast: 2,000 × ~0.2 ms. Token load picks the
    // slow one; the drain time, the fast one.
    let (rs, predictor) = fleet([1_000.0, 2_000.0]);
    let snap = predictor.load();
    let obs = Observation {
        prompt_tokens: f64::from(PROMPT),
        ..Observation::default()
    };
    let (slow, fast) = (
        snap.predict(rs[0].key, &obs).ttft_load_ms_per_token,
        snap.predict(rs[1].key, &obs).ttft_load_ms_per_token,
    );
    assert!(
        slow > 5.0 * fast && fast > 0.0,
        "fitted scales: slow {slow} fast {fast} ms/token"
    );
    assert_eq!(cold_choice(&rs, &predictor), 1);
    // Far more queued on the fast replica: its drain time is the longer one.
    let (rs, predictor) = fleet([1_000.0, 30_000.0]);
    assert_eq!(cold_choice(&rs, &predictor), 0);
}

#[test]
fn a_class_without_labels_leaves_the_cold_order_to_token_load() {
    let (mut rs, predictor) = fleet([1_000.0, 2_000.0]);
    let mut new = PlainReplica::new(2, "new-0", "new-class", "m", Some(8192));
    new.peer_load = PeerLoad {
        load: Load {
            requests: 1.0,
            queued_requests: 1.0,
            queued_prefill_tokens: 3_000.0,
            ..Load::default()
        },
        updated_s: NOW_S,
    };
    rs.push(new);
    assert_eq!(
        cold_choice(&rs, &predictor),
        0,
        "fewest tokens: the slow one"
    );
}
