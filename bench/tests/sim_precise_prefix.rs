//! Precise prefix state in the simulator (`SimConfig::precise_prefix`, what a
//! `precise` KV-event feed gives the router): on the Mooncake conversation trace at
//! 3× its rate (near the `slo` policy's capacity) the router's cached-token count for a
//! placement is the engine's own for ≥ 99% of placements (the rest: blocks evicted or
//! stored between the decision and the engine's scheduling), at least as often as with
//! the approximate prefix index. In this simulator the approximate index is itself
//! exact for ~99% (its engines accept every placement, so what the router sent is
//! what they cache), which bounds what precise state can add here.

use headroom_bench::{
    sim::{SimConfig, simulate},
    workload::Workload,
};

/// (share of placements whose router count equals the engine's, mean |error| tokens).
fn cache_error(precise: bool) -> (f64, f64) {
    let mut wl = Workload::from_spec(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/traces/conversation_trace.jsonl"
    ))
    .expect("Mooncake conversation trace");
    wl.requests.truncate(1500);
    let cfg = SimConfig {
        policy: "slo".into(),
        precise_prefix: precise,
        rate_scale: 3.0,
        ..SimConfig::default()
    };
    let run = simulate(&wl, cfg).expect("simulation runs");
    let placed: Vec<_> = run
        .records
        .iter()
        .filter_map(|r| Some((r.est_cached_tokens?, r.cached_tokens)))
        .collect();
    assert!(
        placed.len() >= 1200,
        "most requests are placed: {}",
        placed.len()
    );
    let n = placed.len() as f64;
    let exact = placed.iter().filter(|(e, c)| e == c).count() as f64 / n;
    let err = placed
        .iter()
        .map(|(e, c)| (f64::from(*e) - f64::from(*c)).abs())
        .sum::<f64>()
        / n;
    (exact, err)
}

#[test]
fn precise_counts_match_the_engines_and_the_estimate_does_not() {
    let (p_exact, p_err) = cache_error(true);
    let (a_exact, a_err) = cache_error(false);
    println!(
        "exact share precise {p_exact:.3} approximate {a_exact:.3}; mean |error| precise {p_err:.0} approximate {a_err:.0} tokens"
    );
    assert!(
        p_exact >= 0.99,
        "precise counts should equal the engine's: {p_exact:.3}"
    );
    assert!(p_exact >= a_exact, "{p_exact:.3} vs {a_exact:.3}");
}
