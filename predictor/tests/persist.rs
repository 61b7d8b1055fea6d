//! Warm start from bytes: round trips are exact, corrupt input is a clear error.

mod support;

use headroom_predictor::{Learner, PersistError, PredictorConfig, ReplicaKey, Sample, Snapshot};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use support::synth::{self, Engine, Load};

fn trained(seed: u64, n: usize) -> (Learner, Vec<Sample>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut l = Learner::new(PredictorConfig::default());
    let mut later = Vec::new();
    for i in 0..(2 * n) {
        let r = rng.random_range(0..4u64);
        let eng = if r < 2 {
            Engine::h100()
        } else {
            Engine::a100()
        };
        let s = synth::situation(&mut rng, &eng, &Load::moderate());
        let y = synth::ttft(&mut rng, &eng, &s);
        let z = synth::tpot(&mut rng, &eng, &s);
        let sample = Sample {
            key: ReplicaKey::new(r, r / 2),
            obs: s.obs,
            at_s: i as f64,
            ttft_ms: Some(y),
            tpot_ms: Some(z),
            output_tokens: 40,
            ..Default::default()
        };
        if i < n {
            l.observe(&sample);
        } else {
            later.push(sample);
        }
    }
    (l, later)
}

#[test]
fn snapshot_round_trip_predicts_identically() {
    let (mut l, later) = trained(41, 600);
    let mut peer = Learner::new(PredictorConfig::default());
    for s in &later[..100] {
        peer.observe(s);
    }
    l.merge_peer_slot(peer.export_slot("peer", 700.0))
        .expect("valid");
    let snap = l.snapshot(700.0);
    let bytes = snap.to_bytes().expect("serialises");
    let back = Snapshot::from_bytes(&bytes).expect("loads");
    for s in &later {
        for r in 0..6u64 {
            let key = ReplicaKey::new(r, r / 2);
            assert_eq!(snap.predict(key, &s.obs), back.predict(key, &s.obs));
        }
    }
    assert_eq!(snap.replica_reports(), back.replica_reports());
    assert_eq!(snap.class_reports(), back.class_reports());
    assert_eq!(back.created_at_s(), 700.0);
}

#[test]
fn learner_state_round_trip_continues_identically() {
    let (mut l, later) = trained(42, 500);
    let mut peer = Learner::new(PredictorConfig::default());
    for s in &later[..50] {
        peer.observe(s);
    }
    l.merge_peer_slot(peer.export_slot("peer", 520.0))
        .expect("valid");
    let bytes = l.save_state().expect("serialises");
    let mut back = Learner::load_state(PredictorConfig::default(), &bytes).expect("loads");
    assert_eq!(back.peers(), l.peers());
    for s in &later[50..] {
        l.observe(s);
        back.observe(s);
    }
    l.tick(1000.0);
    back.tick(1000.0);
    let (a, b) = (l.snapshot(1000.0), back.snapshot(1000.0));
    for s in &later[..50] {
        for r in 0..4u64 {
            let key = ReplicaKey::new(r, r / 2);
            assert_eq!(a.predict(key, &s.obs), b.predict(key, &s.obs));
        }
    }
    assert_eq!(a.replica_reports(), b.replica_reports());
}

#[test]
fn corrupt_or_foreign_bytes_are_clear_errors() {
    let (l, _) = trained(43, 200);
    let good = l.snapshot(200.0).to_bytes().expect("serialises");
    let state = l.save_state().expect("serialises");

    assert!(matches!(
        Snapshot::from_bytes(&[]),
        Err(PersistError::Truncated { .. })
    ));
    assert!(matches!(
        Snapshot::from_bytes(&good[..10]),
        Err(PersistError::Truncated { .. })
    ));
    assert!(matches!(
        Snapshot::from_bytes(&good[..good.len() - 1]),
        Err(PersistError::LengthMismatch { .. })
    ));
    assert!(matches!(
        Snapshot::from_bytes(&state),
        Err(PersistError::BadMagic { .. })
    ));
    assert!(matches!(
        Learner::load_state(PredictorConfig::default(), &good),
        Err(PersistError::BadMagic { .. })
    ));
    let mut v = good.clone();
    v[4] = 99;
    assert!(matches!(
        Snapshot::from_bytes(&v),
        Err(PersistError::UnsupportedVersion { found: 99, .. })
    ));
    let mut rng = ChaCha8Rng::seed_from_u64(44);
    for _ in 0..200 {
        let mut v = good.clone();
        let i = rng.random_range(24..v.len());
        v[i] ^= 1 << rng.random_range(0..8);
        assert_eq!(Snapshot::from_bytes(&v).err(), Some(PersistError::Checksum));
    }
    for _ in 0..200 {
        let n = rng.random_range(0..4096);
        let junk: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        assert!(Snapshot::from_bytes(&junk).is_err());
        assert!(Learner::load_state(PredictorConfig::default(), &junk).is_err());
    }
    let other_tau = PredictorConfig {
        tau_s: 60.0,
        ..Default::default()
    };
    let err = Learner::load_state(other_tau, &state)
        .err()
        .expect("tau mismatch");
    assert!(err.to_string().contains("tau_s"), "{err}");
}
