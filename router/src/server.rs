//! The HTTP front: OpenAI endpoints, health, readiness, metrics and debug views.

use std::{net::SocketAddr, sync::Arc, time::Instant};

use axum::{
    Json, Router,
    body::Body,
    extract::{DefaultBodyLimit, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
    serve::ListenerExt,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    clock,
    error::ApiError,
    node::Node,
    policy::RequestProfile,
    proxy,
    request::{self, Endpoint},
};

/// Builds the router's HTTP application.
pub fn app(node: Arc<Node>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/debug/replicas", get(debug_replicas))
        .route("/debug/cluster", get(debug_cluster))
        .route("/debug/predictor", get(debug_predictor))
        // Size is enforced by `read_body` so the error is OpenAI-shaped.
        .layer(DefaultBodyLimit::disable())
        .with_state(node)
}

/// Serves until `cancel` fires, then drains in-flight requests.
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    tracing::info!(%addr, policy = node.policy.name(), "headroom router listening");
    // TCP_NODELAY: a token stream must not wait on the client's delayed ACKs.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("set_nodelay failed: {e}");
        }
    });
    axum::serve(listener, app(node))
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await?;
    Ok(())
}

async fn read_body(node: &Node, headers: &HeaderMap, body: Body) -> Result<bytes::Bytes, ApiError> {
    let limit = node.cfg.proxy.max_body_bytes;
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ApiError::too_large(limit));
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::too_large(limit))
}

async fn handle(node: Arc<Node>, endpoint: Endpoint, headers: HeaderMap, body: Body) -> Response {
    let arrived = Instant::now();
    let result = async {
        let bytes = read_body(&node, &headers, body).await?;
        let parsed = request::parse(endpoint, &bytes, node.cfg.proxy.chunk_usage)?;
        let tenant = node.tenants.resolve(&headers)?;
        let (parsed, shape) = node.shape_off_worker(parsed).await?;
        let profile = RequestProfile {
            model: parsed.model.clone(),
            prompt_tokens: shape.tokens,
            blocks: shape.blocks,
            max_tokens: parsed.max_tokens,
            expected_output_tokens: node.expected_output(&parsed),
            slo: tenant.slo,
            priority: tenant.priority,
            fallback: tenant.fallback,
            stream: parsed.stream,
        };
        proxy::forward(node.clone(), parsed, profile, headers, arrived).await
    }
    .await;
    match result {
        Ok(resp) => resp,
        Err(e) => {
            node.metrics
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

async fn completions(State(node): State<Arc<Node>>, headers: HeaderMap, body: Body) -> Response {
    handle(node, Endpoint::Completions, headers, body).await
}

async fn chat(State(node): State<Arc<Node>>, headers: HeaderMap, body: Body) -> Response {
    handle(node, Endpoint::ChatCompletions, headers, body).await
}

/// The fleet's models and adapters (union over replicas that answered).
async fn models(State(node): State<Arc<Node>>) -> Json<Value> {
    let mut seen = std::collections::BTreeMap::new();
    for r in node.fleet.replicas().iter() {
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

async fn ready(State(node): State<Arc<Node>>) -> Response {
    let n = node
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

async fn metrics(State(node): State<Arc<Node>>) -> Response {
    use std::sync::atomic::Ordering::Relaxed;
    node.metrics
        .predictor_learned
        .set(node.trainer.learned.load(Relaxed) as i64);
    node.metrics
        .predictor_dropped
        .set(node.trainer.dropped.load(Relaxed) as i64);
    (
        [(http::header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        node.metrics.render(),
    )
        .into_response()
}

async fn debug_replicas(State(node): State<Arc<Node>>) -> Json<Value> {
    let now = clock::now_s();
    let now_ms = clock::now_ms();
    let list: Vec<Value> = node
        .fleet
        .replicas()
        .iter()
        .map(|r| {
            let scraped = r.scraped.load_full();
            let own = r.ledger.load(now);
            let peer = r.peer_load.load();
            json!({
                "name": r.name, "url": r.url, "class": r.class, "region": r.region,
                "health": r.health.state(), "routable": r.health.routable(),
                "consecutive_failures": r.health.consecutive_failures(),
                "ejections": r.health.total_ejections(),
                "last_ejection_age_s": r.health.last_ejection_age_s(now_ms),
                "models": &r.models.load().models,
                "scraped": scraped.as_deref(),
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
            })
        })
        .collect();
    Json(json!({ "replicas": list, "prefix_index_entries": node.prefix.len() }))
}

async fn debug_cluster(State(node): State<Arc<Node>>) -> Json<Value> {
    if let Some(m) = node.mesh.get() {
        return Json(m.cluster_json().await);
    }
    Json(json!({
        "node_id": node.cfg.node_id(),
        "members": [{ "node_id": node.cfg.node_id(), "live": true, "self": true, "age_s": 0.0, "keys": [] }],
    }))
}

async fn debug_predictor(State(node): State<Arc<Node>>) -> Json<Value> {
    let snap = node.trainer.shared.load_full();
    let names: std::collections::HashMap<u64, (String, String)> = node
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
        "policy": node.policy.name(),
        "snapshot_created_at_s": snap.created_at_s(),
        "upper_quantile": snap.upper_quantile(),
        "samples_learned": node.trainer.learned.load(std::sync::atomic::Ordering::Relaxed),
        "samples_dropped": node.trainer.dropped.load(std::sync::atomic::Ordering::Relaxed),
        "counters": snap.counters(),
        "classes": snap.class_reports(),
        "replicas": replicas,
    }))
}
