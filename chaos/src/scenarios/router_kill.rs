//! A router node of a 3-node mesh is SIGKILLed under load.
//!
//! Expected: its clients fail over to another node URL (the harness does what a client
//! behind DNS would) and succeed; only streams that ran through the killed node are
//! cut; the survivors drop it from the live members and forget its placements.

use super::common::base_plan;
use crate::check::{self, Check};
use crate::client::EndClass;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str = "router node n1 of a 3-node mesh SIGKILLed under load; clients fail over";

/// The node killed.
pub const VICTIM: usize = 1;
/// Bound for the survivors to see the death and forget its placements (s).
pub const MEMBERSHIP_BOUND_S: f64 = 20.0;

pub fn plan(o: &RunOptions) -> Plan {
    base_plan(o, 3)
}

/// Waits until node `n` reports `victim` not live and holds none of its placements.
pub async fn wait_forgotten(ctx: &mut Ctx<'_>, n: usize, victim: &str, from: f64, bound: f64) {
    let id = ctx.cluster.routers[n].id.clone();
    let dead = ctx
        .wait_for(n, bound, |s| {
            s.members.is_some() && s.member(victim).is_none_or(|m| !m.live)
        })
        .await;
    ctx.log.checks.push(check::within(
        &format!("{id} marks {victim} dead within the bound"),
        &format!("{victim} not live on {id}"),
        dead.map(|t| t - from),
        bound,
    ));
    let left = (from + bound - ctx.now_s()).max(0.0);
    let forgot = ctx
        .wait_for(n, left, |s| {
            s.members.is_some()
                && s.member(victim)
                    .is_none_or(|m| m.inflight_replicas.is_none())
        })
        .await;
    ctx.log.checks.push(check::within(
        &format!("{id} forgets {victim}'s placements within the bound"),
        &format!("no report of {victim}'s in-flight work left on {id}"),
        forgot.map(|t| t - from),
        bound,
    ));
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    ctx.at(ctx.plan.fault_s).await;
    wait_node_busy(ctx, VICTIM, 3.0).await;
    let victim = ctx.cluster.routers[VICTIM].id.clone();
    let at = ctx.now_s();
    if let Err(e) = ctx.cluster.kill_router(VICTIM).await {
        return ctx.fail(format!("killing {victim}: {e}"));
    }
    ctx.note(format!("router {victim} SIGKILLed"));
    ctx.log.fault_s = Some(at);
    // Refused connections fail over at once; pooled ones break before any byte.
    ctx.log.settle_s = at + 0.5;
    for n in (0..ctx.cluster.routers.len()).filter(|n| *n != VICTIM) {
        wait_forgotten(ctx, n, &victim, at, MEMBERSHIP_BOUND_S).await;
    }
    ctx.note(format!("survivors forgot {victim}"));
}

/// Waits (bounded) until node `n` has a request of its own in flight.
pub async fn wait_node_busy(ctx: &mut Ctx<'_>, n: usize, bound_s: f64) {
    let hit = ctx
        .wait_for(n, bound_s, |s| {
            s.replicas
                .as_ref()
                .is_some_and(|r| r.iter().map(|x| x.inflight).sum::<f64>() >= 1.0)
        })
        .await;
    if hit.is_none() {
        ctx.note(format!("node {n} had nothing in flight within {bound_s} s"));
    }
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let Some(at) = f.log.fault_s else {
        return Vec::new();
    };
    let through: Vec<_> = f
        .records
        .iter()
        .filter(|r| r.node == Some(VICTIM) && r.sent_s <= at && r.end_s >= at)
        .collect();
    let cut = through.iter().filter(|r| r.class == EndClass::Cut).count();
    let failed_over = f
        .records
        .iter()
        .filter(|r| r.sent_s > at && r.attempts > 1 && r.class == EndClass::Ok)
        .count();
    vec![Check::new(
        "the kill hit requests on the node, and later clients failed over",
        !through.is_empty() && failed_over > 0,
        format!(
            "{} requests were open on n{VICTIM} at the kill ({cut} cut, excused above); {failed_over} later requests succeeded on another node after the first refused",
            through.len()
        ),
    )]
}
