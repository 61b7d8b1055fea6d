//! The `headroom-replica` crate: the emulator library and its binary (`src/main.rs`).
//! It depends on `headroom-engine` (the model it paces) and never on `headroom-bench`; one
//! driver task alone owns the engine.
//!
//! `headroom-replica`: an HTTP server that behaves like `vllm serve` for one model,
//! paced by the [`headroom_engine`] model in real time.
//!
//! Layout: one driver task owns the engine ([`driver`]); axum handlers parse and
//! validate requests ([`request`]), tokenize ([`tokenize`]), submit over a bounded
//! channel and turn token deliveries into SSE or JSON ([`stream`], [`response`]).
//! `/metrics` serves vLLM's metric names ([`metrics`]); `--role prefill|decode` serves
//! vLLM's NixlConnector disaggregated flow with a KV transfer model ([`pd`]); `/admin/faults` sets the
//! fault knobs ([`faults`]). With `kv_events` set, the engine's prefix-cache
//! changes are published as vLLM KV events ([`kv_events`]) and `/kv_event_sources`
//! describes the publisher as vLLM's does.
//!
//! Time scale: every modelled duration is multiplied by `time_scale` before the
//! driver sleeps (1.0 = the profile's GPU speed, 0.1 = ten times faster). Latency
//! histograms on `/metrics` are in wall-clock seconds, i.e. already scaled.

pub mod api_error;
pub mod driver;
pub mod faults;
pub mod generation;
pub mod kv_events;
pub mod metrics;
pub mod pd;
pub mod request;
pub mod response;
pub mod server;
pub mod stream;
pub mod tokenize;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use axum::serve::ListenerExt;
use headroom_engine::{Engine, EngineError, Frontend, Profile};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use driver::Driver;
use faults::Faults;
use metrics::ReplicaMetrics;
use server::AppState;

/// Depth of the handler → driver command queue (submissions wait when it is full).
pub const COMMAND_QUEUE: usize = 4096;

/// Everything `headroom-replica` is started with.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// Served model name (`--model`).
    pub model: String,
    /// LoRA adapter names served on top (`--lora`).
    pub adapters: Vec<String>,
    /// Hardware profile, with any overrides applied.
    pub profile: Profile,
    /// Wall seconds per modelled second.
    pub time_scale: f64,
    /// Seeds output lengths, filler text, fault draws and step noise.
    pub seed: u64,
    /// Lognormal log-sd of step-time noise (0 = off; the binary's default is
    /// [`headroom_engine::DEFAULT_STEP_NOISE`]).
    pub step_noise: f64,
    /// Fault knobs at start.
    pub faults: Faults,
    /// Publish KV events (vLLM's `--kv-events-config`), if set.
    pub kv_events: Option<kv_events::KvEventsOptions>,
    /// Prefill/decode role and KV transfer model.
    pub pd: pd::PdEmulation,
}

/// Why the emulator could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("invalid replica configuration: {0}")]
    Config(String),
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl ReplicaConfig {
    /// Checks the knobs that the engine does not check itself.
    pub fn validate(&self) -> Result<(), ReplicaError> {
        if !(self.time_scale.is_finite() && self.time_scale > 0.0 && self.time_scale <= 1000.0) {
            return Err(ReplicaError::Config(format!(
                "time scale must be in (0, 1000], got {}",
                self.time_scale
            )));
        }
        if self.model.is_empty()
            || self
                .adapters
                .iter()
                .any(|a| a.is_empty() || *a == self.model)
        {
            return Err(ReplicaError::Config(
                "model and adapter names must be non-empty and distinct".into(),
            ));
        }
        self.faults.validate().map_err(ReplicaError::Config)?;
        self.pd.validate().map_err(ReplicaError::Config)?;
        self.profile.validate()?;
        Ok(())
    }
}

/// Serves on `listener` until `cancel` fires, then drains and returns.
pub async fn serve(
    config: ReplicaConfig,
    listener: TcpListener,
    cancel: CancellationToken,
) -> Result<(), ReplicaError> {
    config.validate()?;
    let mut engine = Engine::new(&config.profile, config.seed)?;
    engine.set_step_noise(config.step_noise)?;
    let kv = match &config.kv_events {
        Some(o) => {
            let mut pc = headroom_kv_events::publisher::PublisherConfig::new(o.endpoint.clone());
            pc.replay_endpoint = o.replay_endpoint.clone();
            pc.topic = o.topic.clone();
            pc.buffer_steps = o.buffer_steps;
            let p = headroom_kv_events::publisher::Publisher::start(pc, cancel.clone())
                .await
                .map_err(|e| ReplicaError::Config(format!("kv events: {e}")))?;
            tracing::info!(
                "kv events on {} (replay {:?})",
                p.endpoint(),
                p.replay_endpoint()
            );
            engine.enable_kv_log();
            Some(kv_events::KvPublish::new(p, config.profile.block_size))
        }
        None => None,
    };
    let kv_event_sources = kv.as_ref().map(|k| {
        serde_json::json!({"0": {
            "enable_kv_cache_events": true,
            "publisher": "zmq",
            "endpoint": k.publisher().endpoint(),
            "replay_endpoint": k.publisher().replay_endpoint(),
            "buffer_steps": config.kv_events.as_ref().map_or(0, |o| o.buffer_steps),
            "topic": config.kv_events.as_ref().map_or("", |o| o.topic.as_str()),
        }})
    });
    let frontend = Frontend::new(config.profile.stream_interval, config.profile.frontend)?;
    let metrics = Arc::new(ReplicaMetrics::new(&config.model, &config.profile)?);
    let (cmd_tx, cmd_rx) = mpsc::channel(COMMAND_QUEUE);
    let (faults_tx, faults_rx) = watch::channel(config.faults);
    let driver = tokio::spawn(
        Driver {
            engine,
            frontend,
            commands: cmd_rx,
            faults: faults_rx,
            metrics: metrics.clone(),
            time_scale: config.time_scale,
            cancel: cancel.clone(),
            kv,
        }
        .run(),
    );
    // Build the tokenizer now rather than on the first request.
    let warm = tokio::task::spawn_blocking(tokenize::warm_up);
    let state = Arc::new(AppState {
        model: config.model.clone(),
        adapters: config.adapters.clone(),
        max_model_len: config.profile.max_model_len,
        block_size: config.profile.block_size,
        seed: config.seed,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        commands: cmd_tx,
        faults: faults_tx,
        metrics,
        fault_rng: Mutex::new(ChaCha8Rng::seed_from_u64(config.seed ^ 0xfa17)),
        next_id: AtomicU64::new(0),
        cancel: cancel.clone(),
        kv_event_sources,
        pd: config.pd,
        engine_id: format!("headroom-replica-{:016x}", config.seed),
        time_scale: config.time_scale,
    });
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY failed: {e}");
        }
    });
    let served = axum::serve(listener, server::router(state))
        .with_graceful_shutdown(cancel.clone().cancelled_owned())
        .await;
    cancel.cancel();
    let _ = driver.await;
    if let Ok(Err(e)) = warm.await {
        tracing::warn!("tokenizer warm-up failed: {e}");
    }
    served.map_err(ReplicaError::Io)
}
