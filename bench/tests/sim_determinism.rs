//! The simulator is deterministic for a seed: two runs of the same configuration give
//! the same records, load samples and summary (only the decision-time samples, a wall
//! clock around the real decision code, differ); another seed gives another run.

use headroom_bench::{
    report::RunSummary,
    sim::{SimConfig, result::RunResult, simulate},
    workload::Workload,
};

/// A run that exercises every source of randomness: engine step noise, several meshed
/// router nodes with gossip, the `slo` policy's random choices and its predictor.
fn run(seed: u64) -> RunResult {
    let wl = Workload::from_spec("mixed:rate=3,duration=40,seed=4").expect("mixed generator");
    let cfg = SimConfig {
        policy: "slo".into(),
        routers: 3,
        step_noise: 0.05,
        seed,
        ..SimConfig::default()
    };
    let mut r = simulate(&wl, cfg).expect("simulation runs");
    assert_eq!(
        r.decision_ns.len(),
        r.records.len(),
        "a decision per request"
    );
    r.decision_ns.clear();
    r
}

/// The summary without its decision-time figures (wall clock, not simulated).
fn summary(r: &RunResult) -> serde_json::Value {
    let mut v = serde_json::to_value(RunSummary::of(r)).expect("summary serialises");
    v.as_object_mut()
        .expect("summary is an object")
        .remove("decision_us");
    v
}

#[test]
fn same_seed_same_run_other_seed_other_run() {
    let (a, b) = (run(11), run(11));
    assert!(a.records.len() > 50, "{} requests", a.records.len());
    assert_eq!(a, b, "records and load samples repeat exactly");
    assert_eq!(summary(&a), summary(&b));
    let c = run(12);
    assert_ne!(
        a.records, c.records,
        "another seed changes step noise and random choices"
    );
}
