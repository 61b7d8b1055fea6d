//! Two regions 50 ms apart in the simulator, running the router's own policy code:
//! the short form of `bench/results/regions/`. While its replicas are up a region
//! serves its own traffic; when eu-1's replicas go dark its node moves everything to
//! us-1, where the objectives still hold with the round trip, and back when they
//! return. Under a local overload the `slo` policy spills only what the remote region
//! serves within the objectives, where a baseline stays home and misses.

use headroom_bench::{
    report::regions::{PhaseRow, region_phases},
    sim::{Dark, RunResult, SimConfig, parse_fleet, simulate},
    workload::{SloRule, Workload},
};

fn two_regions(fleet: &str, dark: Vec<Dark>, policy: &str, rate: f64) -> (RunResult, SimConfig) {
    let wl = Workload::from_spec(&format!(
        "poisson:rate={rate},duration=60,input=lognormal(800,0.6),output=lognormal(120,0.6),seed=7"
    ))
    .expect("poisson generator")
    .with_slo(&SloRule::parse("ttft=1500,tpot=100").expect("rule"));
    let mut cfg = SimConfig {
        fleet: parse_fleet(fleet).expect("fleet"),
        policy: policy.into(),
        routers: 2,
        dark,
        seed: 5,
        ..SimConfig::default()
    };
    cfg.regions.rtt_ms.insert("eu-1/us-1".into(), 50.0);
    let run = simulate(&wl, cfg.clone()).expect("simulation runs");
    (run, cfg)
}

fn row<'a>(rows: &'a [PhaseRow], region: &str, phase: &str) -> &'a PhaseRow {
    rows.iter()
        .find(|r| r.region == region && r.phase == phase)
        .expect("a row per region and phase")
}

#[test]
fn a_dark_region_moves_its_traffic_and_takes_it_back() {
    let dark = vec![Dark {
        region: "eu-1".into(),
        from_s: 20.0,
        to_s: 40.0,
    }];
    let fleet = "h100-llama3-8b:3@eu-1,h100-llama3-8b:3@us-1";
    let (run, cfg) = two_regions(fleet, dark.clone(), "slo", 6.0);
    assert!(run.records.iter().all(|r| !r.rejected), "nothing lost");
    let rows = region_phases(&run, &cfg);
    for r in &rows {
        println!(
            "{} {:>6}: {:>4} requests, attainment {:.3}, remote {:.3}",
            r.region,
            r.phase,
            r.requests,
            r.attainment.unwrap_or(f64::NAN),
            r.remote_share.unwrap_or(f64::NAN)
        );
    }
    let (before, during, after) = (
        row(&rows, "eu-1", "before"),
        row(&rows, "eu-1", "during"),
        row(&rows, "eu-1", "after"),
    );
    assert!(before.requests > 30 && during.requests > 30 && after.requests > 30);
    assert!(
        before.remote_share.unwrap() < 0.05,
        "home while home is fine"
    );
    assert_eq!(during.remote_share, Some(1.0), "every placement moved");
    assert!(after.remote_share.unwrap() < 0.10, "and came back");
    // The objectives hold across the distance: 50 ms of 1.5 s.
    for r in [before, during, after] {
        assert!(
            r.attainment.unwrap() >= 0.9,
            "eu-1 {}: {:?}",
            r.phase,
            r.attainment
        );
    }
    for phase in ["before", "during", "after"] {
        let us = row(&rows, "us-1", phase);
        assert!(us.remote_share.unwrap() < 0.05, "us-1 stays home {phase}");
        assert!(
            us.attainment.unwrap() >= 0.9,
            "us-1 {phase}: {:?}",
            us.attainment
        );
    }
    // Remote placements are forecast client-side: the RTT is in the prediction.
    let remote_pred: Vec<f64> = run
        .records
        .iter()
        .filter(|r| r.arrival_s >= 25.0 && r.arrival_s < 40.0 && r.node == 0)
        .filter_map(|r| Some(r.predicted_ttft_ms? - r.ttft_s? * 1e3))
        .collect();
    let mean_err = remote_pred.iter().sum::<f64>() / remote_pred.len() as f64;
    assert!(
        mean_err.abs() < 100.0,
        "remote TTFT forecasts are unbiased within 100 ms: mean {mean_err:.0} ms"
    );
    // Deterministic for a seed.
    let (again, _) = two_regions(fleet, dark, "slo", 6.0);
    assert_eq!(again.records, run.records);
}

#[test]
fn an_overloaded_region_spills_to_where_the_objectives_hold() {
    // eu-1 has one replica for half the traffic; us-1 has five.
    let fleet = "l4-llama3-8b:1@eu-1,h100-llama3-8b:5@us-1";
    let (slo, cfg) = two_regions(fleet, Vec::new(), "slo", 8.0);
    let (home, _) = two_regions(fleet, Vec::new(), "token-load", 8.0);
    let (s, h) = (region_phases(&slo, &cfg), region_phases(&home, &cfg));
    let (s_eu, h_eu) = (row(&s, "eu-1", "all"), row(&h, "eu-1", "all"));
    println!("slo eu-1: {s_eu:?}\ntoken-load eu-1: {h_eu:?}");
    let mut fb = std::collections::BTreeMap::new();
    for r in slo.records.iter().filter(|r| r.node == 0) {
        *fb.entry(r.fallback.clone()).or_insert(0) += 1;
    }
    println!("eu-1 fallbacks: {fb:?}");
    assert_eq!(h_eu.remote_share, Some(0.0), "a baseline stays local-first");
    let spill = s_eu.remote_share.unwrap();
    assert!(
        spill > 0.2 && spill < 0.95,
        "slo spills a share: {spill:.3}"
    );
    assert!(
        s_eu.attainment.unwrap() > h_eu.attainment.unwrap() + 0.2,
        "and meets more objectives: {:?} vs {:?}",
        s_eu.attainment,
        h_eu.attainment
    );
    assert!(
        s_eu.remote_attainment.unwrap() >= 0.9,
        "what it sent away met its objectives: {:?}",
        s_eu.remote_attainment
    );
}
