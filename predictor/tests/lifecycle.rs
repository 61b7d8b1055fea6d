//! Cold → Warm → Stale transitions, priors, and sanitisation of hostile inputs.

mod support;

use headroom_predictor::features::{GENERIC_TTFT_THETA, TTFT_DIM, ttft_features};
use headroom_predictor::{
    BoundSource, ClassPrior, Learner, ModelState, Observation, PredictorConfig, ReplicaKey, Sample,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use support::synth::{self, Engine, Load};

fn label(l: &mut Learner, rng: &mut ChaCha8Rng, key: ReplicaKey, at: f64) {
    label_scaled(l, rng, key, at, 1.0);
}

/// Labels `key` with the synthetic engine's TTFT × `ttft_scale` (a stall when > 1: an
/// engine held off its core, nothing the features see).
fn label_scaled(l: &mut Learner, rng: &mut ChaCha8Rng, key: ReplicaKey, at: f64, ttft_scale: f64) {
    let mut sample = synth::sample(rng, &Engine::h100(), &Load::moderate(), key, at);
    sample.ttft_ms = sample.ttft_ms.map(|y| y * ttft_scale);
    l.observe(&sample);
}

#[test]
fn cold_then_warm_then_stale_then_warm_again() {
    let cfg = PredictorConfig::default();
    let mut l = Learner::new(cfg.clone());
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let key = ReplicaKey::new(5, 1);
    let obs = synth::situation(&mut rng, &Engine::h100(), &Load::moderate()).obs;

    let p = l.snapshot(0.0).predict(key, &obs);
    assert_eq!(p.state, ModelState::Cold);
    assert!(p.ttft_ms.is_finite() && p.ttft_ms > 0.0 && p.tpot_ms > 0.0);
    assert!(
        p.ttft_upper_ms >= cfg.cold_upper_factor * p.ttft_ms * 0.999,
        "cold bounds are wide"
    );

    for i in 0..10 {
        label(&mut l, &mut rng, key, i as f64);
    }
    assert_eq!(
        l.snapshot(10.0).predict(key, &obs).state,
        ModelState::Cold,
        "10 labels are not enough"
    );

    for i in 10..200 {
        label(&mut l, &mut rng, key, i as f64);
    }
    let warm = l.snapshot(200.0).predict(key, &obs);
    assert_eq!(warm.state, ModelState::Warm);
    assert!(
        warm.ttft_upper_ms / warm.ttft_ms < p.ttft_upper_ms / p.ttft_ms,
        "bounds tighten once calibrated"
    );

    let later = 199.0 + cfg.stale_after_s + 1.0;
    assert_eq!(
        l.snapshot(later).predict(key, &obs).state,
        ModelState::Stale
    );
    assert_eq!(
        l.snapshot(later).replica_report(5).expect("known").state,
        ModelState::Stale
    );

    label(&mut l, &mut rng, key, later);
    assert_eq!(l.snapshot(later).predict(key, &obs).state, ModelState::Warm);
}

#[test]
fn a_new_replica_of_a_warm_class_borrows_the_class_model_and_bounds() {
    let mut l = Learner::new(PredictorConfig::default());
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    for i in 0..300 {
        label(&mut l, &mut rng, ReplicaKey::new(i % 3, 1), i as f64);
    }
    let snap = l.snapshot(300.0);
    let obs = synth::situation(&mut rng, &Engine::h100(), &Load::moderate()).obs;
    let fresh = snap.predict(ReplicaKey::new(99, 1), &obs);
    assert_eq!(fresh.state, ModelState::Warm);
    let class = &snap.class_reports()[0];
    assert_eq!(class.ttft.bound_source, BoundSource::Class);
    // An unknown class falls back to the generic prior, Cold.
    let stranger = snap.predict(ReplicaKey::new(100, 42), &obs);
    assert_eq!(stranger.state, ModelState::Cold);
    assert!(stranger.ttft_ms.is_finite());
}

#[test]
fn a_configured_prior_drives_cold_predictions() {
    let theta = [10.0, 5.0, 30.0, 10.0, 50.0, 2.0, 8.0, 1.0];
    let cfg = PredictorConfig {
        priors: vec![ClassPrior {
            class: 3,
            ttft_theta: theta.to_vec(),
            tpot_theta: vec![7.0, 0.01, 5.0, 3.0, 1.0, 0.0],
            kappa: 50.0,
        }],
        ..Default::default()
    };
    let l = Learner::new(cfg.clone());
    let obs = Observation {
        prompt_tokens: 2000.0,
        queued_prefill_tokens: 3000.0,
        queued_requests: 2.0,
        decoding_requests: 10.0,
        decode_context_tokens: 20_000.0,
        ..Default::default()
    };
    let x = ttft_features(
        &obs,
        &headroom_predictor::features::FeatureParams {
            default_max_batched_tokens: cfg.default_max_batched_tokens,
            metric_fresh_s: cfg.metric_fresh_s,
        },
    );
    // A prior written before `kv_deficit` existed leaves that coefficient at 0.
    assert_eq!(theta.len() + 1, TTFT_DIM);
    let dot = |t: &[f64]| t.iter().zip(&x).map(|(a, b)| a * b).sum::<f64>();
    let snap = l.snapshot(0.0);
    let p3 = snap.predict(ReplicaKey::new(1, 3), &obs);
    let p4 = snap.predict(ReplicaKey::new(1, 4), &obs);
    assert!(
        (p3.ttft_ms - dot(&theta)).abs() < 1e-9,
        "class 3 uses its prior"
    );
    assert!(
        (p4.ttft_ms - dot(&GENERIC_TTFT_THETA)).abs() < 1e-9,
        "others use the generic one"
    );
}

#[test]
fn hostile_inputs_are_sanitised_counted_and_never_nan() {
    let mut l = Learner::new(PredictorConfig::default());
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let key = ReplicaKey::new(1, 0);
    for i in 0..100 {
        label(&mut l, &mut rng, key, i as f64);
    }
    let evil = Observation {
        prompt_tokens: f64::NAN,
        cached_tokens: f64::INFINITY,
        expected_output_tokens: -5.0,
        queued_prefill_tokens: f64::INFINITY,
        queued_requests: f64::NAN,
        queued_attention_pairs: f64::MAX,
        decoding_requests: f64::NEG_INFINITY,
        decode_context_tokens: 1e300,
        decode_remaining_tokens: f64::NAN,
        prefill_inflow_tps: f64::INFINITY,
        kv_usage: 7.0,
        kv_capacity_tokens: -1.0,
        scraped_waiting: f64::NAN,
        scraped_running: f64::INFINITY,
        preemption_rate: f64::NAN,
        metric_age_s: f64::NEG_INFINITY,
        max_batched_tokens: f64::NAN,
        step_residual_ms: f64::NEG_INFINITY,
    };
    let snap = l.snapshot(100.0);
    let p = snap.predict(key, &evil);
    for v in [
        p.ttft_ms,
        p.ttft_upper_ms,
        p.tpot_ms,
        p.tpot_upper_ms,
        p.ttft_log_sigma,
        p.tpot_median_ms,
    ] {
        assert!(v.is_finite() && v > 0.0, "{p:?}");
    }
    let (a, b) = p.violation_probability(100.0, 50.0);
    assert!((0.0..=1.0).contains(&a) && (0.0..=1.0).contains(&b));
    assert_eq!(snap.counters().sanitized_predictions, 1);

    // Bad labels are rejected and leave the model untouched.
    let probe = synth::situation(&mut rng, &Engine::h100(), &Load::moderate()).obs;
    l.tick(100.0);
    let before = l.snapshot(100.0).predict(key, &probe);
    for bad in [f64::NAN, f64::INFINITY, -1.0, 0.0] {
        l.observe(&Sample {
            key,
            obs: probe,
            at_s: 100.0,
            ttft_ms: Some(bad),
            ..Default::default()
        });
    }
    l.observe(&Sample {
        key,
        obs: probe,
        at_s: f64::NAN,
        ttft_ms: Some(100.0),
        ..Default::default()
    });
    l.tick(100.0);
    assert_eq!(l.counters().rejected_labels, 5);
    assert_eq!(l.snapshot(100.0).predict(key, &probe), before);

    // A hostile observation with a good label is sanitised and learned from without NaN.
    l.observe(&Sample {
        key,
        obs: evil,
        at_s: 101.0,
        ttft_ms: Some(200.0),
        ..Default::default()
    });
    l.tick(101.0);
    assert_eq!(l.counters().sanitized_samples, 1);
    let after = l.snapshot(101.0).predict(key, &probe);
    assert!(after.ttft_ms.is_finite() && after.ttft_upper_ms.is_finite());
}

#[test]
fn replica_measurements_reject_garbage_and_drive_the_admission_wait() {
    let mut l = Learner::new(PredictorConfig::default());
    let key = ReplicaKey::new(9, 4);
    let before = l.counters().rejected_labels;
    l.observe_step_time(key, 1.0, f64::NAN);
    l.observe_step_time(key, 1.0, -3.0);
    l.observe_step_time(key, f64::INFINITY, 30.0);
    l.observe_running(key, 1.0, f64::NAN);
    l.observe_running(key, 1.0, -1.0);
    assert_eq!(l.counters().rejected_labels, before + 5, "each is counted");

    // A replica pinned at 64 running requests for 3 s, 40 ms steps: a request behind 9
    // queued ones waits for 10 of them to finish.
    for i in 0..60 {
        let t = f64::from(i) * 0.05;
        l.observe_running(key, t, 64.0);
        l.observe_step_time(key, t, 40.0);
    }
    let obs = Observation {
        prompt_tokens: 500.0,
        expected_output_tokens: 400.0,
        queued_requests: 9.0,
        queued_prefill_tokens: 4_500.0,
        decoding_requests: 64.0,
        decode_context_tokens: 64.0 * 700.0,
        decode_remaining_tokens: 64.0 * 200.0,
        max_batched_tokens: 2048.0,
        ..Default::default()
    };
    let p = l.snapshot(3.0).predict(key, &obs);
    // Mid-life (200 generated, 200 left): the 10th of 64 after 400·10/64 steps of 40 ms.
    let want = 400.0 * 10.0 / 64.0 * 40.0;
    assert!(
        (p.ttft_wait_ms - want).abs() < 1e-6,
        "{} vs {want}",
        p.ttft_wait_ms
    );
    assert!(
        p.ttft_ms >= want,
        "the wait is in the forecast: {}",
        p.ttft_ms
    );
    // The same load while the count still climbs is no evidence of a cap.
    let mut climbing = Learner::new(PredictorConfig::default());
    for i in 0..60 {
        climbing.observe_running(key, f64::from(i) * 0.05, f64::from(i + 5));
    }
    let p = climbing.snapshot(3.0).predict(key, &obs);
    assert_eq!(p.ttft_wait_ms, 0.0);
}

#[test]
fn a_forecast_splits_into_terms_that_sum_to_it() {
    let mut l = Learner::new(PredictorConfig::default());
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    let key = ReplicaKey::new(9, 2);
    for i in 0..200 {
        label(&mut l, &mut rng, key, i as f64);
    }
    let snap = l.snapshot(200.0);
    // A queue behind a full KV cache.
    let obs = Observation {
        queued_prefill_tokens: 3000.0,
        queued_requests: 2.0,
        decoding_requests: 30.0,
        decode_context_tokens: 60_000.0,
        decode_remaining_tokens: 3000.0,
        kv_capacity_tokens: 60_000.0,
        kv_usage: 1.0,
        metric_age_s: 0.0,
        ..synth::situation(&mut rng, &Engine::h100(), &Load::moderate()).obs
    };
    let terms = snap.ttft_terms(key, &obs);
    let (sum, point): (f64, f64) = (terms.iter().sum(), snap.predict_ttft_ms(key, &obs));
    assert!(terms.iter().all(|t| t.is_finite()), "{terms:?}");
    assert!((sum - point).abs() <= 1e-9 * point, "{sum} vs {point}");
    // An idle replica's forecast may sit on the floor: the terms never exceed it.
    let idle = Observation::default();
    let idle_sum: f64 = snap.ttft_terms(key, &idle).iter().sum();
    assert!(snap.predict_ttft_ms(key, &idle) >= idle_sum - 1e-9);
    let wait = snap.ttft_terms(key, &obs)[6];
    assert!(
        wait > 0.0,
        "a full cache shows in the admission-wait term: {wait}"
    );
}

/// Every fourth label a stall 100× the engine's TTFT.
fn label_with_stalls(l: &mut Learner, rng: &mut ChaCha8Rng, key: ReplicaKey, at: f64, i: u64) {
    label_scaled(l, rng, key, at, if i % 4 == 3 { 100.0 } else { 1.0 });
}

#[test]
fn a_replica_goes_cold_on_its_own_only_when_broken_apart_from_its_class() {
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let obs = synth::situation(&mut rng, &Engine::h100(), &Load::moderate()).obs;
    let mut at = 0.0;

    // Three replicas of one class; then one of them stalls and the others do not.
    let mut l = Learner::new(PredictorConfig::default());
    for i in 0..300 {
        label(&mut l, &mut rng, ReplicaKey::new(i % 3, 1), at);
        at += 1.0;
    }
    for i in 0..240 {
        let r = i % 3;
        if r == 2 {
            label_with_stalls(&mut l, &mut rng, ReplicaKey::new(r, 1), at, i / 3);
        } else {
            label(&mut l, &mut rng, ReplicaKey::new(r, 1), at);
        }
        at += 1.0;
    }
    let snap = l.snapshot(at);
    assert_eq!(
        snap.predict(ReplicaKey::new(0, 1), &obs).state,
        ModelState::Warm
    );
    assert_eq!(
        snap.predict(ReplicaKey::new(2, 1), &obs).ttft_state,
        ModelState::Cold,
        "broken where its class is not"
    );

    // Alone in its class, the same stalls are the class's errors: its gate, which
    // weighs them against the load baseline that misses them too, keeps it warm.
    let mut l = Learner::new(PredictorConfig::default());
    let key = ReplicaKey::new(7, 2);
    for i in 0..300 {
        label(&mut l, &mut rng, key, i as f64);
    }
    for i in 0..240 {
        label_with_stalls(&mut l, &mut rng, key, 300.0 + i as f64, i);
    }
    let p = l.snapshot(540.0).predict(key, &obs);
    assert_eq!(p.ttft_state, ModelState::Warm, "{p:?}");
}
