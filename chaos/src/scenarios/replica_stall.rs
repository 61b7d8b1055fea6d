//! A replica stalls (its engine stops stepping and `/health` hangs), then recovers.
//!
//! Expected: streams running there end with an SSE error + `[DONE]` after the idle
//! timeout; requests placed there before the ejection are retried elsewhere after the
//! first-byte timeout; probes eject it within the bound and re-admit it after the
//! stall clears.

use serde_json::json;

use super::common::{
    FAULTY, FAULTY_NAME, base_plan, ejected_check, readmitted_check, set_faults, streams_cut_at,
    wait_busy, wait_readmitted,
};
use crate::check::Check;
use crate::client::EndClass;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str = "replica r0 stalls (no steps, /health hangs), then recovers";

pub fn plan(o: &RunOptions) -> Plan {
    base_plan(o, 1)
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    let (fault_s, recover_s) = (ctx.plan.fault_s, ctx.plan.recover_s);
    ctx.at(fault_s).await;
    wait_busy(ctx, FAULTY_NAME, 3.0).await;
    let at = ctx.now_s();
    if !set_faults(ctx, FAULTY, json!({"stall": true})).await {
        return;
    }
    ctx.log.fault_s = Some(at);
    let t = &ctx.plan.cluster.timings;
    // A request placed on the stalled replica just before its ejection is retried
    // after the first-byte timeout: from then on, requests must succeed.
    ctx.log.settle_s = ctx.now_s() + t.ejection_bound_s();
    // Outlast the idle timeout, so frozen streams must be ended by the router.
    let min_stall = t.idle_timeout_ms as f64 / 1e3 + 1.0;
    ctx.at(recover_s.max(at + min_stall)).await;
    if !set_faults(ctx, FAULTY, json!({"stall": false})).await {
        return;
    }
    ctx.log.recover_s = Some(ctx.now_s());
    wait_readmitted(ctx, FAULTY_NAME).await;
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    if let Some(at) = f.log.fault_s {
        let cut = streams_cut_at(f, FAULTY_NAME, at);
        // After the idle timeout a frozen stream fails over (`proxy/failover.rs`) and
        // completes whole; one that cannot be continued ends with an error + [DONE].
        let whole = cut.iter().filter(|r| r.class == EndClass::Ok).count();
        let clean = cut
            .iter()
            .filter(|r| r.class == EndClass::StreamError)
            .count();
        let idle = f.plan.cluster.timings.idle_timeout_ms as f64 / 1e3;
        let slowest = cut.iter().map(|r| r.end_s - at).fold(0.0, f64::max);
        out.push(Check::new(
            "streams frozen by the stall end cleanly soon after the idle timeout (whole by failover, or an SSE error + [DONE])",
            !cut.is_empty() && whole + clean == cut.len() && slowest <= idle + 1.5,
            format!(
                "{} streams were running on {FAULTY_NAME} at the stall; {whole} completed whole by failover, {clean} ended with error + [DONE]; the last {slowest:.2} s after it (idle timeout {idle:.1} s)",
                cut.len()
            ),
        ));
    }
    out.push(ejected_check(f, FAULTY_NAME, f.log.fault_s));
    out.push(readmitted_check(
        f,
        FAULTY_NAME,
        f.log.fault_s,
        f.log.recover_s,
    ));
    out
}
