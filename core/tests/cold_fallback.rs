//! The `slo` policy while its TTFT models are cold: token load, priced at each
//! replica's decode step once the TPOT models are warm (`policy::paced`). On a fleet
//! where one replica is twice as slow per token, balancing tokens gives it the same
//! work and twice the latency; pricing tokens by the measured step sends the fast
//! replica more, while staying load-aware (a fast replica buried in work loses) and
//! exactly `token-load` while any TPOT model is cold.

use std::sync::Arc;

use headroom_core::{
    Fallback, PlainReplica, RequestProfile, RouteInputs, Slo,
    ledger::Load,
    policy::{PolicyName, build, candidates::CandidateParams},
    prefix::PrefixIndex,
    route,
    view::PeerLoad,
};
use headroom_predictor::{Learner, ModelState, Observation, PredictorConfig, Sample, SharedPredictor};
use rand::{SeedableRng, rngs::SmallRng};

const NOW_S: f64 = 40.0;

fn profile() -> RequestProfile {
    RequestProfile {
        model: "m".into(),
        prompt_tokens: 400,
        blocks: Vec::new(),
        max_tokens: Some(64),
        expected_output_tokens: 64,
        slo: Slo {
            ttft_ms: 1500.0,
            tpot_ms: 100.0,
        },
        priority: 0,
        fallback: Fallback::LeastBad,
        stream: true,
        exact_cached: Vec::new(),
    }
}

/// A fast (10 ms/token) and a slow (20 ms/token) replica. TPOT models are warmed on
/// `tpot_labels` labels each (the slow class gets none when `slow_tpot` is false);
/// TTFT has fewer labels than the warm gate needs, so it stays cold.
fn fleet(slow_tpot: bool) -> (Vec<PlainReplica>, Arc<SharedPredictor>) {
    let fast = PlainReplica::new(0, "fast-0", "fast", "m", Some(8192));
    let slow = PlainReplica::new(1, "slow-0", "slow", "m", Some(8192));
    let mut learner = Learner::new(PredictorConfig::default());
    for i in 0..300 {
        for (r, step, labelled) in [(&fast, 10.0, true), (&slow, 20.0, slow_tpot)] {
            if !labelled {
                continue;
            }
            learner.observe(&Sample {
                key: r.key,
                obs: Observation {
                    prompt_tokens: 300.0 + f64::from(i % 7) * 20.0,
                    expected_output_tokens: 64.0,
                    ..Observation::default()
                },
                at_s: f64::from(i) * 0.1,
                // A handful of TTFT labels: far fewer than the gate's minimum.
                ttft_ms: (i < 5).then_some(step * 10.0),
                tpot_ms: Some(step),
                output_tokens: 64,
                censored: false,
                predicted: None,
            });
        }
    }
    learner.tick(NOW_S);
    let predictor = Arc::new(SharedPredictor::new(learner.snapshot(NOW_S)));
    (vec![fast, slow], predictor)
}

/// Outstanding decode tokens on each replica, as peers' load (what a mesh reports).
fn with_load(rs: &mut [PlainReplica], tokens: [f64; 2]) {
    for (r, t) in rs.iter_mut().zip(tokens) {
        r.peer_load = PeerLoad {
            load: Load {
                requests: (t / 64.0).ceil(),
                decoding_requests: (t / 64.0).ceil(),
                decode_remaining_tokens: t,
                decode_context_tokens: t * 4.0,
                ..Load::default()
            },
            updated_s: NOW_S,
        };
    }
}

/// Share of `n` seeded decisions that put the request first on the fast replica, and
/// whether every one was the cold-model fallback.
fn fast_share(name: PolicyName, rs: &[PlainReplica], predictor: &Arc<SharedPredictor>) -> (f64, bool) {
    let policy = build(name, predictor.clone(), &Default::default());
    let prefix = PrefixIndex::new(64);
    let inputs = RouteInputs {
        policy: policy.as_ref(),
        predictor,
        prefix: &prefix,
        replicas: rs,
        params: CandidateParams {
            block_tokens: 16,
            stale_after_s: 10.0,
        },
        max_targets: 2,
    };
    let n = 40;
    let mut fast = 0;
    let mut all_cold = true;
    for seed in 0..n {
        let r = route(&inputs, &profile(), NOW_S, &mut SmallRng::seed_from_u64(seed)).unwrap();
        all_cold &= r.fallback == Some("cold-model");
        fast += usize::from(r.targets[0].index == 0);
    }
    (fast as f64 / n as f64, all_cold)
}

#[test]
fn the_tpot_models_are_warm_and_ttft_cold() {
    let (rs, predictor) = fleet(true);
    let snap = predictor.load();
    let alone = Observation {
        prompt_tokens: 400.0,
        expected_output_tokens: 64.0,
        ..Observation::default()
    };
    for (r, step) in rs.iter().zip([10.0, 20.0]) {
        let p = snap.predict(r.key, &alone);
        assert_eq!(p.ttft_state, ModelState::Cold, "{}", r.name);
        assert_eq!(p.tpot_state, ModelState::Warm, "{}", r.name);
        assert!((p.tpot_ms / step - 1.0).abs() < 0.2, "{}: {:.1} ms", r.name, p.tpot_ms);
    }
}

#[test]
fn equal_load_goes_to_the_faster_replica() {
    let (mut rs, predictor) = fleet(true);
    with_load(&mut rs, [256.0, 256.0]);
    let (slo, cold) = fast_share(PolicyName::Slo, &rs, &predictor);
    assert!(cold, "every decision is the cold-model fallback");
    assert_eq!(slo, 1.0, "equal tokens cost the slow replica twice the time");
    let (tl, _) = fast_share(PolicyName::TokenLoad, &rs, &predictor);
    assert!(tl < 0.9, "token-load sees a tie ({tl:.2} fast)");
}

#[test]
fn the_fast_replica_takes_more_work_but_not_all_of_it() {
    let (mut rs, predictor) = fleet(true);
    // Fast holds 1.5x the slow one's tokens: still less time to drain.
    with_load(&mut rs, [1536.0, 1024.0]);
    assert_eq!(fast_share(PolicyName::Slo, &rs, &predictor).0, 1.0);
    assert_eq!(fast_share(PolicyName::TokenLoad, &rs, &predictor).0, 0.0);
    // Fast holds 3x: the slow replica drains sooner.
    with_load(&mut rs, [3072.0, 1024.0]);
    assert_eq!(fast_share(PolicyName::Slo, &rs, &predictor).0, 0.0);
}

#[test]
fn a_cold_tpot_model_leaves_plain_token_load() {
    let (mut rs, predictor) = fleet(false);
    with_load(&mut rs, [1536.0, 1024.0]);
    let (slo, cold) = fast_share(PolicyName::Slo, &rs, &predictor);
    assert!(cold);
    assert_eq!(slo, 0.0, "no pace known for the slow class: fewest tokens wins");
}
