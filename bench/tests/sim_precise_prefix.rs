//! Precise prefix state in the simulator (`SimConfig::precise_prefix`, what a
//! `precise` KV-event feed gives the router): on the Mooncake conversation trace the
//! router's cached-token count for each placement is the engine's far more often, and
//! far closer, than the approximate prefix index's.

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
    wl.requests.truncate(300);
    let cfg = SimConfig {
        policy: "slo".into(),
        precise_prefix: precise,
        ..SimConfig::default()
    };
    let run = simulate(&wl, cfg).expect("simulation runs");
    let placed: Vec<_> = run
        .records
        .iter()
        .filter_map(|r| Some((r.est_cached_tokens?, r.cached_tokens)))
        .collect();
    assert!(placed.len() >= 250, "most requests are placed: {}", placed.len());
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
    assert!(p_exact >= 0.9, "precise counts should equal the engine's: {p_exact:.3}");
    assert!(p_exact > a_exact + 0.05, "{p_exact:.3} vs {a_exact:.3}");
    assert!(p_err < a_err, "{p_err:.0} vs {a_err:.0}");
}
