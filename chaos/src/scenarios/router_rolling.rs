//! A rolling restart of every router node of a 3-node mesh under load: each node in
//! turn gets SIGTERM (it closes its listener, finishes the requests it holds, exits),
//! is started again with its old id and addresses, and the next waits until the mesh
//! is whole again.
//!
//! The clients do what a client behind DNS with the node list does: a refused or
//! broken connection before any response byte, no headers within 2 s, or a 503 (a
//! node still starting) moves the request to the next node in the list — never after
//! a byte arrived, so nothing is duplicated.
//!
//! Expected: zero failed requests — every request sent is answered whole; each node
//! drains within `DRAIN_GRACE` and exits 0; the mesh is whole within `HEAL_BOUND_S`
//! of each restart; each restarted node serves again.

use std::time::Duration;

use super::common::base_plan;
use super::net_partition::{HEAL_BOUND_S, wait_whole};
use crate::check::Check;
use crate::client::EndClass;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str = "rolling restart (SIGTERM, drain, start) of all 3 mesh nodes under load";

/// Longest a node may take to drain after SIGTERM: its longest stream (192 tokens)
/// with margin.
pub const DRAIN_GRACE: Duration = Duration::from_secs(15);
/// Pause between one node rejoining and the next one's SIGTERM (s).
const BETWEEN_S: f64 = 0.5;

pub fn plan(o: &RunOptions) -> Plan {
    let mut p = base_plan(o, 3);
    p.client.next_on_unavailable = true;
    p.fault_s = 0.15 * o.duration_s;
    p
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    ctx.at(ctx.plan.fault_s).await;
    ctx.log.settle_s = 0.0;
    for i in 0..ctx.cluster.routers.len() {
        let id = ctx.cluster.routers[i].id.clone();
        let at = ctx.now_s();
        if i == 0 {
            ctx.log.fault_s = Some(at);
        }
        ctx.note(format!("SIGTERM {id}"));
        let (took, clean) = match ctx.cluster.drain_router(i, DRAIN_GRACE).await {
            Ok(x) => x,
            Err(e) => return ctx.fail(format!("stopping {id}: {e}")),
        };
        ctx.note(format!("{id} exited after {took:.2} s (clean: {clean})"));
        ctx.log.numbers.insert(format!("{id}_drain_s"), took);
        ctx.log.checks.push(Check::new(
            &format!(
                "{id} drains and exits 0 within {} s of SIGTERM",
                DRAIN_GRACE.as_secs()
            ),
            clean,
            format!(
                "exited after {took:.2} s, {}",
                if clean {
                    "status 0"
                } else {
                    "killed or failed"
                }
            ),
        ));
        let back = ctx.now_s();
        if let Err(e) = ctx.cluster.restart_router(i).await {
            return ctx.fail(format!("restarting {id}: {e}"));
        }
        ctx.note(format!("{id} started again"));
        ctx.log.numbers.insert(format!("{id}_back_s"), back);
        wait_whole(ctx, &format!("after restarting {id}"), back, HEAL_BOUND_S).await;
        ctx.at(ctx.now_s() + BETWEEN_S).await;
    }
    ctx.log.recover_s = Some(ctx.now_s());
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let ok = f.records.iter().filter(|r| r.class == EndClass::Ok).count();
    let moved = f
        .records
        .iter()
        .filter(|r| r.attempts > 1 && r.class == EndClass::Ok)
        .count();
    let failed: Vec<String> = f
        .records
        .iter()
        .filter(|r| r.class != EndClass::Ok)
        .take(3)
        .map(|r| {
            format!(
                "#{} {:?} at {:.2} s: {}",
                r.id,
                r.class,
                r.sent_s,
                r.detail.as_deref().unwrap_or("-")
            )
        })
        .collect();
    let mut out = vec![Check::new(
        "zero failed requests through the rolling restart",
        ok == f.records.len() && !f.records.is_empty(),
        format!(
            "{ok} of {} answered whole; {moved} moved to another node before any byte{}",
            f.records.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!("; failed e.g. {}", failed.join(" | "))
            }
        ),
    )];
    for (n, id) in f.router_ids.iter().enumerate() {
        let Some(back) = f.log.numbers.get(&format!("{id}_back_s")) else {
            continue;
        };
        let served = f
            .records
            .iter()
            .filter(|r| r.sent_s > *back && r.node == Some(n) && r.class == EndClass::Ok)
            .count();
        out.push(Check::new(
            &format!("{id} serves again after its restart"),
            served > 0,
            format!("{served} requests sent after its restart succeeded through {id}"),
        ));
    }
    out
}
