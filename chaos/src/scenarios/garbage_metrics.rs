//! A replica's `/metrics` turns to garbage (NaN, negatives, absurd values, malformed
//! lines, binary junk, HTML, an oversized body) while its completions stay healthy.
//!
//! Expected: the router keeps routing (requests succeed), drops and counts the
//! nonsense values, does not eject the replica for it, and its debug view stays
//! readable.

use std::sync::atomic::Ordering;

use super::common::{FAULTY_NAME, base_plan};
use crate::bad_metrics::GARBAGE_KINDS;
use crate::check::Check;
use crate::http::counter_sum;
use crate::observe::health_trace;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "replica r0's /metrics serves garbage (7 kinds in rotation); completions stay healthy";

pub fn plan(o: &RunOptions) -> Plan {
    let mut p = base_plan(o, 1);
    p.cluster.bad_metrics = Some(super::FAULTY);
    // Every garbage kind must reach the router within the run. Paced, one slow kind (the
    // oversized body) stretches the period toward stale_after_ms / 2 and a 3 s window
    // served 6 of 7 kinds on a loaded CI machine; pacing has its own tests.
    p.cluster.timings.scrape_max_duty = 0.0;
    p
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    ctx.at(ctx.plan.fault_s).await;
    let at = ctx.now_s();
    let Some(bad) = ctx.cluster.bad.as_ref() else {
        return ctx.fail("no bad upstream in front of r0");
    };
    bad.garbage.store(true, Ordering::Relaxed);
    ctx.note(format!("{FAULTY_NAME}'s /metrics turns to garbage"));
    ctx.log.fault_s = Some(at);
    ctx.log.settle_s = at;
    ctx.at(ctx.plan.load.duration_s).await;
    let served = ctx
        .cluster
        .bad
        .as_ref()
        .map_or(0, |b| b.scrapes.load(Ordering::Relaxed));
    ctx.log
        .numbers
        .insert("garbage_scrapes_served".into(), served as f64);
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    let m = f.metrics.first().cloned().flatten().unwrap_or_default();
    let rejected = counter_sum(
        &m,
        "headroom_scrape_rejected_values_total",
        Some(("replica", FAULTY_NAME)),
    );
    let errors = counter_sum(
        &m,
        "headroom_scrape_errors_total",
        Some(("replica", FAULTY_NAME)),
    );
    let served = f
        .log
        .numbers
        .get("garbage_scrapes_served")
        .copied()
        .unwrap_or(0.0);
    out.push(Check::new(
        "the router counts the rejected values and unreadable scrapes",
        rejected > 0.0 && errors > 0.0 && served >= GARBAGE_KINDS.len() as f64,
        format!(
            "{served} garbage scrapes served (all {} kinds ≥ once: {}); router counted {rejected} rejected values and {errors} failed scrapes for {FAULTY_NAME}",
            GARBAGE_KINDS.len(),
            served >= GARBAGE_KINDS.len() as f64
        ),
    ));
    if let Some(at) = f.log.fault_s {
        let t = health_trace(f.samples, 0, FAULTY_NAME, at, None);
        out.push(Check::new(
            "garbage metrics do not eject the replica",
            t.ejections == 0 && t.unroutable_samples == 0,
            format!(
                "{} ejections, {} samples unroutable after the garbage began",
                t.ejections, t.unroutable_samples
            ),
        ));
        let after: Vec<_> = f.samples.iter().filter(|s| s.t_s >= at).collect();
        let unread = after.iter().filter(|s| s.replicas.is_none()).count();
        let served_r0 = f
            .records
            .iter()
            .filter(|r| r.sent_s >= at && r.replica.as_deref() == Some(FAULTY_NAME))
            .count();
        out.push(Check::new(
            "the router's debug view stays readable",
            !after.is_empty() && unread == 0,
            format!(
                "{}/{} /debug/replicas polls answered after the garbage began; {FAULTY_NAME} still served {served_r0} requests",
                after.len() - unread,
                after.len()
            ),
        ));
    }
    out
}
