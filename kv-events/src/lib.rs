//! Precise prefix-cache state from the engines' KV events.
//!
//! An inference engine (vLLM; Headroom's emulator) publishes every block it caches
//! or evicts over ZMQ. Per replica, [`subscriber`] follows that stream
//! ([`wire`] decodes it), [`feed`] keeps it in order (sequence numbers, replay on
//! gaps, resync after restarts) and [`replica_blocks`] files each block in the
//! global [`index`] under a [`chain`] key computed from the block's token ids, the
//! same key the router computes from a prompt's token ids. A lookup then gives, per
//! replica, how many leading blocks of a prompt it holds: its cached-token count.
//! [`vllm_hash`] reproduces vLLM's own sha256 block hashes where they are
//! reproducible; [`publisher`] is the engine side (used by the emulator);
//! [`discovery`] reads vLLM's `GET /kv_event_sources`.
//!
//! See README.md for the invariants, the wire format and the measured figures.

pub mod chain;
pub mod discovery;
pub mod feed;
pub mod index;
pub mod mirror;
pub mod publisher;
pub mod replica_blocks;
pub mod share;
pub mod subscriber;
pub mod vllm_hash;
pub mod wire;

pub use feed::{FeedState, FeedStatus};
pub use index::{
    BlockIndex, DrainedLog, IndexOp, MAX_REPLICAS, PrefixMatch, ReplicaId, engine_cached_tokens,
};
pub use subscriber::{
    SharedIndex, SubscriberConfig, SubscriberHandle, shared_index, spawn_subscriber,
};
