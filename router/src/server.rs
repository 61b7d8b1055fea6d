//! The HTTP front: OpenAI endpoints, health, readiness, metrics and debug views.

use std::{net::SocketAddr, sync::Arc, time::Instant};

use anyhow::Context;
use axum::{
    Extension, Json, Router,
    body::Body,
    extract::{DefaultBodyLimit, Path, Query, State, rejection::QueryRejection},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    admission, clock,
    decisions::{self, Asked},
    edge::{self, listen::Peer},
    error::ApiError,
    node::RequestPath,
    otel::RequestTrace,
    policy::RequestProfile,
    proxy,
    request::{self, Endpoint},
};

/// The client application: OpenAI endpoints, health and readiness, plus the admin
/// endpoints (`/metrics`, `/debug/*`) unless `edge.admin_listen` moves them away.
/// Unknown paths and methods get OpenAI-shaped errors.
pub fn app(path: Arc<RequestPath>) -> Router {
    let admin_here = path.cfg.edge.admin_listen.is_none();
    let mut r = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(ready));
    if admin_here {
        r = r.merge(admin_routes(&path));
    }
    finish(r, path)
}

/// The admin application (`edge.admin_listen`): health, readiness, metrics, debug.
pub fn admin_app(path: Arc<RequestPath>) -> Router {
    let r = Router::new()
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .merge(admin_routes(&path));
    finish(r, path)
}

fn admin_routes(path: &Arc<RequestPath>) -> Router<Arc<RequestPath>> {
    let token: Option<Arc<str>> = path.cfg.edge.admin_token.as_deref().map(Arc::from);
    Router::new()
        .route("/metrics", get(metrics))
        .route("/debug/replicas", get(debug_replicas))
        .route("/debug/cluster", get(debug_cluster))
        .route("/debug/predictor", get(debug_predictor))
        .route("/debug/decisions", get(decisions_list))
        .route("/debug/decisions/{id}", get(decisions_one))
        .route("/debug/summary", get(decisions_summary))
        .route("/dashboard", get(crate::dashboard::page))
        .route_layer(axum::middleware::from_fn_with_state(
            token,
            edge::admin::require_token,
        ))
}

fn finish(r: Router<Arc<RequestPath>>, path: Arc<RequestPath>) -> Router {
    r.fallback(|| async {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            "No such endpoint on this router.",
        )
    })
    .method_not_allowed_fallback(|| async {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "Method not allowed on this endpoint.",
        )
    })
    // Size is enforced by `read_body` so the error is OpenAI-shaped.
    .layer(DefaultBodyLimit::disable())
    .with_state(path)
}

/// Serves until `cancel` fires, then drains in-flight requests. Opens the admin
/// listener too when `edge.admin_listen` is set, and speaks TLS on the client listener
/// when `edge.tls_cert`/`edge.tls_key` are.
pub async fn serve(
    path: Arc<RequestPath>,
    listener: tokio::net::TcpListener,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    let e = &path.cfg.edge;
    let tls = match (&e.tls_cert, &e.tls_key) {
        (Some(c), Some(k)) => Some(edge::tls::acceptor(c, k)?),
        _ => None,
    };
    let edge = edge::listen::Edge::new(e, path.metrics.registry());
    let admin = match e.admin_listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot listen on edge.admin_listen {a}"))?,
        ),
        None => None,
    };
    tracing::info!(%addr, tls = tls.is_some(), policy = path.policy.name(), "headroom router listening");
    let admin_task = admin.map(|l| {
        if let Ok(a) = l.local_addr() {
            tracing::info!(addr = %a, "admin endpoints listening");
        }
        let (edge, app, cancel) = (edge.clone(), admin_app(path.clone()), cancel.clone());
        tokio::spawn(async move { edge.serve(l, app, None, cancel).await })
    });
    edge.serve(listener, app(path), tls, cancel).await?;
    if let Some(t) = admin_task {
        t.await??;
    }
    Ok(())
}

async fn read_body(
    path: &RequestPath,
    headers: &HeaderMap,
    body: Body,
) -> Result<bytes::Bytes, ApiError> {
    let limit = path.cfg.proxy.max_body_bytes;
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::too_large(limit));
    }
    let timeout = path.cfg.edge.body_read_timeout();
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err(ApiError::too_large(limit)),
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "The request body did not arrive within {} ms.",
                timeout.as_millis()
            ),
        )),
    }
}

async fn handle(
    path: Arc<RequestPath>,
    endpoint: Endpoint,
    peer: Option<Peer>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let mut record = None;
    let record = &mut record;
    // Off: `None`, and every trace hook below is one test.
    let mut trace = path
        .outcomes
        .traces
        .as_ref()
        .map(|t| t.request(endpoint, &headers));
    let trace_ref = &mut trace;
    let result = async {
        // Identity first: an unauthenticated client never gets its body buffered.
        let tenant = path.tenants.resolve(&headers)?;
        let bytes = read_body(&path, &headers, body).await?;
        let parsed = request::parse(endpoint, &bytes, path.cfg.proxy.chunk_usage)?;
        let (parsed, shape) = path.shape_off_worker(parsed).await?;
        let exact_cached = match &shape.ids {
            Some(ids) => path
                .kv
                .exact_cached(&parsed.model, ids, &path.fleet.replicas()),
            None => Vec::new(),
        };
        let profile = RequestProfile {
            model: parsed.model.clone(),
            prompt_tokens: shape.tokens,
            blocks: shape.blocks,
            max_tokens: parsed.max_tokens,
            expected_output_tokens: path.expected_output(&parsed),
            slo: tenant.slo,
            priority: tenant.priority,
            fallback: tenant.fallback,
            stream: parsed.stream,
            exact_cached,
        };
        let upstream = edge::headers::upstream_headers(&headers, peer.map(|p| p.0.ip()));
        if let Some(t) = trace_ref.as_deref() {
            t.asked(&tenant.name, &profile);
        }
        // The tenant's turn at the gate; the permit lives as long as the response body.
        let span = trace_ref.as_deref().map(RequestTrace::admit);
        let permit = admission::admit(&path, &tenant, &profile, arrived).await;
        if let Some(s) = span {
            RequestTrace::admitted(s, permit.as_ref().err().map(|e| e.message.as_str()));
        }
        let permit = permit?;
        *record = path.records().open(Asked::new(
            &tenant.name,
            &profile,
            path.outcomes.request_log.is_some(),
        ));
        if let Some(t) = trace_ref.as_deref() {
            t.decision_id(*record);
        }
        let failover = tenant.failover;
        let resp = proxy::forward(
            path.clone(),
            parsed,
            profile,
            upstream,
            arrived,
            failover,
            (*record, trace_ref),
        )
        .await?;
        Ok::<_, ApiError>(admission::PermitBody::wrap(resp, permit))
    }
    .await;
    let record = *record;
    let failed = result
        .as_ref()
        .err()
        .map(|e| format!("{} {}", e.status.as_u16(), e.message));
    if let Err(e) = &result {
        path.records()
            .note_end(record, format!("{} {}", e.status.as_u16(), e.message));
    }
    let mut resp = respond_to(&path, result).await;
    // Still here: the response is not a routed stream (an error, a replica's answer
    // passed through); the stream's body ends the trace otherwise.
    if let Some(t) = trace {
        let why =
            failed.or_else(|| (!resp.status().is_success()).then(|| resp.status().to_string()));
        t.end_status(resp.status().as_u16(), why.as_deref());
    }
    if let Some(id) = record {
        resp.headers_mut()
            .insert(crate::DECISION_HEADER, http::HeaderValue::from(id));
    }
    resp
}

async fn respond_to(path: &RequestPath, result: Result<Response, ApiError>) -> Response {
    match result {
        Ok(resp) if !resp.status().is_success() && !is_json(resp.headers()) => {
            openai_shaped(resp).await
        }
        Ok(resp) => resp,
        Err(e) => {
            path.metrics
                .requests
                .with_label_values(&[
                    "-",
                    e.replica.as_deref().unwrap_or("none"),
                    &e.status.as_u16().to_string(),
                ])
                .inc();
            e.into_response()
        }
    }
}

fn is_json(h: &HeaderMap) -> bool {
    h.get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"))
}

/// A replica's error that is not JSON (a proxy's HTML page, plain text) rewritten as an
/// OpenAI error with the same status, naming the replica; the text is kept, bounded.
async fn openai_shaped(resp: Response) -> Response {
    let (parts, body) = resp.into_parts();
    let text = match tokio::time::timeout(
        std::time::Duration::from_secs(5),
        axum::body::to_bytes(body, 64 * 1024),
    )
    .await
    {
        Ok(Ok(b)) => String::from_utf8_lossy(&b)
            .trim()
            .chars()
            .take(300)
            .collect(),
        _ => String::new(),
    };
    let kind = if parts.status.is_client_error() {
        "invalid_request_error"
    } else {
        "upstream_error"
    };
    let mut e = ApiError::new(
        parts.status,
        kind,
        if text.is_empty() {
            format!("The replica answered {}.", parts.status)
        } else {
            format!("The replica answered {}: {text}", parts.status)
        },
    );
    e.replica = parts
        .headers
        .get(crate::REPLICA_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    e.into_response()
}

async fn completions(
    State(path): State<Arc<RequestPath>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let peer = peer.map(|Extension(p)| p);
    handle(path, Endpoint::Completions, peer, headers, body).await
}

async fn chat(
    State(path): State<Arc<RequestPath>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let peer = peer.map(|Extension(p)| p);
    handle(path, Endpoint::ChatCompletions, peer, headers, body).await
}

/// The fleet's models and adapters (union over replicas that answered).
async fn models(State(path): State<Arc<RequestPath>>) -> Json<Value> {
    let mut seen = std::collections::BTreeMap::new();
    for r in path.fleet.replicas().iter() {
        for m in &r.models.load().models {
            let e = seen
                .entry(m.id.clone())
                .or_insert_with(|| (m.clone(), 0u32));
            e.1 += u32::from(r.health.routable());
            e.0.max_model_len = e.0.max_model_len.max(m.max_model_len);
        }
    }
    let data: Vec<Value> = seen
        .into_values()
        .map(|(m, healthy)| {
            json!({
                "id": m.id, "object": "model", "owned_by": "headroom",
                "parent": m.parent, "max_model_len": m.max_model_len,
                "healthy_replicas": healthy,
            })
        })
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

async fn ready(State(path): State<Arc<RequestPath>>) -> Response {
    let n = path
        .fleet
        .replicas()
        .iter()
        .filter(|r| r.health.routable())
        .count();
    if n > 0 {
        (StatusCode::OK, format!("ready: {n} healthy replicas\n")).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no healthy replica\n",
        )
            .into_response()
    }
}

async fn metrics(State(path): State<Arc<RequestPath>>) -> Response {
    use std::sync::atomic::Ordering::Relaxed;
    admission::publish(&path);
    path.kv.export(&path.fleet);
    path.metrics
        .predictor_learned
        .set(path.outcomes.trainer.learned.load(Relaxed) as i64);
    path.metrics
        .predictor_dropped
        .set(path.outcomes.trainer.dropped.load(Relaxed) as i64);
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        path.metrics.render(),
    )
        .into_response()
}

async fn debug_replicas(State(path): State<Arc<RequestPath>>) -> Json<Value> {
    let now = clock::now_s();
    let now_ms = clock::now_ms();
    let list: Vec<Value> = path
        .fleet
        .replicas()
        .iter()
        .map(|r| {
            let scraped = r.scraped.load();
            let own = r.ledger.load(now);
            let peer = r.peer_load.load();
            json!({
                "name": r.name, "url": r.url, "class": r.class, "region": r.region,
                "health": r.health.state(), "routable": r.health.routable(),
                "consecutive_failures": r.health.consecutive_failures(),
                "ejections": r.health.total_ejections(),
                "last_ejection_age_s": r.health.last_ejection_age_s(now_ms),
                "backpressure_429s": r.health.backpressure_total(),
                "last_backpressure_age_s": r.health.last_backpressure_age_s(now_ms),
                "models": &r.models.load().models,
                "scraped": scraped.as_ref(),
                "scraped_age_s": scraped.as_ref().map(|s| now - s.at_s),
                "inflight": {
                    "requests": own.requests, "queued_requests": own.queued_requests,
                    "queued_prefill_tokens": own.queued_prefill_tokens,
                    "decoding_requests": own.decoding_requests,
                    "decode_context_tokens": own.decode_context_tokens,
                    "decode_remaining_tokens": own.decode_remaining_tokens,
                    "prefill_inflow_tps": own.prefill_inflow_tps,
                    "completed": r.ledger.completed(),
                },
                "peer_inflight": { "requests": peer.load.requests, "age_s": now - peer.updated_s },
                "kv_events": path.kv.debug(r),
            })
        })
        .collect();
    Json(json!({
        "replicas": list,
        "prefix_index_entries": path.prefix.len(),
        "kv_index": path.kv.index_debug(),
    }))
}

async fn decisions_one(State(path): State<Arc<RequestPath>>, Path(id): Path<String>) -> Response {
    decisions::api::one(path.records(), &id)
}

async fn decisions_list(
    State(path): State<Arc<RequestPath>>,
    q: Result<Query<decisions::Query>, QueryRejection>,
) -> Response {
    decisions::api::list(path.records(), q)
}

async fn decisions_summary(State(path): State<Arc<RequestPath>>) -> Json<Value> {
    decisions::api::summary(path.records())
}

async fn debug_cluster(State(path): State<Arc<RequestPath>>) -> Json<Value> {
    if let Some(m) = path.outcomes.mesh.as_ref() {
        return Json(m.cluster_json().await);
    }
    Json(json!({
        "node_id": path.cfg.node_id(),
        "members": [{ "node_id": path.cfg.node_id(), "live": true, "self": true, "age_s": 0.0, "keys": [] }],
    }))
}

async fn debug_predictor(State(path): State<Arc<RequestPath>>) -> Json<Value> {
    let snap = path.predictor.load_full();
    let names: std::collections::HashMap<u64, (std::sync::Arc<str>, std::sync::Arc<str>)> = path
        .fleet
        .replicas()
        .iter()
        .map(|r| (r.key, (r.name.clone(), r.class.clone())))
        .collect();
    let replicas: Vec<Value> = snap
        .replica_reports()
        .into_iter()
        .map(|rep| {
            let name = rep
                .replica
                .and_then(|k| names.get(&k))
                .map(|(n, _)| n.clone());
            json!({ "replica": name, "report": rep })
        })
        .collect();
    Json(json!({
        "policy": path.policy.name(),
        "snapshot_created_at_s": snap.created_at_s(),
        "upper_quantile": snap.upper_quantile(),
        "samples_learned": path.outcomes.trainer.learned.load(std::sync::atomic::Ordering::Relaxed),
        "samples_dropped": path.outcomes.trainer.dropped.load(std::sync::atomic::Ordering::Relaxed),
        "counters": snap.counters(),
        "classes": snap.class_reports(),
        "replicas": replicas,
    }))
}
