//! The report of one comparison: a policy per entry, each with its summary, its
//! capacity search (if run) and the run the plots are drawn from; written as
//! `report.md`, `report.json` and SVG plots into one directory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::capacity::{Capacity, CapacityStatus};
use super::summary::RunSummary;
use super::{json, markdown, plot};
use crate::sim::result::RunResult;

/// One policy's results.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyReport {
    pub name: String,
    pub summary: RunSummary,
    pub capacity: Option<Capacity>,
    /// The run summarised and plotted (normally at the nominal rate scale).
    pub run: RunResult,
}

impl PolicyReport {
    /// Named after `run.policy`.
    pub fn new(run: RunResult, capacity: Option<Capacity>) -> Self {
        PolicyReport {
            name: run.policy.clone(),
            summary: RunSummary::of(&run),
            capacity,
            run,
        }
    }
}

/// A side-by-side comparison of policies on one workload.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub title: String,
    /// Run settings shown verbatim (workload spec, fleet, seed, …).
    pub settings: BTreeMap<String, String>,
    pub policies: Vec<PolicyReport>,
}

/// What [`write_report`] wrote.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReportFiles {
    pub markdown: PathBuf,
    pub json: PathBuf,
    pub plots: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: drawing failed: {message}")]
    Plot { path: PathBuf, message: String },
    #[error("report.json: {0}")]
    Json(#[from] serde_json::Error),
}

/// Writes `report.md`, `report.json` and the plots into `dir` (created if needed).
/// Plot files: `attainment_vs_rate.svg` (policies with a capacity search),
/// `ttft_forecast_<policy>.svg` (policies with TTFT predictions), `load_<policy>.svg`
/// (policies with load samples).
pub fn write_report(dir: impl AsRef<Path>, report: &Report) -> Result<ReportFiles, ReportError> {
    let dir = dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| ReportError::Io {
        path: dir.to_path_buf(),
        source: e,
    })?;
    let slugs = slugs(report);
    let mut plots = Vec::new();
    if report.policies.iter().any(|p| p.capacity.is_some()) {
        let path = dir.join("attainment_vs_rate.svg");
        plot::attainment_vs_rate(&path, report)?;
        plots.push(path);
    }
    for (p, slug) in report.policies.iter().zip(&slugs) {
        if p.run
            .records
            .iter()
            .any(|r| r.predicted_ttft_ms.is_some() && r.ttft_s.is_some())
        {
            let path = dir.join(format!("ttft_forecast_{slug}.svg"));
            plot::ttft_forecast(&path, p)?;
            plots.push(path);
        }
    }
    for (p, slug) in report.policies.iter().zip(&slugs) {
        if p.run.load.iter().any(|s| !s.inflight.is_empty()) {
            let path = dir.join(format!("load_{slug}.svg"));
            plot::load_over_time(&path, p)?;
            plots.push(path);
        }
    }
    let names: Vec<String> = plots
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let write = |name: &str, text: String| -> Result<PathBuf, ReportError> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| ReportError::Io {
            path: path.clone(),
            source: e,
        })?;
        Ok(path)
    };
    let markdown = write("report.md", markdown::render(report, &names))?;
    let json = write("report.json", json::render(report, &names)?)?;
    Ok(ReportFiles {
        markdown,
        json,
        plots,
    })
}

/// File-name-safe, unique policy names.
fn slugs(report: &Report) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    report
        .policies
        .iter()
        .map(|p| {
            let mut s: String = p
                .name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() {
                        c.to_ascii_lowercase()
                    } else {
                        '-'
                    }
                })
                .collect();
            if s.is_empty() {
                s = "policy".into();
            }
            let n = seen.entry(s.clone()).or_insert(0);
            *n += 1;
            if *n > 1 { format!("{s}-{n}") } else { s }
        })
        .collect()
}

/// Short word for a capacity status in tables.
pub(crate) fn status_word(s: CapacityStatus) -> &'static str {
    match s {
        CapacityStatus::Converged => "",
        CapacityStatus::RunLimit => " (run limit)",
        CapacityStatus::AllFailed => " (none passed)",
        CapacityStatus::NeverFailed => " (≥, never failed)",
        CapacityStatus::NonMonotone => " (non-monotone)",
    }
}
