//! A replica breaks every stream halfway (an SSE error event and `[DONE]` after about
//! half its tokens), then recovers — with mid-stream failover off
//! (`proxy.failover_attempts = 0`, what a tenant with `failover = false` gets;
//! `midstream-failover` is the same fault with it on).
//!
//! Expected: the router passes the error on once and never retries a stream that has
//! started (no duplicated or spliced output); it counts the broken streams as
//! failures of the replica and ejects it after `eject_after_failures` of them, as its
//! passive outlier detection promises. No router can save a stream that broke after
//! its first byte, so "requests succeed" is judged only after the fault is lifted.

use serde_json::json;

use super::common::{
    FAULTY, FAULTY_NAME, base_plan, readmitted_check, set_faults, wait_readmitted,
};
use crate::check::Check;
use crate::client::EndClass;
use crate::observe::health_trace;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "replica r0 breaks every stream halfway (SSE error + [DONE]), then recovers; failover off";

pub fn plan(o: &RunOptions) -> Plan {
    let mut p = base_plan(o, 1);
    p.cluster.timings.failover_attempts = 0;
    p
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    let (fault_s, recover_s) = (ctx.plan.fault_s, ctx.plan.recover_s);
    ctx.at(fault_s).await;
    let at = ctx.now_s();
    if !set_faults(ctx, FAULTY, json!({"midstream_error_rate": 1.0})).await {
        return;
    }
    ctx.log.fault_s = Some(at);
    ctx.log.settle_s = f64::INFINITY;
    ctx.at(recover_s).await;
    let at = ctx.now_s();
    if set_faults(ctx, FAULTY, json!({"midstream_error_rate": 0.0})).await {
        ctx.log.recover_s = Some(at);
        ctx.log.settle_s = at;
    }
    wait_readmitted(ctx, FAULTY_NAME).await;
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    let broken: Vec<_> = f
        .records
        .iter()
        .filter(|r| r.replica.as_deref() == Some(FAULTY_NAME) && r.class == EndClass::StreamError)
        .collect();
    let over_half = broken
        .iter()
        .filter(|r| r.facts.tokens > r.max_tokens / 2 + 1)
        .count();
    let one_error = broken
        .iter()
        .filter(|r| r.facts.error_events == 1 && r.facts.done_events == 1)
        .count();
    out.push(Check::new(
        "broken streams carry one error + [DONE] and only the tokens made before the break",
        !broken.is_empty() && over_half == 0 && one_error == broken.len(),
        format!(
            "{} streams broken on {FAULTY_NAME}; {one_error} with exactly one error event and one [DONE]; {over_half} carried more than half their max_tokens",
            broken.len()
        ),
    ));
    out.push(ejected_after_few(f));
    out.push(readmitted_check(
        f,
        FAULTY_NAME,
        f.log.fault_s,
        f.log.recover_s,
    ));
    out
}

/// Passive ejection: the replica is ejected before more than twice
/// `eject_after_failures` client-visible broken streams ended on it (the slack covers
/// streams already running when the threshold was reached).
fn ejected_after_few(f: &Finished<'_>) -> Check {
    let k = f.plan.cluster.timings.eject_after_failures;
    let limit = 2 * k as usize;
    let name = format!(
        "{FAULTY_NAME} ejected after at most {limit} broken streams (eject_after_failures = {k})"
    );
    let Some(fault) = f.log.fault_s else {
        return Check::new(&name, false, "the fault never hit");
    };
    let until = f.log.recover_s.unwrap_or(f.load_end_s);
    let failed_on = |to: f64| {
        f.records
            .iter()
            .filter(|r| {
                r.replica.as_deref() == Some(FAULTY_NAME) && r.class == EndClass::StreamError
            })
            .filter(|r| r.end_s >= fault && r.end_s < to)
            .count()
    };
    let ejected = health_trace(f.samples, 0, FAULTY_NAME, fault, None).ejected_s;
    let during = failed_on(until);
    let served: usize = f
        .records
        .iter()
        .filter(|r| r.sent_s >= fault && r.sent_s < until && r.replica.is_some())
        .count();
    match ejected.filter(|t| *t < until) {
        Some(t) => {
            let before = failed_on(t);
            Check::new(
                &name,
                before <= limit,
                format!(
                    "first ejection {:.2} s after the fault, after {before} broken streams; {during} of {served} requests broke while the fault lasted",
                    t - fault
                ),
            )
        }
        None => Check::new(
            &name,
            false,
            format!("never ejected while the fault lasted; {during} of {served} requests broke"),
        ),
    }
}
