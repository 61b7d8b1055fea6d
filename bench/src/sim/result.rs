//! What a simulated (or live) run produces: one record per request, load samples over
//! time, and decision costs. Summaries and reports are computed from these.

use serde::{Deserialize, Serialize};

/// The measured fate of one request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub id: u64,
    pub tenant: Option<String>,
    pub arrival_s: f64,
    /// Index into [`RunResult::replicas`]; `None` when rejected.
    pub replica: Option<u32>,
    /// Router node that decided.
    pub node: u32,
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Prompt tokens the engine served from its prefix cache.
    pub cached_tokens: u32,
    /// The router's estimate of that hit when it placed the request.
    #[serde(default)]
    pub est_cached_tokens: Option<u32>,
    /// Arrival → first token (None when rejected or never served).
    pub ttft_s: Option<f64>,
    /// (last − first) / (tokens − 1); None with fewer than 2 tokens.
    pub tpot_s: Option<f64>,
    pub e2e_s: Option<f64>,
    pub slo_ttft_ms: f64,
    pub slo_tpot_ms: f64,
    /// The TTFT forecast at dispatch, as `ttft_s` counts it: plus the time the request
    /// had waited at the router by then.
    pub predicted_ttft_ms: Option<f64>,
    pub predicted_ttft_upper_ms: Option<f64>,
    pub predicted_tpot_ms: Option<f64>,
    pub predicted_tpot_upper_ms: Option<f64>,
    /// Why the policy fell back, if it did.
    pub fallback: Option<String>,
    pub rejected: bool,
    /// The prefill replica of a disaggregated request (`replica` is its decode side).
    #[serde(default)]
    pub prefill_replica: Option<u32>,
}

impl RequestRecord {
    pub fn met_ttft(&self) -> bool {
        self.ttft_s.is_some_and(|t| t * 1e3 <= self.slo_ttft_ms)
    }
    /// A single-token response has no TPOT and meets its TPOT objective trivially.
    pub fn met_tpot(&self) -> bool {
        !self.rejected
            && self.ttft_s.is_some()
            && self.tpot_s.is_none_or(|t| t * 1e3 <= self.slo_tpot_ms)
    }
    pub fn met_both(&self) -> bool {
        self.met_ttft() && self.met_tpot()
    }
}

/// In-flight requests per replica at one instant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadSample {
    pub t_s: f64,
    /// Requests placed and not finished, per replica (index as in `replicas`).
    pub inflight: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    pub name: String,
    pub profile: String,
}

/// Everything one run of one policy at one rate produced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub policy: String,
    pub workload: String,
    pub rate_scale: f64,
    pub seed: u64,
    pub routers: u32,
    pub replicas: Vec<ReplicaInfo>,
    pub records: Vec<RequestRecord>,
    pub load: Vec<LoadSample>,
    /// Decision cost samples (wall-clock nanoseconds of the real decision code, per decision).
    pub decision_ns: Vec<u32>,
    /// Simulated seconds covered.
    pub sim_duration_s: f64,
}
