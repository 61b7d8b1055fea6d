//! Cost of one `Engine::step()` under a loaded batch, so the simulator's budget is
//! known. Each finished request is replaced at once, so the load stays constant.
//!
//! Run: `cargo bench -p headroom-engine --bench engine_step`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use headroom_engine::{Engine, EngineRequest, Event, Profile, block_hashes_for_hash_ids};

struct Load {
    engine: Engine,
    next_id: u64,
    prompt: u32,
    output: u32,
    hash_sets: Vec<Vec<u64>>,
}

impl Load {
    fn new(profile: &str, running: u64, prompt: u32, output: u32, groups: u64) -> Load {
        let p = Profile::by_name(profile).expect("profile");
        // 64 prompt variants; those in the same group (v % groups) share a 2-id
        // (1024-token) prefix, like chat turns with a common system prompt.
        let hash_sets = (0..64u64)
            .map(|v| {
                let ids: Vec<u64> = (0..u64::from(prompt.div_ceil(512)))
                    .map(|i| {
                        if i < 2 {
                            (v % groups) * 1000 + i
                        } else {
                            (v + 1) * 1_000_000 + i
                        }
                    })
                    .collect();
                block_hashes_for_hash_ids(&ids, prompt, 512, 16, 0).expect("hashes")
            })
            .collect();
        let mut l = Load {
            engine: Engine::new(&p, 1).expect("engine"),
            next_id: 0,
            prompt,
            output,
            hash_sets,
        };
        for _ in 0..running {
            l.submit();
        }
        // Warm up past the initial prefill wave.
        for _ in 0..2_000 {
            l.step();
        }
        l
    }

    fn submit(&mut self) {
        let id = self.next_id;
        self.next_id += 1;
        // Hashes are computed once per request by callers, outside `step()`: reuse a
        // pre-hashed set so the bench times the step alone.
        let hashes = self.hash_sets[(id % self.hash_sets.len() as u64) as usize].clone();
        // Stagger lengths so finishes spread over steps.
        let out = self.output / 2 + (id as u32 * 7919) % self.output;
        self.engine
            .submit(EngineRequest::new(id, self.prompt, hashes, out))
            .expect("submit");
    }

    fn step(&mut self) {
        self.engine.step();
        let finished = self
            .engine
            .events()
            .iter()
            .filter(|e| matches!(e, Event::Finished { .. }))
            .count();
        for _ in 0..finished {
            self.submit();
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine_step");
    g.throughput(Throughput::Elements(1));
    for (name, profile, running, prompt, output) in [
        (
            "h100_decode_256x2k",
            "h100-llama3-8b",
            256u64,
            2_000u32,
            400u32,
        ),
        (
            "h100_mooncake_like_32x12k",
            "h100-llama3-8b",
            32,
            12_000,
            343,
        ),
        ("a100_sharegpt_like_64x900", "a100-llama3-8b", 64, 900, 650),
    ] {
        let mut load = Load::new(profile, running, prompt, output, 8);
        g.bench_function(name, |b| b.iter(|| load.step()));
    }
    g.finish();
    // What an oracle pays to fork a loaded engine (27.5k-block pool, cache map).
    let load = Load::new("h100-llama3-8b", 32, 12_000, 343, 8);
    c.bench_function("engine_clone/h100_mooncake_like_32x12k", |b| {
        b.iter(|| std::hint::black_box(load.engine.clone()))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
