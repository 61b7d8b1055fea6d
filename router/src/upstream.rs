//! The HTTP client used for every upstream call (proxying, scraping, probing).

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Builds the shared client: TCP_NODELAY (a proxy must not wait on delayed ACKs),
/// bounded connect time, kept-alive pooled connections.
pub fn client(connect_timeout: Duration) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_connect_timeout(Some(connect_timeout));
    conn.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .build(conn)
}

/// Why a small upstream GET failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("timed out")]
    Timeout,
    #[error("connection failed: {0}")]
    Connect(String),
    #[error("body exceeded {0} bytes or failed: {1}")]
    Body(usize, String),
    #[error("bad request: {0}")]
    Request(String),
}

/// `GET base+path` with a whole-call timeout and a body cap.
pub async fn get(
    client: &HttpClient,
    base: &Uri,
    path: &str,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(StatusCode, Bytes), FetchError> {
    let uri = join(base, path).map_err(FetchError::Request)?;
    let req = Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| FetchError::Request(e.to_string()))?;
    let fut = async {
        let resp = client
            .request(req)
            .await
            .map_err(|e| FetchError::Connect(e.to_string()))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), max_bytes)
            .collect()
            .await
            .map_err(|e| FetchError::Body(max_bytes, e.to_string()))?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| FetchError::Timeout)?
}

/// `base` (scheme://authority) joined with an absolute path.
pub fn join(base: &Uri, path_and_query: &str) -> Result<Uri, String> {
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(
        path_and_query
            .parse()
            .map_err(|e| format!("bad path {path_and_query}: {e}"))?,
    );
    Uri::from_parts(parts).map_err(|e| e.to_string())
}
