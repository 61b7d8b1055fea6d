//! Errors the router returns to clients, in OpenAI's error shape.
//!
//! `{"error": {"message", "type", "param", "code"}}` with a meaningful HTTP status;
//! `code` carries the status as an integer, as vLLM does.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};
use serde_json::json;

/// A client-visible failure.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
    /// Which replica (if any) the error came from, for `x-headroom-replica`.
    pub replica: Option<String>,
    /// Seconds after which a retry may succeed (`Retry-After`), for 429 and 503.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            replica: None,
            retry_after: None,
        }
    }
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }
    pub fn unknown_model(model: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            format!("The model `{model}` does not exist on any replica."),
        )
        .with_param("model")
    }
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("Request body exceeds the router's limit of {limit} bytes."),
        )
    }
    pub fn no_replica(model: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            format!("No healthy replica can serve model `{model}` right now."),
        )
    }
    /// No replica can meet the request's objectives now: the fleet is full for it (503),
    /// with the policy's estimate of when a retry could fit.
    pub fn no_fit(no: &headroom_core::policy::NoFit) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            no.reason.clone(),
        )
        .with_retry_after(no.retry_after_secs())
    }
    pub fn upstream(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "upstream_error", message)
    }
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "Unknown API key.",
        )
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }

    /// The SSE event used once a stream has started: the error, then `[DONE]`.
    pub fn sse_bytes(&self) -> bytes::Bytes {
        bytes::Bytes::from(format!("data: {}\n\ndata: [DONE]\n\n", self.body()))
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.kind,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        let replica = self.replica.as_deref().unwrap_or("none");
        if let Ok(v) = HeaderValue::from_str(replica) {
            resp.headers_mut().insert(crate::REPLICA_HEADER, v);
        }
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, HeaderValue::from(s));
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape() {
        let e = ApiError::unknown_model("nope");
        let b = e.body();
        assert_eq!(b["error"]["code"], 404);
        assert_eq!(b["error"]["param"], "model");
        assert!(b["error"]["message"].as_str().unwrap().contains("nope"));
        let sse = String::from_utf8(e.sse_bytes().to_vec()).unwrap();
        assert!(sse.starts_with("data: {\"error\""));
        assert!(sse.ends_with("data: [DONE]\n\n"));
    }

    /// Nothing fits: the fleet is full for this request (503, not the tenant's 429),
    /// and the client is told when to retry.
    #[test]
    fn a_no_fit_refusal_is_503_with_retry_after() {
        let no = headroom_core::policy::NoFit::new("no replica fits".into(), 3.2);
        let resp = ApiError::no_fit(&no).into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[http::header::RETRY_AFTER], "4");
    }
}
