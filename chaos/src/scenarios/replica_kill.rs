//! A replica is SIGKILLed while it streams, then started again on its old address.
//!
//! Expected: streams already running there continue on another replica (mid-stream
//! failover) and complete whole, with a pause the client sees bounded; requests that
//! had not got a byte are retried elsewhere; the router ejects the dead replica within
//! the probe bound and re-admits it after the restart.

use super::common::{
    FAULTY, FAULTY_NAME, base_plan, ejected_check, failover_checks, readmitted_check,
    streams_cut_at, wait_busy, wait_readmitted,
};
use crate::check::Check;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "replica r0 SIGKILLed mid-stream (its streams fail over), restarted later on the same port";

pub fn plan(o: &RunOptions) -> Plan {
    base_plan(o, 1)
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    let (fault_s, recover_s) = (ctx.plan.fault_s, ctx.plan.recover_s);
    ctx.at(fault_s).await;
    wait_busy(ctx, FAULTY_NAME, 3.0).await;
    let at = ctx.now_s();
    match ctx.cluster.kill_replica(FAULTY).await {
        Ok(()) => {
            ctx.note(format!("{FAULTY_NAME} SIGKILLed"));
            ctx.log.fault_s = Some(at);
        }
        Err(e) => return ctx.fail(format!("killing {FAULTY_NAME}: {e}")),
    }
    // Nothing may fail even during the kill: cut streams fail over, and requests that
    // had no byte yet are retried elsewhere.
    ctx.log.settle_s = at;
    ctx.at(recover_s).await;
    match ctx.cluster.restart_replica(FAULTY).await {
        Ok(()) => {
            ctx.note(format!("{FAULTY_NAME} restarted on its old address"));
            ctx.log.recover_s = Some(ctx.now_s());
        }
        Err(e) => return ctx.fail(format!("restarting {FAULTY_NAME}: {e}")),
    }
    wait_readmitted(ctx, FAULTY_NAME).await;
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    if let Some(at) = f.log.fault_s {
        // Every stream open there at the kill, including those whose last tokens raced
        // it (`streams_cut_at` leaves those out): each must have completed whole.
        let open: Vec<_> = f
            .records
            .iter()
            .filter(|r| r.replica.as_deref() == Some(FAULTY_NAME))
            .filter(|r| r.first_token_s.is_some_and(|t| t < at) && r.end_s >= at)
            .collect();
        let cut = streams_cut_at(f, FAULTY_NAME, at).len();
        out.extend(failover_checks(f, FAULTY_NAME, &open, cut.max(1)));
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
