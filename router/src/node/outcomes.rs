//! The outcome sink: what a finished request's outcome feeds — the trainer (labels and
//! forecast error), the metrics, replica health, the learned [`Estimates`], the decision
//! records, the request log and traces — and the mesh, which hears of each placement.
//!
//! Invariants: it never routes and never holds the request path (which holds it); a
//! request's outcome is observed exactly once ([`Outcomes::observe`], from the response
//! body), its TTFT label at most once (at the first token, or with the outcome).

use std::{sync::Arc, time::Instant};

use headroom_core::lifecycle::{self, Finished};

use super::Estimates;
use crate::{
    config::HealthConfig,
    decide::Learn,
    decisions::{Asked, DecisionRing, Measured},
    fleet::{Replica, Signal},
    mesh::MeshRuntime,
    metrics::Metrics,
    otel::Traces,
    request_log::RequestLog,
    trainer::Trainer,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutcomeStatus {
    /// Completed normally.
    Ok,
    /// The replica failed mid-response (error, reset, early end).
    UpstreamFailed,
    /// The stream went silent past the idle timeout.
    TimedOut,
    /// The client went away first.
    Cancelled,
}

impl Outcome {
    /// The TPOT label the predictor learns from (s): the engine's own mean inter-token
    /// latency where it reports one, else the stream's measurement. The engine's is
    /// exact; the stream's carries the API server's and the network's buffering.
    pub fn tpot_label_s(&self) -> Option<f64> {
        let engine = self
            .engine_itl_ms
            .filter(|v| v.is_finite() && *v > 0.0 && self.output_tokens.is_some_and(|n| n >= 2))
            .map(|v| v / 1e3);
        engine.or(self.tpot_stream_s)
    }

    /// Arrival → dispatch (s): what the request spent at the router (reading the body,
    /// tokenizing, the tenant's gate, deciding, deferrals) before any replica saw it.
    pub fn router_wait_s(&self) -> f64 {
        self.dispatched
            .saturating_duration_since(self.arrived)
            .as_secs_f64()
    }

    /// The TTFT the client saw (s): arrival → first content chunk. Attainment and the
    /// TTFT histogram use it; the model learns [`Outcome::ttft_s`], the replica's part.
    pub fn client_ttft_s(&self) -> Option<f64> {
        self.ttft_s.map(|t| t + self.router_wait_s())
    }
}

impl OutcomeStatus {
    pub fn label(self) -> &'static str {
        match self {
            OutcomeStatus::Ok => "ok",
            OutcomeStatus::UpstreamFailed => "upstream_failed",
            OutcomeStatus::TimedOut => "timed_out",
            OutcomeStatus::Cancelled => "cancelled",
        }
    }
}

/// Measured outcome of a routed request.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub model: String,
    pub replica: Arc<Replica>,
    pub status: OutcomeStatus,
    /// When the router sent the request upstream (TTFT is measured from here).
    pub dispatched: Instant,
    /// When the request reached the router.
    pub arrived: Instant,
    /// Dispatch → first content chunk (streams only): the TTFT label.
    pub ttft_s: Option<f64>,
    /// TPOT as the client saw it: (last − first content) / (tokens − 1), streams with
    /// ≥ 2 tokens spread over more than one read (attainment and the TPOT histogram).
    pub tpot_s: Option<f64>,
    /// TPOT measured from the stream with the engine's token counts (see
    /// `sse::SseScanner::tpot_label_s`). `None` when unmeasurable.
    pub tpot_stream_s: Option<f64>,
    /// The engine's own mean inter-token latency for this request (ms), where it says.
    pub engine_itl_ms: Option<f64>,
    /// Arrival → end of response.
    pub e2e_s: f64,
    /// Dispatch → end of response (a lower bound on TTFT when no token came).
    pub upstream_s: f64,
    pub output_tokens: Option<u32>,
    /// Prompt tokens the replica reported (usage).
    pub prompt_tokens: Option<u32>,
    /// Text prompt size in bytes and chat message count (for the token estimator).
    pub prompt_bytes: Option<usize>,
    pub prompt_messages: u32,
    pub cached_tokens: Option<u32>,
    /// What the router saw and predicted at dispatch (for learning and error metrics).
    pub learn: Option<Learn>,
    /// The TTFT label was learned at the first token already.
    pub ttft_learned: bool,
    /// Its decision record (`/debug/decisions/{id}`), where records are on.
    pub decision: Option<u64>,
}

pub use headroom_core::lifecycle::Reported;

/// The record's measurements of an outcome, against the request's objectives.
fn measured(o: &Outcome, asked: &Asked) -> Measured {
    let ttft_ms = o.client_ttft_s().map(|s| s * 1e3);
    let tpot_ms = o.tpot_s.map(|s| s * 1e3);
    Measured {
        status: o.status.label(),
        replica: o.replica.name.clone(),
        ttft_ms,
        tpot_ms,
        e2e_ms: o.e2e_s * 1e3,
        router_wait_ms: o.router_wait_s() * 1e3,
        output_tokens: o.output_tokens,
        prompt_tokens: o.prompt_tokens,
        cached_tokens: o.cached_tokens,
        ttft_met: ttft_ms.map(|t| t <= asked.slo_ttft_ms),
        tpot_met: tpot_ms.map(|t| t <= asked.slo_tpot_ms),
    }
}

pub struct Outcomes {
    pub metrics: Arc<Metrics>,
    pub trainer: Arc<Trainer>,
    /// Recent decisions, readable by id (`/debug/decisions`).
    pub decision_records: DecisionRing,
    /// The request log (`request_log`), where configured.
    pub request_log: Option<RequestLog>,
    /// OpenTelemetry traces (`[tracing] otlp_endpoint`), where configured.
    pub traces: Option<Traces>,
    /// The mesh, where this node joined one (it was started before this sink).
    pub mesh: Option<Arc<MeshRuntime>>,
    /// What the request path estimates from outcomes.
    pub estimates: Arc<Estimates>,
    /// How outcomes count against a replica's health.
    pub(super) health: HealthConfig,
}

impl Outcomes {
    /// A replica accepted a request (its first byte came): peers learn the prompt's
    /// blocks too, so a repeat through another node finds the replica holding them.
    pub fn placed(&self, replica: &Replica, blocks: &[u64]) {
        if let Some(mesh) = &self.mesh {
            mesh.note_prefix(replica.key, blocks);
        }
    }

    /// Forecast error and bound coverage of one target against its label.
    fn score(&self, target: &str, actual_ms: f64, pred_ms: f64, upper_ms: f64) {
        if !(actual_ms.is_finite() && actual_ms > 0.0) {
            return;
        }
        let m = &self.metrics;
        m.forecast_rel_error
            .with_label_values(&[target])
            .observe((pred_ms - actual_ms).abs() / actual_ms);
        m.forecast_abs_error
            .with_label_values(&[target])
            .observe((pred_ms - actual_ms).abs() / 1e3);
        let covered = if actual_ms <= upper_ms {
            "true"
        } else {
            "false"
        };
        m.bound_covered.with_label_values(&[target, covered]).inc();
    }

    /// Tells the trainer what the router measures of `replica` now: its step time and
    /// decoding count (what prices a capacity-bound replica's admission wait before
    /// labels from that regime arrive).
    fn report_replica(&self, l: &Learn, replica: &Replica) {
        let gap = replica.ledger.step_s();
        let decoding = replica.ledger.load(crate::clock::now_s()).decoding_requests;
        self.trainer
            .replica_state(l.key, (gap > 0.0).then_some(gap * 1e3), decoding);
    }

    /// The TTFT label, at the first token: scored and handed to the trainer at once.
    pub fn learn_first_token(&self, l: &Learn, ttft_s: f64, reported: Reported) {
        let ttft_ms = ttft_s * 1e3;
        self.score(
            "ttft",
            ttft_ms,
            l.prediction.ttft_ms,
            l.prediction.ttft_upper_ms,
        );
        let at = crate::trainer::wall_s();
        if let Some(s) = lifecycle::first_token_sample(l, at, ttft_ms, reported) {
            self.trainer.submit(s);
        }
    }

    /// The labels known at the end (see [`lifecycle::Finished`]): TPOT (the engine's
    /// own, else measured from the stream with its token counts), and TTFT if it was not
    /// learned at the first token (censored when no token came).
    fn learn(&self, o: &Outcome) {
        let Some(l) = o.learn else { return };
        self.report_replica(&l, &o.replica);
        let finished = Finished {
            ok: o.status == OutcomeStatus::Ok,
            ttft_ms: o.ttft_s.map(|t| t * 1e3),
            ttft_learned: o.ttft_learned,
            upstream_ms: o.upstream_s * 1e3,
            tpot_ms: o.tpot_label_s().map(|s| s * 1e3),
            output_tokens: o.output_tokens.unwrap_or(0),
            reported: Reported {
                prompt_tokens: o.prompt_tokens,
                cached_tokens: o.cached_tokens,
            },
        };
        let labels = finished.labels();
        let p = &l.prediction;
        if let Some(y) = labels.tpot_ms {
            self.score("tpot", y, p.tpot_ms, p.tpot_upper_ms);
        }
        if let (Some(y), false) = (labels.ttft_ms, labels.censored) {
            self.score("ttft", y, p.ttft_ms, p.ttft_upper_ms);
        }
        for s in finished.samples(&l, crate::trainer::wall_s()) {
            self.trainer.submit(s);
        }
    }

    /// Records a finished request: its decision record (and the request log), metrics,
    /// health and learning.
    pub fn observe(&self, o: Outcome) {
        self.decision_records.update(o.decision, |r| {
            r.measured = Some(measured(&o, &r.request));
            if let Some(log) = &self.request_log
                && !log.log(r)
            {
                self.metrics.request_log_dropped.inc();
            }
        });
        self.learn(&o);
        let m = &self.metrics;
        let r = &o.replica.name;
        m.requests
            .with_label_values(&[&o.model, &**r, o.status.label()])
            .inc();
        if let Some(t) = o.client_ttft_s() {
            m.ttft.with_label_values(&[&o.model, &**r]).observe(t);
        }
        m.router_wait.observe(o.router_wait_s());
        if let Some(t) = o.tpot_s {
            m.tpot.with_label_values(&[&o.model, &**r]).observe(t);
        }
        // How far the stream's own measurement is from the engine's (where the engine
        // reports one): the check on labels for engines that report nothing.
        if let (Some(label), Some(itl)) = (o.tpot_stream_s, o.engine_itl_ms.filter(|v| *v > 0.0)) {
            m.tpot_label_ratio
                .with_label_values(&[&**r])
                .observe(label * 1e3 / itl);
        }
        m.e2e.with_label_values(&[&o.model, &**r]).observe(o.e2e_s);
        let now = crate::clock::now_ms();
        match o.status {
            OutcomeStatus::Ok => {
                o.replica
                    .health
                    .on_success(Signal::Request, now, &self.health);
                if let Some(n) = o.output_tokens {
                    self.estimates.observe_output(&o.model, n);
                }
                if let (Some(bytes), Some(tokens)) = (o.prompt_bytes, o.prompt_tokens) {
                    self.estimates
                        .observe_prompt(&o.model, bytes, tokens, o.prompt_messages);
                }
            }
            OutcomeStatus::UpstreamFailed | OutcomeStatus::TimedOut => {
                m.upstream_errors
                    .with_label_values(&[r, o.status.label()])
                    .inc();
                if o.replica
                    .health
                    .on_failure(Signal::Request, now, &self.health)
                {
                    m.ejection(r);
                }
            }
            OutcomeStatus::Cancelled => {}
        }
    }
}
