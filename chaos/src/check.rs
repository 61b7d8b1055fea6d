//! Invariants, each a pass/fail [`Check`] with the numbers behind it.
//!
//! The checks here apply to every scenario: requests end within a bound, ends are
//! clean, output is never duplicated, requests after the fault settles succeed,
//! in-flight ledgers drain to zero, nothing crashed, nothing is left running.
//! Scenario-specific checks (ejection, membership, routing around a slow replica,
//! counted garbage) live with their scenarios and use the same type.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::client::{EndClass, Record};
use crate::cluster::StartedPid;

/// One invariant's verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub pass: bool,
    /// The numbers behind the verdict.
    pub detail: String,
}

impl Check {
    pub fn new(name: &str, pass: bool, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            pass,
            detail: detail.into(),
        }
    }
}

/// Fewest requests a window must hold for a success rate to be judged.
pub const MIN_JUDGED: usize = 10;

/// Count of records per end class.
pub fn class_counts(records: &[Record]) -> BTreeMap<EndClass, usize> {
    let mut m = BTreeMap::new();
    for r in records {
        *m.entry(r.class).or_insert(0) += 1;
    }
    m
}

fn counts_text(records: &[Record]) -> String {
    class_counts(records)
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={v}",
                serde_json::to_value(k)
                    .ok()
                    .and_then(|s| s.as_str().map(str::to_string))
                    .unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `q` quantile (0..1) of `xs` (nearest rank); None when empty.
pub fn quantile(xs: &[f64], q: f64) -> Option<f64> {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

/// Every request ended (any way) within `bound_s`: none hung.
pub fn ends_within_bound(records: &[Record], bound_s: f64) -> Check {
    let hung = records.iter().filter(|r| r.class == EndClass::Hung).count();
    let durations: Vec<f64> = records.iter().map(|r| r.end_s - r.sent_s).collect();
    let max = durations.iter().copied().fold(0.0, f64::max);
    let over = durations.iter().filter(|d| **d > bound_s + 0.5).count();
    Check::new(
        "every request ends within the bound (no hangs)",
        hung == 0 && over == 0 && !records.is_empty(),
        format!(
            "{} requests, hung {hung}, over {bound_s:.0} s {over}; duration p50 {:.3} s, p99 {:.3} s, max {max:.3} s",
            records.len(),
            quantile(&durations, 0.5).unwrap_or(0.0),
            quantile(&durations, 0.99).unwrap_or(0.0),
        ),
    )
}

/// Every request ended cleanly (a result, an OpenAI error JSON, or an SSE error event
/// then `[DONE]`), except those `excused` (e.g. streams through a router node that
/// was killed while they ran — no process can end those cleanly).
pub fn clean_ends(records: &[Record], excused: impl Fn(&Record) -> bool) -> Check {
    let mut unclean = 0;
    let mut excused_n = 0;
    let mut examples = Vec::new();
    for r in records.iter().filter(|r| !r.class.clean()) {
        if excused(r) {
            excused_n += 1;
            continue;
        }
        unclean += 1;
        if examples.len() < 3 {
            examples.push(format!(
                "#{} {:?} at {:.2} s on node {:?}/{:?}: {}",
                r.id,
                r.class,
                r.sent_s,
                r.node,
                r.replica,
                r.detail.as_deref().unwrap_or("-")
            ));
        }
    }
    let mut detail = format!("{}; unclean {unclean}", counts_text(records));
    if excused_n > 0 {
        detail.push_str(&format!(
            " (plus {excused_n} cut with the killed node, excused)"
        ));
    }
    if !examples.is_empty() {
        detail.push_str(&format!("; e.g. {}", examples.join(" | ")));
    }
    Check::new(
        "every end is clean (result, OpenAI error JSON, or SSE error + [DONE])",
        unclean == 0 && !records.is_empty(),
        detail,
    )
}

/// No response carried duplicated or spliced output, and every success was complete.
pub fn output_integrity(records: &[Record]) -> Check {
    let bad: Vec<&Record> = records
        .iter()
        .filter(|r| !r.violations.is_empty())
        .collect();
    let streams = records
        .iter()
        .filter(|r| r.facts.content_events > 0)
        .count();
    let tokens: u64 = records.iter().map(|r| u64::from(r.facts.tokens)).sum();
    let mut detail = format!(
        "{streams} streams with output, {tokens} tokens checked; {} responses violate",
        bad.len()
    );
    for r in bad.iter().take(3) {
        detail.push_str(&format!(
            "; #{} via {:?}: {}",
            r.id,
            r.replica,
            r.violations.join(", ")
        ));
    }
    Check::new(
        "no duplicated output (tokens ≤ max_tokens and usage, one id, one [DONE])",
        bad.is_empty() && streams > 0,
        detail,
    )
}

/// Every request the harness sends is valid, so a 4xx answer other than 429 (shed)
/// is the router refusing a request it should have served.
pub fn no_client_errors(records: &[Record]) -> Check {
    let bad: Vec<&Record> = records
        .iter()
        .filter(|r| {
            r.status
                .is_some_and(|s| (400..500).contains(&s) && s != 429)
        })
        .collect();
    let mut detail = format!("{} valid requests answered with a 4xx", bad.len());
    for r in bad.iter().take(3) {
        detail.push_str(&format!(
            "; #{} at {:.2} s via node {:?}: {}",
            r.id,
            r.sent_s,
            r.node,
            r.detail.as_deref().unwrap_or("-")
        ));
    }
    Check::new(
        "valid requests never get a 4xx (other than 429)",
        bad.is_empty(),
        detail,
    )
}

/// At least `min_rate` of requests sent in `[from_s, to_s)` succeeded.
pub fn success_after(records: &[Record], from_s: f64, to_s: f64, min_rate: f64) -> Check {
    // Requests whose client walked away on purpose have no outcome to judge.
    let window: Vec<&Record> = records
        .iter()
        .filter(|r| r.sent_s >= from_s && r.sent_s < to_s && r.class != EndClass::Abandoned)
        .collect();
    let ok = window.iter().filter(|r| r.class == EndClass::Ok).count();
    let n = window.len();
    let rate = if n == 0 { 0.0 } else { ok as f64 / n as f64 };
    let mut detail = format!(
        "{ok}/{n} = {:.1}% of requests sent in [{from_s:.1} s, {to_s:.1} s) succeeded (need ≥ {:.0}%, ≥ {MIN_JUDGED} requests)",
        rate * 100.0,
        min_rate * 100.0
    );
    if let Some(f) = window.iter().find(|r| r.class != EndClass::Ok) {
        detail.push_str(&format!(
            "; first failure #{} at {:.2} s: {:?} {}",
            f.id,
            f.sent_s,
            f.class,
            f.detail.as_deref().unwrap_or("")
        ));
    }
    Check::new(
        "requests after the fault settles succeed",
        n >= MIN_JUDGED && rate >= min_rate,
        detail,
    )
}

/// Per node: seconds after the load ended until its ledgers read zero.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Drain {
    /// (node id, seconds to zero or None, last own in-flight sum, last peer sum).
    pub nodes: Vec<(String, Option<f64>, f64, f64)>,
    pub bound_s: f64,
}

/// Every live node's in-flight ledgers (own and peers') returned to zero.
pub fn ledgers_drain(d: &Drain) -> Check {
    let pass = !d.nodes.is_empty() && d.nodes.iter().all(|n| n.1.is_some());
    let detail = d
        .nodes
        .iter()
        .map(|(id, t, own, peer)| match t {
            Some(t) => format!("{id}: zero {t:.2} s after the load"),
            None => format!(
                "{id}: NOT zero after {:.0} s (own in-flight {own}, peers' {peer})",
                d.bound_s
            ),
        })
        .collect::<Vec<_>>()
        .join("; ");
    Check::new(
        "in-flight ledgers return to zero after the load (/debug/replicas)",
        pass,
        detail,
    )
}

/// No process the scenario did not kill exited on its own.
pub fn no_crash(crashed: &[String]) -> Check {
    Check::new(
        "no process crashed",
        crashed.is_empty(),
        if crashed.is_empty() {
            "every router and replica not killed on purpose was still running".to_string()
        } else {
            crashed.join("; ")
        },
    )
}

/// Every pid the scenario started is gone after teardown.
pub fn no_leftovers(started: &[StartedPid], left: &[StartedPid]) -> Check {
    Check::new(
        "no process left behind",
        left.is_empty(),
        if left.is_empty() {
            format!("{} processes started, all gone", started.len())
        } else {
            format!(
                "still running: {}",
                left.iter()
                    .map(|p| format!("{} (pid {})", p.label, p.pid))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    )
}

/// A bounded duration check: `what` took `took` (None = never), at most `bound_s`.
pub fn within(name: &str, what: &str, took: Option<f64>, bound_s: f64) -> Check {
    match took {
        Some(t) => Check::new(
            name,
            t <= bound_s,
            format!("{what} after {t:.2} s (bound {bound_s:.1} s)"),
        ),
        None => Check::new(
            name,
            false,
            format!("{what}: never observed (bound {bound_s:.1} s)"),
        ),
    }
}
