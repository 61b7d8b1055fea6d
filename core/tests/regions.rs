//! Regions in one decision: the `slo` policy adds the round trip to a remote
//! candidate's TTFT and leaves the region only when no local candidate meets both
//! objectives and a remote one does; baselines stay local while a local candidate is
//! left; what is learned from a remote placement is engine-side.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use headroom_core::{
    Fallback, Finished, PlainReplica, Reported, RequestProfile, RouteInputs, Slo, Verdict,
    policy::{PolicyName, build, candidates::CandidateParams},
    prefix::PrefixIndex,
    region, route,
};
use headroom_predictor::{
    Learner, ModelState, Observation, PredictorConfig, Sample, SharedPredictor,
};
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

/// A local replica of class `slow` (TTFT 900 ms) and a remote one of class `fast`
/// (TTFT 100 ms) at `rtt_ms`, with models warmed on idle placements.
fn fleet(rtt_ms: f64) -> (Vec<PlainReplica>, Arc<SharedPredictor>) {
    let mut local = PlainReplica::new(0, "eu-slow", "slow", "m", Some(8192));
    let mut remote = PlainReplica::new(1, "us-fast", "fast", "m", Some(8192));
    local.max_batched_tokens = Some(2048);
    remote.max_batched_tokens = Some(2048);
    remote.remote_rtt_ms = Some(rtt_ms);
    let mut learner = Learner::new(PredictorConfig::default());
    for i in 0..400 {
        for (r, ttft) in [(&local, 900.0), (&remote, 100.0)] {
            // Prompts around the request's size so the fit is tight there.
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
    (vec![local, remote], predictor)
}

fn chosen(
    name: PolicyName,
    rs: &[PlainReplica],
    predictor: &Arc<SharedPredictor>,
    req: &RequestProfile,
    seed: u64,
) -> headroom_core::Routed {
    let policy = build(name, predictor.clone(), &Default::default());
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
        max_targets: 2,
    };
    route(&inputs, req, 40.0, &mut SmallRng::seed_from_u64(seed)).unwrap()
}

#[test]
fn the_models_are_warm_and_tell_the_classes_apart() {
    let (rs, predictor) = fleet(50.0);
    let r = chosen(PolicyName::Slo, &rs, &predictor, &profile(2000.0), 1);
    assert!(r.fallback.is_none(), "warm models: {:?}", r.fallback);
    let snap = predictor.load();
    let obs = Observation {
        prompt_tokens: f64::from(PROMPT),
        expected_output_tokens: 64.0,
        ..Observation::default()
    };
    let (slow, fast) = (snap.predict(rs[0].key, &obs), snap.predict(rs[1].key, &obs));
    assert_eq!(slow.ttft_state, ModelState::Warm);
    assert!(
        (slow.ttft_ms - 900.0).abs() < 90.0 && (fast.ttft_ms - 100.0).abs() < 30.0,
        "slow {:.0} ms, fast {:.0} ms",
        slow.ttft_ms,
        fast.ttft_ms
    );
}

#[test]
fn slo_stays_local_while_local_meets_both_objectives() {
    // Both meet 2 s; the remote one is far cheaper, but the region's own replica wins.
    let (rs, predictor) = fleet(50.0);
    for seed in 0..30 {
        let r = chosen(PolicyName::Slo, &rs, &predictor, &profile(2000.0), seed);
        assert_eq!(r.targets[0].index, 0, "seed {seed}");
        assert_eq!(r.targets[0].learn.rtt_ms, 0.0);
    }
}

#[test]
fn slo_leaves_the_region_when_only_a_remote_candidate_fits_with_its_rtt() {
    // 500 ms: local (900) misses; remote 100 + 50 RTT fits.
    let (rs, predictor) = fleet(50.0);
    for seed in 0..30 {
        let r = chosen(PolicyName::Slo, &rs, &predictor, &profile(500.0), seed);
        let t = &r.targets[0];
        assert_eq!(t.index, 1, "seed {seed}");
        assert!(r.fallback.is_none());
        assert_eq!(t.learn.rtt_ms, 50.0);
        // The prediction it carries is what the client sees: the RTT included.
        let engine = region::without_rtt(t.learn.prediction, 50.0);
        assert!((t.learn.prediction.ttft_ms - engine.ttft_ms - 50.0).abs() < 1e-9);
    }
}

#[test]
fn slo_does_not_leave_when_the_rtt_eats_the_objective() {
    // 500 ms with a 450 ms round trip: 100 + 450 misses too; least-bad stays local.
    let (rs, predictor) = fleet(450.0);
    for seed in 0..30 {
        let r = chosen(PolicyName::Slo, &rs, &predictor, &profile(500.0), seed);
        assert_eq!(r.targets[0].index, 0, "seed {seed}");
        assert_eq!(r.fallback, Some("no-fit"));
        assert!(matches!(r.verdict, Verdict::Go));
    }
}

#[test]
fn with_no_local_replica_left_every_policy_goes_remote() {
    let (mut rs, predictor) = fleet(50.0);
    rs[0].routable = false;
    for name in [
        PolicyName::Slo,
        PolicyName::TokenLoad,
        PolicyName::RoundRobin,
    ] {
        let r = chosen(name, &rs, &predictor, &profile(2000.0), 3);
        assert_eq!(r.targets[0].index, 1, "{name:?}");
        assert_eq!(r.targets[0].learn.rtt_ms, 50.0, "{name:?}");
    }
}

#[test]
fn baselines_stay_local_even_when_local_is_busy() {
    let (rs, predictor) = fleet(50.0);
    // Load the local replica: token-load alone would pick the idle remote one.
    let req = profile(2000.0);
    let busy = chosen(PolicyName::TokenLoad, &rs, &predictor, &req, 1);
    let _b: Vec<_> = (0..8)
        .map(|_| headroom_core::lifecycle::book(&rs[0], &req, &busy.targets[0], 40.0))
        .collect();
    for name in [
        PolicyName::TokenLoad,
        PolicyName::LeastRequest,
        PolicyName::RoundRobin,
    ] {
        for seed in 0..10 {
            let r = chosen(name, &rs, &predictor, &req, seed);
            assert_eq!(r.targets.len(), 1, "{name:?}: only local candidates");
            assert_eq!(r.targets[0].index, 0, "{name:?} seed {seed}");
        }
    }
}

#[test]
fn a_remote_placement_teaches_the_engine_side_ttft() {
    let (rs, predictor) = fleet(50.0);
    let r = chosen(PolicyName::Slo, &rs, &predictor, &profile(500.0), 1);
    let learn = r.targets[0].learn;
    assert_eq!(learn.rtt_ms, 50.0);
    // The node measured 160 ms from dispatch to the first token: 110 ms of engine.
    let f = Finished {
        ok: true,
        ttft_ms: Some(160.0),
        ttft_learned: false,
        upstream_ms: 1500.0,
        tpot_ms: Some(21.0),
        output_tokens: 64,
        reported: Reported::default(),
    };
    let s = f.samples(&learn, 41.0);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].ttft_ms, Some(110.0));
    assert_eq!(s[0].tpot_ms, Some(21.0), "TPOT is not the network's");
    let issued = s[0].predicted.expect("the issued prediction");
    assert!((issued.ttft_ms - (learn.prediction.ttft_ms - 50.0)).abs() < 1e-9);
    let first =
        headroom_core::lifecycle::first_token_sample(&learn, 41.0, 160.0, Reported::default())
            .expect("a TTFT sample");
    assert_eq!(first.ttft_ms, Some(110.0));
}

#[test]
fn statistics_cross_regions_per_class_and_corrections_stay_home() {
    // A node in us-1 learned the `fast` class on its replica; a node in eu-1 merges its
    // slot across regions: the class model warms there, the replica's correction does not
    // travel.
    let (rs, predictor) = fleet(50.0);
    drop(predictor);
    let mut us = Learner::new(PredictorConfig::default());
    us.set_node_id("us-node");
    for i in 0..400 {
        us.observe(&Sample {
            key: rs[1].key,
            obs: Observation {
                prompt_tokens: f64::from(PROMPT),
                expected_output_tokens: 64.0,
                ..Observation::default()
            },
            at_s: i as f64 * 0.1,
            ttft_ms: Some(100.0),
            tpot_ms: Some(20.0),
            output_tokens: 64,
            censored: false,
            predicted: None,
        });
    }
    let slot = us.export_slot("us-node", 40.0);
    assert!(!slot.blocks.is_empty() && !slot.corrections.is_empty());
    let crossed = region::cross_region_slot(slot.clone());
    assert!(crossed.corrections.is_empty(), "corrections stay in us-1");
    assert_eq!(crossed.blocks, slot.blocks, "class statistics travel whole");
    let mut eu = Learner::new(PredictorConfig::default());
    eu.set_node_id("eu-node");
    eu.merge_peer_slot(crossed).unwrap();
    eu.tick(40.0);
    let p = eu.snapshot(40.0).predict(
        rs[1].key,
        &Observation {
            prompt_tokens: f64::from(PROMPT),
            expected_output_tokens: 64.0,
            ..Observation::default()
        },
    );
    assert_eq!(p.ttft_state, ModelState::Warm, "the class model federated");
    assert!((p.ttft_ms - 100.0).abs() < 20.0, "{:.0} ms", p.ttft_ms);
}
