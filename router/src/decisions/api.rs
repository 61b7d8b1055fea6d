//! `GET /debug/decisions/{id}` (one record, with why each candidate won or lost) and
//! `GET /debug/decisions?replica=&tenant=&missed=&fallback=&limit=` (newest first).
//! Both sit behind the admin rules (`edge.admin_listen` / `edge.admin_token`); the
//! server's handlers hand each its ring.

use axum::{
    Json,
    extract::{Query, rejection::QueryRejection},
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;

use super::DecisionRing;
use crate::error::ApiError;

pub fn one(ring: &DecisionRing, id: &str) -> Response {
    let Ok(id) = id.parse::<u64>() else {
        return ApiError::bad_request(format!("decision id `{id}` is not a number"))
            .with_param("id")
            .into_response();
    };
    match ring.get(id) {
        Some(r) => Json(r).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            if ring.enabled() {
                format!(
                    "decision {id} is not held: only the latest {} are kept",
                    ring.capacity()
                )
            } else {
                "decision records are off (decision_records = 0)".to_string()
            },
        )
        .into_response(),
    }
}

pub fn list(ring: &DecisionRing, q: Result<Query<super::Query>, QueryRejection>) -> Response {
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
    let records = ring.query(&q);
    Json(json!({ "count": records.len(), "records": records })).into_response()
}

/// `GET /debug/summary`-style numbers from the records: per tenant attainment and
/// fallback share, and the latest finished requests' predicted against measured.
pub fn summary(ring: &DecisionRing) -> Json<serde_json::Value> {
    Json(ring.summary(200))
}
