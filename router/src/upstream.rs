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

/// The retry label of an upstream attempt that failed because this process or host
/// ran out of descriptors or local ports: the replica was never reached, so the
/// failure says nothing about its health (it must not count toward ejection).
pub const LOCAL_EXHAUSTED: &str = "local_exhausted";

/// Whether `e`, or an error it wraps, is this host running out of descriptors
/// (EMFILE, ENFILE) or ephemeral ports (EADDRNOTAVAIL) rather than the peer failing.
pub fn local_exhaustion(e: &(dyn std::error::Error + 'static)) -> bool {
    // EMFILE and ENFILE are 24 and 23 on Linux, the BSDs and macOS.
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && (matches!(io.raw_os_error(), Some(EMFILE | ENFILE))
                || io.kind() == std::io::ErrorKind::AddrNotAvailable)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// The retry label of a request that got no response: `connect`, or
/// [`LOCAL_EXHAUSTED`] when the cause is on this side.
pub fn connect_failure(e: &(dyn std::error::Error + 'static)) -> &'static str {
    if local_exhaustion(e) {
        LOCAL_EXHAUSTED
    } else {
        "connect"
    }
}

/// Why a small upstream GET failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("timed out")]
    Timeout,
    #[error("connection failed: {0}")]
    Connect(String),
    /// This node is out of descriptors or local ports: no verdict on the upstream.
    #[error("no local descriptor or port: {0}")]
    LocalExhausted(String),
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
        let resp = client.request(req).await.map_err(|e| {
            if local_exhaustion(&e) {
                FetchError::LocalExhausted(e.to_string())
            } else {
                FetchError::Connect(e.to_string())
            }
        })?;
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

/// `base` joined with a path known at compile time (the proxied endpoints): no parse,
/// no copy of the path, once per request.
pub fn join_static(base: &Uri, path: &'static str) -> Result<Uri, String> {
    let mut parts = base.clone().into_parts();
    parts.path_and_query = Some(http::uri::PathAndQuery::from_static(path));
    Uri::from_parts(parts).map_err(|e| e.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A legacy client whose connector fails with `err()` before any socket exists.
    async fn fail_with(err: fn() -> std::io::Error) -> hyper_util::client::legacy::Error {
        // `ready`: the client wants an `Unpin` connect future.
        let connector = tower::service_fn(move |_: Uri| {
            std::future::ready(Err::<hyper_util::rt::TokioIo<tokio::net::TcpStream>, _>(
                err(),
            ))
        });
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
        let req = Request::get("http://127.0.0.1:9/health")
            .body(Full::new(Bytes::new()))
            .expect("valid request");
        client.request(req).await.expect_err("the connector fails")
    }

    #[tokio::test]
    async fn running_out_of_descriptors_is_told_apart_from_a_failing_replica() {
        // EMFILE, ENFILE and EADDRNOTAVAIL come through the client's error chain.
        let local: [fn() -> std::io::Error; 3] = [
            || std::io::Error::from_raw_os_error(24),
            || std::io::Error::from_raw_os_error(23),
            || std::io::ErrorKind::AddrNotAvailable.into(),
        ];
        for (i, err) in local.into_iter().enumerate() {
            let e = fail_with(err).await;
            assert_eq!(connect_failure(&e), LOCAL_EXHAUSTED, "case {i}: {e:?}");
        }
        let refused = fail_with(|| std::io::ErrorKind::ConnectionRefused.into()).await;
        assert_eq!(connect_failure(&refused), "connect");
        // A real refused connect through the router's own client: the replica's fault.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let base: Uri = format!("http://127.0.0.1:{port}").parse().expect("uri");
        let c = client(Duration::from_secs(1));
        match get(&c, &base, "/health", Duration::from_secs(2), 64).await {
            Err(FetchError::Connect(_)) => {}
            other => panic!("expected a connect failure, got {other:?}"),
        }
    }
}
