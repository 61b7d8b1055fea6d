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
/// `Copy`: a decision copies it out of the host's cell per candidate (no reference
/// count to bump on a cache line every decision thread shares).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
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

    /// Whether the engine restarted between `before` and this scrape: one of its
    /// monotone counters fell below half its earlier value (a Prometheus counter reset
    /// starts again from zero). A restarted engine's prefix cache is empty, whatever the
    /// router remembers placing there. Not any step back: in a mesh, scrapes of one
    /// engine by different nodes arrive with approximate ages, so two of them can be
    /// compared out of order, a little apart; a reset halves a counter only if the
    /// engine ran less than its own age since — and then it had little cached anyway.
    pub fn restarted_since(&self, before: &Scraped) -> bool {
        let reset = |now: f64, was: f64| now < 0.5 * was;
        reset(self.prefix_queries, before.prefix_queries)
            || reset(self.prefix_hits, before.prefix_hits)
            || reset(self.preemptions, before.preemptions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(queries: f64, hits: f64) -> Scraped {
        Scraped {
            at_s: 0.0,
            engine: EngineKind::Vllm,
            running: 0.0,
            waiting: 0.0,
            kv_usage: None,
            num_gpu_blocks: None,
            block_size: None,
            prefix_queries: queries,
            prefix_hits: hits,
            preemptions: 0.0,
            preemption_rate: 0.0,
            rejected_values: 0,
        }
    }

    #[test]
    fn a_counter_that_goes_back_is_a_restart() {
        assert!(!at(100.0, 40.0).restarted_since(&at(100.0, 40.0)));
        assert!(!at(150.0, 40.0).restarted_since(&at(100.0, 40.0)));
        assert!(at(20.0, 0.0).restarted_since(&at(100.0, 40.0)));
        // Two observers' scrapes compared out of order: a small step back is not one.
        assert!(!at(9_500.0, 3_900.0).restarted_since(&at(10_000.0, 4_000.0)));
        assert!(at(0.0, 0.0).restarted_since(&at(1.0, 0.0)));
        // An engine that reports no prefix counters never looks restarted.
        assert!(!at(0.0, 0.0).restarted_since(&at(0.0, 0.0)));
    }
}
