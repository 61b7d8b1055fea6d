//! `/dashboard`: one self-contained page (HTML, CSS and script embedded in the binary;
//! no CDN, no build step) that polls the router's own JSON — `/debug/replicas`,
//! `/debug/summary` (per-tenant attainment and fallback share, predicted against
//! measured TTFT/TPOT from the decision records), `/debug/cluster` and
//! `/debug/predictor` — once a second. It sits behind the admin rules like those
//! endpoints, so what it can read is exactly what an operator's curl can.

use axum::response::{Html, IntoResponse, Response};

/// The page, compiled in.
pub const PAGE: &str = include_str!("dashboard.html");

pub async fn page() -> Response {
    ([(http::header::CACHE_CONTROL, "no-cache")], Html(PAGE)).into_response()
}
