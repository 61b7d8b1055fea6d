//! TLS on the client listener (issue 15): with `edge.tls_cert`/`edge.tls_key` the
//! router speaks HTTPS (a development certificate from rcgen), serves completions over
//! it, and plain HTTP on that port gets no answer.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use common::{mock, router};
use headroom::policy::PolicyName;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

async fn https(
    addr: std::net::SocketAddr,
    roots: Arc<rustls::RootCertStore>,
    req: http::Request<Full<Bytes>>,
) -> (http::StatusCode, Bytes) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("TLS handshake with the router");
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, body)
}

#[tokio::test]
async fn client_listener_speaks_tls() {
    let dev =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.pem"), dir.path().join("tls.key"));
    std::fs::write(&cert, dev.cert.pem()).unwrap();
    std::fs::write(&key, dev.signing_key.serialize_pem()).unwrap();
    let m = mock("m").await;
    let (c2, k2) = (cert.clone(), key.clone());
    let r = router(&[m.url()], PolicyName::LeastRequest, move |c| {
        c.edge.tls_cert = Some(c2);
        c.edge.tls_key = Some(k2);
    })
    .await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(dev.cert.der().clone()).unwrap();
    let roots = Arc::new(roots);

    let get = http::Request::get("/health")
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, body) = https(r.addr, roots.clone(), get).await;
    assert_eq!(status, 200);
    assert_eq!(&body[..], b"ok");

    let post = http::Request::post("/v1/completions")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","prompt":"hello","max_tokens":2}"#,
        )))
        .unwrap();
    let (status, body) = https(r.addr, roots, post).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["object"], "text_completion");

    // Plain HTTP on the TLS port: no HTTP answer, the connection is closed.
    let mut plain = TcpStream::connect(r.addr).await.unwrap();
    plain
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut buf)).await;
    assert!(!buf.starts_with(b"HTTP/1.1 200"), "plain HTTP was served");
}

#[test]
fn a_missing_certificate_stops_the_node() {
    let mut cfg = headroom::config::RouterConfig::default();
    cfg.edge.tls_cert = Some("/nonexistent/tls.pem".into());
    cfg.edge.tls_key = Some("/nonexistent/tls.key".into());
    let e = cfg.validate().unwrap_err().to_string();
    assert!(
        e.contains("edge.tls_cert") && e.contains("/nonexistent/tls.pem"),
        "{e}"
    );
    cfg.edge.tls_key = None;
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("together"), "{e}");
}
