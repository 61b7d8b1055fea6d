//! `report.md`: the tables a reader compares policies by, then the settings, the
//! capacity probes and the plots.

use std::fmt::Write;

use super::document::{Report, status_word};
use super::quantile::Percentiles;

fn f(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        Some(x) => format!("{x}"),
        None => "–".into(),
    }
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

fn pcts(q: Option<Percentiles>, digits: usize) -> String {
    match q {
        Some(q) => format!(
            "{} / {} / {}",
            f(Some(q.p50), digits),
            f(Some(q.p95), digits),
            f(Some(q.p99), digits)
        ),
        None => "–".into(),
    }
}

fn esc(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

pub(crate) fn render(report: &Report, plots: &[String]) -> String {
    let mut md = String::new();
    let title = if report.title.is_empty() {
        "Headroom benchmark report"
    } else {
        &report.title
    };
    let _ = writeln!(md, "# {}\n", esc(title));
    if report.policies.is_empty() {
        let _ = writeln!(md, "No policies were run.\n");
    }

    let _ = writeln!(md, "## SLO attainment and latency\n");
    let _ = writeln!(
        md,
        "SLO capacity: highest rate scale (and offered req/s) with attainment ≥ target. \
         Attainment counts rejected requests as misses. Latencies in ms, p50 / p95 / p99.\n"
    );
    let _ = writeln!(
        md,
        "| policy | SLO capacity | attainment | TTFT met | TPOT met | goodput (req/s) | TTFT ms | TPOT ms | rejected | cache hits |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    for p in &report.policies {
        let s = &p.summary;
        let cap = match &p.capacity {
            Some(c) => format!(
                "{:.3}× ({:.2} req/s){}",
                c.capacity,
                c.capacity_rps,
                status_word(c.status)
            ),
            None => "–".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} |",
            esc(&p.name),
            cap,
            pct(s.attainment),
            pct(s.ttft_attainment),
            pct(s.tpot_attainment),
            s.goodput_rps,
            pcts(s.ttft_ms, 0),
            pcts(s.tpot_ms, 1),
            pct(s.rejected_share),
            pct(s.cache_hit_share),
        );
    }

    if report
        .policies
        .iter()
        .any(|p| p.summary.disaggregated_share > 0.0)
    {
        let _ = writeln!(
            md,
            "\nPrefill/decode: share of served requests disaggregated.\n"
        );
        let _ = writeln!(md, "| policy | disaggregated |\n|---|---|");
        for p in &report.policies {
            let _ = writeln!(
                md,
                "| {} | {} |",
                esc(&p.name),
                pct(p.summary.disaggregated_share)
            );
        }
    }

    let _ = writeln!(md, "\n## Forecast quality\n");
    let _ = writeln!(
        md,
        "MAPE / MdAPE in percent; absolute error p50 / p95 in ms; coverage = share of \
         requests with actual ≤ predicted upper bound (n = requests with both). The first \
         10% of arrivals (the predictor's warm-up) are excluded. Predictions are those the \
         node's predictor issued at dispatch, whatever the policy; TTFT counts from arrival.\n"
    );
    let _ = writeln!(
        md,
        "| policy | TTFT MAPE | TTFT MdAPE | TTFT abs err p50 / p95 | TTFT coverage | TPOT MAPE | TPOT MdAPE | TPOT abs err p50 / p95 | TPOT coverage |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for p in &report.policies {
        let s = &p.summary;
        let cols = |q: &Option<super::summary::ForecastQuality>, d: usize| match q {
            Some(q) => format!(
                "{:.1} | {:.1} | {} / {} | {}",
                q.mape_pct,
                q.mdape_pct,
                f(Some(q.abs_err_p50_ms), d),
                f(Some(q.abs_err_p95_ms), d),
                q.coverage.map_or("–".into(), |c| format!(
                    "{} (n={})",
                    pct(c),
                    q.bound_samples
                )),
            ),
            None => "– | – | – | –".into(),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            esc(&p.name),
            cols(&s.ttft_forecast, 0),
            cols(&s.tpot_forecast, 1)
        );
    }

    let _ = writeln!(md, "\n## Decision cost and load balance\n");
    let _ = writeln!(
        md,
        "Decision time in µs: wall clock around the real decision code (candidates, prefix \
         match, policy) per routing decision, so a busy machine's preemptions show in the \
         tail. Load CV: coefficient of \
         variation of in-flight requests across replicas, over load samples with any load. \
         Replica share: placed requests per replica, min – max.\n"
    );
    let _ = writeln!(
        md,
        "| policy | decision p50 µs | decision p99 µs | load CV mean | load CV p95 | replica share | fallbacks |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for p in &report.policies {
        let s = &p.summary;
        let shares = &s.load.replica_share;
        let range = if shares.is_empty() {
            "–".into()
        } else {
            let lo = shares.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = shares.iter().copied().fold(0.0, f64::max);
            format!("{} – {}", pct(lo), pct(hi))
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} |",
            esc(&p.name),
            f(s.decision_us.map(|q| q.p50), 1),
            f(s.decision_us.map(|q| q.p99), 1),
            f(s.load.cv_mean, 3),
            f(s.load.cv_p95, 3),
            range,
            fallbacks(s),
        );
    }

    if report
        .policies
        .iter()
        .any(|p| p.summary.tenants.len() > 1 || !p.summary.tenants.contains_key("-"))
    {
        let _ = writeln!(md, "\n## Per tenant\n");
        let _ = writeln!(
            md,
            "| policy | tenant | requests | attainment | TTFT met | TPOT met | TTFT p95 ms |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for p in &report.policies {
            for (t, s) in &p.summary.tenants {
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    esc(&p.name),
                    esc(t),
                    s.requests,
                    pct(s.attainment),
                    pct(s.ttft_attainment),
                    pct(s.tpot_attainment),
                    f(s.ttft_p95_ms, 0),
                );
            }
        }
    }

    let _ = writeln!(md, "\n## Settings\n");
    if !report.settings.is_empty() {
        let _ = writeln!(md, "| setting | value |\n|---|---|");
        for (k, v) in &report.settings {
            let _ = writeln!(md, "| {} | {} |", esc(k), esc(v));
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(
        md,
        "| policy | workload | rate scale | seed | routers | replicas | requests | simulated s |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for p in &report.policies {
        let r = &p.run;
        let mut profiles: Vec<&str> = r.replicas.iter().map(|x| x.profile.as_str()).collect();
        profiles.sort_unstable();
        profiles.dedup();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} ({}) | {} | {:.1} |",
            esc(&p.name),
            esc(&r.workload),
            r.rate_scale,
            r.seed,
            r.routers,
            r.replicas.len(),
            esc(&profiles.join(", ")),
            r.records.len(),
            r.sim_duration_s,
        );
    }

    if report.policies.iter().any(|p| p.capacity.is_some()) {
        let _ = writeln!(md, "\n## Capacity probes\n");
        let _ = writeln!(
            md,
            "| policy | rate scale | offered req/s | attainment | passed | TTFT p95 ms | TPOT p95 ms |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|");
        for p in &report.policies {
            let Some(c) = &p.capacity else { continue };
            for q in c.curve() {
                let _ = writeln!(
                    md,
                    "| {} | {:.4} | {:.2} | {} | {} | {} | {} |",
                    esc(&p.name),
                    q.rate_scale,
                    q.offered_rps,
                    pct(q.attainment),
                    if q.passed { "yes" } else { "no" },
                    f(q.ttft_p95_ms, 0),
                    f(q.tpot_p95_ms, 1),
                );
            }
        }
    }

    if !plots.is_empty() {
        let _ = writeln!(md, "\n## Plots\n");
        for p in plots {
            let _ = writeln!(md, "![{p}]({p})\n");
        }
    }
    md
}

/// The fallback share, and by label where there is more than nothing.
fn fallbacks(s: &super::summary::RunSummary) -> String {
    if s.fallback_by.is_empty() {
        return pct(s.fallback_share);
    }
    let by: Vec<String> = s
        .fallback_by
        .iter()
        .map(|(k, v)| format!("{} {}", esc(k), pct(*v)))
        .collect();
    format!("{} ({})", pct(s.fallback_share), by.join(", "))
}
