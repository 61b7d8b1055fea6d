//! A router node of a 3-node mesh is SIGKILLed under load, and later started again
//! with its old id and addresses.
//!
//! Expected: its clients fail over to another node URL (the harness does what a client
//! behind DNS would) and succeed; only streams that ran through the killed node are
//! cut; the survivors drop it from the live members and forget its placements; the
//! restarted node rejoins (every node sees all three live) and serves again.

use super::common::base_plan;
use crate::check::{self, Check};
use crate::client::EndClass;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "router node n1 of a 3-node mesh SIGKILLed under load (clients fail over), restarted later";

/// The node killed.
pub const VICTIM: usize = 1;
/// Bound for the survivors to see the death and forget its placements (s).
pub const MEMBERSHIP_BOUND_S: f64 = 20.0;
/// Seconds between the survivors forgetting the victim and its restart.
const RESTART_AFTER_S: f64 = 1.0;
/// Bound for a returning node to be a live member everywhere again (s): a few gossip
/// rounds and heartbeats, more than the 3 s peer TTL.
pub const REJOIN_BOUND_S: f64 = 5.0;
/// How long a rejoin is watched (so a slow one is measured, not just failed).
const REJOIN_WATCH_S: f64 = 20.0;

pub fn plan(o: &RunOptions) -> Plan {
    base_plan(o, 3)
}

/// Waits until every node but the victim reports it not live and holds none of its
/// placements; records how long each took.
pub async fn wait_forgotten(ctx: &mut Ctx<'_>, victim_ix: usize, from: f64, bound: f64) {
    let victim = ctx.cluster.routers[victim_ix].id.clone();
    let others: Vec<usize> = (0..ctx.cluster.routers.len())
        .filter(|n| *n != victim_ix)
        .collect();
    let v = victim.clone();
    let dead = ctx
        .wait_all(&others, bound, |s| {
            s.members.is_some() && s.member(&v).is_none_or(|m| !m.live)
        })
        .await;
    let left = (from + bound - ctx.now_s()).max(0.0);
    let forgot = ctx
        .wait_all(&others, left, |s| {
            s.members.is_some() && s.member(&v).is_none_or(|m| m.inflight_replicas.is_none())
        })
        .await;
    for (k, n) in others.iter().enumerate() {
        let id = ctx.cluster.routers[*n].id.clone();
        ctx.log.checks.push(check::within(
            &format!("{id} marks {victim} dead within the bound"),
            &format!("{victim} not live on {id}"),
            dead[k].map(|t| t - from),
            bound,
        ));
        ctx.log.checks.push(check::within(
            &format!("{id} forgets {victim}'s placements within the bound"),
            &format!("no report of {victim}'s in-flight work left on {id}"),
            forgot[k].map(|t| t - from),
            bound,
        ));
    }
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
    wait_forgotten(ctx, VICTIM, at, MEMBERSHIP_BOUND_S).await;
    ctx.note(format!("survivors forgot {victim}"));
    // Back soon after the survivors gave up on it, as a supervisor would restart it.
    ctx.at(ctx.now_s() + RESTART_AFTER_S).await;
    let back = ctx.now_s();
    let watch = watch_startup(ctx, VICTIM);
    if let Err(e) = ctx.cluster.restart_router(VICTIM).await {
        watch.abort();
        return ctx.fail(format!("restarting {victim}: {e}"));
    }
    ctx.note(format!(
        "router {victim} restarted with its old id and addresses"
    ));
    ctx.log.recover_s = Some(back);
    rejoin_check(ctx, &victim, back).await;
    let got = watch.await.unwrap_or_default();
    ctx.log.checks.push(startup_check(&victim, &got));
}

/// Longest a restarted node is watched for its first answers (s).
const STARTUP_WATCH_S: f64 = 15.0;
/// Successful answers after which the watch stops.
const STARTUP_OKS: usize = 5;

/// Concurrent pollers of a restarting node.
const STARTUP_POLLERS: u64 = 4;

/// From before a restart until the node has served a few requests, small valid
/// requests are sent to it back to back by a few concurrent clients (as clients behind
/// DNS would the moment the address accepts connections); every answer is kept.
/// Refused connections are not answers.
fn watch_startup(ctx: &Ctx<'_>, n: usize) -> tokio::task::JoinHandle<Vec<crate::client::Record>> {
    let nodes = std::sync::Arc::new(vec![ctx.cluster.routers[n].url()]);
    let settings = std::sync::Arc::new(crate::client::ClientSettings {
        header_failover: None,
        deadline: std::time::Duration::from_secs(5),
        ..ctx.plan.client.clone()
    });
    let (t0, client) = (ctx.t0, ctx.cluster.client.clone());
    let oks = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let end = std::time::Instant::now() + std::time::Duration::from_secs_f64(STARTUP_WATCH_S);
    tokio::spawn(async move {
        let pollers = (0..STARTUP_POLLERS).map(|p| {
            let (nodes, settings, client, oks) =
                (nodes.clone(), settings.clone(), client.clone(), oks.clone());
            async move {
                let mut got = Vec::new();
                let mut k = 0;
                while std::time::Instant::now() < end
                    && oks.load(std::sync::atomic::Ordering::Relaxed) < STARTUP_OKS
                {
                    let spec = crate::client::RequestSpec {
                        id: 1_000_000 + p * 100_000 + k,
                        kind: crate::client::Kind::Whole,
                        due_s: 0.0,
                        max_tokens: 4,
                        prompt_words: 8,
                        primary: 0,
                        abandon_after: None,
                    };
                    k += 1;
                    let r = crate::client::run_request(&client, &nodes, &spec, &settings, t0).await;
                    if r.class == EndClass::Ok {
                        oks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    if r.status.is_some() {
                        got.push(r);
                    } else {
                        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    }
                }
                got
            }
        });
        futures_util::future::join_all(pollers)
            .await
            .into_iter()
            .flatten()
            .collect()
    })
}

/// A starting node never refuses a valid request with a 4xx: before it can serve it
/// says so with a retryable 503 (or does not accept connections yet).
fn startup_check(id: &str, got: &[crate::client::Record]) -> Check {
    let ok = got.iter().filter(|r| r.class == EndClass::Ok).count();
    let refused: Vec<&crate::client::Record> = got
        .iter()
        .filter(|r| {
            r.status
                .is_some_and(|s| (400..500).contains(&s) && s != 429)
        })
        .collect();
    let other = got.len() - ok - refused.len();
    Check::new(
        &format!("{id} never refuses a valid request with a 4xx while starting"),
        refused.is_empty() && ok > 0,
        format!(
            "{} answers from the moment {id} accepted connections: {ok} ok, {other} retryable errors, {} 4xx{}",
            got.len(),
            refused.len(),
            refused.first().map_or(String::new(), |r| format!(
                " (first at {:.3} s: HTTP {:?} {})",
                r.sent_s,
                r.status,
                r.detail.as_deref().unwrap_or("-")
            ))
        ),
    )
}

/// Waits until every node sees all members live; records how long each took.
pub async fn rejoin_check(ctx: &mut Ctx<'_>, victim: &str, since: f64) {
    let all = ctx.cluster.routers.len();
    let nodes: Vec<usize> = (0..all).collect();
    let left = (since + REJOIN_WATCH_S - ctx.now_s()).max(0.0);
    let got = ctx
        .wait_all(&nodes, left, |s| {
            s.live_members().is_some_and(|m| m.len() == all)
        })
        .await;
    let took: Vec<Option<f64>> = got
        .iter()
        .map(|t| t.map(|t| (t - since).max(0.0)))
        .collect();
    let worst = took.iter().try_fold(0.0f64, |w, t| t.map(|t| w.max(t)));
    let parts: Vec<String> = took
        .iter()
        .enumerate()
        .map(|(n, t)| {
            format!(
                "{}: {}",
                ctx.cluster.routers[n].id,
                t.map_or("never".into(), |t| format!("{t:.2} s"))
            )
        })
        .collect();
    let mut c = check::within(
        &format!("{victim} rejoins: every node sees all {all} members live again"),
        "membership converged",
        worst,
        REJOIN_BOUND_S,
    );
    c.detail = format!("{} ({})", c.detail, parts.join(", "));
    ctx.log.checks.push(c);
    ctx.note("membership converged");
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
    let mut out = vec![Check::new(
        "the kill hit requests on the node, and later clients failed over",
        !through.is_empty() && failed_over > 0,
        format!(
            "{} requests were open on n{VICTIM} at the kill ({cut} cut, excused above); {failed_over} later requests succeeded on another node after the first refused",
            through.len()
        ),
    )];
    if let Some(back) = f.log.recover_s {
        let served = f
            .records
            .iter()
            .filter(|r| r.sent_s > back && r.node == Some(VICTIM) && r.class == EndClass::Ok)
            .count();
        out.push(Check::new(
            "the restarted node serves requests again",
            served > 0,
            format!("{served} requests sent after the restart succeeded through n{VICTIM}"),
        ));
    }
    out
}
