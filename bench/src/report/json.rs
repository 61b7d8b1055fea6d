//! `report.json`: per policy the headline figures as flat keys (`slo_capacity`,
//! `attainment`, `ttft_p95_ms`, `tpot_p95_ms`, …, `null` where not measured), plus
//! the full summary and capacity probes, plus settings and plot file names.

use std::collections::BTreeMap;

use serde::Serialize;

use super::capacity::{Capacity, CapacityStatus};
use super::document::Report;
use super::summary::RunSummary;

#[derive(Serialize)]
struct ReportJson<'a> {
    title: &'a str,
    settings: &'a BTreeMap<String, String>,
    policies: BTreeMap<String, PolicyJson<'a>>,
    plots: &'a [String],
}

#[derive(Serialize)]
struct PolicyJson<'a> {
    slo_capacity: Option<f64>,
    slo_capacity_rps: Option<f64>,
    capacity_status: Option<CapacityStatus>,
    attainment: f64,
    ttft_attainment: f64,
    tpot_attainment: f64,
    goodput_rps: f64,
    ttft_p50_ms: Option<f64>,
    ttft_p95_ms: Option<f64>,
    ttft_p99_ms: Option<f64>,
    tpot_p50_ms: Option<f64>,
    tpot_p95_ms: Option<f64>,
    tpot_p99_ms: Option<f64>,
    ttft_mape_pct: Option<f64>,
    ttft_coverage: Option<f64>,
    tpot_mape_pct: Option<f64>,
    tpot_coverage: Option<f64>,
    decision_p50_us: Option<f64>,
    decision_p99_us: Option<f64>,
    load_cv_mean: Option<f64>,
    load_cv_p95: Option<f64>,
    rejected_share: f64,
    cache_hit_share: f64,
    requests: usize,
    summary: &'a RunSummary,
    capacity: Option<&'a Capacity>,
}

pub(crate) fn render(report: &Report, plots: &[String]) -> Result<String, serde_json::Error> {
    let mut policies = BTreeMap::new();
    for (key, p) in unique_names(report).into_iter().zip(&report.policies) {
        {
            let s = &p.summary;
            let j = PolicyJson {
                slo_capacity: p.capacity.as_ref().map(|c| c.capacity),
                slo_capacity_rps: p.capacity.as_ref().map(|c| c.capacity_rps),
                capacity_status: p.capacity.as_ref().map(|c| c.status),
                attainment: s.attainment,
                ttft_attainment: s.ttft_attainment,
                tpot_attainment: s.tpot_attainment,
                goodput_rps: s.goodput_rps,
                ttft_p50_ms: s.ttft_ms.map(|q| q.p50),
                ttft_p95_ms: s.ttft_ms.map(|q| q.p95),
                ttft_p99_ms: s.ttft_ms.map(|q| q.p99),
                tpot_p50_ms: s.tpot_ms.map(|q| q.p50),
                tpot_p95_ms: s.tpot_ms.map(|q| q.p95),
                tpot_p99_ms: s.tpot_ms.map(|q| q.p99),
                ttft_mape_pct: s.ttft_forecast.as_ref().map(|f| f.mape_pct),
                ttft_coverage: s.ttft_forecast.as_ref().and_then(|f| f.coverage),
                tpot_mape_pct: s.tpot_forecast.as_ref().map(|f| f.mape_pct),
                tpot_coverage: s.tpot_forecast.as_ref().and_then(|f| f.coverage),
                decision_p50_us: s.decision_us.map(|q| q.p50),
                decision_p99_us: s.decision_us.map(|q| q.p99),
                load_cv_mean: s.load.cv_mean,
                load_cv_p95: s.load.cv_p95,
                rejected_share: s.rejected_share,
                cache_hit_share: s.cache_hit_share,
                requests: s.requests,
                summary: s,
                capacity: p.capacity.as_ref(),
            };
            policies.insert(key, j);
        }
    }
    serde_json::to_string_pretty(&ReportJson {
        title: &report.title,
        settings: &report.settings,
        policies,
        plots,
    })
}

/// Policy names, with `#2`, `#3`… appended to repeats so no entry is lost.
pub(crate) fn unique_names(report: &Report) -> Vec<String> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    report
        .policies
        .iter()
        .map(|p| {
            let n = seen.entry(p.name.as_str()).or_insert(0);
            *n += 1;
            if *n > 1 {
                format!("{}#{n}", p.name)
            } else {
                p.name.clone()
            }
        })
        .collect()
}
