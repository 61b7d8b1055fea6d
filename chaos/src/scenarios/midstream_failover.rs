//! A replica breaks every stream halfway (an SSE error event and `[DONE]` after about
//! half its tokens), then recovers — with mid-stream failover on (the default).
//!
//! Expected: the router holds the error back and continues each broken stream on
//! another replica, so every stream that began on the faulty replica completes whole
//! (all its `max_tokens`, one id, one role, one `[DONE]`) and "requests succeed" holds
//! while the fault lasts; the broken attempts still count against the replica, which
//! is ejected although its `/health` answers, and re-admitted after the recovery.

use super::common::{FAULTY_NAME, base_plan, failover_checks, readmitted_check};
use crate::check::Check;
use crate::client::Kind;
use crate::observe::health_trace;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "replica r0 breaks every stream halfway, then recovers; its streams fail over";

pub fn plan(o: &RunOptions) -> Plan {
    base_plan(o, 1)
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    super::midstream_errors::inject(ctx).await;
    // Every request must succeed throughout: nothing is lost to the fault.
    ctx.log.settle_s = 0.0;
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let mut out = Vec::new();
    let Some(fault) = f.log.fault_s else {
        out.push(Check::new("the fault hit", false, "never injected"));
        return out;
    };
    let until = f.log.recover_s.unwrap_or(f.load_end_s);
    // Streams that began on r0 while it broke every stream: each was cut halfway.
    let cut: Vec<_> = f
        .records
        .iter()
        .filter(|r| r.replica.as_deref() == Some(FAULTY_NAME) && r.kind != Kind::Whole)
        .filter(|r| {
            r.first_token_s
                .is_some_and(|t| t >= fault + 0.05 && t < until)
        })
        .collect();
    // Streams admitted there just before the fault are judged too but were not cut.
    out.extend(failover_checks(f, FAULTY_NAME, &cut, 1));
    let ejected = health_trace(f.samples, 0, FAULTY_NAME, fault, None).ejected_s;
    out.push(Check::new(
        &format!("{FAULTY_NAME} ejected while it broke streams, though its /health answered"),
        ejected.is_some_and(|t| t < until),
        match ejected {
            Some(t) => format!("ejected {:.2} s after the fault", t - fault),
            None => "never ejected".into(),
        },
    ));
    out.push(readmitted_check(
        f,
        FAULTY_NAME,
        f.log.fault_s,
        f.log.recover_s,
    ));
    out
}
