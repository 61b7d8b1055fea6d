//! Reports: summaries of runs, SLO capacity search, and the files (`report.md`,
//! `report.json`, SVG plots) that compare policies side by side.

pub mod quantile;
pub mod regions;
pub mod summary;

pub use summary::RunSummary;
pub mod capacity;

pub use capacity::{Capacity, CapacitySearch, CapacityStatus, Probe};
mod document;
mod json;
mod markdown;
mod plot;

pub use document::{PolicyReport, Report, ReportError, ReportFiles, write_report};
