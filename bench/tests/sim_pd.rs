//! Prefill/decode disaggregation in the simulator, through the routing core's own P/D
//! decision and admission (`headroom_core::pd`, as `headroom serve` runs them): the
//! short form of `bench/results/pd/`. A fleet with prefill and decode replicas serves
//! every request; long prompts go through a (P, D) pair and short ones run unified on a
//! decode replica; the pair's forecast is scored end to end; a run is a pure function
//! of its seed.

use headroom_bench::{
    report::summary::RunSummary,
    sim::{RunResult, SimConfig, parse_fleet, simulate},
    workload::{SloRule, Workload},
};

fn run(fleet: &str, min_prompt_tokens: u32, seed: u64) -> RunResult {
    let wl = Workload::from_spec(
        "poisson:rate=6,duration=40,input=lognormal(1500,0.8),output=lognormal(120,0.6),seed=3",
    )
    .expect("poisson generator")
    .with_slo(&SloRule::parse("ttft=2000,tpot=100").expect("rule"));
    let mut cfg = SimConfig {
        fleet: parse_fleet(fleet).expect("fleet"),
        policy: "slo".into(),
        seed,
        ..SimConfig::default()
    };
    cfg.pd.min_prompt_tokens = min_prompt_tokens;
    simulate(&wl, cfg).expect("simulation runs")
}

const PD: &str = "h100-llama3-8b:2:prefill,h100-llama3-8b:2:decode";

#[test]
fn a_disaggregated_fleet_serves_every_request_long_prompts_through_a_pair() {
    let r = run(PD, 512, 1);
    let n = r.records.len();
    assert!(n > 150, "{n} requests");
    assert!(
        r.records.iter().all(|x| !x.rejected && x.ttft_s.is_some()),
        "every request served"
    );
    let roles = |i: Option<u32>| i.map(|i| r.replicas[i as usize].name.clone());
    for x in &r.records {
        match x.prefill_replica {
            // Prefill on replicas 0-1, decode on 2-3: the pair spans both roles.
            Some(p) => {
                assert!(p < 2, "prefill on a prefill replica: {:?}", roles(Some(p)));
                assert!(
                    x.replica.is_some_and(|d| d >= 2),
                    "decode on a decode replica"
                );
            }
            // Unified: a decode replica prefills it (short, or its prefix is there).
            None => assert!(x.replica.is_some_and(|d| d >= 2), "{:?}", roles(x.replica)),
        }
    }
    let long = r.records.iter().filter(|x| x.input_tokens >= 2000);
    let (pd, all) = long.fold((0, 0), |(p, a), x| {
        (p + x.prefill_replica.is_some() as usize, a + 1)
    });
    assert!(
        all > 20 && pd * 10 >= all * 9,
        "{pd} of {all} long prompts disaggregated"
    );
    let s = RunSummary::of(&r);
    assert!(s.disaggregated_share > 0.3, "{s:?}");
    assert!(s.attainment > 0.9, "attainment {:.3}", s.attainment);
    // The pair's forecast, end to end, is scored against the TTFT the client saw.
    let f = s.ttft_forecast.expect("TTFT forecasts");
    assert!(f.mdape_pct < 40.0, "TTFT MdAPE {:.1}%", f.mdape_pct);
}

#[test]
fn with_no_threshold_every_request_it_can_is_disaggregated() {
    let r = run(PD, 0, 1);
    let s = RunSummary::of(&r);
    assert!(s.disaggregated_share > 0.95, "{:.3}", s.disaggregated_share);
    // A unified fleet never disaggregates.
    let u = run("h100-llama3-8b:4", 0, 1);
    assert!(u.records.iter().all(|x| x.prefill_replica.is_none()));
}

#[test]
fn a_disaggregated_run_is_a_pure_function_of_its_seed() {
    let (a, b) = (run(PD, 512, 4), run(PD, 512, 4));
    assert_eq!(a.records, b.records);
}
