//! Reports: summaries of runs, SLO capacity search, and the files (`report.md`,
//! `report.json`, SVG plots) that compare policies side by side.

pub mod quantile;
