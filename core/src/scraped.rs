//! One replica's engine state as the host last scraped it (`/metrics`).
//!
//! Invariant: the host drops nonsense values before they land here (NaN, negative
//! gauges, KV usage outside 0..1), so every policy may read these fields as given.

/// Which engine's names were found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Vllm,
    Sglang,
    Unknown,
}

/// One replica's engine state as of `at_s`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Scraped {
    pub at_s: f64,
    pub engine: EngineKind,
    pub running: f64,
    pub waiting: f64,
    /// KV blocks held by live requests, 0..1.
    pub kv_usage: Option<f64>,
    pub num_gpu_blocks: Option<u32>,
    pub block_size: Option<u32>,
    /// Cumulative prefix-cache query and hit tokens.
    pub prefix_queries: f64,
    pub prefix_hits: f64,
    pub preemptions: f64,
    /// Preemptions per second since the previous scrape.
    pub preemption_rate: f64,
    /// Samples rejected as nonsense in this scrape.
    pub rejected_values: u32,
}

impl Scraped {
    /// KV capacity in tokens, when the engine reported both factors.
    pub fn kv_capacity_tokens(&self) -> Option<u64> {
        Some(u64::from(self.num_gpu_blocks?) * u64::from(self.block_size?))
    }
}
