//! A router node's shared state: configuration, fleet, prefix index, policy,
//! tenants, tokenizers and metrics. Handlers hold an `Arc<Node>`.

use std::{collections::HashMap, sync::Arc};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use headroom_core::lifecycle::{self, Deferrals, Finished};
pub use headroom_core::output::OutputEstimator;

use crate::{
    config::RouterConfig,
    decide::Learn,
    error::ApiError,
    fleet::{Fleet, Signal, view::Origin},
    metrics::Metrics,
    policy::{self, Policy, PolicyName},
    prefix::PrefixIndex,
    proxy::outcome::{Outcome, OutcomeStatus, Reported},
    request::{Endpoint, ParsedRequest, PromptInput},
    tenant::Tenants,
    tokens::{self, PromptShape, Tokenizer},
    trainer::Trainer,
    upstream,
};

pub struct Node {
    pub cfg: Arc<RouterConfig>,
    pub fleet: Arc<Fleet>,
    pub prefix: Arc<PrefixIndex>,
    /// The engines' KV events, for replicas that publish them.
    pub kv: Arc<crate::fleet::kv_feed::KvFeeds>,
    pub policy: Box<dyn Policy>,
    pub metrics: Arc<Metrics>,
    pub tenants: Tenants,
    pub trainer: Arc<Trainer>,
    /// The mesh, once joined.
    pub mesh: std::sync::OnceLock<Arc<crate::mesh::MeshRuntime>>,
    /// Recent decisions, readable by id (`/debug/decisions`).
    pub decision_records: crate::decisions::DecisionRing,
    /// The request log (`request_log`), where configured.
    pub request_log: Option<crate::request_log::RequestLog>,
    /// OpenTelemetry traces (`[tracing] otlp_endpoint`), where configured.
    pub traces: Option<crate::otel::Traces>,
    /// Requests currently deferred (bounded by `slo.max_deferred`).
    pub deferred: Arc<Deferrals>,
    /// The admission gate (tenants' rates, concurrency, shares and queue).
    pub gate: Arc<headroom_core::admission::Gate>,
    /// The prefill→decode links' KV transfer times, learned from measured transfers.
    pub pd_links: headroom_core::pd::Links,
    /// Decisions made so far (each seeded decision draws from its own stream).
    decisions: std::sync::atomic::AtomicU64,
    tokenizers: HashMap<String, Tokenizer>,
    outputs: OutputEstimator,
    /// Per model: prompt bytes per token, learned from replicas' usage reports (the
    /// estimator's ratio for models without a configured tokenizer).
    text_ratio: Mutex<HashMap<String, f64>>,
    /// Long prompts are tokenized on the blocking pool, at most this many at once, so a
    /// burst of them neither stalls the async workers nor grows an unbounded queue.
    tokenize_slots: tokio::sync::Semaphore,
}

/// Text prompts at least this long (bytes) are tokenized off the async workers: BPE
/// costs ≈ 0.04 ms per KB, so 16 KB holds a worker ≈ 0.6 ms, long enough to delay
/// every stream it carries.
pub const OFFLOAD_TOKENIZE_BYTES: usize = 16 * 1024;

/// The same bound for a Hugging Face tokenizer (`hf:`): on the tiny model's byte-level
/// BPE it cost ≈ 6× cl100k per byte (dev build: 110 vs 19 ms per 16 KB), plus the chat
/// template's render, so it leaves the workers at an eighth of the size.
pub const OFFLOAD_HF_TOKENIZE_BYTES: usize = 2 * 1024;

impl Node {
    /// Builds the node and starts its fleet tasks (must run inside a tokio runtime).
    pub fn start(cfg: RouterConfig, cancel: CancellationToken) -> anyhow::Result<Arc<Node>> {
        cfg.validate()?;
        let cfg = Arc::new(cfg);
        let metrics = Arc::new(Metrics::new());
        let prefix = Arc::new(PrefixIndex::new(cfg.prefix.max_entries));
        let client = upstream::client(cfg.proxy.connect_timeout());
        let fleet = Fleet::new(cfg.clone(), client, metrics.clone(), prefix.clone(), cancel);
        for rc in &cfg.replicas {
            fleet.add(rc, Origin::Static).map_err(anyhow::Error::msg)?;
        }
        fleet.start_discovery();
        let kv =
            crate::fleet::kv_feed::KvFeeds::new(&cfg.kv_events, &cfg.replicas, metrics.registry());
        kv.start(&fleet);
        let mut tokenizers = HashMap::new();
        for m in &cfg.models {
            if let Some(t) = &m.tokenizer {
                let tok = Tokenizer::from_config(t, m.chat_template.as_deref())
                    .map_err(|e| anyhow::anyhow!("model `{}`: {e}", m.name))?;
                tokenizers.insert(m.name.clone(), tok);
            }
        }
        let trainer = Trainer::start(
            cfg.predictor.clone(),
            &cfg.node_id(),
            std::time::Duration::from_millis(cfg.predictor_publish_ms),
            cfg.predictor_state.clone(),
            cfg.predictor_journal.clone(),
        )?;
        let policy = build_policy(cfg.policy, &trainer, &cfg)?;
        Ok(Arc::new(Node {
            trainer,
            mesh: Default::default(),
            deferred: Deferrals::new(),
            gate: headroom_core::admission::Gate::new(cfg.admission.gate()),
            pd_links: headroom_core::pd::Links::new(cfg.pd.link_model()),
            decision_records: crate::decisions::DecisionRing::new(cfg.decision_records),
            request_log: match &cfg.request_log {
                Some(p) => Some(crate::request_log::RequestLog::open(
                    p,
                    cfg.prefix.block_tokens,
                )?),
                None => None,
            },
            traces: crate::otel::Traces::start(&cfg.tracing)?,
            decisions: Default::default(),
            tenants: Tenants::from_config(&cfg),
            cfg,
            fleet,
            prefix,
            kv,
            policy,
            metrics,
            tokenizers,
            outputs: OutputEstimator::default(),
            text_ratio: Mutex::new(HashMap::new()),
            tokenize_slots: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, |n| n.get()),
            ),
        }))
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
                let ratio = self
                    .text_ratio
                    .lock()
                    .get(&req.model)
                    .copied()
                    .unwrap_or(tokens::EST_BYTES_PER_TOKEN);
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
        let node = self.clone();
        tokio::task::spawn_blocking(move || {
            let shape = node.shape(&req);
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

    /// The random source of the next decision (ties, sampling, exploration): from
    /// `seed` and the decision's number when `seed` is set, so a node replaying the same
    /// requests in the same order decides the same way; from entropy otherwise.
    pub fn decision_rng(&self) -> rand::rngs::SmallRng {
        use rand::SeedableRng;
        let n = self
            .decisions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self.cfg.seed {
            0 => rand::rngs::SmallRng::from_rng(&mut rand::rng()),
            seed => {
                rand::rngs::SmallRng::seed_from_u64(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            }
        }
    }

    /// Expected output tokens (see [`OutputEstimator`]).
    pub fn expected_output(&self, req: &ParsedRequest) -> u32 {
        self.outputs
            .estimate(&req.model, req.max_tokens, req.ignore_eos)
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
    fn report_replica(&self, l: &Learn, replica: &crate::fleet::Replica) {
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

    /// Refines a model's bytes-per-token ratio from a usage report (estimator only).
    fn learn_text_ratio(&self, o: &Outcome) {
        let (Some(bytes), Some(tokens)) = (o.prompt_bytes, o.prompt_tokens) else {
            return;
        };
        if self.tokenizers.contains_key(&o.model) {
            return;
        }
        let mut m = self.text_ratio.lock();
        let prev = m.get(&o.model).copied();
        if let Some(r) = next_text_ratio(prev, bytes, tokens, o.prompt_messages) {
            m.insert(o.model.clone(), r);
        }
    }

    /// Records a finished request: metrics, health and learning.
    pub fn observe(&self, o: Outcome) {
        self.decision_records.update(o.decision, |r| {
            r.measured = Some(crate::decisions::Measured::from_outcome(&o, &r.request));
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
            .with_label_values(&[&o.model, r, o.status.label()])
            .inc();
        if let Some(t) = o.ttft_s {
            m.ttft.with_label_values(&[&o.model, r]).observe(t);
        }
        if let Some(t) = o.tpot_s {
            m.tpot.with_label_values(&[&o.model, r]).observe(t);
        }
        // How far the stream's own measurement is from the engine's (where the engine
        // reports one): the check on labels for engines that report nothing.
        if let (Some(label), Some(itl)) = (o.tpot_stream_s, o.engine_itl_ms.filter(|v| *v > 0.0)) {
            m.tpot_label_ratio
                .with_label_values(&[r])
                .observe(label * 1e3 / itl);
        }
        m.e2e.with_label_values(&[&o.model, r]).observe(o.e2e_s);
        let now = crate::clock::now_ms();
        match o.status {
            OutcomeStatus::Ok => {
                o.replica
                    .health
                    .on_success(Signal::Request, now, &self.cfg.health);
                if let Some(n) = o.output_tokens {
                    self.outputs.observe(&o.model, n);
                }
                self.learn_text_ratio(&o);
            }
            OutcomeStatus::UpstreamFailed | OutcomeStatus::TimedOut => {
                m.upstream_errors
                    .with_label_values(&[r, o.status.label()])
                    .inc();
                if o.replica
                    .health
                    .on_failure(Signal::Request, now, &self.cfg.health)
                {
                    m.ejection(r);
                }
            }
            OutcomeStatus::Cancelled => {}
        }
    }
}

/// The next bytes-per-token estimate after a usage report: an EWMA of bytes over the
/// prompt's text tokens (chat templates' ~4 tokens per message removed); `None` when
/// the report is too small to say anything.
pub fn next_text_ratio(prev: Option<f64>, bytes: usize, tokens: u32, messages: u32) -> Option<f64> {
    let text_tokens = tokens.saturating_sub(4 * messages) as f64;
    if text_tokens < 8.0 || bytes < 32 {
        return None;
    }
    let r = (bytes as f64 / text_tokens).clamp(0.5, 16.0);
    Some(prev.map_or(r, |p| 0.9 * p + 0.1 * r))
}

/// Constructs a policy by name, with the configured knobs.
pub fn build_policy(
    name: PolicyName,
    trainer: &Trainer,
    cfg: &RouterConfig,
) -> anyhow::Result<Box<dyn Policy>> {
    Ok(policy::build(
        name,
        trainer.shared.clone(),
        &cfg.policy_settings(),
    ))
}

#[cfg(test)]
mod tests {
    use rand::RngCore;

    #[tokio::test]
    async fn a_seeded_node_draws_the_same_decisions_again() {
        let start = |seed| {
            let cfg = crate::config::RouterConfig {
                seed,
                ..Default::default()
            };
            super::Node::start(cfg, tokio_util::sync::CancellationToken::new()).unwrap()
        };
        let draw =
            |n: &super::Node| -> Vec<u64> { (0..4).map(|_| n.decision_rng().next_u64()).collect() };
        let (a, b) = (start(7), start(7));
        let first = draw(&a);
        assert_eq!(first, draw(&b), "same seed, same decisions");
        assert_ne!(first[0], first[1], "each decision its own stream");
        assert_ne!(draw(&start(0)), draw(&start(0)), "seed 0: from entropy");
    }

    #[test]
    fn text_ratio_converges_to_what_replicas_report() {
        let mut r = None;
        for _ in 0..60 {
            r = super::next_text_ratio(r, 3000, 1000 + 8, 2).or(r);
        }
        assert!((r.unwrap() - 3.0).abs() < 0.01, "{r:?}");
        assert_eq!(super::next_text_ratio(Some(3.0), 10, 2, 0), None);
        // Absurd reports are clamped, never NaN.
        assert_eq!(super::next_text_ratio(None, 1_000_000, 10, 0), Some(16.0));
    }
}
