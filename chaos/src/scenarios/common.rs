//! What the scenarios share: the default plan, replica fault injection through the
//! emulator's `/admin/faults`, waiting for live traffic on a target, and the
//! ejection / re-admission checks.

use std::time::Duration;

use serde_json::Value;

use crate::check::{self, Check};
use crate::client::{ClientSettings, EndClass, Record};
use crate::cluster::ClusterSpec;
use crate::http::post_json;
use crate::load::LoadShape;
use crate::observe::health_trace;
use crate::router_config::RouterTimings;
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

/// Index of the replica the replica scenarios break (named `r0`).
pub const FAULTY: usize = 0;
pub const FAULTY_NAME: &str = "r0";

/// Longest a request may take before it counts as hung: three attempts each bounded
/// by the first-byte timeout, a client failover, and the longest stream.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(20);

/// How long a mesh client waits for a node's response headers before trying the next.
pub const MESH_HEADER_FAILOVER: Duration = Duration::from_secs(2);

/// The plan most scenarios start from: three H100-class emulators, `routers` nodes
/// with the `slo` policy, a mixed streamed/non-streamed load.
pub fn base_plan(o: &RunOptions, routers: usize) -> Plan {
    let d = o.duration_s;
    Plan {
        cluster: ClusterSpec {
            replica_profiles: vec!["h100-llama3-8b".into(); 3],
            bad_metrics: None,
            routers,
            relay: false,
            clock_offsets_ms: Vec::new(),
            policy: "slo".into(),
            timings: RouterTimings::default(),
            time_scale: o.time_scale,
            seed: o.seed,
            model: "llama-3-8b".into(),
        },
        load: LoadShape {
            rate_per_s: o.rate_per_s.unwrap_or(20.0),
            duration_s: d,
            max_tokens: (32, 192),
            prompt_words: (20, 200),
            chat_share: 0.2,
            whole_share: 0.1,
            max_inflight: 256,
            abandon_share: 0.0,
            abandon_window: (0.0, 0.0),
            burst: None,
        },
        client: ClientSettings {
            model: "llama-3-8b".into(),
            // Mesh scenarios break router nodes, not replicas: a healthy node answers
            // well within this, so silence means the node is gone.
            header_failover: (routers > 1).then_some(MESH_HEADER_FAILOVER),
            deadline: REQUEST_DEADLINE,
            slo_ms: o
                .slo_model_ms
                .map(|(ttft, tpot)| (ttft * o.time_scale, tpot * o.time_scale)),
            next_on_unavailable: false,
        },
        fault_s: 0.3 * d,
        recover_s: 0.6 * d,
    }
}

/// Applies a fault patch to replica `i` through its emulator's admin endpoint.
pub async fn set_faults(ctx: &mut Ctx<'_>, i: usize, patch: Value) -> bool {
    let Some(r) = ctx.cluster.replicas.get(i) else {
        ctx.fail(format!("no replica {i}"));
        return false;
    };
    let url = format!("http://{}/admin/faults", r.addr);
    let name = r.name.clone();
    match post_json(&ctx.cluster.client, &url, &patch, Duration::from_secs(2)).await {
        Ok(_) => {
            ctx.note(format!("{name}: faults {patch}"));
            true
        }
        Err(e) => {
            ctx.fail(format!("setting faults on {name}: {e}"));
            false
        }
    }
}

/// Waits (bounded) until some node has a request decoding (streaming tokens) on
/// `replica`, so the fault hits live streams; returns whether it did.
pub async fn wait_busy(ctx: &mut Ctx<'_>, replica: &str, bound_s: f64) -> bool {
    let nodes = ctx.cluster.routers.len();
    let end = ctx.now_s() + bound_s;
    while ctx.now_s() < end {
        for n in 0..nodes {
            let hit = ctx
                .wait_for(n, 0.0, |s| {
                    s.replica(replica).is_some_and(|r| r.decoding >= 1.0)
                })
                .await;
            if hit.is_some() {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ctx.note(format!(
        "{replica} had no stream decoding within {bound_s} s"
    ));
    false
}

/// Streams that had begun on `replica` (first token before `at_s`) and were still open
/// at it — less those that completed normally within 100 ms of it (their last tokens
/// raced the fault).
/// Waits (within the re-admission bound) until every router node routes to `replica`
/// again.
pub async fn wait_readmitted(ctx: &mut Ctx<'_>, replica: &str) {
    let bound = ctx.plan.cluster.timings.readmission_bound_s();
    for n in 0..ctx.cluster.routers.len() {
        ctx.wait_for(n, bound, |s| s.replica(replica).is_some_and(|r| r.routable))
            .await;
    }
}

pub fn streams_cut_at<'a>(f: &'a Finished<'_>, replica: &str, at_s: f64) -> Vec<&'a Record> {
    f.records
        .iter()
        .filter(|r| {
            r.replica.as_deref() == Some(replica)
                && r.first_token_s.is_some_and(|t| t < at_s)
                && r.end_s >= at_s
                && !(r.class == EndClass::Ok && r.end_s < at_s + 0.1)
        })
        .collect()
}

/// The replica was ejected by every live node within the bound after `fault_s`.
pub fn ejected_check(f: &Finished<'_>, replica: &str, fault_s: Option<f64>) -> Check {
    let name = format!("faulty replica {replica} ejected within the bound");
    let Some(fault) = fault_s else {
        return Check::new(&name, false, "the fault never hit");
    };
    let bound = f.plan.cluster.timings.ejection_bound_s();
    let mut worst: Option<f64> = Some(0.0);
    let mut parts = Vec::new();
    for (n, id) in f.router_ids.iter().enumerate() {
        let t = health_trace(f.samples, n, replica, fault, None);
        let took = t.ejected_s.map(|e| e - fault);
        parts.push(format!(
            "{id}: {}",
            took.map_or("never".to_string(), |x| format!("{x:.2} s"))
        ));
        worst = match (worst, took) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    let mut c = check::within(&name, "ejected on every node", worst, bound);
    c.detail = format!("{} ({})", c.detail, parts.join(", "));
    c
}

/// The replica was routable again on every live node within the bound after
/// `recover_s`.
pub fn readmitted_check(
    f: &Finished<'_>,
    replica: &str,
    fault_s: Option<f64>,
    recover_s: Option<f64>,
) -> Check {
    let name = format!("{replica} re-admitted within the bound after recovery");
    let (Some(fault), Some(rec)) = (fault_s, recover_s) else {
        return Check::new(&name, false, "the fault was never lifted");
    };
    let bound = f.plan.cluster.timings.readmission_bound_s();
    let mut worst: Option<f64> = Some(0.0);
    let mut parts = Vec::new();
    for (n, id) in f.router_ids.iter().enumerate() {
        let t = health_trace(f.samples, n, replica, fault, Some(rec));
        let took = t.readmitted_s.map(|x| x - rec);
        parts.push(format!(
            "{id}: {} ({} ejections)",
            took.map_or("never".to_string(), |x| format!("{x:.2} s")),
            t.ejections
        ));
        worst = match (worst, took) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
    }
    let mut c = check::within(&name, "routable again on every node", worst, bound);
    c.detail = format!("{} ({})", c.detail, parts.join(", "));
    c
}

/// Requests served by `replica` among those sent in `[from, to)`: (served, total).
pub fn share_in(f: &Finished<'_>, replica: &str, from: f64, to: f64) -> (usize, usize) {
    let w: Vec<&Record> = f
        .records
        .iter()
        .filter(|r| r.sent_s >= from && r.sent_s < to && r.replica.is_some())
        .collect();
    let on = w
        .iter()
        .filter(|r| r.replica.as_deref() == Some(replica))
        .count();
    (on, w.len())
}

/// Fewest requests the pre-fault window must hold for the balance to be judged.
const MIN_BALANCE_JUDGED: usize = 30;

/// Before the fault every replica (all alike) served a fair part of the load: at
/// least a quarter of an even share over the 5 s before the fault.
pub fn balanced_before(f: &Finished<'_>) -> Check {
    let name = "no healthy replica starves before the fault";
    let fault = f.log.fault_s.unwrap_or(f.plan.fault_s);
    let (from, to) = ((fault - 5.0).max(0.0), fault);
    let names: Vec<String> = (0..f.plan.cluster.replica_profiles.len())
        .map(|i| format!("r{i}"))
        .collect();
    let floor = 1.0 / (4.0 * names.len() as f64);
    let mut parts = Vec::new();
    let mut pass = true;
    let mut total = 0;
    for n in &names {
        let (on, all) = share_in(f, n, from, to);
        total = all;
        pass &= on as f64 / all.max(1) as f64 >= floor;
        parts.push(format!("{n} {on}"));
    }
    if total < MIN_BALANCE_JUDGED {
        return Check::new(
            name,
            true,
            format!("not judged: {total} requests before the fault (need {MIN_BALANCE_JUDGED})"),
        );
    }
    Check::new(
        name,
        pass,
        format!(
            "requests sent in [{from:.1} s, {to:.1} s): {} of {total} (each needs ≥ {:.1}%)",
            parts.join(", "),
            floor * 100.0
        ),
    )
}

/// Longest pause a failed-over stream may show the client (s): the continuation's
/// routing, connect and prefill on a loopback emulator take well under this.
pub const FAILOVER_PAUSE_BOUND_S: f64 = 2.0;

/// The sum over live nodes of one counter line in their `/metrics` (e.g.
/// `headroom_failover_total{outcome="resumed"}`).
pub fn metric_sum(f: &Finished<'_>, line: &str) -> f64 {
    f.metrics
        .iter()
        .flatten()
        .flat_map(|m| m.lines())
        .filter_map(|l| l.strip_prefix(line))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

/// Mid-stream failover held: every stream in `cut` (begun on `replica` and broken
/// there, or at risk of it) completed whole, the pause it showed stayed within the
/// bound, and the nodes counted at least `min_resumed` continuations and no failed one.
pub fn failover_checks(
    f: &Finished<'_>,
    replica: &str,
    cut: &[&Record],
    min_resumed: usize,
) -> Vec<Check> {
    let whole = cut
        .iter()
        .filter(|r| r.class == EndClass::Ok && r.violations.is_empty())
        .count();
    let pct = if cut.is_empty() {
        0.0
    } else {
        100.0 * whole as f64 / cut.len() as f64
    };
    let mut out = vec![Check::new(
        &format!("every stream cut on {replica} completed whole by failover"),
        !cut.is_empty() && whole == cut.len(),
        format!(
            "{whole} of {} cut streams completed ({pct:.0}%), each with all its max_tokens, one id, one [DONE]",
            cut.len()
        ),
    )];
    let cut_ids: std::collections::BTreeSet<u64> = cut.iter().map(|r| r.id).collect();
    let pauses: Vec<f64> = cut.iter().filter_map(|r| r.max_gap_s).collect();
    let normal: Vec<f64> = f
        .records
        .iter()
        .filter(|r| r.class == EndClass::Ok && !cut_ids.contains(&r.id))
        .filter_map(|r| r.max_gap_s)
        .collect();
    let worst = pauses
        .iter()
        .copied()
        .fold(None, |a: Option<f64>, x| Some(a.map_or(x, |a| a.max(x))));
    let (p50, base) = (median(pauses), median(normal));
    let added = match (p50, base) {
        (Some(a), Some(b)) => format!("{:.0}", (a - b) * 1e3),
        _ => "-".into(),
    };
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.0}", v * 1e3));
    let pause = Check::new(
        &format!("failed-over streams pause at most {FAILOVER_PAUSE_BOUND_S} s"),
        worst.is_some_and(|w| w <= FAILOVER_PAUSE_BOUND_S),
        format!(
            "longest pause {} ms; median longest pause {} ms in failed-over streams vs {} ms in the others (added ≈ {added} ms)",
            ms(worst),
            ms(p50),
            ms(base)
        ),
    );
    out.push(pause);
    let resumed = metric_sum(f, "headroom_failover_total{outcome=\"resumed\"}");
    let failed = metric_sum(f, "headroom_failover_total{outcome=\"failed\"}");
    out.push(Check::new(
        &format!("the nodes counted ≥ {min_resumed} continuations and none failed"),
        resumed >= min_resumed as f64 && failed == 0.0,
        format!(
            "headroom_failover_total: resumed {resumed}, failed {failed} ({} streams judged)",
            cut.len()
        ),
    ));
    out
}
