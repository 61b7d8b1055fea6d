//! Clients walk away from a third of their streams midway (they close the connection
//! after a random number of tokens, up to half of what they asked for).
//!
//! Expected: the router closes each abandoned request out exactly once (counted as
//! cancelled, its booking released) and closes the upstream connection, so the
//! replica aborts the generation: the replicas generate few tokens nobody reads, after
//! the load every replica's engine is empty again and every ledger reads zero.

use std::time::Duration;

use super::common::base_plan;
use crate::check::{self, Check};
use crate::client::EndClass;
use crate::http::{counter_sum, get_text};
use crate::scenario::{Ctx, Finished, Plan, RunOptions};

pub const ABOUT: &str =
    "clients abandon a third of their streams midway; the router must release them upstream";

/// Share of streams abandoned while the fault lasts.
const SHARE: f64 = 1.0 / 3.0;
/// Bound for every replica's engine to be empty after the load (s).
const EMPTY_BOUND_S: f64 = 5.0;

pub fn plan(o: &RunOptions) -> Plan {
    let mut p = base_plan(o, 1);
    p.load.abandon_share = SHARE;
    p.load.abandon_window = (p.fault_s, p.recover_s);
    p
}

pub async fn inject(ctx: &mut Ctx<'_>) {
    let (from, to) = (ctx.plan.fault_s, ctx.plan.recover_s);
    ctx.at(from).await;
    ctx.note("clients start abandoning streams");
    ctx.log.fault_s = Some(from);
    ctx.log.settle_s = from;
    ctx.at(to).await;
    ctx.note("clients stop abandoning streams");
    ctx.log.recover_s = Some(to);
}

/// Running plus waiting requests and generated tokens so far, as an emulator reports
/// them (None if unreadable).
async fn engine_load(ctx: &Ctx<'_>, addr: std::net::SocketAddr) -> Option<(f64, f64)> {
    let text = get_text(
        &ctx.cluster.client,
        &format!("http://{addr}/metrics"),
        Duration::from_secs(1),
    )
    .await
    .ok()?;
    Some((
        counter_sum(&text, "vllm:num_requests_running", None)
            + counter_sum(&text, "vllm:num_requests_waiting", None),
        counter_sum(&text, "vllm:generation_tokens_total", None),
    ))
}

pub async fn after_load(ctx: &mut Ctx<'_>) {
    let start = ctx.now_s();
    let addrs: Vec<(String, std::net::SocketAddr)> = ctx
        .cluster
        .replicas
        .iter()
        .map(|r| (r.name.clone(), r.addr))
        .collect();
    let mut last = Vec::new();
    let took = loop {
        last.clear();
        for (name, addr) in &addrs {
            last.push((name.clone(), engine_load(ctx, *addr).await));
        }
        if last.iter().all(|(_, l)| l.is_some_and(|(q, _)| q == 0.0)) {
            break Some(ctx.now_s() - start);
        }
        if ctx.now_s() - start > EMPTY_BOUND_S {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut c = check::within(
        "every replica's engine is empty after the load (abandoned generations aborted)",
        "running + waiting = 0 on every replica",
        took,
        EMPTY_BOUND_S,
    );
    c.detail = format!(
        "{} ({})",
        c.detail,
        last.iter()
            .map(|(n, l)| format!(
                "{n}: {}",
                l.map_or("unreadable".into(), |v| v.0.to_string())
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    ctx.log.checks.push(c);
    if last.iter().all(|(_, l)| l.is_some()) {
        let generated: f64 = last.iter().filter_map(|(_, l)| l.map(|v| v.1)).sum();
        ctx.log.numbers.insert("generated_tokens".into(), generated);
    }
}

pub fn checks(f: &Finished<'_>) -> Vec<Check> {
    let quit: Vec<_> = f
        .records
        .iter()
        .filter(|r| r.class == EndClass::Abandoned)
        .collect();
    let abandoned = quit.len();
    // Tokens clients read: streamed content, or a whole answer's usage.
    let delivered: f64 = f
        .records
        .iter()
        .map(|r| {
            f64::from(
                r.facts
                    .usage_tokens
                    .filter(|_| r.facts.content_events == 0)
                    .unwrap_or(r.facts.tokens),
            )
        })
        .sum();
    let unread_if_kept: f64 = quit
        .iter()
        .map(|r| f64::from(r.max_tokens.saturating_sub(r.facts.tokens)))
        .sum();
    let generated = f.log.numbers.get("generated_tokens").copied();
    let waste = generated.map(|g| g - delivered);
    let mut out = Vec::new();
    out.push(Check::new(
        "abandoned generations are aborted (unread tokens ≤ 25% of what running them out would waste)",
        abandoned > 0 && waste.is_some_and(|w| w <= 0.25 * unread_if_kept),
        format!(
            "replicas generated {} tokens, clients read {delivered}; {} unread, against {unread_if_kept} had the {abandoned} abandoned streams run to max_tokens",
            generated.map_or("?".into(), |g| g.to_string()),
            waste.map_or("?".into(), |w| w.to_string()),
        ),
    ));
    let m = f.metrics.first().cloned().flatten().unwrap_or_default();
    let cancelled = counter_sum(&m, "headroom_requests_total", Some(("status", "cancelled")));
    out.push(Check::new(
        "each abandoned stream is closed out once, as cancelled",
        abandoned > 0 && cancelled == abandoned as f64,
        format!(
            "{abandoned} streams abandoned by clients; the router counted {cancelled} cancelled"
        ),
    ));
    out
}
