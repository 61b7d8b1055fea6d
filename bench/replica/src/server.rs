//! HTTP routes of the emulator (axum): the OpenAI endpoints, `/v1/models`,
//! `/health`, `/metrics` and `/admin/faults`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use headroom_engine::hashing::mix64;
use headroom_engine::{EngineRequest, block_hashes_for_tokens_salted, salt_for_adapter};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::api_error::ApiError;
use super::driver::Command;
use super::faults::{Faults, FaultsPatch};
use super::generation::eos_after;
use super::kv_events::KvPrompt;
use super::metrics::ReplicaMetrics;
use super::pd::{self, KvTransfer, PdEmulation};
use super::request::{self, Endpoint};
use super::response::Meta;
use super::stream::{AbortGuard, Generation, collect, sse_response};
use super::tokenize::prompt_token_ids;

/// Largest request body accepted (a 131k-token prompt is < 1 MiB as JSON).
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// State shared by every handler.
pub struct AppState {
    pub model: String,
    pub adapters: Vec<String>,
    pub max_model_len: u32,
    pub block_size: u32,
    pub seed: u64,
    pub created: u64,
    pub commands: mpsc::Sender<Command>,
    pub faults: watch::Sender<Faults>,
    pub metrics: Arc<ReplicaMetrics>,
    /// Seeded draws for injected faults, in request order.
    pub fault_rng: Mutex<ChaCha8Rng>,
    pub next_id: AtomicU64,
    pub cancel: CancellationToken,
    /// `GET /kv_event_sources` (vLLM's shape) when KV events are published.
    pub kv_event_sources: Option<serde_json::Value>,
    /// Prefill/decode role and KV transfer model.
    pub pd: PdEmulation,
    /// `remote_engine_id` in the prefill responses' `kv_transfer_params`.
    pub engine_id: String,
    /// Wall seconds per modelled second (the transfer wait is scaled by it).
    pub time_scale: f64,
}

/// The emulator's router.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/kv_event_sources", get(kv_event_sources))
        .route("/metrics", get(metrics))
        .route("/admin/faults", get(get_faults).post(post_faults))
        .with_state(state)
}

async fn completions(
    State(s): State<Arc<AppState>>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    generate(s, Endpoint::Completions, request_id(&headers), body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat(
    State(s): State<Arc<AppState>>,
    headers: axum::http::HeaderMap,
    body: Body,
) -> Response {
    generate(s, Endpoint::Chat, request_id(&headers), body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The client's `X-Request-Id` (vLLM uses it as the request's id), if valid text.
fn request_id(h: &axum::http::HeaderMap) -> Option<String> {
    h.get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

async fn read_body(body: Body) -> Result<axum::body::Bytes, ApiError> {
    axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| {
            let too_large = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if too_large {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("request body exceeds {MAX_BODY_BYTES} bytes"),
                )
            } else {
                ApiError::bad_request(format!("could not read request body: {e}"))
            }
        })
}

/// Served name and LoRA adapter (if any) for a requested model name.
fn resolve_model(
    s: &AppState,
    requested: Option<String>,
) -> Result<(String, Option<String>), ApiError> {
    match requested {
        None => Ok((s.model.clone(), None)),
        Some(m) if m == s.model => Ok((m, None)),
        Some(m) if s.adapters.contains(&m) => Ok((m.clone(), Some(m))),
        Some(m) => Err(ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!("The model `{m}` does not exist."),
            )
        }),
    }
}

/// Seeded draws: (fail before any byte, fail mid-generation).
fn draw_faults(s: &AppState) -> (bool, bool) {
    let f = *s.faults.borrow();
    let mut rng = s.fault_rng.lock().unwrap_or_else(|p| p.into_inner());
    let early = f.error_rate > 0.0 && rng.random::<f64>() < f.error_rate;
    let mid = f.midstream_error_rate > 0.0 && rng.random::<f64>() < f.midstream_error_rate;
    (early, mid)
}

async fn generate(
    s: Arc<AppState>,
    endpoint: Endpoint,
    request_id: Option<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(body).await?;
    let req = request::parse(endpoint, &bytes)?;
    if let Some(t) = &req.kv_transfer {
        pd::check_role(s.pd.role, t)?;
    }
    let (served, adapter) = resolve_model(&s, req.model.clone())?;
    let (fail_early, fail_mid) = draw_faults(&s);
    if fail_early {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "injected fault: the replica failed this request",
        ));
    }
    // Tokenizing and hashing a long prompt takes milliseconds: keep it off the
    // async workers.
    let prompt = req.prompt.clone();
    let (bs, salt) = (s.block_size as usize, salt_for_adapter(adapter.as_deref()));
    let keep_ids = s.kv_event_sources.is_some();
    let (n_prompt, hashes, ids) = tokio::task::spawn_blocking(move || {
        prompt_token_ids(&prompt).map(|ids| {
            let h = block_hashes_for_tokens_salted(&ids, bs, salt);
            (ids.len(), h, keep_ids.then_some(ids))
        })
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("tokenizer task failed: {e}"),
        )
    })?
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
    if n_prompt == 0 {
        return Err(ApiError::bad_param("prompt", "the prompt is empty"));
    }
    let n_prompt = u32::try_from(n_prompt).unwrap_or(u32::MAX);
    let max_len = s.max_model_len;
    // As vLLM 0.32 (`get_max_tokens`): a prompt that fills the context is refused, and
    // max_tokens past its end is cut to what is left (the stream stops at the end).
    if n_prompt >= max_len {
        return Err(ApiError::bad_param(
            "prompt",
            format!(
                "This model's maximum context length is {max_len} tokens. However, your \
                 request has {n_prompt} input tokens. Please reduce the length of the input \
                 messages."
            ),
        ));
    }
    if req.max_tokens == Some(0) {
        return Err(ApiError::bad_param(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
    }
    let room = max_len - n_prompt;
    let max_tokens = req.max_tokens.map_or(room, |m| m.min(room));
    if let Some(KvTransfer::Decode { remote_num_tokens }) = req.kv_transfer {
        receive_kv(&s, &hashes, remote_num_tokens.unwrap_or(n_prompt)).await?;
    }
    let n_blocks = hashes.len();
    let id = s.next_id.fetch_add(1, Ordering::Relaxed);
    let seed = req.seed.unwrap_or_else(|| mix64(s.seed ^ mix64(id)));
    let eos = match req.emulator_output_tokens {
        Some(n) => (n < max_tokens).then_some(n),
        None => eos_after(seed, req.ignore_eos, req.min_tokens, max_tokens),
    };
    let fail_after = fail_mid.then(|| eos.unwrap_or(max_tokens) / 2);
    let (tx, rx) = mpsc::channel(max_tokens as usize + 2);
    let engine_req = EngineRequest {
        id,
        prompt_tokens: n_prompt,
        block_hashes: hashes,
        max_output_tokens: max_tokens,
        eos_after: eos,
    };
    s.commands
        .send(Command::Submit {
            req: engine_req,
            tx,
            kv: ids.map(|ids| KvPrompt {
                tokens: ids.into(),
                adapter: adapter.clone(),
            }),
        })
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine is shut down"))?;
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let g = Generation {
        meta: Meta {
            endpoint,
            id: format!("{prefix}-{:016x}{:016x}", mix64(seed), mix64(id ^ s.seed)),
            created: unix_now(),
            model: served,
            include_usage: req.include_usage,
            // vLLM: `continuous_usage_stats` only acts together with `include_usage`.
            continuous_usage: req.include_usage && req.continuous_usage,
            prompt_tokens: n_prompt,
        },
        rx,
        guard: AbortGuard {
            id,
            commands: s.commands.clone(),
            armed: true,
        },
        seed,
        fail_after,
    };
    let remote_request_id = request_id.unwrap_or_else(|| g.meta.id.clone());
    if req.stream {
        Ok(sse_response(g))
    } else if req.kv_transfer == Some(KvTransfer::Prefill) {
        let resp = collect(g).await?;
        let params =
            pd::prefill_response_params(&s.engine_id, &remote_request_id, n_blocks, n_prompt);
        with_kv_transfer_params(resp, params).await
    } else {
        collect(g).await
    }
}

/// Pulls the remote prefill's blocks of this prompt (up to `remote_tokens` tokens)
/// into the engine's cache, after the modelled transfer time of those not held.
async fn receive_kv(s: &AppState, hashes: &[u64], remote_tokens: u32) -> Result<(), ApiError> {
    let bs = s.block_size.max(1);
    let n = hashes.len().min((remote_tokens / bs) as usize);
    let (reply, pulled) = tokio::sync::oneshot::channel();
    s.commands
        .send(Command::Import {
            block_hashes: hashes[..n].to_vec(),
            reply,
        })
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine is shut down"))?;
    let pulled = pulled
        .await
        .map_err(|_| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine is shut down"))?;
    let wait = s.pd.transfer_s(pulled.saturating_mul(bs)) * s.time_scale;
    tokio::select! {
        _ = tokio::time::sleep(std::time::Duration::from_secs_f64(wait)) => Ok(()),
        _ = s.cancel.cancelled() => Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down")),
    }
}

/// The prefill's JSON response with vLLM's `kv_transfer_params` member added.
async fn with_kv_transfer_params(
    resp: Response,
    params: serde_json::Value,
) -> Result<Response, ApiError> {
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES)
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let mut v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if let Some(o) = v.as_object_mut() {
        o.insert("kv_transfer_params".into(), params);
    }
    let mut out = Json(v).into_response();
    *out.status_mut() = parts.status;
    Ok(out)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn models(State(s): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let card = |id: &str, root: &str, parent: Option<&str>| {
        json!({
            "id": id, "object": "model", "created": s.created, "owned_by": "vllm",
            "root": root, "parent": parent, "max_model_len": s.max_model_len,
            "permission": [{
                "id": format!("modelperm-{:016x}", mix64(s.seed ^ id.len() as u64)),
                "object": "model_permission", "created": s.created, "allow_create_engine": false,
                "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
                "allow_view": true, "allow_fine_tuning": false, "organization": "*",
                "group": null, "is_blocking": false,
            }],
        })
    };
    let mut data = vec![card(&s.model, &s.model, None)];
    data.extend(s.adapters.iter().map(|a| card(a, a, Some(&s.model))));
    Json(json!({"object": "list", "data": data}))
}

/// 200 with an empty body; hangs while the engine is stalled (see `faults`).
/// vLLM's `GET /kv_event_sources`: the publisher config per DP rank, `{}` if off.
async fn kv_event_sources(State(s): State<Arc<AppState>>) -> Json<serde_json::Value> {
    Json(s.kv_event_sources.clone().unwrap_or_else(|| json!({})))
}

async fn health(State(s): State<Arc<AppState>>) -> StatusCode {
    let mut rx = s.faults.subscribe();
    loop {
        if !rx.borrow_and_update().stall {
            return StatusCode::OK;
        }
        tokio::select! {
            changed = rx.changed() => if changed.is_err() { return StatusCode::SERVICE_UNAVAILABLE },
            _ = s.cancel.cancelled() => return StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    match s.metrics.render() {
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn get_faults(State(s): State<Arc<AppState>>) -> Json<Faults> {
    Json(*s.faults.borrow())
}

async fn post_faults(State(s): State<Arc<AppState>>, body: Body) -> Response {
    let result = async {
        let bytes = read_body(body).await?;
        let patch: FaultsPatch = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("invalid faults JSON: {e}")))?;
        let mut outcome = Ok(Faults::default());
        s.faults.send_if_modified(|f| match f.patched(&patch) {
            Ok(next) => {
                let changed = next != *f;
                *f = next;
                outcome = Ok(next);
                changed
            }
            Err(e) => {
                outcome = Err(ApiError::bad_request(e));
                false
            }
        });
        outcome
    }
    .await;
    match result {
        Ok(f) => Json(f).into_response(),
        Err(e) => e.into_response(),
    }
}
