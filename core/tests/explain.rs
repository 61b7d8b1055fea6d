//! A decision's explanation: the same decision as without it, one note per eligible
//! candidate with what the policy saw (load, cached tokens, prediction) and its rank.

use std::sync::Arc;

use headroom_core::{
    Fallback, Learn, PlainReplica, RequestProfile, RouteInputs, Routed, RoutedTarget, Slo,
    lifecycle,
    policy::{PolicyName, build, candidates::CandidateParams},
    prefix::PrefixIndex,
    route, route_explained,
};
use headroom_predictor::SharedPredictor;
use rand::{SeedableRng, rngs::SmallRng};

fn profile() -> RequestProfile {
    RequestProfile {
        model: "m".into(),
        prompt_tokens: 64,
        blocks: (1..=4).collect(),
        max_tokens: Some(16),
        expected_output_tokens: 16,
        slo: Slo {
            ttft_ms: 1000.0,
            tpot_ms: 50.0,
        },
        priority: 0,
        fallback: Fallback::LeastBad,
        stream: true,
        exact_cached: Vec::new(),
    }
}

#[test]
fn explained_decision_is_the_same_decision_with_every_candidate_noted() {
    let rs: Vec<PlainReplica> = (0..3)
        .map(|i| PlainReplica::new(i, &format!("r{i}"), "h100", "m", Some(8192)))
        .collect();
    let p = profile();
    let prefix = PrefixIndex::new(1024);
    // Replica 0 is busy and replica 2 holds the prompt: both must show in the notes.
    let at = |index| RoutedTarget {
        index,
        cached_tokens: 0,
        learn: Learn {
            key: Default::default(),
            obs: Default::default(),
            prediction: Default::default(),
            rtt_ms: 0.0,
        },
    };
    let _busy = lifecycle::book(&rs[0], &p, &at(0), 0.0);
    lifecycle::remember_prefix(&prefix, &rs[2], &p, &at(2), 16);

    for name in [
        PolicyName::Slo,
        PolicyName::TokenLoad,
        PolicyName::RoundRobin,
    ] {
        let predictor = Arc::new(SharedPredictor::default());
        let policy = build(name, predictor.clone(), &Default::default());
        let inputs = RouteInputs {
            policy: policy.as_ref(),
            predictor: &predictor,
            prefix: &prefix,
            replicas: rs.as_slice(),
            params: CandidateParams {
                block_tokens: 16,
                stale_after_s: 1.0,
            },
            max_targets: 3,
        };
        let plain = route(&inputs, &p, 0.0, &mut SmallRng::seed_from_u64(7)).unwrap();
        let policy = build(name, predictor.clone(), &Default::default());
        let inputs = RouteInputs {
            policy: policy.as_ref(),
            ..inputs
        };
        let told = route_explained(&inputs, &p, 0.0, &mut SmallRng::seed_from_u64(7)).unwrap();
        assert!(
            plain.explain.is_none(),
            "{name:?}: no explanation unless asked"
        );
        let order = |r: &Routed| r.targets.iter().map(|t| t.index).collect::<Vec<_>>();
        assert_eq!(order(&plain), order(&told), "{name:?}: the same decision");
        let ex = told.explain.expect("asked for");
        assert_eq!(ex.candidates.len(), 3, "{name:?}: one note per candidate");
        let chosen = ex.candidates.iter().find(|c| c.rank == Some(0)).unwrap();
        assert_eq!(
            chosen.index, told.targets[0].index,
            "{name:?}: rank 0 is the choice"
        );
        let n0 = ex.candidates.iter().find(|c| c.index == 0).unwrap();
        assert_eq!(n0.own.requests, 1.0, "{name:?}: the busy replica's load");
        let n2 = ex.candidates.iter().find(|c| c.index == 2).unwrap();
        assert!(n2.cached_tokens > 0, "{name:?}: the holder's cached tokens");
        assert_eq!(
            chosen.prediction.ttft_ms.to_bits(),
            told.targets[0].learn.prediction.ttft_ms.to_bits(),
            "{name:?}: the choice's noted prediction is the one it was routed with"
        );
    }
}
