//! The edge holds against slow, careless and hostile clients (issue 15): slow-loris
//! connections are timed out and capped without starving normal clients, bodies that
//! never finish get 408, headers sent upstream are cleaned, replica credentials never
//! show, every error is OpenAI-shaped, admin endpoints can be moved or locked, and a
//! replica's 429 is backpressure, not a failure.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU16, Ordering::SeqCst},
    },
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::IntoResponse,
    routing::{get, post},
};
use common::{client, mock, router};
use headroom::policy::PolicyName;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_util::sync::CancellationToken;

/// A replica that records the headers it was sent and answers with `status`.
struct Recorder {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<HeaderMap>>>,
    status: Arc<AtomicU16>,
    cancel: CancellationToken,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[derive(Clone)]
struct RecState {
    seen: Arc<Mutex<Vec<HeaderMap>>>,
    status: Arc<AtomicU16>,
}

async fn recorder(model: &'static str) -> Recorder {
    let st = RecState {
        seen: Arc::default(),
        status: Arc::new(AtomicU16::new(200)),
    };
    let app = Router::new()
        .route(
            "/v1/completions",
            post(move |State(s): State<RecState>, h: HeaderMap| async move {
                s.seen.lock().push(h);
                let status = s.status.load(SeqCst);
                if status == 502 {
                    // What a proxy in front of an engine says: not JSON.
                    return (StatusCode::BAD_GATEWAY, "<html><body>502 Bad Gateway</body></html>").into_response();
                }
                if status != 200 {
                    let code = StatusCode::from_u16(status).unwrap();
                    return (code, Json(json!({"error": {"message": "busy", "type": "rate_limit", "param": null, "code": status}}))).into_response();
                }
                Json(json!({"id":"x","object":"text_completion","created":1,"model":model,
                    "choices":[{"index":0,"text":"hi","finish_reason":"length"}],
                    "usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}))
                .into_response()
            }),
        )
        .route(
            "/v1/models",
            get(move || async move {
                Json(json!({"object":"list","data":[{"id":model,"object":"model","max_model_len":4096}]}))
            }),
        )
        .route("/health", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|| async { "vllm:num_requests_running{engine=\"0\"} 0\nvllm:num_requests_waiting{engine=\"0\"} 0\n" }),
        )
        .with_state(st.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cancel = CancellationToken::new();
    let c = cancel.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { c.cancelled().await })
            .await
            .ok();
    });
    Recorder {
        addr,
        seen: st.seen,
        status: st.status,
        cancel,
    }
}

fn completion() -> Value {
    json!({"model": "m", "prompt": "hello", "max_tokens": 1})
}

/// Reads until EOF or `limit`; true when the peer closed the connection.
async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

fn assert_openai_error(v: &Value, status: u16) {
    let e = &v["error"];
    assert!(e["message"].is_string(), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(e.get("param").is_some(), "{v}");
    assert_eq!(e["code"], status, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_connections_are_timed_out_and_do_not_starve_normal_clients() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.edge.header_read_timeout_ms = 1_500;
        // Fewer slots than attackers (a low descriptor limit): they must not lock out
        // normal clients or /health.
        c.edge.max_connections = 200;
    })
    .await;
    // 250 connections that send nothing, 250 that trickle a header byte at a time.
    let mut silent = Vec::new();
    for _ in 0..250 {
        silent.push(TcpStream::connect(r.addr).await.unwrap());
    }
    let stop = CancellationToken::new();
    let mut tricklers = Vec::new();
    for _ in 0..250 {
        let mut s = TcpStream::connect(r.addr).await.unwrap();
        let stop = stop.clone();
        tricklers.push(tokio::spawn(async move {
            let head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: ";
            for b in head.iter().chain(std::iter::repeat(&b'a')) {
                if stop.is_cancelled() || s.write_all(&[*b]).await.is_err() {
                    return true; // the router closed it
                }
                tokio::select! {
                    _ = stop.cancelled() => return false,
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
            false
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Normal clients are served meanwhile, and /health answers.
    let c = client();
    for _ in 0..20 {
        let h = c.get(r.url("/health")).send().await.unwrap();
        assert_eq!(h.status(), 200);
        let resp = c
            .post(r.url("/v1/completions"))
            .json(&completion())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    // Every silent connection is closed after the header deadline.
    for s in &mut silent {
        assert!(
            closed_within(s, Duration::from_secs(10)).await,
            "a silent connection stayed open past the header deadline"
        );
    }
    // Every trickling one too (the write fails once the router has closed it).
    let deadline = tokio::time::sleep(Duration::from_secs(10));
    tokio::pin!(deadline);
    let all = futures_util::future::join_all(tricklers);
    let closed = tokio::select! {
        r = all => r.into_iter().filter(|x| matches!(x, Ok(true))).count(),
        _ = &mut deadline => { stop.cancel(); 0 }
    };
    assert_eq!(
        closed, 250,
        "trickling connections outlived the header deadline"
    );
    let metrics = r.metrics_text().await;
    assert!(
        metrics.contains("headroom_edge_connections_closed_total{reason=\"header_timeout\"}"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_idle_connections_make_room_for_real_clients() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.edge.max_connections = 8;
        c.edge.header_read_timeout_ms = 60_000;
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(TcpStream::connect(r.addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Full of connections that never sent a request: a real client still gets in,
    // every time, long before the header deadline would free anything.
    let c = client();
    for _ in 0..4 {
        let h = c.get(r.url("/health")).send().await.unwrap();
        assert_eq!(h.status(), 200);
    }
    // The oldest idle ones were closed to make room; open connections stay capped.
    let mut closed = 0;
    for s in &mut held {
        if closed_within(s, Duration::from_millis(200)).await {
            closed += 1;
        }
    }
    assert!(closed >= 1, "no idle connection was closed to make room");
    let metrics = r.metrics_text().await;
    let open: f64 = metrics
        .lines()
        .find(|l| l.starts_with("headroom_edge_open_connections "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(open <= 8.0, "{open} connections open over a cap of 8");
}

#[tokio::test]
async fn kept_alive_idle_connection_is_closed() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.edge.idle_timeout_ms = 500;
    })
    .await;
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
}

#[tokio::test]
async fn body_that_never_finishes_gets_408() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.edge.body_read_timeout_ms = 300;
    })
    .await;
    let mut s = TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\"")
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        match tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                out.extend_from_slice(&buf[..n]);
                if out.windows(4).any(|w| w == b"\r\n\r\n") && out.ends_with(b"}}") {
                    break;
                }
            }
        }
    }
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: Value = serde_json::from_str(body).unwrap();
    assert_openai_error(&v, 408);
}

#[tokio::test]
async fn upstream_headers_are_cleaned_and_forwarded_for_appended() {
    let rec = recorder("m").await;
    let r = router(
        &[format!("http://{}", rec.addr)],
        PolicyName::LeastRequest,
        |_| {},
    )
    .await;
    let resp = client()
        .post(r.url("/v1/completions"))
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "secret")
        .header("keep-alive", "timeout=5")
        .header("proxy-authorization", "Basic Zm9vOmJhcg==")
        .header("te", "trailers")
        .header("upgrade", "h2c")
        .header("trailer", "x-foo")
        .header("x-forwarded-for", "203.0.113.7")
        .header("x-request-id", "abc")
        .json(&completion())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = rec.seen.lock().last().cloned().unwrap();
    for h in [
        "x-hop",
        "keep-alive",
        "proxy-authorization",
        "te",
        "upgrade",
        "trailer",
    ] {
        assert!(seen.get(h).is_none(), "{h} was forwarded: {seen:?}");
    }
    // `connection` is hyper's own (keep-alive to the pool), never the client's list.
    assert!(
        seen.get_all("connection")
            .iter()
            .all(|v| !v.to_str().unwrap().contains("x-hop")),
        "{seen:?}"
    );
    assert_eq!(seen.get_all("content-type").iter().count(), 1, "{seen:?}");
    assert_eq!(seen["content-type"], "application/json");
    assert_eq!(seen["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    assert_eq!(seen["x-request-id"], "abc");
}

#[tokio::test]
async fn replica_credentials_never_show() {
    let m = mock("m").await;
    let url = format!("http://admin:hunter2secret@{}", m.addr);
    let r = router(&[url], PolicyName::LeastRequest, |_| {}).await;
    let c = client();
    let resp = c
        .post(r.url("/v1/completions"))
        .json(&completion())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let replica = resp.headers()["x-headroom-replica"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(replica, m.addr.to_string());
    let metrics = r.metrics_text().await;
    let debug = r.get_text("/debug/replicas").await;
    for (what, text) in [("metrics", &metrics), ("debug", &debug)] {
        assert!(!text.contains("hunter2"), "{what} leaks the password");
        assert!(!text.contains("admin:"), "{what} leaks the user");
    }
    assert!(debug.contains(&format!("http://{}", m.addr)), "{debug}");
}

#[tokio::test]
async fn every_error_is_openai_shaped() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.proxy.max_body_bytes = 1_000;
    })
    .await;
    let c = client();
    let cases: Vec<(reqwest::RequestBuilder, u16)> = vec![
        (c.get(r.url("/nope")), 404),
        (c.get(r.url("/v1/completions")), 405),
        (c.post(r.url("/v1/completions")).body("not json"), 400),
        (
            c.post(r.url("/v1/completions"))
                .json(&json!({"model": "m", "prompt": "x".repeat(2_000)})),
            413,
        ),
        (
            c.post(r.url("/v1/completions"))
                .json(&json!({"model": "other", "prompt": "x"})),
            404,
        ),
    ];
    for (req, status) in cases {
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status);
        let v: Value = resp.json().await.unwrap();
        assert_openai_error(&v, status);
    }
    // A replica's own error page that is not JSON is rewritten, status kept.
    let rec = recorder("m").await;
    rec.status.store(502, SeqCst);
    let r = router(
        &[format!("http://{}", rec.addr)],
        PolicyName::LeastRequest,
        |c| {
            c.proxy.retries = 0;
        },
    )
    .await;
    let resp = c
        .post(r.url("/v1/completions"))
        .json(&completion())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 502);
    assert!(resp.headers().contains_key("x-headroom-replica"));
    let v: Value = resp.json().await.unwrap();
    assert_openai_error(&v, 502);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("502 Bad Gateway"),
        "{v}"
    );
}

#[tokio::test]
async fn admin_endpoints_move_to_their_own_listener_and_take_a_token() {
    let m = mock("m").await;
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.edge.admin_listen = Some(admin);
        c.edge.admin_token = Some("s3cret-admin-token".into());
    })
    .await;
    let c = client();
    for p in [
        "/metrics",
        "/debug/replicas",
        "/debug/cluster",
        "/debug/predictor",
    ] {
        let resp = c.get(r.url(p)).send().await.unwrap();
        assert_eq!(resp.status(), 404, "{p} still on the client port");
        let url = format!("http://{admin}{p}");
        let mut ok = None;
        for _ in 0..50 {
            match c.get(&url).send().await {
                Ok(resp) => {
                    ok = Some(resp);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        let resp = ok.expect("admin listener answers");
        assert_eq!(resp.status(), 401, "{p} without the token");
        assert_openai_error(&resp.json().await.unwrap(), 401);
        let resp = c
            .get(&url)
            .bearer_auth("s3cret-admin-token")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{p} with the token");
    }
    // Clients are served on the client port as before.
    let resp = c
        .post(r.url("/v1/completions"))
        .json(&completion())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_replicas_429_is_backpressure_not_failure() {
    let busy = recorder("m").await;
    busy.status.store(429, SeqCst);
    let fine = mock("m").await;
    let r = router(
        &[format!("http://{}", busy.addr), fine.url()],
        PolicyName::RoundRobin,
        |c| c.health.eject_after_failures = 2,
    )
    .await;
    let c = client();
    for _ in 0..20 {
        let resp = c
            .post(r.url("/v1/completions"))
            .json(&completion())
            .send()
            .await
            .unwrap();
        // Retried on the other replica before the first byte.
        assert_eq!(resp.status(), 200);
    }
    assert!(
        busy.seen.lock().len() >= 5,
        "the busy replica was never tried"
    );
    let replicas = r.node.path.fleet.replicas();
    let b = replicas
        .iter()
        .find(|x| x.base.port_u16() == Some(busy.addr.port()))
        .unwrap();
    assert!(b.health.routable(), "429s ejected the replica");
    assert_eq!(b.health.total_ejections(), 0);
    assert!(b.health.backpressure_total() >= 5);
    let dbg = r.get_json("/debug/replicas").await;
    let row = dbg["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["url"] == format!("http://{}", busy.addr))
        .unwrap()
        .clone();
    assert!(row["backpressure_429s"].as_u64().unwrap() >= 5, "{row}");
}
