//! Warm-up: a new class is warm within 40 labels when its forecasts are good, stays warm,
//! and borrows a warm class's shape scaled by its own speed ratio.

mod support;

use headroom_predictor::{Learner, ModelState, PredictorConfig, ReplicaKey, Sample};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use support::synth::{self, Engine, Load};

/// One prequential label: forecast from the current snapshot, then learn.
fn label(
    l: &mut Learner,
    rng: &mut ChaCha8Rng,
    eng: &Engine,
    key: ReplicaKey,
    at: f64,
) -> (f64, f64, ModelState) {
    let s = synth::situation(rng, eng, &Load::moderate());
    let y = synth::ttft(rng, eng, &s);
    let z = synth::tpot(rng, eng, &s);
    l.tick(at);
    let p = l.snapshot(at).predict(key, &s.obs);
    l.observe(&Sample {
        key,
        obs: s.obs,
        at_s: at,
        ttft_ms: Some(y),
        tpot_ms: Some(z),
        output_tokens: 64,
        predicted: Some(p),
        ..Default::default()
    });
    (p.ttft_ms, y, p.ttft_state)
}

#[test]
fn a_new_class_is_warm_within_40_labels_and_stays_warm() {
    for seed in 1..=5 {
        let mut l = Learner::new(PredictorConfig::default());
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let key = ReplicaKey::new(1, 3);
        let eng = Engine::a100();
        let mut warm_at = None;
        let mut cold_after = 0;
        for i in 0..400 {
            let (_, _, st) = label(&mut l, &mut rng, &eng, key, i as f64);
            match (warm_at, st) {
                (None, ModelState::Warm) => warm_at = Some(i),
                (Some(_), s) if s != ModelState::Warm => cold_after += 1,
                _ => {}
            }
        }
        eprintln!("seed {seed}: warm at label {warm_at:?}, {cold_after} non-warm forecasts after");
        let w = warm_at.expect("warm at some point");
        assert!(w <= 40, "seed {seed}: warm only at label {w}");
        assert_eq!(cold_after, 0, "seed {seed}: fell back after warming");
    }
}

#[test]
fn a_slower_class_borrows_a_warm_class_shape_scaled_by_its_speed_ratio() {
    // Class 1 (H100-like) is warm; class 2 is the same engine 2.5× slower. After 6 labels
    // of class 2, its forecasts over fresh situations are compared with a learner that
    // never saw class 1 (generic physics prior).
    let fast = Engine::h100();
    let slow = Engine::h100().slowed(2.5);
    let mut with_donor = Learner::new(PredictorConfig::default());
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for i in 0..300 {
        label(
            &mut with_donor,
            &mut rng,
            &fast,
            ReplicaKey::new(1, 1),
            i as f64,
        );
    }
    let mut alone = Learner::new(PredictorConfig::default());
    let key = ReplicaKey::new(2, 2);
    for i in 0..6 {
        let s = synth::situation(&mut rng, &slow, &Load::moderate());
        let y = synth::ttft(&mut rng, &slow, &s);
        for l in [&mut with_donor, &mut alone] {
            l.observe(&Sample {
                key,
                obs: s.obs,
                at_s: 300.0 + f64::from(i),
                ttft_ms: Some(y),
                ..Default::default()
            });
        }
    }
    let (a, b) = (with_donor.snapshot(310.0), alone.snapshot(310.0));
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    for _ in 0..300 {
        let s = synth::situation(&mut rng, &slow, &Load::moderate());
        let y = synth::ttft(&mut rng, &slow, &s);
        ea.push((a.predict(key, &s.obs).ttft_ms - y).abs() / y);
        eb.push((b.predict(key, &s.obs).ttft_ms - y).abs() / y);
    }
    ea.sort_by(f64::total_cmp);
    eb.sort_by(f64::total_cmp);
    let (ma, mb) = (ea[150], eb[150]);
    eprintln!(
        "6 labels of a 2.5x slower class: MdAPE {:.1}% with a warm donor, {:.1}% from the generic prior",
        100.0 * ma,
        100.0 * mb
    );
    assert!(ma < 0.2, "{ma}");
    assert!(ma < mb, "the borrowed shape helps: {ma} vs {mb}");
}
