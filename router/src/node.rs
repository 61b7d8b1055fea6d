//! A router node's shared state: configuration, fleet, prefix index, policy,
//! tenants, tokenizers and metrics. Handlers hold an `Arc<Node>`.

use std::{collections::HashMap, sync::Arc};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

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

/// Default output estimate when a model has no history yet and no max_tokens.
const DEFAULT_OUTPUT_TOKENS: f64 = 256.0;

pub struct Node {
    pub cfg: Arc<RouterConfig>,
    pub fleet: Arc<Fleet>,
    pub prefix: Arc<PrefixIndex>,
    pub policy: Box<dyn Policy>,
    pub metrics: Arc<Metrics>,
    pub tenants: Tenants,
    pub trainer: Arc<Trainer>,
    /// The mesh, once joined.
    pub mesh: std::sync::OnceLock<Arc<crate::mesh::MeshRuntime>>,
    /// Requests currently deferred (bounded by `slo.max_deferred`).
    pub deferred: std::sync::atomic::AtomicUsize,
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
        );
        let policy = build_policy(cfg.policy, &trainer, &cfg)?;
        Ok(Arc::new(Node {
            trainer,
            mesh: Default::default(),
            deferred: Default::default(),
            tenants: Tenants::from_config(&cfg),
            cfg,
            fleet,
            prefix,
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

    /// Token count and prefix blocks of a request's prompt.
    pub fn shape(&self, req: &ParsedRequest) -> PromptShape {
        let block = self.cfg.prefix.block_tokens as usize;
        let max_blocks = self.cfg.prefix.max_blocks_per_request;
        match &req.prompt {
            PromptInput::Ids(ids) => tokens::shape_of_ids(ids, block, max_blocks),
            PromptInput::Text(t) => {
                let tok = self
                    .tokenizers
                    .get(&req.model)
                    .unwrap_or(&Tokenizer::Estimate);
                // The model's chat template renders the exact prompt (what the engine
                // sees), so no per-message allowance applies then.
                if req.endpoint == Endpoint::ChatCompletions
                    && let Some(s) =
                        tokens::shape_of_chat(tok, &req.upstream_body, block, max_blocks)
                {
                    return s;
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

    /// [`Node::shape`], run on the blocking pool when the prompt is long text for a real
    /// tokenizer (see [`OFFLOAD_TOKENIZE_BYTES`], [`OFFLOAD_HF_TOKENIZE_BYTES`]); inline
    /// otherwise. Fails only when the blocking pool is gone (the node is shutting down)
    /// or the tokenizer panicked.
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
        let l = as_reported(l, reported);
        let at = crate::trainer::wall_s();
        if let Some(s) = crate::decide::sample(&l, at, Some(ttft_ms), None, 0, false) {
            self.trainer.submit(s);
        }
    }

    /// The labels known at the end: TPOT (the engine's own, else measured from the
    /// stream with its token counts), and TTFT if no token came (then only a lower
    /// bound: censored).
    fn learn(&self, o: &Outcome) {
        let Some(l) = o.learn else { return };
        self.report_replica(&l, &o.replica);
        let ok = o.status == OutcomeStatus::Ok;
        let tpot_ms = o.tpot_label_s().map(|s| s * 1e3).filter(|_| ok);
        if let Some(y) = tpot_ms {
            self.score("tpot", y, l.prediction.tpot_ms, l.prediction.tpot_upper_ms);
        }
        let ttft_ms = if o.ttft_learned {
            None
        } else {
            match o.ttft_s {
                Some(t) => {
                    self.score(
                        "ttft",
                        t * 1e3,
                        l.prediction.ttft_ms,
                        l.prediction.ttft_upper_ms,
                    );
                    Some(t * 1e3)
                }
                // No token ever came: the request waited at least this long.
                None if !ok => Some(o.upstream_s * 1e3),
                None => None,
            }
        };
        let censored = ttft_ms.is_some() && o.ttft_s.is_none();
        let l = as_reported(
            &l,
            Reported {
                prompt_tokens: o.prompt_tokens,
                cached_tokens: o.cached_tokens,
            },
        );
        let at = crate::trainer::wall_s();
        let out = o.output_tokens.unwrap_or(0);
        // TTFT and TPOT travel separately: one may be censored while the other is not.
        if let Some(s) = crate::decide::sample(&l, at, ttft_ms, None, out, censored) {
            self.trainer.submit(s);
        }
        if let Some(s) = crate::decide::sample(&l, at, None, tpot_ms, out, false) {
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

/// `l` with the request's own inputs as the engine reported them: its prompt tokens,
/// and cached tokens where given (else the router's estimate, within the prompt). The
/// model then learns what the engine did, not what the router guessed at dispatch.
fn as_reported(l: &Learn, r: Reported) -> Learn {
    let mut l = *l;
    if let Some(p) = r.prompt_tokens.filter(|p| *p > 0) {
        l.obs.prompt_tokens = f64::from(p);
    }
    if let Some(c) = r.cached_tokens {
        l.obs.cached_tokens = f64::from(c);
    }
    l.obs.cached_tokens = l.obs.cached_tokens.min(l.obs.prompt_tokens);
    l
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

/// Constructs a policy by name.
pub fn build_policy(
    name: PolicyName,
    trainer: &Trainer,
    cfg: &RouterConfig,
) -> anyhow::Result<Box<dyn Policy>> {
    Ok(policy::build_with(
        name,
        trainer.shared.clone(),
        cfg.slo.clone(),
        cfg.prefix_affinity.clone(),
    ))
}

/// The router's estimate of a request's output length: exact under `ignore_eos`,
/// else the model's observed mean (EWMA over completions), capped by `max_tokens`.
#[derive(Debug, Default)]
pub struct OutputEstimator {
    mean: Mutex<HashMap<String, f64>>,
}

impl OutputEstimator {
    pub fn estimate(&self, model: &str, max_tokens: Option<u32>, ignore_eos: bool) -> u32 {
        if let (true, Some(m)) = (ignore_eos, max_tokens) {
            return m;
        }
        let mean = self
            .mean
            .lock()
            .get(model)
            .copied()
            .unwrap_or(DEFAULT_OUTPUT_TOKENS);
        let est = mean.round().max(1.0) as u32;
        max_tokens.map_or(est, |m| m.min(est).max(1))
    }

    pub fn observe(&self, model: &str, output_tokens: u32) {
        let mut means = self.mean.lock();
        let e = means
            .entry(model.to_string())
            .or_insert(output_tokens as f64);
        *e = 0.95 * *e + 0.05 * output_tokens as f64;
    }
}

#[cfg(test)]
mod tests {
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
