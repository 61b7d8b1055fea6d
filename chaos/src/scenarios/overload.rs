//! Overload: one router node in front of three emulators, with the admission gate's
//! capacity on (`admission.per_replica_in_flight = 1`: `C` = 3 requests in flight),
//! gets about 5× the fleet's capacity for 40% of the run (from 20%), then the base
//! load again.
//!
//! Capacity (req/s) = `C` / the mean service time of the requests sent after the
//! burst (warm, unqueued: the base load is light): what the fleet completes per
//! second at the gate's limit. The burst's rate is fixed up front (the schedule is
//! seeded), so the factor actually offered is measured and reported against it.
//!
//! Expected: every request ends with a result or a clear, fast refusal (429/503 with
//! an OpenAI error body, within the gate's `max_wait_ms` + 1 s);
//! the fleet keeps completing work during the burst; the router's resident memory
//! stays flat (bounded queues: growth ≤ `RSS_GROWTH_MIB`); service recovers at once
//! (requests sent from 1 s after the burst succeed, the common ≥ 99% check).

use std::time::Duration;

use super::common::base_plan;
use crate::check::{self, Check};
use crate::client::EndClass;
use crate::load::Burst;
use crate::os;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "5x the fleet's capacity (admission gate on) for 40% of the run, then the base load";

/// Requests in flight per replica the gate allows.
const PER_REPLICA: u32 = 1;
/// Longest a request waits at the gate (ms).
const MAX_WAIT_MS: u64 = 1_000;
/// Base arrivals (req/s): below capacity.
const BASE_RATE: f64 = 5.0;
/// Burst arrivals (req/s): about 5× the capacity measured on this fleet (≈ 8 req/s
/// at time scale 0.5 with 64–128 output tokens).
const BURST_RATE: f64 = 40.0;
/// The offered factor the burst must reach for the run to count as 5× overload.
const MIN_FACTOR: f64 = 4.0;
/// Most the router's resident memory may grow from before the burst to its end.
const RSS_GROWTH_MIB: f64 = 32.0;
/// Time after the burst from which every request must succeed (s).
const RECOVER_S: f64 = 1.0;

pub fn plan(o: &RunOptions) -> Plan {
    let mut p = base_plan(o, 1);
    let d = o.duration_s;
    p.cluster.timings.admission_per_replica = PER_REPLICA;
    p.cluster.timings.admission_max_wait_ms = MAX_WAIT_MS;
    p.load.rate_per_s = o.rate_per_s.unwrap_or(BASE_RATE);
    p.load.max_tokens = (64, 128);
    p.load.max_inflight = 512;
    p.fault_s = 0.2 * d;
    p.recover_s = 0.6 * d;
    p.load.burst = Some(Burst {
        from_s: p.fault_s,
        to_s: p.recover_s,
        rate_per_s: BURST_RATE * p.load.rate_per_s / BASE_RATE,
    });
    p
}

fn rss_mib(ctx: &Ctx<'_>) -> Option<f64> {
    os::rss_kib(ctx.cluster.router_pid(0)?).map(|k| k as f64 / 1024.0)
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    let (from, to) = (ctx.plan.fault_s, ctx.plan.recover_s);
    ctx.at(from - 0.2).await;
    let before = rss_mib(ctx);
    ctx.at(from).await;
    ctx.note("overload starts");
    ctx.log.fault_s = Some(from);
    // Sample the router's memory through the burst; keep the largest.
    let mut peak = before.unwrap_or(0.0);
    while ctx.now_s() < to {
        tokio::time::sleep(Duration::from_millis(200)).await;
        peak = peak.max(rss_mib(ctx).unwrap_or(0.0));
    }
    ctx.note("overload ends");
    ctx.log.recover_s = Some(to);
    ctx.log.settle_s = to + RECOVER_S;
    ctx.at(ctx.plan.load.duration_s).await;
    let after = rss_mib(ctx);
    for (k, v) in [
        ("rss_before_mib", before),
        ("rss_peak_mib", Some(peak)),
        ("rss_after_mib", after),
    ] {
        if let Some(v) = v {
            ctx.log.numbers.insert(k.into(), v);
        }
    }
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let (from, to) = (f.plan.fault_s, f.plan.recover_s);
    let n = |k: &str| f.log.numbers.get(k).copied();
    let slots = f64::from(PER_REPLICA) * f.plan.cluster.replica_profiles.len() as f64;
    let service: Vec<f64> = f
        .records
        .iter()
        .filter(|r| r.sent_s >= to + RECOVER_S && r.class == EndClass::Ok)
        .map(|r| r.end_s - r.sent_s)
        .collect();
    let mean = (!service.is_empty()).then(|| service.iter().sum::<f64>() / service.len() as f64);
    let capacity = mean.map(|m| slots / m);
    let burst: Vec<_> = f
        .records
        .iter()
        .filter(|r| r.sent_s >= from && r.sent_s < to)
        .collect();
    let offered = burst.len() as f64 / (to - from);
    let factor = capacity.map(|c| offered / c);
    let answered = burst.iter().filter(|r| r.class == EndClass::Ok).count();
    let refused: Vec<_> = burst
        .iter()
        .filter(|r| r.class == EndClass::ErrorJson && matches!(r.status, Some(429 | 503)))
        .collect();
    let other = burst.len() - answered - refused.len();
    let refusal_s: Vec<f64> = refused.iter().map(|r| r.end_s - r.sent_s).collect();
    let bound = MAX_WAIT_MS as f64 / 1e3 + 1.0;
    let worst_refusal = refusal_s.iter().copied().fold(0.0, f64::max);
    let fmt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    let mut out = vec![
        Check::new(
            &format!("the burst offered ≥ {MIN_FACTOR}× the fleet's capacity"),
            factor.is_some_and(|x| x >= MIN_FACTOR),
            format!(
                "offered {offered:.1} req/s; capacity {} req/s ({slots} slots / mean service {} s after the burst): {}×",
                fmt(capacity),
                mean.map_or("-".into(), |m| format!("{m:.3}")),
                fmt(factor)
            ),
        ),
        Check::new(
            "under overload every request gets a result or a fast, clear refusal",
            other == 0 && !refused.is_empty() && worst_refusal <= bound,
            format!(
                "{} sent during the burst: {answered} answered whole, {} refused (429/503 with an OpenAI error), {other} otherwise; refusal time p50 {} ms, p99 {} ms, max {:.0} ms (bound {:.0} ms)",
                burst.len(),
                refused.len(),
                check::quantile(&refusal_s, 0.5).map_or("-".into(), |v| format!("{:.0}", v * 1e3)),
                check::quantile(&refusal_s, 0.99).map_or("-".into(), |v| format!("{:.0}", v * 1e3)),
                worst_refusal * 1e3,
                bound * 1e3
            ),
        ),
    ];
    // Completions while saturated: the gate keeps the fleet busy, not idle or beyond C.
    let done = f
        .records
        .iter()
        .filter(|r| r.class == EndClass::Ok && r.end_s >= from + 1.0 && r.end_s < to)
        .count() as f64
        / (to - from - 1.0).max(1e-3);
    out.push(Check::new(
        "the fleet keeps completing work through the burst (≥ half its capacity)",
        capacity.is_some_and(|c| done >= 0.5 * c),
        format!(
            "{done:.1} req/s completed whole from 1 s into the burst to its end vs capacity {} req/s",
            fmt(capacity)
        ),
    ));
    let (b, p) = (n("rss_before_mib"), n("rss_peak_mib"));
    out.push(Check::new(
        &format!("the router's memory stays flat (growth ≤ {RSS_GROWTH_MIB} MiB)"),
        matches!((b, p), (Some(b), Some(p)) if p - b <= RSS_GROWTH_MIB),
        format!(
            "resident {} MiB before the burst, peak {} MiB during it, {} MiB at the end",
            fmt(b),
            fmt(p),
            fmt(n("rss_after_mib"))
        ),
    ));
    out
}
