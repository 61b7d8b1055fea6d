//! Workloads: what arrives, when, with which prefix structure and objectives.
//!
//! One in-memory form ([`Workload`]) for every source — the Mooncake-style JSON lines
//! of `DESIGN.md`, the Azure CSV traces, and the generators — so the simulator and the
//! live load generator replay exactly the same requests.

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
        let k = if rate_scale.is_finite() && rate_scale > 0.0 { rate_scale } else { 1.0 };
        Workload {
            name: self.name.clone(),
            requests: self
                .requests
                .iter()
                .map(|r| Request { arrival_s: r.arrival_s / k, ..r.clone() })
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
}
