//! Generators: determinism for a seed, requested rates, tenant structure, the incident's
//! shape, and spec parsing errors.

use headroom_bench::workload::generator::{self, Arrivals, Incident, TenantSpec};
use headroom_bench::workload::{LengthDist, Workload};

fn make(spec: &str) -> Workload {
    match Workload::from_spec(spec) {
        Ok(w) => w,
        Err(e) => panic!("{spec}: {e}"),
    }
}

#[test]
fn same_seed_same_workload_other_seed_other_workload() {
    for spec in [
        "poisson:rate=20,duration=60,seed=7",
        "bursty:rate_on=40,rate_off=2,on=5,off=10,duration=120,seed=7",
        "mixed:rate=10,duration=60,seed=7",
        "incident:duration=120,start=30,length=30,seed=7",
    ] {
        let a = make(spec);
        assert_eq!(a, make(spec), "{spec}");
        let other = make(&spec.replace("seed=7", "seed=8"));
        assert_ne!(a.requests, other.requests, "{spec}");
        assert!(
            a.requests
                .windows(2)
                .all(|p| p[0].arrival_s <= p[1].arrival_s)
        );
        assert!(a.requests.iter().enumerate().all(|(i, r)| r.id == i as u64));
        // Every prompt is fully covered by its hash ids, as the engine model needs.
        assert!(
            a.requests.iter().all(|r| r.input_tokens >= 1
                && r.hash_ids.len() as u64 * u64::from(r.block_tokens)
                    >= u64::from(r.input_tokens)),
            "{spec}"
        );
    }
}

#[test]
fn changing_lengths_keeps_arrival_times() {
    let a = make("poisson:rate=5,duration=100,seed=3,input=lognormal(1000,0.8)");
    let b = make("poisson:rate=5,duration=100,seed=3,input=uniform(10,20)");
    let times = |w: &Workload| w.requests.iter().map(|r| r.arrival_s).collect::<Vec<_>>();
    assert_eq!(times(&a), times(&b));
    assert!(
        b.requests
            .iter()
            .all(|r| (10..=20).contains(&r.input_tokens))
    );
}

#[test]
fn poisson_rate_and_lognormal_means_are_as_requested() {
    let w = make(
        "poisson:rate=20,duration=1000,input=lognormal(1000,0.8),output=lognormal(200,0.7),seed=1",
    );
    let s = w.summary();
    // 20,000 expected arrivals: the count's standard deviation is ≈ 141 (0.7%).
    assert!((s.rate_rps - 20.0).abs() < 0.5, "{}", s.rate_rps);
    assert!((s.input.mean - 1000.0).abs() < 30.0, "{}", s.input.mean);
    assert!((s.output.mean - 200.0).abs() < 6.0, "{}", s.output.mean);
    // Median of a lognormal with mean m is m·exp(−σ²/2).
    let median = 1000.0 * (-0.32f64).exp();
    assert!(
        (s.input.p50 - median).abs() < 30.0,
        "{} vs {median}",
        s.input.p50
    );
    assert_eq!(s.prefix_reuse, 0.0, "plain Poisson prompts share nothing");
    assert!(
        w.requests
            .iter()
            .all(|r| r.tenant.is_none() && r.slo_ttft_ms.is_none())
    );
}

#[test]
fn bursty_arrivals_have_the_mmpp_mean_rate_and_are_burstier_than_poisson() {
    let arrivals = Arrivals::OnOff {
        rate_on: 50.0,
        rate_off: 2.0,
        mean_on_s: 5.0,
        mean_off_s: 20.0,
    };
    assert!((arrivals.mean_rate() - 11.6).abs() < 1e-12);
    let tenant = TenantSpec::plain(LengthDist::Const(100), LengthDist::Const(10));
    let w = generator::bursty(arrivals, 4000.0, tenant.clone(), 5).generate();
    let rate = w.requests.len() as f64 / 4000.0;
    assert!((rate - 11.6).abs() < 1.2, "{rate}");
    let p = generator::poisson(11.6, 4000.0, tenant, 5).generate();
    // Index of dispersion of counts per 10 s bin: 1 for Poisson, ≫ 1 for bursts.
    let dispersion = |w: &Workload| {
        let mut bins = vec![0.0f64; 400];
        for r in &w.requests {
            bins[((r.arrival_s / 10.0) as usize).min(399)] += 1.0;
        }
        let m = bins.iter().sum::<f64>() / 400.0;
        bins.iter().map(|b| (b - m).powi(2)).sum::<f64>() / 399.0 / m
    };
    let (db, dp) = (dispersion(&w), dispersion(&p));
    assert!(dp < 1.5 && db > 10.0, "poisson {dp}, bursty {db}");
}

#[test]
fn mixed_tenants_share_prompts_within_a_tenant_only() {
    let w = make("mixed:rate=20,duration=300,chat_share=0.7,seed=2");
    let s = w.summary();
    let (chat, batch) = (s.tenants["chat"] as f64, s.tenants["batch"] as f64);
    assert!((chat / (chat + batch) - 0.7).abs() < 0.03, "{chat} {batch}");
    for r in &w.requests {
        let (ttft, tpot) = match r.tenant.as_deref() {
            Some("chat") => (500.0, 50.0),
            Some("batch") => (10_000.0, 200.0),
            other => panic!("unexpected tenant {other:?}"),
        };
        assert_eq!((r.slo_ttft_ms, r.slo_tpot_ms), (Some(ttft), Some(tpot)));
    }
    let first_ids = |t: &str| {
        w.requests
            .iter()
            .filter(|r| r.tenant.as_deref() == Some(t))
            .map(|r| r.hash_ids[0])
            .collect::<std::collections::BTreeSet<_>>()
    };
    let (c, b) = (first_ids("chat"), first_ids("batch"));
    assert_eq!(c.len(), 8, "chat uses its 8 system prompts");
    assert_eq!(b.len(), 1, "batch shares one instruction");
    assert!(c.is_disjoint(&b));
    assert!(s.prefix_reuse > 0.01, "{}", s.prefix_reuse);
    // Beyond the shared prompt, blocks are unique to their request.
    let mut tails = std::collections::HashSet::new();
    assert!(
        w.requests
            .iter()
            .flat_map(|r| r.hash_ids[1..].iter())
            .all(|id| tails.insert(*id))
    );
}

#[test]
fn incident_has_short_chat_throughout_and_long_batch_in_its_window_only() {
    let inc = Incident {
        chat_rate: 10.0,
        batch_rate: 2.0,
        start_s: 60.0,
        length_s: 120.0,
        duration_s: 300.0,
        seed: 4,
        ..Incident::default()
    };
    let w = inc.spec().generate();
    let chat: Vec<_> = w
        .requests
        .iter()
        .filter(|r| r.tenant.as_deref() == Some("chat"))
        .collect();
    let batch: Vec<_> = w
        .requests
        .iter()
        .filter(|r| r.tenant.as_deref() == Some("batch"))
        .collect();
    assert_eq!(chat.len() + batch.len(), w.requests.len());
    assert!(
        (chat.len() as f64 / 300.0 - 10.0).abs() < 1.0,
        "{}",
        chat.len()
    );
    assert!(
        (batch.len() as f64 / 120.0 - 2.0).abs() < 0.5,
        "{}",
        batch.len()
    );
    assert!(chat.first().is_some_and(|r| r.arrival_s < 5.0));
    assert!(chat.last().is_some_and(|r| r.arrival_s > 295.0));
    assert!(batch.iter().all(|r| (60.0..180.0).contains(&r.arrival_s)));
    assert!(
        batch
            .iter()
            .all(|r| (8_192..=32_768).contains(&r.input_tokens))
    );
    let mut chat_inputs: Vec<u32> = chat.iter().map(|r| r.input_tokens).collect();
    chat_inputs.sort_unstable();
    let p95 = chat_inputs[(chat_inputs.len() * 95).div_ceil(100) - 1];
    assert!(p95 < 2_500, "chat p95 input {p95}");
    assert!(chat.iter().all(|r| r.slo_ttft_ms == Some(500.0)));
    assert!(batch.iter().all(|r| r.slo_ttft_ms == Some(10_000.0)));

    // The spec form builds the same workload.
    let from_spec =
        make("incident:chat_rate=10,batch_rate=2,start=60,length=120,duration=300,seed=4");
    assert_eq!(from_spec.requests, w.requests);
}

#[test]
fn mixed_tenants_take_their_own_lengths_objectives_and_prompts() {
    let w = make(
        "mixed:rate=20,duration=200,chat_share=0.5,seed=3,block=64,\
         chat_input=lognormal(500,0.5),chat_ttft=400,chat_tpot=25,chat_prompts=2,\
         batch_input=lognormal(1200,0.4),batch_output=lognormal(64,0.3),batch_ttft=5000,\
         batch_prompts=3,batch_prompt_blocks=4",
    );
    let mean_input = |t: &str| {
        let v: Vec<f64> = w
            .requests
            .iter()
            .filter(|r| r.tenant.as_deref() == Some(t))
            .map(|r| r.input_tokens as f64)
            .collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    // The shared prompt comes on top of the user's part: 1 and 4 blocks of 64.
    let (c, b) = (mean_input("chat"), mean_input("batch"));
    assert!(
        (c - 564.0).abs() < 40.0 && (b - 1456.0).abs() < 80.0,
        "{c} {b}"
    );
    for r in &w.requests {
        let want = match r.tenant.as_deref() {
            // Unset keys keep the preset's (batch TPOT 200 ms).
            Some("chat") => (400.0, 25.0),
            Some("batch") => (5_000.0, 200.0),
            other => panic!("unexpected tenant {other:?}"),
        };
        assert_eq!((r.slo_ttft_ms, r.slo_tpot_ms), (Some(want.0), Some(want.1)));
    }
    let firsts = |t: &str| {
        w.requests
            .iter()
            .filter(|r| r.tenant.as_deref() == Some(t))
            .map(|r| r.hash_ids[0])
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    assert_eq!((firsts("chat"), firsts("batch")), (2, 3));
    let batch_long: Vec<_> = w
        .requests
        .iter()
        .filter(|r| r.tenant.as_deref() == Some("batch") && r.input_tokens > 4 * 64)
        .collect();
    // Each starts with one of the tenant's 4-block shared prompts, which another holds.
    let shared4 = batch_long
        .iter()
        .filter(|r| {
            batch_long
                .iter()
                .any(|o| !std::ptr::eq(**r, *o) && o.hash_ids[..4] == r.hash_ids[..4])
        })
        .count();
    assert!(
        shared4 * 10 >= batch_long.len() * 9,
        "{shared4} of {}",
        batch_long.len()
    );
}

#[test]
fn bad_specs_are_clear_errors() {
    for (spec, want) in [
        ("poisson:duration=10", "`rate` is required"),
        ("poisson:rate=1,durration=10", "unknown key `durration`"),
        ("poisson:rate=-1", "not a non-negative number"),
        ("poisson:rate=1,input=lognormal(1000,0.8", "unbalanced"),
        ("poisson:rate=1,input=gamma(2,3)", "unknown distribution"),
        ("poisson:rate=1,input=uniform(50,10)", "lo <= hi"),
        ("poisson:rate=1,rate=2", "given twice"),
        ("poisson:rate=1e9,duration=1e9", "too many"),
        ("mixed:rate=1,chat_share=2", "chat_share"),
        ("mixed:rate=1,chat_ttft=0", "`chat_ttft` must be positive"),
        (
            "mixed:rate=1,chat_inputs=lognormal(5,1)",
            "unknown key `chat_inputs`",
        ),
        ("bursty:rate_on=0", "mean rate must be positive"),
        ("nosuchfile.jsonl", "nosuchfile.jsonl"),
    ] {
        match Workload::from_spec(spec) {
            Ok(_) => panic!("{spec} accepted"),
            Err(e) => assert!(e.to_string().contains(want), "{spec}: `{e}` lacks `{want}`"),
        }
    }
}

#[test]
fn lengths_can_be_resampled_from_a_trace() {
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/traces/AzureLLMInferenceTrace_code.csv"
    );
    let w = make(&format!(
        "poisson:rate=50,duration=200,input=trace({trace}),output=trace({trace}),seed=9"
    ));
    let s = w.summary();
    assert!((s.input.mean - 2_048.0).abs() < 100.0, "{}", s.input.mean);
    assert!((s.output.mean - 28.0).abs() < 3.0, "{}", s.output.mean);
    assert!(s.input.max <= 7_437.0);
}
