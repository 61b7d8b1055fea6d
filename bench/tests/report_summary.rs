//! Summary math on a hand-built run whose every figure is worked out in the comments.

use headroom_bench::report::RunSummary;
use headroom_bench::sim::result::{LoadSample, ReplicaInfo, RequestRecord, RunResult};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[allow(clippy::too_many_arguments)]
fn rec(
    id: u64,
    tenant: Option<&str>,
    replica: Option<u32>,
    ttft_s: Option<f64>,
    tpot_s: Option<f64>,
    slo: (f64, f64),
    input: u32,
    cached: u32,
) -> RequestRecord {
    RequestRecord {
        id,
        tenant: tenant.map(str::to_string),
        arrival_s: id as f64,
        replica,
        input_tokens: input,
        output_tokens: if tpot_s.is_some() { 10 } else { 1 },
        cached_tokens: cached,
        ttft_s,
        tpot_s,
        slo_ttft_ms: slo.0,
        slo_tpot_ms: slo.1,
        rejected: replica.is_none(),
        ..RequestRecord::default()
    }
}

fn run() -> RunResult {
    let chat = (500.0, 50.0);
    let batch = (10_000.0, 200.0);
    // r0 meets both; r1 misses TTFT; r2 misses TPOT; r3 is rejected; r4 has one token.
    let mut r0 = rec(
        0,
        Some("chat"),
        Some(0),
        Some(0.2),
        Some(0.04),
        chat,
        100,
        50,
    );
    (r0.predicted_ttft_ms, r0.predicted_ttft_upper_ms) = (Some(250.0), Some(300.0));
    (r0.predicted_tpot_ms, r0.predicted_tpot_upper_ms) = (Some(50.0), Some(60.0));
    let mut r1 = rec(
        1,
        Some("chat"),
        Some(1),
        Some(0.6),
        Some(0.03),
        chat,
        100,
        0,
    );
    (r1.predicted_ttft_ms, r1.predicted_ttft_upper_ms) = (Some(300.0), Some(500.0));
    let mut r2 = rec(
        2,
        Some("batch"),
        Some(0),
        Some(1.0),
        Some(0.3),
        batch,
        200,
        100,
    );
    (r2.predicted_ttft_ms, r2.predicted_ttft_upper_ms) = (Some(1000.0), Some(2000.0));
    let mut r3 = rec(3, Some("batch"), None, None, None, batch, 300, 0);
    r3.fallback = Some("reject: nothing fits".into());
    let r4 = rec(4, None, Some(0), Some(0.1), None, chat, 100, 0);
    RunResult {
        policy: "slo".into(),
        workload: "hand".into(),
        rate_scale: 1.0,
        replicas: vec![
            ReplicaInfo {
                name: "a".into(),
                profile: "h100".into(),
            },
            ReplicaInfo {
                name: "b".into(),
                profile: "h100".into(),
            },
        ],
        records: vec![r0, r1, r2, r3, r4],
        load: vec![
            LoadSample {
                t_s: 0.0,
                inflight: vec![2, 2],
            }, // CV 0
            LoadSample {
                t_s: 1.0,
                inflight: vec![3, 1],
            }, // mean 2, std 1: CV 0.5
            LoadSample {
                t_s: 2.0,
                inflight: vec![0, 0],
            }, // idle: skipped
            LoadSample {
                t_s: 3.0,
                inflight: vec![4, 0],
            }, // mean 2, std 2: CV 1
        ],
        decision_ns: vec![4000, 1000, 3000, 2000],
        sim_duration_s: 10.0,
        ..RunResult::default()
    }
}

#[test]
fn attainment_goodput_and_latency_percentiles() {
    let s = RunSummary::of(&run());
    assert_eq!((s.requests, s.served), (5, 4));
    assert!(close(s.attainment, 2.0 / 5.0), "{}", s.attainment);
    assert!(close(s.ttft_attainment, 3.0 / 5.0));
    assert!(close(s.tpot_attainment, 3.0 / 5.0));
    // Arrivals span 0..4 s: 2 good requests / 4 s.
    assert!(close(s.arrival_window_s, 4.0));
    assert!(close(s.goodput_rps, 0.5));
    assert!(close(s.offered_rps, 1.25));
    // TTFTs 100, 200, 600, 1000 ms: nearest rank p50 = 2nd, p95 = p99 = 4th.
    let t = s.ttft_ms.expect("ttft present");
    assert!(
        close(t.p50, 200.0) && close(t.p95, 1000.0) && close(t.p99, 1000.0),
        "{t:?}"
    );
    // TPOTs 30, 40, 300 ms.
    let t = s.tpot_ms.expect("tpot present");
    assert!(close(t.p50, 40.0) && close(t.p95, 300.0), "{t:?}");
    assert!(close(s.rejected_share, 0.2));
    assert!(close(s.fallback_share, 0.2));
    // Served prompts 100 + 100 + 200 + 100 tokens, 150 of them cached.
    assert!(close(s.cache_hit_share, 0.3));
}

#[test]
fn per_tenant_attainment() {
    let s = RunSummary::of(&run());
    let chat = &s.tenants["chat"];
    assert_eq!(chat.requests, 2);
    assert!(
        close(chat.attainment, 0.5)
            && close(chat.ttft_attainment, 0.5)
            && close(chat.tpot_attainment, 1.0)
    );
    assert!(close(chat.ttft_p95_ms.expect("served"), 600.0));
    let batch = &s.tenants["batch"];
    assert!(
        close(batch.attainment, 0.0)
            && close(batch.ttft_attainment, 0.5)
            && close(batch.tpot_attainment, 0.0)
    );
    assert!(close(s.tenants["-"].attainment, 1.0));
}

#[test]
fn forecast_quality() {
    let s = RunSummary::with_warmup(&run(), 0.0);
    // TTFT: (pred, actual) = (250, 200), (300, 600), (1000, 1000):
    // APE 25 %, 50 %, 0 %; abs err 50, 300, 0; upper bounds hold for r0 and r2 only.
    let f = s.ttft_forecast.expect("predictions present");
    assert_eq!(f.samples, 3);
    assert!(close(f.mape_pct, 25.0), "{}", f.mape_pct);
    assert!(close(f.mdape_pct, 25.0));
    assert!(close(f.abs_err_p50_ms, 50.0) && close(f.abs_err_p95_ms, 300.0));
    assert_eq!(f.bound_samples, 3);
    assert!(close(f.coverage.expect("bounds present"), 2.0 / 3.0));
    // TPOT: only r0, predicted 50 for 40 (APE 25 %), bound 60 holds.
    let f = s.tpot_forecast.expect("tpot prediction present");
    assert_eq!(f.samples, 1);
    assert!((f.mape_pct - 25.0).abs() < 1e-6);
    assert!(close(f.coverage.expect("bound"), 1.0));
}

#[test]
fn forecast_quality_skips_the_warm_up() {
    let all = RunSummary::with_warmup(&run(), 0.0)
        .ttft_forecast
        .expect("predictions");
    let later = RunSummary::of(&run()).ttft_forecast.expect("predictions");
    assert!(
        later.samples < all.samples,
        "{} vs {}",
        later.samples,
        all.samples
    );
}

#[test]
fn decision_cost_and_load_balance() {
    let s = RunSummary::of(&run());
    let d = s.decision_us.expect("decisions present");
    assert!(close(d.p50, 2.0) && close(d.p99, 4.0), "{d:?}");
    // CVs 0, 0.5, 1 over the three busy samples.
    assert_eq!(s.load.samples, 3);
    assert!(close(s.load.cv_mean.expect("samples"), 0.5));
    assert!(close(s.load.cv_p95.expect("samples"), 1.0));
    // Placed: r0, r2, r4 on replica 0; r1 on replica 1.
    assert_eq!(s.load.replica_share, vec![0.75, 0.25]);
}

#[test]
fn empty_and_prediction_free_runs_summarise_without_panicking() {
    let s = RunSummary::of(&RunResult::default());
    assert_eq!((s.requests, s.attainment, s.goodput_rps), (0, 0.0, 0.0));
    assert!(s.ttft_ms.is_none() && s.ttft_forecast.is_none() && s.decision_us.is_none());
    assert!(s.load.cv_mean.is_none());

    let mut r = run();
    for x in &mut r.records {
        x.predicted_ttft_ms = None;
        x.predicted_ttft_upper_ms = None;
        x.predicted_tpot_ms = None;
        x.predicted_tpot_upper_ms = None;
    }
    let s = RunSummary::of(&r);
    assert!(s.ttft_forecast.is_none() && s.tpot_forecast.is_none());
}
