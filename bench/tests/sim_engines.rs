//! Engines that do not flatter the router: the simulated router sees tokens as a live
//! one would (after the front end's coalescing), and engines may run constants other
//! than their profile's (profile files, `engine_mismatch`), deterministically.

use headroom_bench::{
    report::RunSummary,
    sim::{SimConfig, parse_fleet, result::RunResult, simulate},
    workload::Workload,
};
use headroom_engine::ProfileFile;

const FLEET: &str = "h100-llama3-8b:2,a100-llama3-8b:2";

fn workload() -> Workload {
    Workload::from_spec("mixed:rate=4,duration=30,seed=3").expect("mixed generator")
}

fn run(cfg: SimConfig) -> RunResult {
    let mut r = simulate(
        &workload(),
        SimConfig {
            fleet: parse_fleet(FLEET).expect("fleet"),
            policy: "token-load".into(),
            ..cfg
        },
    )
    .expect("simulation runs");
    r.decision_ns.clear(); // wall clock, not simulated
    r
}

fn exact() -> SimConfig {
    SimConfig {
        step_noise: 0.0,
        engine_files: ["h100-llama3-8b", "a100-llama3-8b"]
            .iter()
            .map(|c| {
                let f = ProfileFile {
                    frontend_step_ms: Some(0.0),
                    frontend_chunk_ms: Some(0.0),
                    ..ProfileFile::default()
                };
                (c.to_string(), f)
            })
            .collect(),
        ..SimConfig::default()
    }
}

fn with_files(f: ProfileFile) -> SimConfig {
    SimConfig {
        step_noise: 0.0,
        engine_files: ["h100-llama3-8b", "a100-llama3-8b"]
            .iter()
            .map(|c| (c.to_string(), f.clone()))
            .collect(),
        ..SimConfig::default()
    }
}

fn ttft_p50(r: &RunResult) -> f64 {
    RunSummary::of(r).ttft_ms.expect("ttft").p50
}

#[test]
fn defaults_are_noisy_and_coalescing_and_exactness_can_be_pinned() {
    let d = SimConfig::default();
    assert!(d.step_noise > 0.0, "step noise on by default");
    let (a, b) = (run(exact()), run(exact()));
    assert_eq!(a, b);
    let noisy = run(SimConfig::default());
    assert_eq!(noisy.records.len(), a.records.len());
    assert_ne!(
        noisy.records, a.records,
        "default noise and front end change outcomes"
    );
}

#[test]
fn a_busy_front_end_delays_and_bunches_what_the_router_measures() {
    let free = run(exact());
    // 3 ms per chunk: with a few dozen streams per replica the front end takes longer
    // than a decode step, so steps merge and tokens arrive late and together.
    let busy = run(with_files(ProfileFile {
        frontend_step_ms: Some(0.1),
        frontend_chunk_ms: Some(3.0),
        ..ProfileFile::default()
    }));
    assert_eq!(free.records.len(), busy.records.len());
    for (f, b) in free.records.iter().zip(&busy.records) {
        assert_eq!(
            f.output_tokens, b.output_tokens,
            "every token still arrives"
        );
    }
    let (tf, tb) = (ttft_p50(&free), ttft_p50(&busy));
    assert!(tb > tf + 3.0, "TTFT p50 {tb:.1} ms busy vs {tf:.1} ms free");
}

#[test]
fn stream_interval_alone_keeps_first_and_last_token_times() {
    let one = run(exact());
    let eight = run(with_files(ProfileFile {
        frontend_step_ms: Some(0.0),
        frontend_chunk_ms: Some(0.0),
        stream_interval: Some(8),
        ..ProfileFile::default()
    }));
    // The first token and the last chunk leave at once; only progress in between is
    // coarser. TTFT is identical; TPOT can differ only through what the router's
    // ledger learned from coarser progress (placements), not through measurement.
    let same_place = one
        .records
        .iter()
        .zip(&eight.records)
        .filter(|(a, b)| a.replica == b.replica && a.arrival_s < 5.0)
        .collect::<Vec<_>>();
    assert!(!same_place.is_empty());
    let (a, b) = same_place[0];
    assert_eq!(
        a.ttft_s, b.ttft_s,
        "the first placement's first token is not held"
    );
}

#[test]
fn mismatched_engines_are_deterministic_and_differ_from_matched() {
    let cfg = |m: f64, seed: u64| SimConfig {
        engine_mismatch: m,
        seed,
        ..exact()
    };
    let matched = run(cfg(0.0, 1));
    let (m1, m1b) = (run(cfg(0.3, 1)), run(cfg(0.3, 1)));
    assert_eq!(m1, m1b, "mismatch is drawn from the seed");
    assert_ne!(m1.records, matched.records);
    // A uniformly slower engine is slower: scale every constant by 1.3.
    let slow = run(with_files(ProfileFile {
        frontend_step_ms: Some(0.0),
        frontend_chunk_ms: Some(0.0),
        scale: Some(1.3),
        ..ProfileFile::default()
    }));
    let (tm, ts) = (ttft_p50(&matched), ttft_p50(&slow));
    assert!(ts > tm * 1.15, "TTFT p50 {ts:.1} ms slow vs {tm:.1} ms");
    // The router is still configured by class: replica names do not change.
    assert_eq!(
        m1.replicas.iter().map(|r| &r.profile).collect::<Vec<_>>(),
        matched
            .replicas
            .iter()
            .map(|r| &r.profile)
            .collect::<Vec<_>>()
    );
}

#[test]
fn bad_engine_settings_are_refused() {
    let wl = workload();
    let bad = |cfg: SimConfig| simulate(&wl, cfg).is_err();
    assert!(bad(SimConfig {
        engine_mismatch: f64::NAN,
        ..SimConfig::default()
    }));
    assert!(bad(SimConfig {
        step_noise: -0.1,
        ..SimConfig::default()
    }));
    assert!(bad(SimConfig {
        engine_files: vec![(
            "h100-llama3-8b".into(),
            ProfileFile {
                stream_interval: Some(0),
                ..ProfileFile::default()
            }
        )],
        ..SimConfig::default()
    }));
}
