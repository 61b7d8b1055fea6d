//! The `headroom-replica` binary over real HTTP on loopback: OpenAI shapes, vLLM
//! metrics, prefix caching, errors, fault knobs, disconnects and shutdown.
//! Every process is killed on drop; every wait is bounded.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

/// A running replica process, killed when dropped.
struct Replica {
    child: Child,
    base: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(extra: &[&str]) -> Replica {
    let mut child = Command::new(env!("CARGO_BIN_EXE_headroom-replica"))
        .args(["--listen", "127.0.0.1:0", "--model", "m", "--seed", "7"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn headroom-replica");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    // The guard exists before any wait, so a failed start still kills the child.
    let mut replica = Replica {
        child,
        base: String::new(),
    };
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("replica announced its address");
    replica.base = line
        .trim()
        .strip_prefix("headroom-replica listening on ")
        .expect("announcement line")
        .to_string();
    replica
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

async fn post(r: &Replica, path: &str, body: Value) -> (u16, Value) {
    let resp = client()
        .post(format!("{}{path}", r.base))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn metrics(r: &Replica) -> String {
    client()
        .get(format!("{}/metrics", r.base))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text")
}

/// Value of one unlabelled-by-extra-label series, e.g. `vllm:prefix_cache_hits_total`.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no series {name}"))
}

fn success(text: &str, reason: &str) -> f64 {
    text.lines()
        .find(|l| {
            l.starts_with("vllm:request_success_total{")
                && l.contains(&format!("finished_reason=\"{reason}\""))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("success series")
}

/// Streams a request; returns the SSE `data:` payloads and the time to the first
/// content-bearing event.
async fn stream(r: &Replica, path: &str, body: Value) -> (Vec<String>, Duration) {
    let t0 = Instant::now();
    let resp = client()
        .post(format!("{}{path}", r.base))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let mut first = None;
    let mut buf = String::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.expect("chunk");
        if first.is_none() && !chunk.is_empty() {
            first = Some(t0.elapsed());
        }
        buf.push_str(std::str::from_utf8(&chunk).expect("utf8"));
    }
    assert!(buf.ends_with("\n\n"), "events end with a blank line");
    let events = buf
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data: prefix").to_string())
        .collect();
    (events, first.expect("some output"))
}

/// Output tokens in a content chunk: the emulator's filler text is one word per
/// token, each starting with a space.
fn words_in(chunk: &Value) -> usize {
    let choice = &chunk["choices"][0];
    let text = choice["delta"]["content"]
        .as_str()
        .or_else(|| choice["text"].as_str())
        .unwrap_or("");
    text.matches(' ').count()
}

/// Content chunks (not the role chunk, not the usage chunk) of a stream's events.
fn content_chunks(events: &[String]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).expect("chunk is JSON"))
        .filter(|c| c["choices"].as_array().is_some_and(|a| !a.is_empty()) && words_in(c) > 0)
        .collect()
}

#[tokio::test]
async fn two_replicas_stream_chat_sse_with_usage_and_done() {
    let a = spawn(&["--profile", "h100-llama3-8b", "--time-scale", "0.05"]);
    let b = spawn(&["--profile", "a100-llama3-8b", "--time-scale", "0.05"]);
    assert_ne!(a.base, b.base);
    for r in [&a, &b] {
        let body = json!({
            "model": "m", "stream": true, "max_tokens": 6, "ignore_eos": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Tell me about prefix caching."}],
        });
        let (events, _) = stream(r, "/v1/chat/completions", body).await;
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
        let json: Vec<Value> = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).expect("chunk is JSON"))
            .collect();
        assert!(json.iter().all(|c| c["object"] == "chat.completion.chunk"));
        assert!(
            json.iter().all(|c| c.get("usage").is_some()),
            "include_usage: usage on every chunk"
        );
        assert_eq!(json[0]["choices"][0]["delta"]["role"], "assistant");
        let content: Vec<&Value> = json
            .iter()
            .filter(|c| !c["choices"].as_array().expect("choices").is_empty())
            .collect();
        // Role chunk, then the 6 tokens: one per chunk unless chunks queued while the
        // stream was not polled, which go out merged (as vLLM's do).
        let tokens: Vec<usize> = content[1..].iter().map(|c| words_in(c)).collect();
        assert_eq!(tokens.iter().sum::<usize>(), 6, "{tokens:?}");
        assert!(tokens.iter().all(|&n| n >= 1), "{tokens:?}");
        let last = content.len() - 1;
        assert!(
            content[..last]
                .iter()
                .all(|c| c["choices"][0]["finish_reason"].is_null())
        );
        assert_eq!(content[last]["choices"][0]["finish_reason"], "length");
        let usage = &json.last().expect("usage chunk")["usage"];
        assert_eq!(json.last().expect("last")["choices"], json!([]));
        assert_eq!(usage["completion_tokens"], 6);
        assert!(usage["prompt_tokens"].as_u64().expect("prompt tokens") > 5);
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    }
}

#[tokio::test]
async fn models_health_and_metrics_look_like_vllm() {
    let r = spawn(&[
        "--profile",
        "rtx4090-llama3-8b",
        "--time-scale",
        "0.05",
        "--lora",
        "sql-lora",
    ]);
    let health = client()
        .get(format!("{}/health", r.base))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status().as_u16(), 200);
    assert!(health.text().await.expect("text").is_empty());
    let models: Value = client()
        .get(format!("{}/v1/models", r.base))
        .send()
        .await
        .expect("models")
        .json()
        .await
        .expect("json");
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "m");
    assert_eq!(models["data"][0]["max_model_len"], 32768);
    assert_eq!(models["data"][1]["id"], "sql-lora");
    assert_eq!(models["data"][1]["parent"], "m");
    let (status, body) = post(
        &r,
        "/v1/completions",
        json!({"model": "sql-lora", "prompt": "hi", "max_tokens": 3}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["model"], "sql-lora");
    assert_eq!(body["usage"]["completion_tokens"], 3);
    let text = metrics(&r).await;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:cache_config_info",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
    ] {
        assert!(text.contains(&format!("{name}{{")), "missing {name}");
    }
    assert!(text.contains("model_name=\"m\"") && text.contains("engine=\"0\""));
    assert!(text.contains("num_gpu_blocks=\"2588\"") && text.contains("block_size=\"16\""));
    assert!(text.contains(
        "vllm:time_to_first_token_seconds_bucket{engine=\"0\",model_name=\"m\",le=\"0.001\"}"
    ));
    assert_eq!(metric(&text, "vllm:generation_tokens_total"), 3.0);
    assert_eq!(success(&text, "length"), 1.0);
}

#[tokio::test]
async fn repeated_long_prompt_hits_prefix_cache_and_cuts_ttft() {
    let r = spawn(&["--profile", "a100-llama3-8b", "--time-scale", "0.2"]);
    let prompt: Vec<u32> = (0..8000u32).map(|i| (i * 7919) % 100_000).collect();
    let body = json!({"model": "m", "prompt": prompt, "max_tokens": 2, "ignore_eos": true,
                      "stream": true, "stream_options": {"include_usage": true}});
    let (cold_events, cold) = stream(&r, "/v1/completions", body.clone()).await;
    let (warm_events, warm) = stream(&r, "/v1/completions", body).await;
    let cached = |events: &[String]| -> u64 {
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).expect("usage chunk");
        usage["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached")
    };
    assert_eq!(cached(&cold_events), 0);
    assert_eq!(
        cached(&warm_events),
        7984,
        "all full blocks but the one holding the last token"
    );
    // Cold: ~4 prefill chunks of 2048 tokens ≈ 0.6 s model = 0.12 s wall at 0.2.
    assert!(warm * 3 < cold, "warm TTFT {warm:?} vs cold {cold:?}");
    let text = metrics(&r).await;
    assert_eq!(metric(&text, "vllm:prefix_cache_hits_total"), 7984.0);
    assert_eq!(metric(&text, "vllm:prefix_cache_queries_total"), 16000.0);
}

#[tokio::test]
async fn errors_are_openai_json_with_the_right_status() {
    let r = spawn(&["--profile", "rtx4090-llama3-8b", "--time-scale", "0.05"]);
    let (s, b) = post(
        &r,
        "/v1/chat/completions",
        json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(s, 404);
    assert_eq!(b["error"]["code"], 404);
    assert_eq!(b["error"]["type"], "NotFoundError");
    assert!(
        b["error"]["message"]
            .as_str()
            .expect("message")
            .contains("nope")
    );
    let raw = client()
        .post(format!("{}/v1/completions", r.base))
        .header("content-type", "application/json")
        .body("{\"prompt\": ")
        .send()
        .await
        .expect("send");
    assert_eq!(raw.status().as_u16(), 400);
    let b: Value = raw.json().await.expect("json error");
    assert_eq!(b["error"]["code"], 400);
    for bad in [
        json!({"prompt": "x", "max_tokens": "many"}),
        json!({"prompt": "x", "n": 3}),
        json!({"prompt": "x", "max_tokens": 0}),
        json!({"prompt": vec![1u32; 32768]}),
        json!({"prompt": ""}),
    ] {
        let (s, b) = post(&r, "/v1/completions", bad.clone()).await;
        assert_eq!(s, 400, "{bad}");
        assert_eq!(b["error"]["code"], 400);
        assert!(b["error"]["message"].is_string());
    }
    // max_tokens past the context is cut to what is left, as vLLM 0.32 does.
    let (s, b) = post(
        &r,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 40_000, "emulator_output_tokens": 3}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["usage"]["completion_tokens"], 3);
    let huge = vec![b'x'; 9 * 1024 * 1024];
    let resp = client()
        .post(format!("{}/v1/completions", r.base))
        .body(huge)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 413);
    let b: Value = resp.json().await.expect("json");
    assert_eq!(b["error"]["code"], 413);
}

async fn e2e_time(r: &Replica) -> Duration {
    let t0 = Instant::now();
    let (s, b) = post(
        r,
        "/v1/completions",
        json!({"prompt": [1, 2, 3], "max_tokens": 200, "ignore_eos": true}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    t0.elapsed()
}

#[tokio::test]
async fn fault_knobs_fail_slow_and_stall() {
    let r = spawn(&["--profile", "a100-llama3-8b", "--time-scale", "0.05"]);
    let admin = |body: Value| {
        let url = format!("{}/admin/faults", r.base);
        async move { client().post(url).json(&body).send().await.expect("admin") }
    };
    // Slowdown: 200 decode steps of ~10.4 ms × 0.05 ≈ 105 ms; ×5 ≈ 520 ms. The
    // bound leaves room for HTTP overhead on a busy machine.
    let normal = e2e_time(&r).await;
    assert_eq!(admin(json!({"slowdown": 5.0})).await.status().as_u16(), 200);
    let slow = e2e_time(&r).await;
    assert!(slow > normal * 5 / 2, "slowdown: {slow:?} vs {normal:?}");
    assert_eq!(
        admin(json!({"slowdown": 1.0, "error_rate": 1.0}))
            .await
            .status()
            .as_u16(),
        200
    );
    let (s, b) = post(
        &r,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, 500);
    assert_eq!(b["error"]["code"], 500);
    // Nonsense values are refused and change nothing.
    assert_eq!(
        admin(json!({"error_rate": 2.0})).await.status().as_u16(),
        400
    );
    assert_eq!(
        admin(json!({"slowdown": "fast"})).await.status().as_u16(),
        400
    );
    let now: Value = client()
        .get(format!("{}/admin/faults", r.base))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(now["error_rate"], 1.0);
    // Mid-stream failure: an SSE error event, then [DONE].
    admin(json!({"error_rate": 0.0, "midstream_error_rate": 1.0})).await;
    let (events, _) = stream(
        &r,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 10, "ignore_eos": true, "stream": true}),
    )
    .await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let err: Value = serde_json::from_str(&events[events.len() - 2]).expect("error event");
    assert_eq!(err["error"]["code"], 500);
    assert_eq!(events.len(), 2 + 5, "failed after half of the 10 tokens");
    // Stall: /health hangs and requests wait until the stall clears.
    admin(json!({"midstream_error_rate": 0.0, "stall": true})).await;
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    assert!(
        quick
            .get(format!("{}/health", r.base))
            .send()
            .await
            .is_err(),
        "health hangs while stalled"
    );
    let pending = tokio::spawn({
        let url = format!("{}/v1/completions", r.base);
        async move {
            client()
                .post(url)
                .json(&json!({"prompt": "x", "max_tokens": 3, "ignore_eos": true}))
                .send()
                .await
                .map(|resp| resp.status().as_u16())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished(), "no progress while stalled");
    assert_eq!(metric(&metrics(&r).await, "vllm:num_requests_waiting"), 1.0);
    admin(json!({"stall": false})).await;
    let status = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("finishes after the stall")
        .expect("task")
        .expect("response");
    assert_eq!(status, 200);
    assert_eq!(
        quick
            .get(format!("{}/health", r.base))
            .send()
            .await
            .expect("health")
            .status()
            .as_u16(),
        200
    );
}

#[tokio::test]
async fn disconnecting_client_aborts_its_request() {
    let r = spawn(&["--profile", "a100-llama3-8b", "--time-scale", "0.05"]);
    let resp = client()
        .post(format!("{}/v1/completions", r.base))
        .json(&json!({"prompt": "x", "max_tokens": 20_000, "ignore_eos": true, "stream": true}))
        .send()
        .await
        .expect("send");
    let mut body = resp.bytes_stream();
    let first = body.next().await.expect("first chunk").expect("ok");
    assert!(!first.is_empty());
    drop(body);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = metrics(&r).await;
        if success(&text, "abort") == 1.0 {
            assert_eq!(metric(&text, "vllm:num_requests_running"), 0.0);
            assert_eq!(metric(&text, "vllm:kv_cache_usage_perc"), 0.0);
            break;
        }
        assert!(Instant::now() < deadline, "abort not seen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn sigterm_shuts_down_gracefully() {
    let mut r = spawn(&["--profile", "h100-llama3-8b", "--time-scale", "0.05"]);
    let (s, _) = post(
        &r,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": 2}),
    )
    .await;
    assert_eq!(s, 200);
    let pid = r.child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = r.child.try_wait().expect("wait") {
            assert!(status.success(), "clean exit on SIGTERM: {status}");
            break;
        }
        assert!(Instant::now() < deadline, "did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn stream_interval_packs_tokens_and_continuous_usage_counts_them() {
    let r = spawn(&["--stream-interval", "4", "--time-scale", "0.2"]);
    let body = json!({
        "model": "m", "stream": true, "max_tokens": 10, "ignore_eos": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
        "prompt": "word ".repeat(300),
    });
    for round in 0..2 {
        let (events, _) = stream(&r, "/v1/completions", body.clone()).await;
        let content = content_chunks(&events);
        let sizes: Vec<usize> = content.iter().map(words_in).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 10, "{sizes:?}");
        // First token alone (unless merged), then 4 at a time, the rest at the end.
        assert!((1..=4).contains(&sizes.len()), "{sizes:?}");
        let mut cumulative = 0;
        for (c, n) in content.iter().zip(&sizes) {
            cumulative += *n as u64;
            let u = &c["usage"];
            assert_eq!(
                u["completion_tokens"], cumulative,
                "usage is cumulative: {c}"
            );
            let prompt = u["prompt_tokens"].as_u64().expect("prompt tokens");
            assert_eq!(u["total_tokens"], prompt + cumulative);
        }
        let last: Value = serde_json::from_str(&events[events.len() - 2]).expect("usage chunk");
        assert_eq!(last["choices"], json!([]));
        assert_eq!(last["usage"]["completion_tokens"], 10);
        let cached = last["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached tokens reported");
        if round == 0 {
            assert_eq!(cached, 0, "cold cache");
        } else {
            assert!(cached >= 256, "the repeated prompt hits: {cached}");
        }
    }
}

#[tokio::test]
async fn a_busy_front_end_delivers_tokens_in_bursts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("busy.toml");
    // 20 ms of front-end work per chunk against ~6.5 ms decode steps: about three
    // steps' tokens wait and leave together.
    std::fs::write(&file, "frontend_chunk_ms = 20.0\nstep_noise = 0.0\n").expect("write");
    let path = file.to_str().expect("utf8 path");
    let r = spawn(&["--profile-file", path, "--time-scale", "1"]);
    let body = json!({
        "model": "m", "stream": true, "max_tokens": 30, "ignore_eos": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
        "prompt": "hello there",
    });
    let (events, _) = stream(&r, "/v1/completions", body).await;
    let content = content_chunks(&events);
    let sizes: Vec<usize> = content.iter().map(words_in).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 30, "{sizes:?}");
    assert!(sizes.len() <= 15, "bursts: {sizes:?}");
    assert!(sizes.iter().any(|&n| n >= 3), "{sizes:?}");
}

#[test]
fn bad_profile_files_fail_with_a_clear_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "stream_interval = -1\n").expect("write");
    let missing = dir.path().join("missing.toml");
    for (path, needle) in [(&bad, "bad.toml"), (&missing, "missing.toml")] {
        let out = Command::new(env!("CARGO_BIN_EXE_headroom-replica"))
            .args(["--listen", "127.0.0.1:0", "--profile-file"])
            .arg(path)
            .output()
            .expect("run");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{err}");
    }
    for flag in [["--step-noise", "NaN"], ["--stream-interval", "0"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_headroom-replica"))
            .args(["--listen", "127.0.0.1:0"])
            .args(flag)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{flag:?} accepted");
    }
}

#[test]
fn bad_flags_fail_with_a_clear_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_headroom-replica"))
        .args(["--listen", "127.0.0.1:0", "--profile", "tpu-v9"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tpu-v9") && err.contains("h100-llama3-8b"),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_headroom-replica"))
        .args(["--listen", "127.0.0.1:0", "--time-scale", "0"])
        .output()
        .expect("run");
    assert!(!out.status.success());
}
