//! The admin surface (`/metrics`, `/debug/*`): optionally behind a bearer token.
//!
//! The token is compared in constant time, so response timing does not reveal how
//! much of a guess was right.

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};
use http::StatusCode;

use crate::error::ApiError;

/// Lets the request through when no token is configured or it carries the token.
pub async fn require_token(
    State(token): State<Option<Arc<str>>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(want) = token else {
        return next.run(req).await;
    };
    let got = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if got.is_some_and(|g| constant_time_eq(g.as_bytes(), want.as_bytes())) {
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "authentication_error",
        "This endpoint needs the admin token: `Authorization: Bearer <edge.admin_token>`.",
    )
    .into_response()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_comparison() {
        assert!(super::constant_time_eq(b"secret-1", b"secret-1"));
        assert!(!super::constant_time_eq(b"secret-1", b"secret-2"));
        assert!(!super::constant_time_eq(b"secret", b"secret-1"));
    }
}
