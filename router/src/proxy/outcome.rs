//! What happened to one request, as the router measured it.

use std::{sync::Arc, time::Instant};

use crate::{decide::Learn, fleet::Replica};

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
    /// Dispatch → first content chunk (streams only).
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
