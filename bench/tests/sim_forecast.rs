//! The predictor and the `slo` policy on a heterogeneous fleet under a mixed workload,
//! in the simulator running the router's own code, five seeds: after warm-up, TTFT
//! forecasts within 10% MAPE (8% on average), p90 bounds covering 85-95%, TPOT within the
//! error that future arrivals leave (see below), and SLO attainment above every baseline
//! in the same run.

use headroom_bench::{
    report::RunSummary,
    sim::{SimConfig, parse_fleet, simulate},
    workload::{SloRule, Workload},
};

const FLEET: &str = "h100-llama3-8b:2,l4-llama3-8b:2";
/// The first quarter of arrivals (150 s) is the predictor's warm-up.
const WARMUP_SHARE: f64 = 0.25;

fn run(policy: &str, seed: u64) -> RunSummary {
    let wl = Workload::from_spec(&format!("mixed:rate=1.5,duration=600,seed={seed}"))
        .expect("mixed generator");
    let wl = wl.clone().with_slo(&SloRule::for_trace(&wl.name));
    let cfg = SimConfig {
        policy: policy.into(),
        fleet: parse_fleet(FLEET).expect("fleet"),
        ..SimConfig::default()
    };
    let r = simulate(&wl, cfg).expect("simulation runs");
    RunSummary::with_warmup(&r, WARMUP_SHARE)
}

#[test]
fn slo_forecasts_within_bounds_and_beats_every_baseline_on_a_mixed_fleet() {
    let seeds = [1, 2, 3, 4, 5];
    let (mut ttft_mape, mut tpot_mape) = (0.0, 0.0);
    for seed in seeds {
        let slo = run("slo", seed);
        let ttft = slo.ttft_forecast.clone().expect("ttft forecasts");
        let tpot = slo.tpot_forecast.clone().expect("tpot forecasts");
        let (tc, pc) = (ttft.coverage.unwrap_or(0.0), tpot.coverage.unwrap_or(0.0));
        println!(
            "seed {seed}: slo attainment {:.3}; TTFT MAPE {:.1}% coverage {tc:.3}; TPOT MAPE {:.1}% coverage {pc:.3}",
            slo.attainment, ttft.mape_pct, tpot.mape_pct
        );
        ttft_mape += ttft.mape_pct / seeds.len() as f64;
        tpot_mape += tpot.mape_pct / seeds.len() as f64;
        assert!(
            ttft.mape_pct <= 10.0,
            "seed {seed}: TTFT MAPE {:.1}%",
            ttft.mape_pct
        );
        assert!(
            (0.85..=0.95).contains(&tc),
            "seed {seed}: TTFT p90 coverage {tc:.3}"
        );
        assert!(
            (0.85..=0.95).contains(&pc),
            "seed {seed}: TPOT p90 coverage {pc:.3}"
        );
        for base in [
            "token-load",
            "least-request",
            "prefix-affinity",
            "round-robin",
        ] {
            let b = run(base, seed);
            println!("seed {seed}: {base} attainment {:.3}", b.attainment);
            assert!(
                slo.attainment > b.attainment,
                "seed {seed}: slo {:.3} not above {base} {:.3}",
                slo.attainment,
                b.attainment
            );
        }
    }
    println!(
        "over {} seeds: TTFT MAPE {ttft_mape:.1}%, TPOT MAPE {tpot_mape:.1}%",
        seeds.len()
    );
    assert!(ttft_mape <= 8.0, "TTFT MAPE {ttft_mape:.1}% over the seeds");
    // TPOT here depends on documents that arrive while a request decodes (a 20k-token
    // prefill adds ~5 ms to every token of a 2 s chat response): no router can see
    // those at decision time. This bounds what the model leaves on top of that (11.3%
    // with the Huber-weighted fit; 12.6% with plain squared loss).
    assert!(
        tpot_mape <= 12.5,
        "TPOT MAPE {tpot_mape:.1}% over the seeds"
    );
}
