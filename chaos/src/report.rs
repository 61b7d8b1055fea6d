//! A run's summary: `report.json` (everything, machine-readable) and `report.md`
//! (per scenario: verdict, checks with their numbers, outcome counts, timeline).

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use crate::ChaosError;
use crate::router_config::RouterTimings;
use crate::scenario::ScenarioReport;

/// One `headroom-chaos run`.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Unix seconds at the start.
    pub started_unix_s: u64,
    pub duration_s: f64,
    pub seed: u64,
    pub time_scale: f64,
    pub wall_s: f64,
    pub pass: bool,
    pub scenarios: Vec<ScenarioReport>,
}

impl RunReport {
    pub fn failed_checks(&self) -> usize {
        self.scenarios
            .iter()
            .map(|s| s.checks.iter().filter(|c| !c.pass).count() + usize::from(s.error.is_some()))
            .sum()
    }
}

/// Writes `report.json` and `report.md` into `dir` (created).
pub fn write(dir: &Path, r: &RunReport) -> Result<(), ChaosError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| ChaosError::io(format!("creating {}", dir.display()), e))?;
    let json = serde_json::to_string_pretty(r)?;
    std::fs::write(dir.join("report.json"), json)
        .map_err(|e| ChaosError::io("writing report.json", e))?;
    std::fs::write(dir.join("report.md"), markdown(r))
        .map_err(|e| ChaosError::io("writing report.md", e))?;
    Ok(())
}

fn verdict(pass: bool) -> &'static str {
    if pass { "PASS" } else { "**FAIL**" }
}

/// The Markdown summary.
pub fn markdown(r: &RunReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# headroom-chaos run\n");
    let _ = writeln!(
        s,
        "Verdict: {} — {} scenarios, {} failed checks; {:.0} s of load each, seed {}, emulator time scale {}, wall {:.1} s.\n",
        verdict(r.pass),
        r.scenarios.len(),
        r.failed_checks(),
        r.duration_s,
        r.seed,
        r.time_scale,
        r.wall_s
    );
    let _ = writeln!(
        s,
        "| scenario | verdict | checks passed | requests sent / answered whole | outcomes | e2e p50 / p99 (s) | wall (s) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for sc in &r.scenarios {
        let passed = sc.checks.iter().filter(|c| c.pass).count();
        let outcomes = sc
            .outcomes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            s,
            "| {} | {} | {passed}/{} | {} / {} | {outcomes} | {} / {} | {:.1} |",
            sc.name,
            verdict(sc.pass),
            sc.checks.len(),
            sc.requests,
            sc.answered,
            fmt_opt(sc.e2e_p50_s),
            fmt_opt(sc.e2e_p99_s),
            sc.wall_s
        );
    }
    let _ = writeln!(s);
    let failing: Vec<(&str, &str, &str)> = r
        .scenarios
        .iter()
        .flat_map(|sc| {
            sc.checks
                .iter()
                .filter(|c| !c.pass)
                .map(move |c| (sc.name.as_str(), c.name.as_str(), c.detail.as_str()))
        })
        .collect();
    if !failing.is_empty() {
        let _ = writeln!(s, "## Failing checks\n");
        for (sc, name, detail) in failing {
            let _ = writeln!(s, "- **{sc}** — {name}: {detail}");
        }
        let _ = writeln!(s);
    }
    if let Some(t) = r
        .scenarios
        .iter()
        .find_map(|sc| sc.plan.as_ref().map(|p| &p.cluster.timings))
    {
        timings(&mut s, t);
    }
    for sc in &r.scenarios {
        scenario(&mut s, sc);
    }
    s
}

fn fmt_opt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.3}"))
}

fn timings(s: &mut String, t: &RouterTimings) {
    let _ = writeln!(
        s,
        "Router timings (every node): probe every {} ms (timeout {} ms), eject after {} failures, backoff {}–{} ms; first-byte timeout {} ms, idle timeout {} ms, {} retries; scrape every {} ms. Ejection bound {:.2} s, re-admission bound {:.2} s.\n",
        t.probe_interval_ms,
        t.probe_timeout_ms,
        t.eject_after_failures,
        t.backoff_initial_ms,
        t.backoff_max_ms,
        t.first_byte_timeout_ms,
        t.idle_timeout_ms,
        t.retries,
        t.scrape_interval_ms,
        t.ejection_bound_s(),
        t.readmission_bound_s()
    );
}

fn scenario(s: &mut String, sc: &ScenarioReport) {
    let _ = writeln!(s, "## {} — {}\n", sc.name, verdict(sc.pass));
    let _ = writeln!(s, "{}.\n", sc.about);
    if let Some(e) = &sc.error {
        let _ = writeln!(s, "Setup failed: {e}\n");
        return;
    }
    if let Some(p) = &sc.plan {
        let _ = writeln!(
            s,
            "{} replicas ({}), {} router node(s), policy `{}`; load {:.0} req/s for {:.0} s, max_tokens {}–{}; fault at {:.1} s{}. Logs: `{}`.\n",
            p.cluster.replica_profiles.len(),
            p.cluster.replica_profiles.join(", "),
            p.cluster.routers,
            p.cluster.policy,
            p.load.rate_per_s,
            p.load.duration_s,
            p.load.max_tokens.0,
            p.load.max_tokens.1,
            sc.fault.fault_s.unwrap_or(p.fault_s),
            sc.fault
                .recover_s
                .map_or(String::new(), |t| format!(", lifted at {t:.1} s")),
            sc.log_dir
        );
    }
    let _ = writeln!(s, "| check | verdict | numbers |");
    let _ = writeln!(s, "|---|---|---|");
    for c in &sc.checks {
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            c.name,
            verdict(c.pass),
            c.detail.replace('|', "/")
        );
    }
    let served = sc
        .served_by
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ");
    let _ = writeln!(
        s,
        "\nRequests {} (served by: {served}); max send lag {:.3} s.\n",
        sc.requests, sc.max_send_lag_s
    );
    if !sc.fault.numbers.is_empty() {
        let nums = sc
            .fault
            .numbers
            .iter()
            .map(|(k, v)| format!("{k} = {v:.2}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(s, "Measured: {nums}.\n");
    }
    let _ = writeln!(s, "Timeline:\n");
    for e in &sc.timeline {
        let _ = writeln!(s, "- {:7.2} s  {}", e.t_s, e.what);
    }
    let _ = writeln!(s);
}
