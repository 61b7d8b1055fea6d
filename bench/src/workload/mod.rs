//! Workloads: what arrives, when, with which prefix structure and objectives.
//!
//! One in-memory form ([`Workload`]) for every source — the Mooncake-style JSON lines
//! of `DESIGN.md`, the Azure CSV traces, and the generators — so the simulator and the
//! live load generator replay exactly the same requests.
//!
//! Invariants of every [`Workload`] built here: requests are sorted by arrival (ties
//! keep their source order), `id` is the position, and arrivals read from a trace are
//! relative to its first request (so the first arrives at 0 s). Generated workloads keep
//! their own clock (an incident that starts at 60 s starts at 60 s).
//!
//! Entry points: [`Workload::load`] (file by extension), [`Workload::from_spec`] (file
//! or generator spec, for `--workload`), [`SloRule`] (objectives where missing),
//! [`Workload::summary`], and the generators in [`generator`].

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;

pub mod azure;
pub mod dist;
mod error;
pub mod generator;
pub mod jsonl;
pub mod slo;
pub mod spec;
pub mod summary;

pub use dist::LengthDist;
pub use error::WorkloadError;
pub use generator::{Arrivals, GenSpec, Incident, Stream, TenantSpec};
pub use slo::{SloClass, SloRule};
pub use summary::WorkloadSummary;

/// One request of a workload.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    /// Position in the workload (0-based, unique).
    pub id: u64,
    /// Arrival time in seconds from the workload's start.
    pub arrival_s: f64,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Prefix-block ids: equal ids at equal positions are the same content. Empty
    /// means the prompt shares nothing with any other.
    pub hash_ids: Vec<u64>,
    /// Tokens per hash id (512 for Mooncake).
    pub block_tokens: u32,
    pub tenant: Option<String>,
    pub slo_ttft_ms: Option<f64>,
    pub slo_tpot_ms: Option<f64>,
}

/// A named, time-ordered list of requests.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    pub name: String,
    pub requests: Vec<Request>,
}

impl Workload {
    /// Same requests with arrivals compressed by `rate_scale` (2.0 = twice the rate).
    pub fn scaled(&self, rate_scale: f64) -> Workload {
        let k = if rate_scale.is_finite() && rate_scale > 0.0 {
            rate_scale
        } else {
            1.0
        };
        Workload {
            name: self.name.clone(),
            requests: self
                .requests
                .iter()
                .map(|r| Request {
                    arrival_s: r.arrival_s / k,
                    ..r.clone()
                })
                .collect(),
        }
    }

    /// Seconds from the first to the last arrival.
    pub fn duration_s(&self) -> f64 {
        match (self.requests.first(), self.requests.last()) {
            (Some(a), Some(b)) => b.arrival_s - a.arrival_s,
            _ => 0.0,
        }
    }

    /// Requests in any order → a workload obeying the module invariants, with arrivals
    /// made relative to the earliest one.
    pub fn from_requests(name: impl Into<String>, mut requests: Vec<Request>) -> Workload {
        requests.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
        let t0 = requests.first().map_or(0.0, |r| r.arrival_s);
        for (i, r) in requests.iter_mut().enumerate() {
            r.id = i as u64;
            r.arrival_s -= t0;
        }
        Workload {
            name: name.into(),
            requests,
        }
    }

    /// Reads a trace file: `.jsonl`/`.json` as JSON lines, `.csv` as the Azure CSV.
    /// The workload is named after the file stem.
    pub fn load(path: impl AsRef<Path>) -> Result<Workload, WorkloadError> {
        let path = path.as_ref();
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let reader = || -> Result<BufReader<File>, WorkloadError> {
            File::open(path)
                .map(BufReader::new)
                .map_err(|e| WorkloadError::Io {
                    path: path.to_path_buf(),
                    source: e,
                })
        };
        let requests = match ext.as_deref() {
            Some("jsonl" | "json") => jsonl::read(reader()?, path)?,
            Some("csv") => azure::read(reader()?, path)?,
            _ => {
                return Err(WorkloadError::UnknownFormat {
                    path: path.to_path_buf(),
                });
            }
        };
        if requests.is_empty() {
            return Err(WorkloadError::Empty {
                path: path.to_path_buf(),
            });
        }
        let name = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        Ok(Workload::from_requests(name, requests))
    }

    /// `--workload FILE|GENERATOR-SPEC`: an existing file is read; otherwise a spec such
    /// as `poisson:rate=20,duration=300` is generated (see [`spec`]).
    pub fn from_spec(text: &str) -> Result<Workload, WorkloadError> {
        let path = Path::new(text);
        if path.is_file() || !spec::is_generator(text) {
            return Workload::load(path);
        }
        Ok(spec::parse(text)?.generate())
    }

    /// Writes the JSON-lines form that [`Workload::load`] reads back.
    pub fn write_jsonl(&self, path: impl AsRef<Path>) -> Result<(), WorkloadError> {
        let path = path.as_ref();
        let io = |e: std::io::Error| WorkloadError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        jsonl::write(&self.requests, &mut out).map_err(io)?;
        out.flush().map_err(io)
    }

    /// The first `n` requests.
    pub fn head(&self, n: usize) -> Workload {
        Workload {
            name: self.name.clone(),
            requests: self.requests.iter().take(n).cloned().collect(),
        }
    }

    /// Requests arriving in `[start_s, end_s)`, re-timed so `start_s` becomes 0 (gaps
    /// at the window's start are kept) and re-numbered from 0.
    pub fn window(&self, start_s: f64, end_s: f64) -> Workload {
        let requests = self
            .requests
            .iter()
            .filter(|r| r.arrival_s >= start_s && r.arrival_s < end_s)
            .enumerate()
            .map(|(i, r)| Request {
                id: i as u64,
                arrival_s: r.arrival_s - start_s,
                ..r.clone()
            })
            .collect();
        Workload {
            name: self.name.clone(),
            requests,
        }
    }

    /// Fills missing objectives with `rule` (see [`SloRule::apply`]).
    pub fn with_slo(mut self, rule: &SloRule) -> Workload {
        rule.apply(&mut self);
        self
    }

    /// Gives every request without `hash_ids` (Azure rows) fresh ids of its own that
    /// cover its prompt, numbered above every id in use, so an engine model that needs
    /// block ids can run it; such prompts still share nothing.
    pub fn with_unique_hash_ids(mut self) -> Workload {
        let mut next = self
            .requests
            .iter()
            .flat_map(|r| r.hash_ids.iter().copied())
            .max()
            .map_or(0, |m| m.saturating_add(1));
        for r in self.requests.iter_mut().filter(|r| r.hash_ids.is_empty()) {
            let n = r.input_tokens.div_ceil(r.block_tokens.max(1));
            r.hash_ids = (0..u64::from(n)).map(|i| next.saturating_add(i)).collect();
            next = next.saturating_add(u64::from(n));
        }
        self
    }

    pub fn summary(&self) -> WorkloadSummary {
        WorkloadSummary::of(self)
    }
}
