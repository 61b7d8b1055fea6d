//! A router node of a 3-node mesh is frozen (SIGSTOP) long enough for its peers to
//! declare it dead, then resumed (SIGCONT).
//!
//! Expected: the peers mark it dead and forget its placements; clients whose node
//! stopped answering fail over after a header timeout; once resumed the node rejoins
//! (every node sees all three live), finishes or cleanly ends what it held, and its
//! ledgers drain to zero like everyone's.

use super::common::{MESH_HEADER_FAILOVER, base_plan};
use super::router_kill::{MEMBERSHIP_BOUND_S, rejoin_check, wait_forgotten, wait_node_busy};
use crate::check::Check;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "router node n1 of a 3-node mesh SIGSTOPped until its peers drop it, then SIGCONTed";

/// The node paused.
pub const VICTIM: usize = 1;

pub fn plan(o: &RunOptions) -> Plan {
    let mut p = base_plan(o, 3);
    // Requests held by the frozen node wait out the pause; the deadline covers it.
    p.client.deadline += std::time::Duration::from_secs_f64(MEMBERSHIP_BOUND_S);
    p
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    ctx.at(ctx.plan.fault_s).await;
    wait_node_busy(ctx, VICTIM, 3.0).await;
    let victim = ctx.cluster.routers[VICTIM].id.clone();
    let at = ctx.now_s();
    if let Err(e) = ctx.cluster.pause_router(VICTIM, true) {
        return ctx.fail(format!("pausing {victim}: {e}"));
    }
    ctx.note(format!("router {victim} SIGSTOPped"));
    ctx.log.fault_s = Some(at);
    ctx.log.settle_s = at;
    wait_forgotten(ctx, VICTIM, at, MEMBERSHIP_BOUND_S).await;
    ctx.note(format!("peers dropped {victim}"));
    // Stay frozen long enough that its clients must fail over.
    let min_pause = MESH_HEADER_FAILOVER.as_secs_f64() + 1.5;
    ctx.at(at + min_pause).await;
    let resumed = ctx.now_s();
    if let Err(e) = ctx.cluster.pause_router(VICTIM, false) {
        return ctx.fail(format!("resuming {victim}: {e}"));
    }
    ctx.note(format!("router {victim} SIGCONTed"));
    ctx.log.recover_s = Some(resumed);
    ctx.log.numbers.insert("paused_s".into(), resumed - at);
    rejoin_check(ctx, &victim, resumed).await;
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let (Some(at), Some(resumed)) = (f.log.fault_s, f.log.recover_s) else {
        return Vec::new();
    };
    let held: Vec<_> = f
        .records
        .iter()
        .filter(|r| r.node == Some(VICTIM) && r.sent_s <= at && r.end_s >= at)
        .collect();
    let failed_over = f
        .records
        .iter()
        .filter(|r| r.sent_s > at && r.sent_s < resumed && r.attempts > 1)
        .count();
    vec![Check::new(
        "the pause froze requests on the node, and new clients failed over",
        !held.is_empty() && failed_over > 0,
        format!(
            "{} requests were open on n{VICTIM} when it froze (all ended: {}); {failed_over} requests sent during the pause moved to another node after the header timeout",
            held.len(),
            held.iter().all(|r| r.class.clean())
        ),
    )]
}
