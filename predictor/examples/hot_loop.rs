//! A fixed amount of hot-path work, for instruction counting under callgrind (load-
//! independent, unlike wall time on a shared machine):
//! `valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out target/release/examples/hot_loop`
//! with arguments `OBSERVES PREDICTS`; the difference in total instructions between two
//! runs that differ in one count, divided by that difference, is the cost per call.

#[path = "../tests/support/synth.rs"]
mod synth;

use std::hint::black_box;

use headroom_predictor::{Learner, PredictorConfig, ReplicaKey, Sample};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use synth::{Engine, Load};

fn main() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let data: Vec<Sample> = (0..4000)
        .map(|i| {
            let r = rng.random_range(0..1024u64);
            let eng = if r % 2 == 0 {
                Engine::h100()
            } else {
                Engine::a100()
            };
            let s = synth::situation(&mut rng, &eng, &Load::moderate());
            let y = synth::ttft(&mut rng, &eng, &s);
            Sample {
                key: ReplicaKey::new(r, r % 4),
                obs: s.obs,
                at_s: i as f64 * 0.05,
                ttft_ms: Some(y),
                tpot_ms: Some(y / 20.0),
                output_tokens: 100,
                ..Default::default()
            }
        })
        .collect();
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let observes = args.first().copied().unwrap_or(20_000);
    let predicts = args.get(1).copied().unwrap_or(1_000_000);
    let mut l = Learner::new(PredictorConfig::default());
    for i in 0..observes {
        let s = Sample {
            at_s: i as f64 * 0.05,
            ..data[i % data.len()]
        };
        l.observe(black_box(&s));
    }
    let snap = l.snapshot(1000.0);
    let mut acc = 0.0;
    for i in 0..predicts {
        let s = &data[i % data.len()];
        acc += snap
            .predict(black_box(s.key), black_box(&s.obs))
            .ttft_upper_ms;
    }
    println!("observe calls {observes}, predict calls {predicts}, checksum {acc:.3}");
}
