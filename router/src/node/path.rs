//! The request path: what a request needs to be parsed, measured, admitted, decided
//! and dispatched. Handlers and the proxy hold an `Arc<RequestPath>`.
//!
//! Invariants: it reads the fleet, the prefix index and the predictor's snapshot but
//! learns nothing itself; everything a request's outcome feeds goes through
//! [`RequestPath::outcomes`]. Built last, by [`super::Node::start`], so every handle it
//! holds is whole from its first request.

use std::{collections::HashMap, sync::Arc};

use headroom_core::{
    admission::Gate,
    decide::RoutedTarget,
    lifecycle::{self, Deferrals},
    pd::Links,
    policy::RequestProfile,
};
use headroom_predictor::SharedPredictor;

use super::{Estimates, Outcomes};
use crate::{
    config::RouterConfig,
    decisions::DecisionRing,
    error::ApiError,
    fleet::{Fleet, Replica, kv_feed::KvFeeds},
    metrics::Metrics,
    policy::Policy,
    prefix::PrefixIndex,
    request::{Endpoint, ParsedRequest, PromptInput},
    tenant::Tenants,
    tokens::{self, PromptShape, Tokenizer},
};

pub struct RequestPath {
    pub cfg: Arc<RouterConfig>,
    pub fleet: Arc<Fleet>,
    pub prefix: Arc<PrefixIndex>,
    /// The engines' KV events, for replicas that publish them.
    pub kv: Arc<KvFeeds>,
    pub policy: Box<dyn Policy>,
    /// The predictor's latest snapshot (the trainer publishes it).
    pub predictor: Arc<SharedPredictor>,
    /// Counters and histograms of the request's steps (decision time, fallbacks,
    /// admission, retries, upstream errors).
    pub metrics: Arc<Metrics>,
    /// The tenant table (swapped whole on `SIGHUP`).
    pub tenants: Arc<Tenants>,
    /// Requests currently deferred (bounded by `slo.max_deferred`).
    pub deferred: Arc<Deferrals>,
    /// The admission gate (tenants' rates, concurrency, shares and queue).
    pub gate: Arc<Gate>,
    /// The prefill→decode links' KV transfer times, learned from measured transfers.
    pub pd_links: Links,
    /// Output lengths and bytes per token, learned from finished requests.
    pub estimates: Arc<Estimates>,
    /// Where a request's notes and its outcome go.
    pub outcomes: Arc<Outcomes>,
    /// Decisions made so far (each seeded decision draws from its own stream).
    decisions: std::sync::atomic::AtomicU64,
    /// This node's id hashed (stable across runs): its part of a seeded decision's stream.
    node_seed: u64,
    tokenizers: HashMap<String, Tokenizer>,
    /// Long prompts are tokenized on the blocking pool, at most this many at once, so a
    /// burst of them neither stalls the async workers nor grows an unbounded queue.
    tokenize_slots: tokio::sync::Semaphore,
    /// Long prompts' prefix records run on the blocking pool, at most this many at once
    /// (none free: inline, so that pool's queue stays bounded).
    record_slots: Arc<tokio::sync::Semaphore>,
}

/// Text prompts at least this long (bytes) are tokenized off the async workers: BPE
/// costs ≈ 0.04 ms per KB, so 16 KB holds a worker ≈ 0.6 ms, long enough to delay
/// every stream it carries.
pub const OFFLOAD_TOKENIZE_BYTES: usize = 16 * 1024;

/// The same bound for a Hugging Face tokenizer (`hf:`): on the tiny model's byte-level
/// BPE a segment the cache has not seen costs ≈ 4× cl100k per byte (≈ 0.17 µs; whole
/// 8 KB prompts 1.4 ms), plus the chat template's render, so a prompt leaves the
/// workers at an eighth of the size. Seen segments cost a hash and a copy
/// ([`crate::segment_cache`]), but which are seen is known only after the lookup.
pub const OFFLOAD_HF_TOKENIZE_BYTES: usize = 2 * 1024;

/// A placement that sends a replica at least this many blocks new to it is recorded in
/// the prefix index off the async workers: each new block is a table insert (≈ 0.15 µs,
/// mostly a cache miss in a table of up to 120 MB), so a 128k-token prompt of new
/// blocks (≈ 7,600 at 16 tokens) held the worker carrying its stream ≈ 1–2 ms before
/// the first token went out. 1,024 blocks (≈ 0.15 ms inline) is a judgement, not a
/// tuned value: well above every prompt of the real-vLLM workloads (≤ 190 blocks),
/// which keep the index current at once, and well below where a record holds a
/// worker for a millisecond.
pub const OFFLOAD_RECORD_BLOCKS: usize = 1024;

/// What [`RequestPath::new`] is built from (the assembly in [`super::Node::start`]).
pub(super) struct Parts {
    pub cfg: Arc<RouterConfig>,
    pub fleet: Arc<Fleet>,
    pub kv: Arc<KvFeeds>,
    pub policy: Box<dyn Policy>,
    pub predictor: Arc<SharedPredictor>,
    pub tenants: Arc<Tenants>,
    pub tokenizers: HashMap<String, Tokenizer>,
    pub estimates: Arc<Estimates>,
    pub outcomes: Arc<Outcomes>,
}

impl RequestPath {
    pub(super) fn new(p: Parts) -> Self {
        let cfg = p.cfg;
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self {
            deferred: Deferrals::new(),
            gate: Gate::new(cfg.admission.gate()),
            pd_links: Links::new(cfg.pd.link_model()),
            decisions: Default::default(),
            node_seed: xxhash_rust::xxh3::xxh3_64(cfg.node_id().as_bytes()),
            prefix: p.fleet.prefix.clone(),
            metrics: p.fleet.metrics.clone(),
            fleet: p.fleet,
            kv: p.kv,
            policy: p.policy,
            predictor: p.predictor,
            tenants: p.tenants,
            tokenizers: p.tokenizers,
            estimates: p.estimates,
            outcomes: p.outcomes,
            tokenize_slots: tokio::sync::Semaphore::new(cores),
            record_slots: Arc::new(tokio::sync::Semaphore::new(cores)),
            cfg,
        }
    }

    /// The decision records (held by the outcome sink, which closes them).
    pub fn records(&self) -> &DecisionRing {
        &self.outcomes.decision_records
    }

    /// Token count and prefix blocks of a request's prompt; with KV events followed,
    /// also its exact token ids (token-id prompts, a chat template, or a completions
    /// text prompt through the model's own tokenizer).
    pub fn shape(&self, req: &ParsedRequest) -> PromptShape {
        let block = self.cfg.prefix.block_tokens as usize;
        let max_blocks = self.cfg.prefix.max_blocks_per_request;
        let keep = self.kv.active();
        let exact = |ids: Vec<u32>| {
            let mut s = tokens::shape_of_ids(&ids, block, max_blocks);
            if keep {
                s.ids = Some(ids.into());
            }
            s
        };
        match &req.prompt {
            PromptInput::Ids(ids) => {
                let mut s = tokens::shape_of_ids(ids, block, max_blocks);
                if keep {
                    s.ids = Some(ids.as_slice().into());
                }
                s
            }
            PromptInput::Text(t) => {
                let tok = self
                    .tokenizers
                    .get(&req.model)
                    .unwrap_or(&Tokenizer::Estimate);
                // The model's chat template renders the exact prompt (what the engine
                // sees), so no per-message allowance applies then.
                if req.endpoint == Endpoint::ChatCompletions {
                    if let Some(ids) = tokens::ids_of_chat(tok, &req.upstream_body) {
                        return exact(ids);
                    }
                } else if let Some(ids) = tokens::ids_of_text(tok, t) {
                    return exact(ids);
                }
                let ratio = self.estimates.text_ratio(&req.model);
                let mut s = tokens::shape_of_text(tok, t, block, max_blocks, ratio);
                // Chat templates add a few tokens per message.
                s.tokens = s.tokens.saturating_add(4 * req.messages as u32);
                s
            }
        }
    }

    pub async fn shape_off_worker(
        self: &Arc<Self>,
        req: ParsedRequest,
    ) -> Result<(ParsedRequest, PromptShape), ApiError> {
        let long_bpe = match &req.prompt {
            PromptInput::Text(t) => match self.tokenizers.get(&req.model) {
                Some(Tokenizer::Bpe(_)) => t.len() >= OFFLOAD_TOKENIZE_BYTES,
                Some(Tokenizer::Hf(_)) => t.len() >= OFFLOAD_HF_TOKENIZE_BYTES,
                _ => false,
            },
            PromptInput::Ids(_) => false,
        };
        if !long_bpe {
            let shape = self.shape(&req);
            return Ok((req, shape));
        }
        // The semaphore is never closed; if it were, going ahead without a slot is fine.
        let _slot = self.tokenize_slots.acquire().await.ok();
        let path = self.clone();
        tokio::task::spawn_blocking(move || {
            let shape = path.shape(&req);
            (req, shape)
        })
        .await
        .map_err(|e| {
            ApiError::new(
                http::StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                format!("could not measure the prompt: {e}"),
            )
        })
    }

    /// Records in the prefix index that `replica` accepted the request (it now holds
    /// the prompt's blocks, [`lifecycle::remember_prefix`]): inline for a few new
    /// blocks, on the blocking pool for [`OFFLOAD_RECORD_BLOCKS`] or more while a slot
    /// is free. The index then learns the prompt a moment after its first token went
    /// out, instead of before; a request that shares the prompt and arrives in that
    /// moment is matched as if it came before.
    pub fn remember_prefix(
        &self,
        replica: &Arc<Replica>,
        profile: &RequestProfile,
        target: &RoutedTarget,
    ) {
        let block = self.cfg.prefix.block_tokens;
        let matched = lifecycle::matched_blocks(target, block);
        if profile.blocks.len().saturating_sub(matched) >= OFFLOAD_RECORD_BLOCKS
            && let Ok(slot) = self.record_slots.clone().try_acquire_owned()
        {
            let (prefix, r, blocks) =
                (self.prefix.clone(), replica.clone(), profile.blocks.clone());
            // Finite work: the task ends with the record, its slot released with it.
            drop(tokio::task::spawn_blocking(move || {
                prefix.record(&r.prefix_cursor, r.id, &blocks, matched);
                drop(slot);
            }));
            return;
        }
        lifecycle::remember_prefix(&self.prefix, replica.as_ref(), profile, target, block);
    }

    /// The random source of the next decision (ties, sampling, exploration): from
    /// `seed`, this node's id and the decision's number when `seed` is set, so a node
    /// replaying the same requests in the same order decides the same way; from entropy
    /// otherwise.
    ///
    /// The node id is in it because a mesh is usually started from one config: with
    /// `seed` alone every node's n-th decision drew the same numbers, so the nodes'
    /// random choices among near-equals moved together instead of spreading (16 nodes
    /// with one seed: one replica served 5% under a fair share in three of four runs of
    /// one load; `chaos/README.md`).
    pub fn decision_rng(&self) -> rand::rngs::SmallRng {
        use rand::SeedableRng;
        let n = self
            .decisions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.cfg.seed {
            0 => rand::rngs::SmallRng::from_rng(&mut rand::rng()),
            seed => rand::rngs::SmallRng::seed_from_u64(
                seed ^ self.node_seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
        }
    }

    /// Expected output tokens (see [`headroom_core::output::OutputEstimator`]).
    pub fn expected_output(&self, req: &ParsedRequest) -> u32 {
        self.estimates
            .output(&req.model, req.max_tokens, req.ignore_eos)
    }
}
