//! Values that cross the engine boundary: requests in, events and statistics out.

/// A request handed to [`super::Engine::submit`].
///
/// `block_hashes` are the chained hashes of the prompt's FULL blocks (see
/// [`super::hashing`]), computed once by the caller; fewer than `prompt_tokens /
/// block_size` hashes is allowed (the rest of the prompt is then unique to this
/// request), more is an error.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineRequest {
    /// Caller-chosen id, unique among requests currently in the engine.
    pub id: u64,
    /// Prompt length in tokens (≥ 1).
    pub prompt_tokens: u32,
    /// Chained hashes of the prompt's full blocks.
    pub block_hashes: Vec<u64>,
    /// Output cap (`max_tokens`); prompt + this must fit `max_model_len`.
    pub max_output_tokens: u32,
    /// The model emits EOS after this many tokens (finish reason `stop`) if it is
    /// below `max_output_tokens`; `None` runs to the cap (finish reason `length`).
    pub eos_after: Option<u32>,
}

impl EngineRequest {
    /// A request that generates exactly `max_output_tokens` tokens.
    pub fn new(
        id: u64,
        prompt_tokens: u32,
        block_hashes: Vec<u64>,
        max_output_tokens: u32,
    ) -> Self {
        EngineRequest {
            id,
            prompt_tokens,
            block_hashes,
            max_output_tokens,
            eos_after: None,
        }
    }
}

/// Why a request stopped generating.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS was sampled.
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The client went away ([`super::Engine::abort`]).
    Abort,
}

impl FinishReason {
    /// The OpenAI/vLLM spelling (`stop`, `length`, `abort`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// Something that happened at the END of a step (all at engine time `now_s()`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event {
    /// The first output token; `ttft_s` counts from submission (model seconds).
    FirstToken { id: u64, ttft_s: f64 },
    /// A later output token; `itl_s` is the gap since the previous one.
    Token { id: u64, itl_s: f64 },
    /// The request is done and has left the engine (follows its last token event).
    Finished {
        id: u64,
        reason: FinishReason,
        prompt_tokens: u32,
        output_tokens: u32,
        /// Prompt tokens served from the prefix cache at first admission.
        cached_tokens: u32,
        /// Submission to last token (model seconds).
        e2e_s: f64,
    },
    /// The request lost its KV and went back to the front of the queue (recompute).
    Preempted { id: u64 },
}

/// What one call to [`super::Engine::step`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepInfo {
    /// Modelled duration (seconds), including slowdown and noise. 0 when idle.
    pub duration_s: f64,
    /// Requests in the batch.
    pub num_reqs: u32,
    /// Tokens in the batch (decode + prefill).
    pub num_tokens: u32,
    /// Requests preempted while scheduling this step.
    pub num_preempted: u32,
    /// Nothing to do: no step ran and the clock did not move.
    pub idle: bool,
}

/// A snapshot of the engine's gauges and counters (vLLM metric semantics).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// Engine clock (model seconds).
    pub now_s: f64,
    /// Requests in the running batch.
    pub running: u32,
    /// Requests waiting (including preempted ones).
    pub waiting: u32,
    /// `1 − free/(num_gpu_blocks − 1)`, free including evictable cached blocks.
    pub kv_cache_usage: f64,
    /// vLLM's `num_gpu_blocks` (with the null block).
    pub num_gpu_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Free blocks, including evictable cached ones.
    pub free_blocks: u32,
    /// Blocks whose prefix hash can currently be hit.
    pub cached_blocks: u32,
    /// Prompt tokens looked up in the prefix cache (once per admission).
    pub prefix_cache_queries: u64,
    /// Of those, tokens found cached.
    pub prefix_cache_hits: u64,
    /// Recompute preemptions so far.
    pub preemptions: u64,
    /// Prompt tokens of requests that produced their first token.
    pub prompt_tokens: u64,
    /// Output tokens produced.
    pub generation_tokens: u64,
    /// Requests finished with `stop`.
    pub finished_stop: u64,
    /// Requests finished with `length`.
    pub finished_length: u64,
    /// Requests aborted.
    pub finished_abort: u64,
    /// Steps run.
    pub steps: u64,
    /// Sum of step durations (model seconds): time the GPU was busy.
    pub busy_s: f64,
}
