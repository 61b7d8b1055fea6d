//! A replica fails half its requests with HTTP 500 before any byte, then recovers.
//!
//! Expected: the router retries those on another replica before the first byte, so
//! clients never see the injected errors.

use serde_json::json;

use super::common::{FAULTY, FAULTY_NAME, base_plan, set_faults};
use crate::check::Check;
use crate::http::counter_sum;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "replica r0 answers 50% of requests with HTTP 500 before any byte, then recovers";

pub fn plan(o: &RunOptions) -> Plan {
    base_plan(o, 1)
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    let (fault_s, recover_s) = (ctx.plan.fault_s, ctx.plan.recover_s);
    ctx.at(fault_s).await;
    let at = ctx.now_s();
    if !set_faults(ctx, FAULTY, json!({"error_rate": 0.5})).await {
        return;
    }
    ctx.log.fault_s = Some(at);
    ctx.log.settle_s = at;
    ctx.at(recover_s).await;
    let at = ctx.now_s();
    if set_faults(ctx, FAULTY, json!({"error_rate": 0.0})).await {
        ctx.log.recover_s = Some(at);
    }
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let m = f.metrics.first().cloned().flatten().unwrap_or_default();
    let errors = counter_sum(
        &m,
        "headroom_upstream_errors_total",
        Some(("replica", FAULTY_NAME)),
    );
    let retried = counter_sum(&m, "headroom_retries_total", Some(("reason", "5xx")));
    let ejections = counter_sum(
        &m,
        "headroom_ejections_total",
        Some(("replica", FAULTY_NAME)),
    );
    vec![Check::new(
        "the injected 500s happened and were retried by the router",
        errors >= 1.0 && retried >= 1.0,
        format!(
            "router counted {errors} upstream errors on {FAULTY_NAME}, {retried} retries after a 5xx, {ejections} ejections of {FAULTY_NAME}"
        ),
    )]
}
