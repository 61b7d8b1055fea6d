//! Slow-loris against a real `headroom serve` process (issue 15): N connections that
//! send nothing or one header byte a second, while a normal client measures `/health`
//! and completion latency; the router's RSS is read from /proc before and during.
//!
//! `cargo bench -p headroom --bench edge_slowloris` (release build). Knobs:
//! `SLOWLORIS_CONNS` (default 500), `SLOWLORIS_SECS` (how long the attack runs while
//! measuring, default 20), `SLOWLORIS_HEADER_MS` (the router's
//! `edge.header_read_timeout_ms`, default 10000), `SLOWLORIS_CAP` (`edge.max_connections`,
//! default 4096).

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::{
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    routing::{get, post},
};
use serde_json::json;
use tokio::{io::AsyncWriteExt, net::TcpStream};
use tokio_util::sync::CancellationToken;

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

async fn replica() -> SocketAddr {
    let app = Router::new()
        .route(
            "/v1/completions",
            post(|| async {
                Json(json!({"id":"x","object":"text_completion","created":1,"model":"m",
                    "choices":[{"index":0,"text":"hi","finish_reason":"length"}],
                    "usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}))
            }),
        )
        .route(
            "/v1/models",
            get(|| async {
                Json(json!({"object":"list","data":[{"id":"m","object":"model","max_model_len":4096}]}))
            }),
        )
        .route("/health", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|| async { "vllm:num_requests_running{engine=\"0\"} 0\nvllm:num_requests_waiting{engine=\"0\"} 0\n" }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.ok() });
    addr
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

async fn measure(c: &reqwest::Client, base: &str, secs: u64) -> (Vec<f64>, Vec<f64>, usize) {
    let (mut health, mut comp, mut failed) = (Vec::new(), Vec::new(), 0);
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let t = Instant::now();
        match c.get(format!("{base}/health")).send().await {
            Ok(r) if r.status() == 200 => health.push(t.elapsed().as_secs_f64() * 1e3),
            _ => failed += 1,
        }
        let t = Instant::now();
        match c
            .post(format!("{base}/v1/completions"))
            .json(&json!({"model":"m","prompt":"hello","max_tokens":1}))
            .send()
            .await
        {
            Ok(r) if r.status() == 200 => comp.push(t.elapsed().as_secs_f64() * 1e3),
            _ => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (health, comp, failed)
}

fn report(what: &str, h: &mut [f64], c: &mut [f64], failed: usize) {
    println!(
        "{what}: /health p50 {:.2} ms p99 {:.2} ms max {:.2} ms | completion p50 {:.2} ms p99 {:.2} ms max {:.2} ms | {} ok, {failed} failed",
        pct(h, 0.5),
        pct(h, 0.99),
        pct(h, 1.0),
        pct(c, 0.5),
        pct(c, 0.99),
        pct(c, 1.0),
        h.len() + c.len()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing useful.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let conns = env("SLOWLORIS_CONNS", 500) as usize;
    let secs = env("SLOWLORIS_SECS", 20);
    let header_ms = env("SLOWLORIS_HEADER_MS", 10_000);
    let cap = env("SLOWLORIS_CAP", 4_096);
    let rep = replica().await;
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("r.toml");
    std::fs::write(
        &cfg,
        format!(
            "listen = \"{listen}\"\npolicy = \"least-request\"\n[[replicas]]\nurl = \"http://{rep}\"\n[edge]\nheader_read_timeout_ms = {header_ms}\nmax_connections = {cap}\n"
        ),
    )
    .unwrap();
    let router = Proc(
        Command::new(env!("CARGO_BIN_EXE_headroom"))
            .args(["serve", "--config", cfg.to_str().unwrap()])
            .env("HEADROOM_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn headroom"),
    );
    let pid = router.0.id();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let base = format!("http://{listen}");
    let t0 = Instant::now();
    loop {
        if let Ok(r) = c.get(format!("{base}/ready")).send().await
            && r.status() == 200
        {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "router never ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut h, mut cc, f) = measure(&c, &base, 3).await;
    report("baseline", &mut h, &mut cc, f);
    let rss_before = rss_kb(pid);

    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for i in 0..conns {
        let stop = stop.clone();
        let addr = listen;
        tasks.push(tokio::spawn(async move {
            // Reconnect whenever the router closes us: the attack never lets up.
            let mut opened = 0u32;
            while !stop.is_cancelled() {
                let Ok(mut s) = TcpStream::connect(addr).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                opened += 1;
                let head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Pad: ";
                let mut bytes = head.iter().chain(std::iter::repeat(&b'a'));
                loop {
                    if i % 2 == 0 {
                        // Silent: send nothing, wait to be closed.
                        let mut b = [0u8; 1];
                        tokio::select! {
                            _ = stop.cancelled() => return opened,
                            r = tokio::io::AsyncReadExt::read(&mut s, &mut b) => if matches!(r, Ok(0) | Err(_)) { break },
                        }
                    } else {
                        let b = *bytes.next().unwrap();
                        if s.write_all(&[b]).await.is_err() {
                            break;
                        }
                        tokio::select! {
                            _ = stop.cancelled() => return opened,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                }
            }
            opened
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut h, mut cc, f) = measure(&c, &base, secs).await;
    let rss_during = rss_kb(pid);
    report(
        &format!("with {conns} slow connections"),
        &mut h,
        &mut cc,
        f,
    );
    stop.cancel();
    let mut reopened = 0u64;
    for t in tasks {
        reopened += u64::from(t.await.unwrap_or(0));
    }
    println!(
        "router RSS: {} KiB before, {} KiB during ({} connections opened over {secs} s, header timeout {header_ms} ms, max_connections {cap})",
        rss_before, rss_during, reopened
    );
}
