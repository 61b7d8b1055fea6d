//! A replica crashes and is started again at once on its old address — as a
//! supervisor restarts a crashed engine — so it comes back with an empty prefix
//! cache, possibly before the routers' health probes noticed it was gone.
//!
//! Expected: the router sees the restart from the engine's own counters (a monotone
//! counter went back), counts it once in `headroom_replica_restarts_total` and
//! forgets every prefix it placed there: a prompt it held as cached on that replica
//! before the crash is held cached there no more after it (`cached_tokens` of that
//! candidate in the prompt's decision record). No other replica is counted as
//! restarted; streams cut by the crash fail over, and nothing is lost.
//!
//! The victim is the replica the marker prompt landed on, not a fixed one, so the
//! check never depends on where the policy happened to place it.

use std::time::Duration;

use http::Method;
use serde_json::{Value, json};

use super::common::{base_plan, failover_checks, streams_cut_at, wait_busy, wait_readmitted};
use crate::check::Check;
use crate::http::{call_with_headers, counter_sum, get_json, get_text};
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str = "the replica holding a known prompt is SIGKILLed and restarted at once (empty prefix cache): the router counts the restart and forgets its prefixes";

/// Key in the fault log's numbers naming the victim's index.
const VICTIM_KEY: &str = "victim";
/// Longest the router may take to count the restart after the engine is back (s):
/// a few scrape periods and a retry or two on the busy two-core machines we run on.
const DETECT_BOUND_S: f64 = 5.0;
const RESTARTS: &str = "headroom_replica_restarts_total";

pub fn plan(o: &RunOptions) -> Plan {
    base_plan(o, 1)
}

/// A prompt no load request shares a block with (their prompts start with
/// "chaos request N says"): about 700 words, dozens of prefix blocks.
fn marker_prompt() -> String {
    let mut s = String::from("replica restart marker:");
    for k in 0..700u32 {
        s.push_str(
            [
                " north", " south", " east", " west", " up", " down", " left",
            ][(k % 7) as usize],
        );
    }
    s
}

/// What one marker request showed: where it went, and the tokens the router held
/// cached on each candidate when it decided.
struct MarkerSeen {
    replica: String,
    cached: Vec<(String, u64)>,
}

impl MarkerSeen {
    fn cached_on(&self, replica: &str) -> Option<u64> {
        self.cached
            .iter()
            .find(|(r, _)| r == replica)
            .map(|(_, c)| *c)
    }
}

/// Sends the marker prompt (non-streamed, 2 tokens) and reads its decision record.
async fn send_marker(ctx: &Ctx<'_>) -> Result<MarkerSeen, String> {
    let node = ctx.cluster.routers.first().ok_or("no router")?.url();
    let body = json!({
        "model": ctx.plan.client.model,
        "prompt": marker_prompt(),
        "max_tokens": 2,
    });
    let url = format!("{node}/v1/completions");
    let (status, headers, _) = call_with_headers(
        &ctx.cluster.client,
        Method::POST,
        &url,
        Some(&body),
        Duration::from_secs(10),
    )
    .await?;
    if status != 200 {
        return Err(format!("marker request answered HTTP {status}"));
    }
    let header = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or(format!("marker answer lacks {k}"))
    };
    let replica = header("x-headroom-replica")?;
    let id = header("x-headroom-decision-id")?;
    let rec = get_json(
        &ctx.cluster.client,
        &format!("{node}/debug/decisions/{id}"),
        Duration::from_secs(2),
    )
    .await?;
    let cached = rec
        .pointer("/decision/candidates")
        .and_then(Value::as_array)
        .ok_or("marker's decision record lists no candidates")?
        .iter()
        .filter_map(|c| {
            Some((
                c.get("replica")?.as_str()?.to_string(),
                c.get("cached_tokens")?.as_u64()?,
            ))
        })
        .collect();
    Ok(MarkerSeen { replica, cached })
}

/// Restarts counted by node 0 for each replica name.
async fn restarts(ctx: &Ctx<'_>) -> Result<Vec<(String, f64)>, String> {
    let node = ctx.cluster.routers.first().ok_or("no router")?.url();
    let text = get_text(
        &ctx.cluster.client,
        &format!("{node}/metrics"),
        Duration::from_secs(2),
    )
    .await?;
    Ok(ctx
        .cluster
        .replicas
        .iter()
        .map(|r| {
            let n = counter_sum(&text, RESTARTS, Some(("replica", r.name.as_str())));
            (r.name.clone(), n)
        })
        .collect())
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    let (fault_s, end_s) = (ctx.plan.fault_s, ctx.plan.recover_s);
    ctx.at(fault_s).await;
    // Place the marker, then send it again until the router holds it cached where it
    // went (the index learns a placement at dispatch; a few tries absorb a race).
    let first = match send_marker(ctx).await {
        Ok(m) => m,
        Err(e) => return ctx.fail(e),
    };
    let holder = first.replica.clone();
    let mut before = None;
    for _ in 0..5 {
        match send_marker(ctx).await {
            Ok(m) if m.cached_on(&holder).unwrap_or(0) > 0 => {
                before = m.cached_on(&holder);
                break;
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => return ctx.fail(e),
        }
    }
    ctx.note(format!(
        "marker placed on {holder}; held cached there: {before:?} tokens"
    ));
    ctx.log.checks.push(Check::new(
        "before the crash the router holds the marker cached where it went",
        before.is_some(),
        format!("{holder}: {before:?} cached tokens in the repeat's decision record"),
    ));
    let Some(victim) = ctx.cluster.replicas.iter().position(|r| r.name == holder) else {
        return ctx.fail(format!("marker went to unknown replica {holder}"));
    };
    ctx.log.numbers.insert(VICTIM_KEY.into(), victim as f64);
    let counted_before = restarts(ctx).await.unwrap_or_default();

    wait_busy(ctx, &holder, 3.0).await;
    let at = ctx.now_s();
    if let Err(e) = ctx.cluster.kill_replica(victim).await {
        return ctx.fail(format!("killing {holder}: {e}"));
    }
    ctx.note(format!("{holder} SIGKILLed"));
    ctx.log.fault_s = Some(at);
    // Nothing may fail even during the crash.
    ctx.log.settle_s = at;
    if let Err(e) = ctx.cluster.restart_replica(victim).await {
        return ctx.fail(format!("restarting {holder}: {e}"));
    }
    let back = ctx.now_s();
    ctx.note(format!(
        "{holder} restarted on its old address {:.2} s after the kill",
        back - at
    ));
    ctx.log.recover_s = Some(back);

    // The router must count the restart, from the engine's counters.
    let mut seen_at = None;
    let mut counted = Vec::new();
    while ctx.now_s() < back + DETECT_BOUND_S {
        if let Ok(now) = restarts(ctx).await {
            let delta = |name: &str| {
                let was = counted_before
                    .iter()
                    .find(|(r, _)| r == name)
                    .map_or(0.0, |x| x.1);
                now.iter().find(|(r, _)| r == name).map_or(0.0, |x| x.1) - was
            };
            if delta(&holder) >= 1.0 {
                seen_at = Some(ctx.now_s());
                counted = now.iter().map(|(r, _)| (r.clone(), delta(r))).collect();
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    ctx.log.checks.push(crate::check::within(
        &format!("the router counts {holder}'s restart"),
        "counted after the engine was back",
        seen_at.map(|t| t - back),
        DETECT_BOUND_S,
    ));
    let others: Vec<String> = counted
        .iter()
        .filter(|(r, n)| *r != holder && *n != 0.0)
        .map(|(r, n)| format!("{r}: {n}"))
        .collect();
    ctx.log.checks.push(Check::new(
        "only the restarted replica is counted as restarted",
        seen_at.is_some() && others.is_empty(),
        format!("counted: {counted:?}"),
    ));

    // And hold nothing cached there any more, once it is a candidate again (the
    // probes may have ejected it while it was down).
    wait_readmitted(ctx, &holder).await;
    match send_marker(ctx).await {
        Ok(m) => {
            let after = m.cached_on(&holder);
            ctx.note(format!(
                "marker after the restart: went to {}, held cached on {holder}: {after:?}",
                m.replica
            ));
            ctx.log.checks.push(Check::new(
                &format!("after the restart the router holds nothing cached on {holder}"),
                after == Some(0),
                format!(
                    "{holder}: {before:?} cached tokens before the crash, {after:?} after (the marker went to {} this time)",
                    m.replica
                ),
            ));
        }
        Err(e) => ctx.fail(e),
    }
    ctx.at(end_s).await;
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let (Some(at), Some(v)) = (f.log.fault_s, f.log.numbers.get(VICTIM_KEY)) else {
        return vec![Check::new(
            "the crash happened",
            false,
            "no fault was injected",
        )];
    };
    // Replicas are named by their index (`Cluster::start`).
    let victim = format!("r{}", *v as usize);
    // Every stream open there at the kill, including those whose last tokens raced it.
    let open: Vec<_> = f
        .records
        .iter()
        .filter(|r| r.replica.as_deref() == Some(victim.as_str()))
        .filter(|r| r.first_token_s.is_some_and(|t| t < at) && r.end_s >= at)
        .collect();
    let cut = streams_cut_at(f, &victim, at).len();
    failover_checks(f, &victim, &open, cut.max(1))
}
