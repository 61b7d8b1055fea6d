//! vLLM-named Prometheus metrics of one emulated replica.
//!
//! Names, label sets and histogram buckets follow vLLM v1's `PrometheusStatLogger`
//! (see `shared/reference/engine-and-traces.md` §3.1). Every series carries
//! `model_name` and `engine="0"`. Gauges are written by the engine driver after
//! each step and command batch, so a scrape sees the engine as of its last change.
//! Latency histograms are in wall-clock seconds (model seconds × time scale), as a
//! client of this emulator observes them.

use headroom_engine::{EngineStats, Profile};
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// The replica's metric families, registered in their own registry.
pub struct ReplicaMetrics {
    registry: Registry,
    running: IntGauge,
    waiting: IntGauge,
    kv_usage: Gauge,
    prefix_queries: IntCounter,
    prefix_hits: IntCounter,
    preemptions: IntCounter,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    success: IntCounterVec,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
}

impl ReplicaMetrics {
    /// Builds and registers every family for `model` served with `profile`.
    pub fn new(model: &str, profile: &Profile) -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let opts = |name: &str, help: &str| {
            Opts::new(name, help)
                .const_label("model_name", model)
                .const_label("engine", "0")
        };
        let hist = |name: &str, help: &str, buckets: &[f64]| {
            HistogramOpts::new(name, help)
                .const_label("model_name", model)
                .const_label("engine", "0")
                .buckets(buckets.to_vec())
        };
        let m = ReplicaMetrics {
            running: IntGauge::with_opts(opts(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
            ))?,
            waiting: IntGauge::with_opts(opts(
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
            ))?,
            kv_usage: Gauge::with_opts(opts(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
            ))?,
            prefix_queries: IntCounter::with_opts(opts(
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            ))?,
            prefix_hits: IntCounter::with_opts(opts(
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            ))?,
            preemptions: IntCounter::with_opts(opts(
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
            ))?,
            prompt_tokens: IntCounter::with_opts(opts(
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
            ))?,
            generation_tokens: IntCounter::with_opts(opts(
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
            ))?,
            success: IntCounterVec::new(
                opts(
                    "vllm:request_success_total",
                    "Count of successfully processed requests.",
                ),
                &["finished_reason"],
            )?,
            ttft: Histogram::with_opts(hist(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
            ))?,
            itl: Histogram::with_opts(hist(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                ITL_BUCKETS,
            ))?,
            e2e: Histogram::with_opts(hist(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                E2E_BUCKETS,
            ))?,
            registry,
        };
        let info = Gauge::with_opts(
            Opts::new(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
            )
            .const_label("engine", "0")
            .const_label("block_size", profile.block_size.to_string())
            .const_label("num_gpu_blocks", profile.num_gpu_blocks.to_string())
            .const_label("enable_prefix_caching", "True")
            .const_label("gpu_memory_utilization", "0.9")
            .const_label("cache_dtype", "auto"),
        )?;
        info.set(1.0);
        let r = &m.registry;
        r.register(Box::new(m.running.clone()))?;
        r.register(Box::new(m.waiting.clone()))?;
        r.register(Box::new(m.kv_usage.clone()))?;
        r.register(Box::new(m.prefix_queries.clone()))?;
        r.register(Box::new(m.prefix_hits.clone()))?;
        r.register(Box::new(m.preemptions.clone()))?;
        r.register(Box::new(m.prompt_tokens.clone()))?;
        r.register(Box::new(m.generation_tokens.clone()))?;
        r.register(Box::new(m.success.clone()))?;
        r.register(Box::new(m.ttft.clone()))?;
        r.register(Box::new(m.itl.clone()))?;
        r.register(Box::new(m.e2e.clone()))?;
        r.register(Box::new(info))?;
        for reason in ["stop", "length", "abort"] {
            m.success.with_label_values(&[reason]);
        }
        Ok(m)
    }

    /// Publishes gauges and the counter deltas since `last`.
    pub fn publish(&self, now: &EngineStats, last: &EngineStats) {
        self.running.set(i64::from(now.running));
        self.waiting.set(i64::from(now.waiting));
        self.kv_usage.set(now.kv_cache_usage);
        let delta = |c: &IntCounter, a: u64, b: u64| c.inc_by(a.saturating_sub(b));
        delta(
            &self.prefix_queries,
            now.prefix_cache_queries,
            last.prefix_cache_queries,
        );
        delta(
            &self.prefix_hits,
            now.prefix_cache_hits,
            last.prefix_cache_hits,
        );
        delta(&self.preemptions, now.preemptions, last.preemptions);
        delta(&self.prompt_tokens, now.prompt_tokens, last.prompt_tokens);
        delta(
            &self.generation_tokens,
            now.generation_tokens,
            last.generation_tokens,
        );
        for (reason, a, b) in [
            ("stop", now.finished_stop, last.finished_stop),
            ("length", now.finished_length, last.finished_length),
            ("abort", now.finished_abort, last.finished_abort),
        ] {
            delta(&self.success.with_label_values(&[reason]), a, b);
        }
    }

    /// Records one first-token latency (wall seconds).
    pub fn observe_ttft(&self, s: f64) {
        self.ttft.observe(s);
    }

    /// Records one inter-token latency (wall seconds).
    pub fn observe_itl(&self, s: f64) {
        self.itl.observe(s);
    }

    /// Records one end-to-end latency (wall seconds).
    pub fn observe_e2e(&self, s: f64) {
        self.e2e.observe(s);
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        String::from_utf8(buf).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}
