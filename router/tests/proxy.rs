//! The router as a proxy, against in-process mock replicas: bytes pass through
//! intact, errors are OpenAI-shaped, retries happen only before the first byte, and a
//! replica dying mid-stream ends the stream cleanly.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{sync::atomic::Ordering::SeqCst, time::Duration};

use common::{Behaviour, client, mock, router, sse_events};
use headroom::policy::PolicyName;
use serde_json::{Value, json};

async fn post(url: &str, body: Value) -> reqwest::Response {
    client().post(url).json(&body).send().await.unwrap()
}

#[tokio::test]
async fn stream_passes_through_and_strips_injected_usage() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::RoundRobin, |_| {}).await;
    // Client did not ask for usage: router asks upstream, then removes it.
    let resp = post(&r.url("/v1/chat/completions"), json!({"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]})).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-headroom-replica"],
        m.addr.to_string().as_str()
    );
    let got = resp.text().await.unwrap();
    assert_eq!(
        got,
        sse_events(true, 5, false).concat(),
        "client sees exactly a usage-free stream"
    );
    // Client asked for usage: bytes identical to the replica's.
    let resp = post(&r.url("/v1/completions"), json!({"model":"m","stream":true,"max_tokens":3,"prompt":"x","stream_options":{"include_usage":true}})).await;
    assert_eq!(
        resp.text().await.unwrap(),
        sse_events(false, 3, true).concat()
    );
    // The router measured the stream.
    let metrics = r.metrics_text().await;
    assert!(metrics.contains("headroom_ttft_seconds_count"), "{metrics}");
    assert!(metrics.contains("status=\"ok\"} 2"), "{metrics}");
}

#[tokio::test]
async fn non_streaming_is_identical_to_direct() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::LeastRequest, |_| {}).await;
    let body = json!({"model":"m","max_tokens":2,"prompt":"hello"});
    let direct = post(&format!("{}/v1/completions", m.url()), body.clone())
        .await
        .text()
        .await
        .unwrap();
    let via = post(&r.url("/v1/completions"), body).await;
    assert_eq!(via.status(), 200);
    assert_eq!(via.text().await.unwrap(), direct);
    // A whole response is a completed request, not a cancelled one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let metrics = r.metrics_text().await;
        if metrics.contains("status=\"ok\"} 1") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not recorded as ok: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn errors_are_openai_json() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::RoundRobin, |c| {
        c.proxy.max_body_bytes = 10_000
    })
    .await;
    let check = |resp: reqwest::Response, status: u16| async move {
        assert_eq!(resp.status().as_u16(), status);
        assert!(resp.headers().contains_key("x-headroom-replica"));
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], status);
        assert!(v["error"]["message"].as_str().unwrap().len() > 5);
        v
    };
    let v = check(
        post(
            &r.url("/v1/completions"),
            json!({"model":"nope","prompt":"x"}),
        )
        .await,
        404,
    )
    .await;
    assert_eq!(v["error"]["param"], "model");
    let resp = client()
        .post(r.url("/v1/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    check(resp, 400).await;
    check(
        post(
            &r.url("/v1/completions"),
            json!({"model":"m","prompt":"x".repeat(20_000)}),
        )
        .await,
        413,
    )
    .await;
    // A max_tokens past the context goes on: vLLM stops the output at the context's end.
    let resp = post(
        &r.url("/v1/completions"),
        json!({"model":"m","prompt":"x","max_tokens":100000}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    // A prompt longer than every replica's context (4,096 tokens) is the router's 400.
    check(
        post(
            &r.url("/v1/completions"),
            json!({"model":"m","prompt":vec![1u32; 4097]}),
        )
        .await,
        400,
    )
    .await;
    let resp = client()
        .post(r.url("/v1/completions"))
        .header("x-slo-ttft-ms", "-3")
        .json(&json!({"model":"m","prompt":"x"}))
        .send()
        .await
        .unwrap();
    check(resp, 400).await;
}

#[tokio::test]
async fn retries_on_5xx_before_the_first_byte() {
    let bad = mock("m").await;
    let good = mock("m").await;
    bad.set(Behaviour::Fail500);
    let r = router(&[bad.url(), good.url()], PolicyName::RoundRobin, |_| {}).await;
    for _ in 0..4 {
        let resp = post(
            &r.url("/v1/completions"),
            json!({"model":"m","stream":true,"max_tokens":2,"prompt":"x"}),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["x-headroom-replica"],
            good.addr.to_string().as_str()
        );
        assert!(resp.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    }
    assert!(bad.hits.load(SeqCst) >= 1);
}

#[tokio::test]
async fn replica_dying_mid_stream_ends_with_error_event_and_done() {
    let m = mock("m").await;
    m.set(Behaviour::DieMidStream);
    let r = router(&[m.url()], PolicyName::RoundRobin, |_| {}).await;
    let resp = post(&r.url("/v1/chat/completions"), json!({"model":"m","stream":true,"max_tokens":6,"messages":[{"role":"user","content":"x"}]})).await;
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(Duration::from_secs(5), resp.text())
        .await
        .expect("no hang")
        .unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 4, "two tokens, one error, DONE: {text}");
    assert!(events[2].starts_with("data: {\"error\""));
    assert_eq!(events[3], "data: [DONE]");
    // Exactly the two tokens the replica sent: nothing duplicated.
    assert_eq!(text.matches("\"content\"").count(), 2);
}

/// The idle timeout bounds the silence between a stream's chunks, not its length: a
/// stream that trickles (a chunk every 150 ms, ≈ 1 s in all) under a 400 ms timeout is
/// carried whole; one that falls silent after two chunks ends about a timeout later,
/// with an error event and `[DONE]`.
#[tokio::test]
async fn the_idle_timeout_bounds_silence_between_chunks_not_a_streams_length() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::RoundRobin, |c| {
        c.proxy.idle_timeout_ms = 400;
    })
    .await;
    let ask = json!({"model":"m","stream":true,"max_tokens":6,"prompt":"x"});
    m.set(Behaviour::Trickle);
    let started = std::time::Instant::now();
    let resp = post(&r.url("/v1/completions"), ask.clone()).await;
    let text = tokio::time::timeout(Duration::from_secs(10), resp.text())
        .await
        .expect("no hang")
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(800),
        "it trickled"
    );
    assert_eq!(text.matches("\"text\"").count(), 6, "every token: {text}");
    assert!(!text.contains("\"error\""), "{text}");
    m.set(Behaviour::SilentMidStream);
    let started = std::time::Instant::now();
    let resp = post(&r.url("/v1/completions"), ask).await;
    let text = tokio::time::timeout(Duration::from_secs(10), resp.text())
        .await
        .expect("the silent stream is ended")
        .unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 4, "two tokens, one error, DONE: {text}");
    assert!(events[2].starts_with("data: {\"error\""), "{text}");
    assert_eq!(events[3], "data: [DONE]");
}

#[tokio::test]
async fn dead_replica_is_ejected_and_traffic_moves() {
    let alive = mock("m").await;
    let dead = mock("m").await;
    let r = router(&[dead.url(), alive.url()], PolicyName::RoundRobin, |_| {}).await;
    let dead_addr = dead.addr;
    drop(dead); // its port now refuses connections
    for _ in 0..10 {
        let resp = post(
            &r.url("/v1/completions"),
            json!({"model":"m","max_tokens":1,"prompt":"x"}),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["x-headroom-replica"],
            alive.addr.to_string().as_str()
        );
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let dbg: Value = r.get_json("/debug/replicas").await;
        let d = dbg["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == dead_addr.to_string())
            .unwrap()
            .clone();
        if d["health"] == "ejected" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ejected: {d}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn stalled_replica_times_out_to_another_and_is_readmitted() {
    let stalled = mock("m").await;
    let good = mock("m").await;
    let r = router(&[stalled.url(), good.url()], PolicyName::RoundRobin, |c| {
        c.proxy.first_byte_timeout_ms = 300;
    })
    .await;
    stalled.set(Behaviour::Stall);
    stalled.health_ok.store(0, SeqCst);
    // Probes fail: ejected within a few probe periods.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while r.node.path.fleet.replicas()[0].health.routable() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "stalled replica never ejected"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resp = post(
        &r.url("/v1/completions"),
        json!({"model":"m","max_tokens":1,"prompt":"x"}),
    )
    .await;
    assert_eq!(
        resp.headers()["x-headroom-replica"],
        good.addr.to_string().as_str()
    );
    // It recovers: re-admitted after its backoff.
    stalled.set(Behaviour::Normal);
    stalled.health_ok.store(1, SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !r.node.path.fleet.replicas()[0].health.routable() {
        assert!(tokio::time::Instant::now() < deadline, "never re-admitted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn models_health_ready_and_debug() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::RoundRobin, |_| {}).await;
    let models: Value = r.get_json("/v1/models").await;
    assert_eq!(models["data"][0]["id"], "m");
    assert_eq!(
        client()
            .get(r.url("/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client().get(r.url("/ready")).send().await.unwrap().status(),
        200
    );
    let dbg: Value = r.get_json("/debug/replicas").await;
    let rep = &dbg["replicas"][0];
    assert_eq!(rep["scraped"]["kv_usage"], 0.1);
    assert_eq!(rep["scraped"]["num_gpu_blocks"], 1000);
    assert!(rep["scraped_age_s"].as_f64().unwrap() < 1.0);
}

/// A replica whose `/metrics` takes 300 ms describes its state as of when the scrape was
/// sent: the router never reports that state as fresher than it is.
#[tokio::test]
async fn a_slow_metrics_endpoint_is_never_reported_fresher_than_it_is() {
    let m = mock("m").await;
    m.metrics_delay_ms.store(300, SeqCst);
    let r = router(&[m.url()], PolicyName::RoundRobin, |_| {}).await;
    let mut ages = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ages.len() < 10 {
        assert!(std::time::Instant::now() < deadline, "ages seen: {ages:?}");
        let dbg: Value = r.get_json("/debug/replicas").await;
        if let Some(age) = dbg["replicas"][0]["scraped_age_s"].as_f64() {
            ages.push(age);
        }
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
    assert!(
        ages.iter().all(|a| *a >= 0.29 && *a < 3.0),
        "a 300 ms scrape reported as younger than 300 ms, or stale: {ages:?}"
    );
}

#[tokio::test]
async fn silent_replica_costs_one_first_byte_timeout_then_retries() {
    let silent = mock("m").await;
    let good = mock("m").await;
    let r = router(&[silent.url(), good.url()], PolicyName::RoundRobin, |c| {
        c.proxy.first_byte_timeout_ms = 300;
    })
    .await;
    silent.set(Behaviour::Stall); // health still answers: only a timeout can tell
    for _ in 0..2 {
        let t = std::time::Instant::now();
        let resp = post(
            &r.url("/v1/completions"),
            json!({"model":"m","stream":true,"max_tokens":2,"prompt":"x"}),
        )
        .await;
        assert_eq!(
            resp.headers()["x-headroom-replica"],
            good.addr.to_string().as_str()
        );
        assert!(resp.text().await.unwrap().ends_with("data: [DONE]\n\n"));
        assert!(t.elapsed() < Duration::from_secs(2));
    }
    assert!(
        silent.hits.load(SeqCst) >= 1,
        "round robin tried the silent one"
    );
}

#[tokio::test]
async fn long_text_prompts_are_measured_off_the_workers_exactly_as_inline() {
    use headroom::{
        config::ModelConfig,
        node::OFFLOAD_TOKENIZE_BYTES,
        request::{Endpoint, parse},
    };
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::RoundRobin, |c| {
        c.models.push(ModelConfig {
            name: "m".into(),
            tokenizer: Some("cl100k".into()),
            chat_template: None,
        })
    })
    .await;
    // 16.6 KB of text, over the offload threshold and within the mock's 4,096-token
    // context: cl100k reads each sentence as 10 tokens (the estimator would say 4,163).
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(370);
    assert!(text.len() >= OFFLOAD_TOKENIZE_BYTES);
    let body = json!({"model":"m","prompt":text,"max_tokens":5});
    let bytes = bytes::Bytes::from(serde_json::to_vec(&body).unwrap());
    let parsed = parse(Endpoint::Completions, &bytes, true).unwrap();
    let inline = r.node.path.shape(&parsed);
    assert!(
        (3_695..=3_705).contains(&inline.tokens),
        "{}",
        inline.tokens
    );
    assert_eq!(inline.blocks.len(), inline.tokens as usize / 16);
    let (back, off) = r.node.path.shape_off_worker(parsed.clone()).await.unwrap();
    assert_eq!(off, inline, "the blocking pool measures the same prompt");
    assert_eq!(
        back.upstream_body, parsed.upstream_body,
        "the request is intact"
    );
    // End to end: concurrent long prompts all come back whole.
    let url = r.url("/v1/completions");
    let sends = (0..8).map(|_| post(&url, body.clone()));
    for resp in futures_util::future::join_all(sends).await {
        assert_eq!(resp.status(), 200);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["object"], "text_completion", "{v}");
    }
}

/// The tiny model's tokenizer and template, laid out as a model directory.
fn tiny_model_dir() -> tempfile::TempDir {
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/vllm/fixtures");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        fixtures.join("tiny-llama-tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    // As scripts/vllm/make-tiny-model.py writes it.
    let cfg = json!({"bos_token": "<s>", "eos_token": "</s>", "chat_template":
        "{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}"});
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    dir
}

#[tokio::test]
async fn hf_tokenizer_counts_are_exposed_per_response_streamed_or_not() {
    use headroom::config::ModelConfig;
    let dir = tiny_model_dir();
    let m = mock("m").await;
    let spec = format!("hf:{}", dir.path().join("tokenizer.json").display());
    let r = router(&[m.url()], PolicyName::RoundRobin, |c| {
        c.models.push(ModelConfig {
            name: "m".into(),
            tokenizer: Some(spec.clone()),
            chat_template: None,
        })
    })
    .await;
    // The requests of scripts/vllm/fixtures: real vLLM reported 16 and 32 prompt tokens.
    let prompt = "The router sends each request where its objectives hold.";
    let messages = json!([{"role":"system","content":"Be brief."},
                          {"role":"user","content":"Describe a prefix cache in one line."}]);
    for stream in [false, true] {
        let resp = post(
            &r.url("/v1/completions"),
            json!({"model":"m","prompt":prompt,"max_tokens":4,"stream":stream}),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["x-headroom-prompt-tokens"],
            "16",
            "stream {stream}"
        );
        let resp = post(
            &r.url("/v1/chat/completions"),
            json!({"model":"m","messages":messages,"max_tokens":4,"stream":stream}),
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            resp.headers()["x-headroom-prompt-tokens"],
            "32",
            "stream {stream}"
        );
    }
}

#[tokio::test]
async fn long_chat_prompts_are_rendered_off_the_workers_exactly_as_inline() {
    use headroom::{
        config::ModelConfig,
        node::OFFLOAD_HF_TOKENIZE_BYTES,
        request::{Endpoint, parse},
    };
    let dir = tiny_model_dir();
    let m = mock("m").await;
    let spec = format!("hf:{}", dir.path().join("tokenizer.json").display());
    let r = router(&[m.url()], PolicyName::RoundRobin, |c| {
        c.models.push(ModelConfig {
            name: "m".into(),
            tokenizer: Some(spec.clone()),
            chat_template: None,
        })
    })
    .await;
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(370);
    assert!(text.len() >= OFFLOAD_HF_TOKENIZE_BYTES);
    let body = json!({"model":"m","messages":[{"role":"user","content":text}],"max_tokens":5});
    let parsed = parse(
        Endpoint::ChatCompletions,
        &bytes::Bytes::from(serde_json::to_vec(&body).unwrap()),
        true,
    )
    .unwrap();
    let inline = r.node.path.shape(&parsed);
    let (_, off) = r.node.path.shape_off_worker(parsed.clone()).await.unwrap();
    assert_eq!(off, inline, "the blocking pool measures the same prompt");
    // The render: "<s>user\n" + text + "</s>\n<s>assistant\n" costs a handful of tokens
    // on top of the text itself, not 4 a message on top of an estimate.
    let plain = r.node.path.shape(
        &parse(
            Endpoint::Completions,
            &bytes::Bytes::from(serde_json::to_vec(&json!({"model":"m","prompt":text})).unwrap()),
            true,
        )
        .unwrap(),
    );
    assert!(
        inline.tokens > plain.tokens && inline.tokens < plain.tokens + 12,
        "chat {} vs text {}",
        inline.tokens,
        plain.tokens
    );
}

#[tokio::test]
async fn a_missing_tokenizer_file_stops_the_node_naming_it() {
    use headroom::{
        config::{ModelConfig, RouterConfig},
        node::Node,
    };
    let mut cfg = RouterConfig::default();
    cfg.models.push(ModelConfig {
        name: "m".into(),
        tokenizer: Some("hf:/nowhere/tokenizer.json".into()),
        chat_template: None,
    });
    let cancel = tokio_util::sync::CancellationToken::new();
    let err = Node::start(cfg, cancel.clone())
        .await
        .err()
        .expect("must fail");
    cancel.cancel();
    let s = format!("{err:#}");
    assert!(
        s.contains("/nowhere/tokenizer.json") && s.contains("model `m`"),
        "{s}"
    );
}

/// With `deadline_priority` the engine gets each request's TTFT deadline (Unix ms) as
/// its `priority`, the rest of the body untouched; a client's own priority is kept, and
/// a replica that schedules first come, first served gets none.
#[tokio::test]
async fn engines_that_schedule_by_priority_get_the_ttft_deadline() {
    let fcfs = mock("m").await;
    let prio = mock("m").await;
    let r = router(&[fcfs.url(), prio.url()], PolicyName::RoundRobin, |c| {
        c.replicas[1].deadline_priority = Some(true);
    })
    .await;
    let last = |m: &common::Mock| -> Value {
        serde_json::from_slice(m.last_body.lock().unwrap().as_ref().unwrap()).unwrap()
    };
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let body = json!({"model":"m","max_tokens":2,"prompt":"hello","stream":true});
    let mut seen = (false, false);
    for _ in 0..4 {
        let before = unix_ms();
        let resp = client()
            .post(r.url("/v1/completions"))
            .header("x-slo-ttft-ms", "750")
            .json(&body)
            .send()
            .await
            .unwrap();
        let replica = resp.headers()["x-headroom-replica"]
            .to_str()
            .unwrap()
            .to_string();
        resp.text().await.unwrap();
        if replica == prio.addr.to_string() {
            seen.1 = true;
            let got = last(&prio);
            let ttft_ms = 750;
            let p = got["priority"].as_i64().expect("a priority");
            assert!(
                (before..=unix_ms()).contains(&(p - ttft_ms)),
                "deadline {p} is not arrival + {ttft_ms} ms"
            );
            assert_eq!(got["prompt"], "hello");
            assert_eq!(got["max_tokens"], 2);
        } else {
            seen.0 = true;
            assert!(
                last(&fcfs).get("priority").is_none(),
                "only engines configured for priority get one"
            );
        }
    }
    assert_eq!(seen, (true, true), "round robin reached both");
    // The client's own priority is the engine's.
    for _ in 0..2 {
        let mine = json!({"model":"m","max_tokens":2,"prompt":"hi","priority":-7});
        post(&r.url("/v1/completions"), mine)
            .await
            .text()
            .await
            .unwrap();
    }
    assert_eq!(last(&prio)["priority"], -7);
}
