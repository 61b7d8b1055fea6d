//! Federation: merged slots equal pooled data, merging is idempotent, stale and bad slots
//! are handled, and a cold node starts warm from its peers.

mod support;

use headroom_predictor::{
    FederationError, FederationSlot, Learner, MergeOutcome, ModelState, PredictorConfig,
    ReplicaKey, Sample, StatsBlock, TARGET_TPOT, TARGET_TTFT,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use support::synth::{self, Engine, Load};

/// Labelled samples over 2000 s (crossing several forward-decay landmarks), for two
/// classes and six replicas.
fn samples(n: usize, seed: u64) -> Vec<Sample> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let r = rng.random_range(0..6u64);
            let (class, eng) = if r < 3 {
                (0, Engine::h100())
            } else {
                (1, Engine::a100())
            };
            let s = synth::situation(&mut rng, &eng, &Load::moderate());
            let y = synth::ttft(&mut rng, &eng, &s);
            let z = synth::tpot(&mut rng, &eng, &s);
            Sample {
                key: ReplicaKey::new(r, class),
                obs: s.obs,
                at_s: i as f64 * 2000.0 / n as f64,
                ttft_ms: Some(y),
                tpot_ms: Some(z),
                output_tokens: 64,
                ..Default::default()
            }
        })
        .collect()
}

fn rel(a: f64, b: f64) -> f64 {
    (a - b).abs() / a.abs().max(b.abs()).max(1e-300)
}

fn assert_blocks_equal(a: &StatsBlock, b: &StatsBlock, tol: f64) {
    assert_eq!(
        (a.group, a.target, a.dim, a.n),
        (b.group, b.target, b.dim, b.n)
    );
    assert_eq!(a.landmark_s, b.landmark_s);
    for (x, y) in a.a_upper.iter().zip(&b.a_upper).chain(a.b.iter().zip(&b.b)) {
        assert!(rel(*x, *y) <= tol, "{x} vs {y}");
    }
    assert!(rel(a.sum_w, b.sum_w) <= tol && rel(a.sum_wyy, b.sum_wyy) <= tol);
}

#[test]
fn merged_slots_equal_one_learner_that_saw_all_the_data() {
    let all = samples(1500, 31);
    // Plain L2 weights: Huber weights depend on each node's own forecast at the time, so
    // with them merged statistics equal pooled ones only approximately (tested below).
    let cfg = PredictorConfig {
        tau_s: 120.0,
        huber_log: 0.0,
        ..Default::default()
    };
    let mut pooled = Learner::new(cfg.clone());
    let mut nodes: Vec<Learner> = (0..3).map(|_| Learner::new(cfg.clone())).collect();
    for (i, s) in all.iter().enumerate() {
        pooled.observe(s);
        nodes[i % 3].observe(s);
    }
    let slots: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| n.export_slot(&format!("node-{i}"), 2000.0))
        .collect();
    let a = &mut nodes[0];
    a.set_node_id("node-0");
    for s in &slots[1..] {
        assert_eq!(a.merge_peer_slot(s.clone()), Ok(MergeOutcome::Added));
    }
    a.tick(2000.0);
    pooled.tick(2000.0);
    for class in [0, 1] {
        for target in [TARGET_TTFT, TARGET_TPOT] {
            let m = a.merged_stats(class, target).expect("merged");
            let p = pooled.merged_stats(class, target).expect("pooled");
            assert_blocks_equal(&m, &p, 1e-9);
            let (cm, cp) = (
                a.coefficients(class, target).unwrap(),
                pooled.coefficients(class, target).unwrap(),
            );
            for (x, y) in cm.iter().zip(&cp) {
                assert!((x - y).abs() <= 1e-6 * (1.0 + y.abs()), "θ {x} vs {y}");
            }
        }
    }

    // Idempotent: the same slots again change nothing.
    let again = a.merged_stats(0, TARGET_TTFT).expect("merged");
    for s in &slots[1..] {
        assert_eq!(a.merge_peer_slot(s.clone()), Ok(MergeOutcome::Replaced));
    }
    assert_eq!(a.merged_stats(0, TARGET_TTFT).expect("merged"), again);
    // An older slot from the same node is ignored.
    let mut old = slots[1].clone();
    old.exported_at_s -= 10.0;
    old.blocks.clear();
    assert_eq!(a.merge_peer_slot(old), Ok(MergeOutcome::Outdated));
    assert_eq!(a.merged_stats(0, TARGET_TTFT).expect("merged"), again);
    // Our own slot coming back through gossip is refused.
    assert!(matches!(
        a.merge_peer_slot(slots[0].clone()),
        Err(FederationError::OwnSlot(_))
    ));
    // Forgetting the peers leaves only the own statistics.
    assert!(a.forget_peer("node-1") && a.forget_peer("node-2"));
    assert_eq!(
        a.merged_stats(1, TARGET_TPOT).expect("own").n,
        a.export_slot("x", 0.0).blocks[3].n
    );
}

#[test]
fn with_huber_weights_merged_forecasts_match_pooled_ones_closely() {
    let all = samples(1500, 32);
    let cfg = PredictorConfig {
        tau_s: 120.0,
        ..Default::default()
    };
    assert!(cfg.huber_log > 0.0, "the default is robust");
    let mut pooled = Learner::new(cfg.clone());
    let mut nodes: Vec<Learner> = (0..3).map(|_| Learner::new(cfg.clone())).collect();
    for (i, s) in all.iter().enumerate() {
        pooled.observe(s);
        nodes[i % 3].observe(s);
    }
    let slots: Vec<_> = (1..3)
        .map(|i| nodes[i].export_slot(&format!("node-{i}"), 2000.0))
        .collect();
    let a = &mut nodes[0];
    a.set_node_id("node-0");
    for s in slots {
        assert_eq!(a.merge_peer_slot(s), Ok(MergeOutcome::Added));
    }
    a.tick(2000.0);
    pooled.tick(2000.0);
    let (sa, sp) = (a.snapshot(2000.0), pooled.snapshot(2000.0));
    // Forecasts on fresh situations from the class models (a replica neither has seen).
    let held_out = samples(200, 33);
    let (mut worst, mut sum) = (0.0f64, 0.0);
    for s in &held_out {
        let key = ReplicaKey::new(100 + s.key.class, s.key.class);
        let (x, y) = (sa.predict(key, &s.obs), sp.predict(key, &s.obs));
        let d = rel(x.ttft_ms, y.ttft_ms).max(rel(x.tpot_ms, y.tpot_ms));
        worst = worst.max(d);
        sum += d;
    }
    let mean = sum / held_out.len() as f64;
    // Far inside the forecast error itself (~10% on these synthetic labels).
    assert!(
        mean < 0.01 && worst < 0.05,
        "merged and pooled forecasts differ by {mean:.4} on average, {worst:.3} at worst"
    );
}

/// Nodes whose wall clocks disagree by seconds (one 5 s ahead, one 5 s behind) stamp
/// their labels and slots on their own axes; the forward-decayed statistics they
/// federate still give forecasts within 1% of nodes with one clock, on the default
/// decay constant (a 5 s shift re-weighs a node's labels by e^(5/τ) ≈ 1.7%).
#[test]
fn peers_with_clocks_seconds_apart_federate_all_but_identically() {
    let all = samples(1500, 34);
    let cfg = PredictorConfig::default();
    let skews = [0.0, 5.0, -5.0];
    let run = |skewed: bool| {
        let mut nodes: Vec<Learner> = (0..3).map(|_| Learner::new(cfg.clone())).collect();
        for (i, s) in all.iter().enumerate() {
            let k = i % 3;
            let mut s = *s;
            if skewed {
                s.at_s += skews[k];
            }
            nodes[k].observe(&s);
        }
        let slots: Vec<_> = (1..3)
            .map(|k| {
                let at = 2000.0 + if skewed { skews[k] } else { 0.0 };
                nodes[k].export_slot(&format!("node-{k}"), at)
            })
            .collect();
        let mut a = nodes.swap_remove(0);
        a.set_node_id("node-0");
        for s in slots {
            assert_eq!(a.merge_peer_slot(s), Ok(MergeOutcome::Added));
        }
        a.tick(2000.0);
        a.snapshot(2000.0)
    };
    let (plain, skewed) = (run(false), run(true));
    let held_out = samples(200, 35);
    let (mut worst, mut sum) = (0.0f64, 0.0);
    for s in &held_out {
        let key = ReplicaKey::new(100 + s.key.class, s.key.class);
        let (x, y) = (plain.predict(key, &s.obs), skewed.predict(key, &s.obs));
        let d = rel(x.ttft_ms, y.ttft_ms).max(rel(x.tpot_ms, y.tpot_ms));
        worst = worst.max(d);
        sum += d;
    }
    let mean = sum / held_out.len() as f64;
    assert!(
        mean < 0.01 && worst < 0.02,
        "skewed and unskewed federated forecasts differ by {mean:.4} on average, {worst:.3} at worst"
    );
}

#[test]
fn stale_peer_slots_are_dropped_and_corrupt_ones_refused() {
    let data = samples(200, 32);
    let mut a = Learner::new(PredictorConfig::default());
    let mut b = Learner::new(PredictorConfig::default());
    for s in &data {
        b.observe(s);
    }
    let slot = b.export_slot("b", 2000.0);
    let mut bad = slot.clone();
    bad.blocks[0].a_upper[0] = f64::NAN;
    assert!(matches!(
        a.merge_peer_slot(bad),
        Err(FederationError::BadBlock { .. })
    ));
    let mut bad = slot.clone();
    bad.blocks[0].b.pop();
    assert!(a.merge_peer_slot(bad).is_err());
    let mut bad = slot.clone();
    bad.blocks[0].dim += 1;
    assert!(a.merge_peer_slot(bad).is_err());
    let mut bad = slot.clone();
    bad.blocks[0].sum_w = -1.0;
    assert!(a.merge_peer_slot(bad).is_err());
    let mut bad = slot.clone();
    bad.tau_s = 60.0;
    let err = a.merge_peer_slot(bad).expect_err("different decay");
    assert!(err.to_string().contains("tau_s"), "{err}");
    assert_eq!(a.counters().rejected_slots, 5);
    assert!(a.peers().is_empty(), "nothing was merged from bad slots");

    a.merge_peer_slot(slot).expect("valid");
    assert_eq!(a.peers(), vec!["b".to_string()]);
    a.tick(2000.0 + a.config().peer_max_age_s - 1.0);
    assert_eq!(a.peers().len(), 1);
    a.tick(2000.0 + a.config().peer_max_age_s + 1.0);
    assert!(
        a.peers().is_empty(),
        "a slot older than peer_max_age_s is dropped"
    );
    assert!(a.merged_stats(0, TARGET_TTFT).is_none_or(|m| m.n == 0));
}

#[test]
fn a_fresh_node_is_warm_from_its_peers_without_labels() {
    let data = samples(1200, 33);
    let mut veteran = Learner::new(PredictorConfig::default());
    for s in &data {
        veteran.observe(s);
    }
    veteran.tick(2000.0);
    let mut fresh = Learner::new(PredictorConfig::default());
    fresh
        .merge_peer_slot(veteran.export_slot("veteran", 2000.0))
        .expect("valid");
    let snap = fresh.snapshot(2000.0);
    let vsnap = veteran.snapshot(2000.0);
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    let mut errs = Vec::new();
    let mut same_wait = 0;
    for _ in 0..200 {
        let eng = Engine::a100();
        let s = synth::situation(&mut rng, &eng, &Load::moderate());
        let y = synth::ttft(&mut rng, &eng, &s);
        let p = snap.predict(ReplicaKey::new(4, 1), &s.obs);
        assert_eq!(p.ttft_state, ModelState::Warm);
        errs.push((p.ttft_ms - y).abs() / y);
        let pv = vsnap.predict(ReplicaKey::new(4, 1), &s.obs);
        // What a node measured about a replica itself (its step time, the most requests
        // seen running on it) stays local like calibration, so the admission wait of a
        // placement at the replica's running peak may differ; everything else is shared.
        if p.ttft_wait_ms == pv.ttft_wait_ms {
            same_wait += 1;
            assert!(
                rel(p.ttft_ms, pv.ttft_ms) < 1e-6,
                "same model and correction as the veteran"
            );
        }
    }
    assert!(same_wait >= 150, "{same_wait} of 200 placements compared");
    errs.sort_by(f64::total_cmp);
    eprintln!(
        "fresh node, zero own labels: TTFT MdAPE {:.1}%",
        100.0 * errs[100]
    );
    assert!(errs[100] < 0.1);
}

#[test]
fn per_replica_corrections_merge_weighted_by_label_count() {
    let mut a = Learner::new(PredictorConfig::default());
    let mut b = Learner::new(PredictorConfig::default());
    let mut rng = ChaCha8Rng::seed_from_u64(35);
    let eng = Engine::h100();
    // a sees replica 1 at class speed; b sees replica 0 at class speed and replica 1 1.5×
    // slower, with more labels for replica 1 than a has.
    for i in 0..4000 {
        let s = synth::situation(&mut rng, &eng, &Load::moderate());
        let y = synth::ttft(&mut rng, &eng, &s);
        let base = Sample {
            key: ReplicaKey::new(1, 0),
            obs: s.obs,
            at_s: i as f64 * 0.1,
            ttft_ms: Some(y),
            ..Default::default()
        };
        match i % 5 {
            0 => a.observe(&base),
            1 => b.observe(&Sample {
                key: ReplicaKey::new(0, 0),
                ..base
            }),
            _ => b.observe(&Sample {
                ttft_ms: Some(1.5 * y),
                ..base
            }),
        }
    }
    let ra = a.snapshot(400.0).replica_report(1).unwrap().ttft;
    let rb = b.snapshot(400.0).replica_report(1).unwrap().ttft;
    a.merge_peer_slot(b.export_slot("b", 400.0)).expect("valid");
    let merged = a.snapshot(400.0).replica_report(1).unwrap().ttft;
    let (wa, wb) = (ra.labels as f64, rb.labels as f64);
    let expect = (wa * ra.correction_log + wb * rb.correction_log) / (wa + wb);
    let plain = 0.5 * (ra.correction_log + rb.correction_log);
    eprintln!(
        "corrections: a {:.3} ({wa} labels), b {:.3} ({wb} labels), merged {:.3}, count-weighted {expect:.3}, plain mean {plain:.3}",
        ra.correction_log, rb.correction_log, merged.correction_log
    );
    assert!((merged.correction_log - expect).abs() < 0.01);
    assert!(
        (merged.correction_log - plain).abs() > 0.02,
        "the weighting matters here"
    );
    assert_eq!(merged.peer_labels, rb.labels);
}

/// The checks a row-validating transport (the gossip crate) applies to every block.
fn transport_accepts(b: &StatsBlock) -> bool {
    let d = usize::from(b.dim);
    b.dim <= 64
        && b.a_upper.len() == d * (d + 1) / 2
        && b.b.len() == d
        && b.a_upper.iter().chain(&b.b).all(|x| x.is_finite())
        && b.sum_w.is_finite()
        && b.sum_wyy.is_finite()
        && b.landmark_s.is_finite()
}

#[test]
fn a_slot_travels_losslessly_as_plain_stat_blocks() {
    // Many replicas, so the correction table spans several rows.
    let mut rng = ChaCha8Rng::seed_from_u64(36);
    let mut b = Learner::new(PredictorConfig::default());
    for i in 0..3000 {
        let r = rng.random_range(0..600u64) + (1u64 << 40);
        let eng = Engine::h100();
        let s = synth::situation(&mut rng, &eng, &Load::moderate());
        let y = synth::ttft(&mut rng, &eng, &s);
        b.observe(&Sample {
            key: ReplicaKey::new(r, u64::MAX - 3),
            obs: s.obs,
            at_s: i as f64 * 0.5,
            ttft_ms: Some(y),
            tpot_ms: Some(y / 30.0),
            output_tokens: 10,
            ..Default::default()
        });
    }
    let slot = b.export_slot("b", 1500.0);
    let rows = slot.to_blocks();
    assert!(rows.iter().all(transport_accepts));
    assert!(rows.len() <= 256, "{} rows", rows.len());
    eprintln!(
        "{} corrections and {} stat blocks travel as {} rows",
        slot.corrections.len(),
        slot.blocks.len(),
        rows.len()
    );
    let back = FederationSlot::from_blocks("b", &rows).expect("decodes");
    assert_eq!(back.blocks, slot.blocks);
    assert_eq!(back.label_times, slot.label_times);
    assert_eq!(
        (back.tau_s, back.exported_at_s),
        (slot.tau_s, slot.exported_at_s)
    );
    assert_eq!(back.corrections.len(), slot.corrections.len());

    // Merging the decoded slot predicts exactly like merging the original.
    let mut via_struct = Learner::new(PredictorConfig::default());
    let mut via_rows = Learner::new(PredictorConfig::default());
    via_struct.merge_peer_slot(slot).expect("valid");
    via_rows.merge_peer_slot(back).expect("valid");
    let (s1, s2) = (via_struct.snapshot(1500.0), via_rows.snapshot(1500.0));
    let obs = synth::situation(&mut rng, &Engine::h100(), &Load::moderate()).obs;
    for r in 0..600u64 {
        let key = ReplicaKey::new(r + (1u64 << 40), u64::MAX - 3);
        let (p1, p2) = (s1.predict(key, &obs), s2.predict(key, &obs));
        assert!(rel(p1.ttft_ms, p2.ttft_ms) < 1e-12 && rel(p1.tpot_ms, p2.tpot_ms) < 1e-12);
        assert_eq!(p1.state, p2.state);
    }

    // Damaged rows are refused with an error, never a panic.
    let mut no_meta = rows.clone();
    no_meta.retain(|b| b.target != headroom_predictor::TARGET_META);
    assert!(FederationSlot::from_blocks("b", &no_meta).is_err());
    let mut bad_kind = rows.clone();
    bad_kind[0].target = 77;
    assert!(FederationSlot::from_blocks("b", &bad_kind).is_err());
    let mut bad_table = rows.clone();
    if let Some(t) = bad_table
        .iter_mut()
        .find(|b| b.target == headroom_predictor::TARGET_CORRECTIONS)
    {
        t.a_upper[0] = 0.5; // not an integer id half
    }
    assert!(FederationSlot::from_blocks("b", &bad_table).is_err());
    let mut short = rows;
    if let Some(t) = short
        .iter_mut()
        .find(|b| b.target == headroom_predictor::TARGET_LABEL_TIMES)
    {
        t.b.pop();
    }
    assert!(FederationSlot::from_blocks("b", &short).is_err());
}
