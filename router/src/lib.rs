//! Headroom: an SLO-aware router mesh for LLM inference.
//!
//! Crate map: `server` (HTTP front) → `request`/`tokens`/`tenant` (what a request is)
//! → `admission` (the tenant's turn at the node's gate: rates, shares, queue)
//! → the routing core (`headroom-core`, re-exported as `decide`, `lifecycle`,
//! `policy`, `ledger`, `prefix`; it reads `fleet` replicas through `replica_view`)
//! → `proxy` (forwarding, retries, streaming) → `node::Outcomes` (what a finished
//! request feeds). `node` assembles a node: the `RequestPath` handlers hold and the
//! outcome sink. Background work lives in `fleet::tasks`. `up` runs a whole local
//! deployment.

pub mod admission;
pub mod bpe_cache;
pub mod chat;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod decisions;
pub mod edge;
pub mod error;
pub mod fleet;
pub mod hf_segments;
pub mod mesh;
pub mod metrics;
pub mod node;
pub mod otel;
pub mod proxy;
pub mod replica_view;
pub mod request;
pub mod request_log;
pub mod segment_cache;
pub mod server;
pub mod tenant;
pub mod tokens;
pub mod trainer;
pub mod up;
pub mod upstream;
pub use config::validate;

// The routing core, under the paths the rest of the router has always used.
pub use headroom_core::{decide, ledger, lifecycle, policy, prefix};

/// Response header naming the replica that served (or failed) a request; for a
/// disaggregated request, the decode replica.
pub const REPLICA_HEADER: &str = "x-headroom-replica";
/// Response header naming the prefill replica of a disaggregated request.
pub const PREFILL_REPLICA_HEADER: &str = "x-headroom-prefill-replica";
/// Response header with the prompt tokens the router counted for the request (exact
/// with the model's `hf:` tokenizer), sent with the prediction headers.
pub const PROMPT_TOKENS_HEADER: &str = "x-headroom-prompt-tokens";
/// The cached tokens the router routed on for the chosen replica, and where that
/// count came from (`precise` / `recovering`: the engine's KV events; `approximate`:
/// the router's own prefix index).
pub const CACHED_TOKENS_HEADER: &str = "x-headroom-cached-tokens";
pub const CACHED_SOURCE_HEADER: &str = "x-headroom-cached-tokens-source";
/// Response header: the id of the request's decision record (`/debug/decisions/{id}`).
pub const DECISION_HEADER: &str = "x-headroom-decision-id";
