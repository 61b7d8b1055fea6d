//! A replica slows down threefold (every engine step takes 3× longer), then recovers.
//!
//! Expected: the `slo` policy, which learns each replica's token time from what it
//! observes and prefers the cheapest placement among equally safe ones, sends clearly
//! less of the load to the slow replica once it has had a few seconds of evidence, and
//! sends it traffic again once it is fast again.

use serde_json::json;

use super::common::{FAULTY, FAULTY_NAME, base_plan, set_faults, share_in};
use crate::check::{Check, MIN_JUDGED, quantile};
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "replica r0 slows down 3x, then recovers; the slo policy should route around it";

/// Slowdown factor.
const FACTOR: f64 = 3.0;
/// Seconds the router gets to notice the slowdown (≈ 20 requests on the replica).
pub const LEARN_S: f64 = 3.0;
/// Seconds after the recovery before its traffic is judged.
const RETURN_S: f64 = 2.0;

pub fn plan(o: &RunOptions) -> Plan {
    let mut p = base_plan(o, 1);
    let d = o.duration_s;
    p.fault_s = 0.2 * d;
    p.recover_s = 0.6 * d;
    p
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    let (fault_s, recover_s) = (ctx.plan.fault_s, ctx.plan.recover_s);
    ctx.at(fault_s).await;
    let at = ctx.now_s();
    if !set_faults(ctx, FAULTY, json!({"slowdown": FACTOR})).await {
        return;
    }
    ctx.log.fault_s = Some(at);
    ctx.log.settle_s = at + LEARN_S;
    ctx.at(recover_s).await;
    let at = ctx.now_s();
    if set_faults(ctx, FAULTY, json!({"slowdown": 1.0})).await {
        ctx.log.recover_s = Some(at);
    }
}

fn median_tpot_ms(f: &Finished<'_>, replica: &str, from: f64, to: f64) -> (Option<f64>, usize) {
    let xs: Vec<f64> = f
        .records
        .iter()
        .filter(|r| r.replica.as_deref() == Some(replica))
        .filter(|r| r.first_token_s.is_some_and(|t| t >= from) && r.end_s < to)
        .filter_map(|r| r.tpot_s())
        .map(|s| s * 1e3)
        .collect();
    (quantile(&xs, 0.5), xs.len())
}

/// Seconds after `from` until the replica's share over a 2-s window first fell to
/// `limit` or below (None = not before `to`).
fn adapted_after(f: &Finished<'_>, from: f64, to: f64, limit: f64) -> Option<f64> {
    let mut t = from;
    while t + 2.0 <= to {
        let (on, all) = share_in(f, FAULTY_NAME, t, t + 2.0);
        if all > 0 && (on as f64 / all as f64) <= limit {
            return Some(t - from);
        }
        t += 0.5;
    }
    None
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let (Some(fault), Some(recover)) = (f.log.fault_s, f.log.recover_s) else {
        return vec![Check::new(
            "slowdown applied and lifted",
            false,
            "it was not",
        )];
    };
    let warm = 0.5 * fault;
    let mut out = Vec::new();
    let (before, n_before) = median_tpot_ms(f, FAULTY_NAME, 0.0, fault);
    let (during, n_during) = median_tpot_ms(f, FAULTY_NAME, fault, recover);
    let fmt = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.2} ms"));
    out.push(Check::new(
        "the slowdown is visible to clients (r0 token time ≥ 2× before)",
        matches!((before, during), (Some(b), Some(d)) if d >= 2.0 * b),
        format!(
            "median wall TPOT on {FAULTY_NAME}: before {} ({n_before} streams), during {} ({n_during} streams)",
            fmt(before),
            fmt(during)
        ),
    ));
    let (on_b, all_b) = share_in(f, FAULTY_NAME, warm, fault);
    let (on_d, all_d) = share_in(f, FAULTY_NAME, f.log.settle_s, recover);
    let sb = on_b as f64 / all_b.max(1) as f64;
    let sd = on_d as f64 / all_d.max(1) as f64;
    let adapted = adapted_after(f, fault, recover, 0.5 * sb);
    out.push(Check::new(
        "the router routes around the slow replica (its share at most half of before)",
        all_b >= MIN_JUDGED && all_d >= MIN_JUDGED && on_b > 0 && sd <= 0.5 * sb,
        format!(
            "{FAULTY_NAME} served {on_b}/{all_b} = {:.1}% before the slowdown, {on_d}/{all_d} = {:.1}% from {LEARN_S} s after it to the recovery; its share over 2 s first fell to half {}",
            sb * 100.0,
            sd * 100.0,
            adapted.map_or("never before the recovery".to_string(), |t| format!("{t:.1} s after the slowdown"))
        ),
    ));
    let (on_a, all_a) = share_in(f, FAULTY_NAME, recover + RETURN_S, f.plan.load.duration_s);
    let sa = on_a as f64 / all_a.max(1) as f64;
    out.push(Check::new(
        "the recovered replica takes traffic again (share ≥ half of before)",
        all_a >= MIN_JUDGED && sa >= 0.5 * sb,
        format!(
            "{FAULTY_NAME} served {on_a}/{all_a} = {:.1}% from {RETURN_S} s after the recovery",
            sa * 100.0
        ),
    ));
    out
}
