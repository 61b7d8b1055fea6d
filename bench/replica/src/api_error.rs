//! OpenAI-style error responses, shaped as vLLM sends them:
//! `{"error": {"message", "type", "param", "code"}}` with `code` = the HTTP status.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// An error to return before any response byte.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// A 400 about one request field.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..Self::bad_request(message)
        }
    }

    /// vLLM's type name for a status.
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 413 | 422 => "BadRequestError",
            404 => "NotFoundError",
            503 => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON object (also used inside mid-stream SSE error events).
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body().to_string(),
        )
            .into_response()
    }
}
