//! `GET /debug/decisions/{id}` (one record, with why each candidate won or lost) and
//! `GET /debug/decisions?replica=&tenant=&missed=&fallback=&limit=` (newest first).
//! Both sit behind the admin rules (`edge.admin_listen` / `edge.admin_token`).

use std::sync::Arc;

use axum::{
    Json,
    extract::{Path, Query, State, rejection::QueryRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;

use crate::{error::ApiError, node::Node};

pub async fn one(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<u64>() else {
        return ApiError::bad_request(format!("decision id `{id}` is not a number"))
            .with_param("id")
            .into_response();
    };
    match node.decision_records.get(id) {
        Some(r) => Json(r).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            if node.decision_records.enabled() {
                format!(
                    "decision {id} is not held: only the latest {} are kept",
                    node.decision_records.capacity()
                )
            } else {
                "decision records are off (decision_records = 0)".to_string()
            },
        )
        .into_response(),
    }
}

pub async fn list(
    State(node): State<Arc<Node>>,
    q: Result<Query<super::Query>, QueryRejection>,
) -> Response {
    let q = match q {
        Ok(Query(q)) => q,
        Err(e) => {
            return ApiError::bad_request(format!(
                "bad query: {}; accepted: replica, tenant, missed=true|false, fallback=true|false, limit=N",
                e.body_text()
            ))
            .into_response();
        }
    };
    let records = node.decision_records.query(&q);
    Json(json!({ "count": records.len(), "records": records })).into_response()
}

/// `GET /debug/summary`-style numbers from the records: per tenant attainment and
/// fallback share, and the latest finished requests' predicted against measured.
pub async fn summary(State(node): State<Arc<Node>>) -> Json<serde_json::Value> {
    Json(node.decision_records.summary(200))
}
