//! Hot-path cost: predict() per candidate and per request of 8/64/256/1024 candidates,
//! and observe() per label. Run: `cargo bench -p headroom-predictor --bench predict`.

#[path = "../tests/support/synth.rs"]
mod synth;

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use headroom_predictor::{Learner, Observation, PredictorConfig, ReplicaKey, Sample, Snapshot};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use synth::{Engine, Load};

const REPLICAS: u64 = 1024;

fn key(r: u64) -> ReplicaKey {
    ReplicaKey::new(r, r % 4)
}

/// Labelled samples spread over `REPLICAS` replicas in 4 classes.
fn samples(n: usize, seed: u64) -> Vec<Sample> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let r = rng.random_range(0..REPLICAS);
            let eng = if r % 2 == 0 {
                Engine::h100()
            } else {
                Engine::a100()
            };
            let s = synth::situation(&mut rng, &eng, &Load::moderate());
            let y = synth::ttft(&mut rng, &eng, &s);
            let z = synth::tpot(&mut rng, &eng, &s);
            Sample {
                key: key(r),
                obs: s.obs,
                at_s: i as f64 * 0.05,
                ttft_ms: Some(y),
                tpot_ms: Some(z),
                output_tokens: 100,
                ..Default::default()
            }
        })
        .collect()
}

fn trained() -> (Learner, Vec<Sample>) {
    let mut l = Learner::new(PredictorConfig::default());
    let data = samples(20_000, 1);
    for s in &data {
        l.observe(s);
    }
    (l, data)
}

fn bench_predict(c: &mut Criterion) {
    let (l, data) = trained();
    let snap: Snapshot = l.snapshot(1000.0);
    let obs: Vec<Observation> = data.iter().take(1024).map(|s| s.obs).collect();
    let mut g = c.benchmark_group("predict");
    g.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    g.bench_function("one_candidate", |b| {
        b.iter(|| {
            i = (i + 1) & 1023;
            black_box(snap.predict(key(i as u64), black_box(&obs[i])))
        })
    });
    for n in [8usize, 64, 256, 1024] {
        let cands: Vec<(ReplicaKey, Observation)> = (0..n)
            .map(|j| {
                let r = (j as u64 * 7919) % REPLICAS;
                (key(r), obs[j % obs.len()])
            })
            .collect();
        let mut out = Vec::with_capacity(n);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::new("candidates", n), &cands, |b, cands| {
            b.iter(|| {
                snap.predict_many(black_box(cands), &mut out);
                black_box(out.len())
            })
        });
    }
    g.finish();
}

fn bench_observe(c: &mut Criterion) {
    let (mut l, _) = trained();
    let fresh = samples(4096, 2);
    let mut g = c.benchmark_group("observe");
    g.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    let mut t = 1000.0;
    g.bench_function("one_label", |b| {
        b.iter(|| {
            i = (i + 1) & 4095;
            t += 0.01;
            let s = Sample {
                at_s: t,
                ..fresh[i]
            };
            l.observe(black_box(&s));
        })
    });
    g.finish();
}

fn bench_snapshot(c: &mut Criterion) {
    let (l, _) = trained();
    c.bench_function("snapshot_1024_replicas", |b| {
        b.iter(|| black_box(l.snapshot(1000.0)))
    });
}

criterion_group!(benches, bench_predict, bench_observe, bench_snapshot);
criterion_main!(benches);
