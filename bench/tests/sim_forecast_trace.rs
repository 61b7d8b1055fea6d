//! The predictor and the `slo` policy on a real production mix: the first 3,000
//! requests of the Azure LLM inference conversation trace (2023; prompts 10 to 14k
//! tokens, real arrival times, ≈ 9 minutes) on 2 H100 + 2 L4, three seeds. After
//! warm-up the bars of the design hold: TTFT and TPOT forecasts within 10% MAPE, p90
//! bounds covering 85-95%, SLO attainment above every baseline in the same run.

use headroom_bench::{
    report::RunSummary,
    sim::{SimConfig, parse_fleet, simulate},
    workload::{SloRule, Workload},
};

const FLEET: &str = "h100-llama3-8b:2,l4-llama3-8b:2";
const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/traces/AzureLLMInferenceTrace_conv.csv"
);
const REQUESTS: usize = 3000;
const WARMUP_SHARE: f64 = 0.25;

fn run(wl: &Workload, policy: &str, seed: u64) -> RunSummary {
    let cfg = SimConfig {
        policy: policy.into(),
        fleet: parse_fleet(FLEET).expect("fleet"),
        seed,
        ..SimConfig::default()
    };
    RunSummary::with_warmup(&simulate(wl, cfg).expect("simulation runs"), WARMUP_SHARE)
}

#[test]
fn forecasts_meet_the_bars_and_slo_beats_every_baseline_on_the_azure_conversation_trace() {
    let mut wl = Workload::from_spec(TRACE).expect("trace reads");
    wl.requests.truncate(REQUESTS);
    let wl = wl.clone().with_slo(&SloRule::for_trace(&wl.name));
    for seed in [1, 2, 3] {
        let slo = run(&wl, "slo", seed);
        let ttft = slo.ttft_forecast.clone().expect("ttft forecasts");
        let tpot = slo.tpot_forecast.clone().expect("tpot forecasts");
        let (tc, pc) = (ttft.coverage.unwrap_or(0.0), tpot.coverage.unwrap_or(0.0));
        println!(
            "seed {seed}: slo attainment {:.3}; TTFT MAPE {:.1}% coverage {tc:.3}; TPOT MAPE {:.1}% coverage {pc:.3} ({} forecasts)",
            slo.attainment, ttft.mape_pct, tpot.mape_pct, tpot.samples
        );
        assert!(
            tpot.samples >= 1500,
            "seed {seed}: {} forecasts",
            tpot.samples
        );
        for (name, mape) in [("TTFT", ttft.mape_pct), ("TPOT", tpot.mape_pct)] {
            assert!(mape <= 10.0, "seed {seed}: {name} MAPE {mape:.1}%");
        }
        for (name, c) in [("TTFT", tc), ("TPOT", pc)] {
            assert!(
                (0.85..=0.95).contains(&c),
                "seed {seed}: {name} p90 coverage {c:.3}"
            );
        }
        for base in [
            "token-load",
            "least-request",
            "prefix-affinity",
            "round-robin",
        ] {
            let b = run(&wl, base, seed);
            println!("seed {seed}: {base} attainment {:.3}", b.attainment);
            assert!(
                slo.attainment > b.attainment,
                "seed {seed}: slo {:.3} not above {base} {:.3}",
                slo.attainment,
                b.attainment
            );
        }
    }
}
