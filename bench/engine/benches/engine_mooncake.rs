//! Whole-trace budget check: the Mooncake conversation trace (12k requests, mean
//! prompt 12k tokens) replayed in virtual time over 32 H100 engines, least-loaded
//! placement. Prints hashing time, simulation time and steps per second.
//!
//! Run: `cargo bench -p headroom-engine --bench engine_mooncake`
//! (trace path: `$MOONCAKE_TRACE`, default `bench/traces/conversation_trace.jsonl`,
//! the repository's copy).

use std::time::Instant;

use headroom_engine::{Engine, EngineRequest, Event, Profile, block_hashes_for_hash_ids};

#[derive(serde::Deserialize)]
struct Row {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

fn main() -> anyhow::Result<()> {
    let path = std::env::var("MOONCAKE_TRACE").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../traces/conversation_trace.jsonl"
        )
        .to_string()
    });
    let text = std::fs::read_to_string(&path)?;
    let rows: Vec<Row> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;

    let t_hash = Instant::now();
    let reqs: Vec<(f64, EngineRequest)> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let h = block_hashes_for_hash_ids(&r.hash_ids, r.input_length, 512, 16, 0)?;
            Ok((
                r.timestamp / 1000.0,
                EngineRequest::new(i as u64, r.input_length, h, r.output_length.max(1)),
            ))
        })
        .collect::<anyhow::Result<_>>()?;
    let hash_s = t_hash.elapsed().as_secs_f64();

    let profile = Profile::by_name("h100-llama3-8b")?;
    let mut engines: Vec<Engine> = (0..32)
        .map(|i| Engine::new(&profile, i))
        .collect::<Result<_, _>>()?;
    let mut outstanding = vec![0u32; engines.len()];
    let mut where_: Vec<usize> = vec![0; reqs.len()];
    let (mut steps, mut ttft_sum, mut firsts) = (0u64, 0.0f64, 0u64);
    let t_sim = Instant::now();
    let mut run_until = |e: &mut Engine, k: usize, t: f64, outstanding: &mut [u32]| {
        while !e.is_idle() && e.now_s() < t {
            e.step();
            steps += 1;
            for ev in e.events() {
                match ev {
                    Event::FirstToken { ttft_s, .. } => {
                        ttft_sum += ttft_s;
                        firsts += 1;
                    }
                    Event::Finished { .. } => outstanding[k] -= 1,
                    _ => {}
                }
            }
        }
    };
    for (i, (t, req)) in reqs.into_iter().enumerate() {
        for (k, e) in engines.iter_mut().enumerate() {
            run_until(e, k, t, &mut outstanding);
        }
        let k = (0..engines.len())
            .min_by_key(|&k| outstanding[k])
            .unwrap_or(0);
        engines[k].submit_at(req, t)?;
        outstanding[k] += 1;
        where_[i] = k;
    }
    for (k, e) in engines.iter_mut().enumerate() {
        run_until(e, k, f64::INFINITY, &mut outstanding);
    }
    let sim_s = t_sim.elapsed().as_secs_f64();
    let preempt: u64 = engines.iter().map(|e| e.stats().preemptions).sum();
    let hits: u64 = engines.iter().map(|e| e.stats().prefix_cache_hits).sum();
    let queries: u64 = engines.iter().map(|e| e.stats().prefix_cache_queries).sum();
    println!(
        "mooncake x32 h100: {} requests, hashing {hash_s:.2}s, simulation {sim_s:.2}s, \
         {steps} steps = {:.0} steps/s, mean TTFT {:.3}s, prefix hit rate {:.3}, preemptions {preempt}",
        where_.len(),
        steps as f64 / sim_s,
        ttft_sum / firsts.max(1) as f64,
        hits as f64 / queries.max(1) as f64,
    );
    Ok(())
}
