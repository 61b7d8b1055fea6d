//! Test 4: the `slo` policy's predictor learns from real outcomes: forecast error on
//! the real servers, samples learned, per-replica reports.

use serde_json::Value;

use super::{
    harness::{Env, RouterProc, get_json, metric, metrics_when},
    workload::{self, mape},
};

pub const WARM: usize = 40;
pub const MEASURED: usize = 30;

fn hist(m: &str, target: &str) -> (f64, f64) {
    let want = [("target", target)];
    (
        metric(m, "headroom_forecast_relative_error_sum", &want).unwrap_or(0.0),
        metric(m, "headroom_forecast_relative_error_count", &want).unwrap_or(0.0),
    )
}

pub async fn run(env: &Env) {
    let r = RouterProc::start(env, "slo", "").await;
    let early = workload::mixed(&r, "t4-warm", WARM, 2, 1500).await;
    let m0 = metrics_when(&r, |m| hist(m, "ttft").1 >= WARM as f64).await;
    let late = workload::mixed(&r, "t4-measured", MEASURED, 2, 1500).await;
    let total = (WARM + MEASURED) as f64;
    let m1 = metrics_when(&r, |m| hist(m, "ttft").1 >= total).await;
    let ((s0, n0), (s1, n1)) = (hist(&m0, "ttft"), hist(&m1, "ttft"));
    let (all, late_router) = (s1 / n1.max(1.0), (s1 - s0) / (n1 - n0).max(1.0));
    let (ts1, tn1) = hist(&m1, "tpot");
    let covered = metric(
        &m1,
        "headroom_forecast_bound_total",
        &[("target", "ttft"), ("covered", "true")],
    )
    .unwrap_or(0.0);
    let bounded =
        metric(&m1, "headroom_forecast_bound_total", &[("target", "ttft")]).unwrap_or(0.0);
    // The trainer thread learns asynchronously: give it a moment to catch up.
    let mut dbg: Value = get_json(&r.url("/debug/predictor")).await;
    for _ in 0..50 {
        if dbg["samples_learned"].as_u64().unwrap_or(0) as f64 >= total {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        dbg = get_json(&r.url("/debug/predictor")).await;
    }
    let learned = dbg["samples_learned"].as_u64().unwrap_or(0);
    let reps = dbg["replicas"].as_array().cloned().unwrap_or_default();
    println!(
        "  TTFT MAPE from the router's histogram: all {n1} {:.1}%, after warm-up ({} requests) {:.1}%; \
         client-side (forecast header vs measured): first {WARM} {:.1}%, last {MEASURED} {:.1}%; \
         TTFT p90-bound coverage {:.0}%; TPOT MAPE {:.1}% over {tn1}; samples learned {learned}",
        all * 100.0,
        n1 - n0,
        late_router * 100.0,
        mape(&early) * 100.0,
        mape(&late) * 100.0,
        covered / bounded.max(1.0) * 100.0,
        ts1 / tn1.max(1.0) * 100.0,
    );
    for rep in &reps {
        let (t, p) = (&rep["report"]["ttft"], &rep["report"]["tpot"]);
        println!(
            "  {}: state {}; TTFT {} labels {} recent |log err| {:.2} coverage {:.2}; TPOT {} recent |log err| {:.2}",
            rep["replica"],
            rep["report"]["state"],
            t["state"],
            t["labels"],
            t["recent_log_err"].as_f64().unwrap_or(f64::NAN),
            t["coverage"].as_f64().unwrap_or(f64::NAN),
            p["state"],
            p["recent_log_err"].as_f64().unwrap_or(f64::NAN),
        );
    }
    assert!(
        all.is_finite() && late_router.is_finite(),
        "MAPE must be finite"
    );
    assert!(n1 >= total, "a TTFT error per streamed request: {n1}");
    assert!(
        learned as f64 >= total,
        "the trainer learned from {learned} of {total} outcomes"
    );
    assert_eq!(reps.len(), env.urls.len(), "a report per replica: {dbg}");
    for rep in &reps {
        assert!(
            rep["report"]["ttft"]["labels"].as_u64().unwrap_or(0) > 0,
            "no TTFT labels for {}",
            rep["replica"]
        );
    }
}
