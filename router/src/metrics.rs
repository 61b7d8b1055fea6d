//! The node's own Prometheus metrics (`/metrics`).

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Latency buckets (seconds) wide enough for TTFT of long prompts under load.
const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0,
];
const TPOT_BUCKETS: &[f64] = &[
    0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
];
const REL_ERR_BUCKETS: &[f64] = &[0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0];
/// Arrival → dispatch (s): microseconds when nothing waits, up to a deferral's seconds.
const WAIT_BUCKETS: &[f64] = &[
    1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];
/// Label ÷ engine-reported value: honest labels sit near 1.
const RATIO_BUCKETS: &[f64] = &[
    0.25, 0.5, 0.75, 0.85, 0.9, 1.0, 1.1, 1.15, 1.25, 1.5, 2.0, 4.0,
];
const DECISION_BUCKETS: &[f64] = &[
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3,
];

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub ttft: HistogramVec,
    pub tpot: HistogramVec,
    pub e2e: HistogramVec,
    pub retries: IntCounterVec,
    /// Streams cut after their first byte, by what became of them (`proxy/failover.rs`).
    pub failover: IntCounterVec,
    /// From the cut to the continuation's first byte.
    pub failover_seconds: HistogramVec,
    pub upstream_errors: IntCounterVec,
    pub ejections: IntCounterVec,
    pub replica_restarts: IntCounterVec,
    pub healthy: IntGaugeVec,
    pub scrape_errors: IntCounterVec,
    pub scrape_rejected: IntCounterVec,
    pub scrape_period: GaugeVec,
    pub decision_seconds: HistogramVec,
    /// Arrival → dispatch of each routed request.
    pub router_wait: prometheus::Histogram,
    pub rejected: IntCounterVec,
    pub fallbacks: IntCounterVec,
    pub forecast_rel_error: HistogramVec,
    pub forecast_abs_error: HistogramVec,
    pub bound_covered: IntCounterVec,
    pub tpot_label_ratio: HistogramVec,
    pub predictor_learned: IntGauge,
    pub admission: IntCounterVec,
    pub admission_running: IntGaugeVec,
    pub admission_queued: IntGaugeVec,
    pub predictor_dropped: IntGauge,
    pub request_log_dropped: IntCounter,
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    // Names are static and unique, so registration cannot fail in practice; a
    // duplicate would be a programming error caught by the tests.
    if let Err(e) = r.register(Box::new(c.clone())) {
        tracing::error!("metric registration failed: {e}");
    }
    c
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let h = |name: &str, help: &str, b: &[f64], labels: &[&str]| {
            HistogramVec::new(HistogramOpts::new(name, help).buckets(b.to_vec()), labels)
                .expect("static histogram options are valid")
        };
        let c = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
                .expect("static counter options are valid")
        };
        Self {
            requests: reg(
                &r,
                c(
                    "headroom_requests_total",
                    "Requests by outcome.",
                    &["model", "replica", "status"],
                ),
            ),
            ttft: reg(
                &r,
                h(
                    "headroom_ttft_seconds",
                    "Time to first token as the client saw it: arrival at the router to the first content chunk (headroom_router_wait_seconds is the router's part).",
                    LATENCY_BUCKETS,
                    &["model", "replica"],
                ),
            ),
            tpot: reg(
                &r,
                h(
                    "headroom_tpot_seconds",
                    "Time per output token after the first.",
                    TPOT_BUCKETS,
                    &["model", "replica"],
                ),
            ),
            e2e: reg(
                &r,
                h(
                    "headroom_e2e_seconds",
                    "Request time, arrival to last byte.",
                    LATENCY_BUCKETS,
                    &["model", "replica"],
                ),
            ),
            retries: reg(
                &r,
                c(
                    "headroom_retries_total",
                    "Attempts moved to another replica before the first byte.",
                    &["reason"],
                ),
            ),
            failover: reg(
                &r,
                c(
                    "headroom_failover_total",
                    "Streams cut after their first byte: resumed (continued on another replica), finished (cut after the last token), ineligible, or failed (no replica could continue).",
                    &["outcome"],
                ),
            ),
            failover_seconds: reg(
                &r,
                h(
                    "headroom_failover_seconds",
                    "Cut to the continuation's first byte (the pause the client saw).",
                    LATENCY_BUCKETS,
                    &[],
                ),
            ),
            upstream_errors: reg(
                &r,
                c(
                    "headroom_upstream_errors_total",
                    "Upstream failures by kind.",
                    &["replica", "kind"],
                ),
            ),
            ejections: reg(
                &r,
                c(
                    "headroom_ejections_total",
                    "Replicas ejected by health checks.",
                    &["replica"],
                ),
            ),
            replica_restarts: reg(
                &r,
                c(
                    "headroom_replica_restarts_total",
                    "Engine restarts seen (a monotone counter went back); the prefix index forgot the replica.",
                    &["replica"],
                ),
            ),
            healthy: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "headroom_replica_healthy",
                        "1 when the replica takes traffic.",
                    ),
                    &["replica"],
                )
                .expect("valid"),
            ),
            scrape_errors: reg(
                &r,
                c(
                    "headroom_scrape_errors_total",
                    "Failed metric scrapes.",
                    &["replica", "kind"],
                ),
            ),
            scrape_rejected: reg(
                &r,
                c(
                    "headroom_scrape_rejected_values_total",
                    "Nonsense metric values ignored.",
                    &["replica"],
                ),
            ),
            scrape_period: reg(
                &r,
                GaugeVec::new(
                    Opts::new(
                        "headroom_scrape_period_seconds",
                        "Wait before this node's next /metrics read of the replica (paced to the scrape's cost).",
                    ),
                    &["replica"],
                )
                .expect("valid"),
            ),
            decision_seconds: reg(
                &r,
                h(
                    "headroom_decision_seconds",
                    "Time to choose a replica.",
                    DECISION_BUCKETS,
                    &["policy"],
                ),
            ),
            router_wait: reg(
                &r,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        "headroom_router_wait_seconds",
                        "Arrival to dispatch of each routed request: reading the body, tokenizing, the tenant's gate, deciding and deferrals (part of the client's TTFT).",
                    )
                    .buckets(WAIT_BUCKETS.to_vec()),
                )
                .expect("static histogram options are valid"),
            ),
            rejected: reg(
                &r,
                c(
                    "headroom_rejected_total",
                    "Requests refused by the router.",
                    &["reason"],
                ),
            ),
            fallbacks: reg(
                &r,
                c(
                    "headroom_fallback_total",
                    "Decisions that fell back (cold model, nothing fits, deferral).",
                    &["kind"],
                ),
            ),
            forecast_rel_error: reg(
                &r,
                h(
                    "headroom_forecast_relative_error",
                    "|predicted − actual| / actual, per target.",
                    REL_ERR_BUCKETS,
                    &["target"],
                ),
            ),
            forecast_abs_error: reg(
                &r,
                h(
                    "headroom_forecast_absolute_error_seconds",
                    "|predicted − actual|, per target.",
                    TPOT_BUCKETS,
                    &["target"],
                ),
            ),
            bound_covered: reg(
                &r,
                c(
                    "headroom_forecast_bound_total",
                    "Outcomes inside (covered=true) or above the calibrated upper bound.",
                    &["target", "covered"],
                ),
            ),
            tpot_label_ratio: reg(
                &r,
                h(
                    "headroom_tpot_label_ratio",
                    "The TPOT the router measured from the stream over the engine's own mean inter-token latency for the same request (vLLM --enable-per-request-metrics), per replica.",
                    RATIO_BUCKETS,
                    &["replica"],
                ),
            ),
            admission: reg(
                &r,
                c(
                    "headroom_admission_total",
                    "Admission outcomes (admitted, queued, rejected) per tenant and reason.",
                    &["tenant", "outcome", "reason"],
                ),
            ),
            admission_running: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "headroom_admission_running",
                        "Requests holding an admission permit, per tenant.",
                    ),
                    &["tenant"],
                )
                .expect("valid"),
            ),
            admission_queued: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        "headroom_admission_queued",
                        "Requests waiting at the admission gate, per tenant.",
                    ),
                    &["tenant"],
                )
                .expect("valid"),
            ),
            predictor_learned: reg(
                &r,
                IntGauge::new(
                    "headroom_predictor_samples_learned",
                    "Outcomes the predictor has learned from.",
                )
                .expect("valid"),
            ),
            predictor_dropped: reg(
                &r,
                IntGauge::new(
                    "headroom_predictor_samples_dropped",
                    "Outcomes dropped because the trainer queue was full.",
                )
                .expect("valid"),
            ),
            request_log_dropped: reg(
                &r,
                IntCounter::new(
                    "headroom_request_log_dropped_total",
                    "Request log lines dropped because the writer's queue was full.",
                )
                .expect("valid"),
            ),
            registry: r,
        }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Prometheus text of everything registered.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!("metrics encoding failed: {e}");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    pub fn scrape_error(&self, replica: &str, kind: &str) {
        self.scrape_errors.with_label_values(&[replica, kind]).inc();
    }
    pub fn scrape_rejected_values(&self, replica: &str, n: u32) {
        self.scrape_rejected
            .with_label_values(&[replica])
            .inc_by(n as u64);
    }
    pub fn set_scrape_period(&self, replica: &str, wait: std::time::Duration) {
        self.scrape_period
            .with_label_values(&[replica])
            .set(wait.as_secs_f64());
    }
    pub fn ejection(&self, replica: &str) {
        self.ejections.with_label_values(&[replica]).inc();
    }
    pub fn replica_restart(&self, replica: &str) {
        self.replica_restarts.with_label_values(&[replica]).inc();
    }
    pub fn set_health(&self, replica: &str, healthy: bool) {
        self.healthy
            .with_label_values(&[replica])
            .set(healthy as i64);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn renders_registered_metrics() {
        let m = super::Metrics::new();
        m.requests.with_label_values(&["m", "r", "200"]).inc();
        m.ttft.with_label_values(&["m", "r"]).observe(0.1);
        let text = m.render();
        assert!(
            text.contains("headroom_requests_total{model=\"m\",replica=\"r\",status=\"200\"} 1")
        );
        assert!(text.contains("headroom_ttft_seconds_bucket"));
    }
}
