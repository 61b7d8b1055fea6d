//! The admission gate through a live router: 429 with `Retry-After` over a tenant's
//! rate or concurrency, 503 with `Retry-After` when the fleet is full for a tenant
//! with nothing running, every refusal OpenAI-shaped and counted in `/metrics`.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Behaviour, client, mock, router};
use headroom::{config::TenantConfig, policy::PolicyName};
use serde_json::{Value, json};

fn tenant(name: &str, key: &str, edit: impl FnOnce(&mut TenantConfig)) -> TenantConfig {
    let mut t = TenantConfig {
        api_keys: vec![key.into()],
        name: name.into(),
        ..TenantConfig::default_tenant()
    };
    edit(&mut t);
    t
}

fn body() -> Value {
    json!({"model": "m", "prompt": "hello", "max_tokens": 2})
}

async fn refusal(resp: reqwest::Response, status: u16, kind: &str) -> u64 {
    assert_eq!(resp.status(), status);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert_eq!(v["error"]["code"], status, "{v}");
    retry
}

#[tokio::test]
async fn over_its_request_rate_a_tenant_gets_429_with_the_buckets_retry_after() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.tenants = vec![tenant("capped", "k-capped", |t| t.rpm = 2.0)];
    })
    .await;
    let c = client();
    let send = || {
        c.post(r.url("/v1/completions"))
            .bearer_auth("k-capped")
            .json(&body())
            .send()
    };
    for _ in 0..2 {
        assert_eq!(send().await.unwrap().status(), 200);
    }
    // Two per minute: the next one is 30 s away.
    let retry = refusal(send().await.unwrap(), 429, "rate_limit_exceeded").await;
    assert!((29..=30).contains(&retry), "{retry}");
    assert_eq!(m.hits.load(std::sync::atomic::Ordering::SeqCst), 2);
    let metrics = r.metrics_text().await;
    assert!(
        metrics.contains(
            "headroom_admission_total{outcome=\"rejected\",reason=\"rate_requests\",tenant=\"capped\"} 1"
        ),
        "{metrics}"
    );
    assert!(metrics.contains(
        "headroom_admission_total{outcome=\"admitted\",reason=\"direct\",tenant=\"capped\"} 2"
    ));
}

#[tokio::test]
async fn concurrency_limit_is_429_and_a_full_fleet_is_503_both_within_max_wait() {
    let m = mock("m").await;
    m.set(Behaviour::Stall);
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.tenants = vec![
            tenant("one", "k-one", |t| t.max_concurrency = 1),
            tenant("other", "k-other", |_| {}),
        ];
        // Capacity 1: whoever runs holds it; shares of two tenants are ⌊1/2⌋ = 0.
        c.admission.per_replica_in_flight = 1;
        c.admission.max_wait_ms = 300;
        // The held request gives up on the stalled replica soon after its client left.
        c.proxy.first_byte_timeout_ms = 2_000;
    })
    .await;
    let c = client();
    let url = r.url("/v1/completions");
    // One request of `one` holds the only slot (the replica never answers).
    let held = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        async move { c.post(url).bearer_auth("k-one").json(&body()).send().await }
    });
    for _ in 0..100 {
        if m.hits.load(std::sync::atomic::Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = std::time::Instant::now();
    let resp = c
        .post(&url)
        .bearer_auth("k-one")
        .json(&body())
        .send()
        .await
        .unwrap();
    refusal(resp, 429, "rate_limit_exceeded").await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "waited {waited:?}, bounded by max_wait_ms"
    );
    // `other` runs nothing and still cannot start: the fleet is full, not its fault.
    let resp = c
        .post(&url)
        .bearer_auth("k-other")
        .json(&body())
        .send()
        .await
        .unwrap();
    let retry = refusal(resp, 503, "service_unavailable").await;
    assert!(retry >= 1);
    held.abort();
    // Once the held request ends (its client gone, the replica timed out), its slot
    // frees: `other` gets in.
    m.set(Behaviour::Normal);
    let mut ok = false;
    for _ in 0..100 {
        let s = c
            .post(&url)
            .bearer_auth("k-other")
            .json(&body())
            .send()
            .await
            .unwrap();
        if s.status() == 200 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "the slot was never released after the client left");
}

/// A request that waited at the gate saw that wait in its TTFT: the forecast in its
/// headers, the decision record's measured TTFT and `headroom_ttft_seconds` all count
/// from arrival at the router, and the wait itself is reported apart.
#[tokio::test]
async fn time_waited_at_the_gate_counts_in_the_forecast_and_the_measured_ttft() {
    let m = mock("m").await;
    m.set(Behaviour::Stall);
    let r = router(&[m.url()], PolicyName::Slo, |c| {
        c.admission.per_replica_in_flight = 1;
        c.admission.max_wait_ms = 5_000;
        c.proxy.first_byte_timeout_ms = 10_000;
    })
    .await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    let chat = json!({"model":"m","stream":true,"max_tokens":4,
        "messages":[{"role":"user","content":"hello there"}]});
    let held = tokio::spawn({
        let (c, url, chat) = (c.clone(), url.clone(), chat.clone());
        async move { c.post(url).json(&chat).send().await }
    });
    for _ in 0..100 {
        if m.hits.load(std::sync::atomic::Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The second waits at the gate until the first's client leaves (≥ 400 ms).
    let waiting = tokio::spawn({
        let (c, url, chat) = (c.clone(), url.clone(), chat.clone());
        async move { c.post(url).json(&chat).send().await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    m.set(Behaviour::Normal);
    held.abort();
    let resp = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("admitted once the slot freed")
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), 200);
    let header = |k: &str| -> f64 { resp.headers()[k].to_str().unwrap().parse().unwrap() };
    let (ttft, upper) = (
        header("x-headroom-predicted-ttft-ms"),
        header("x-headroom-predicted-ttft-upper-ms"),
    );
    assert!(
        ttft >= 350.0 && upper >= ttft,
        "forecast {ttft} / {upper} ms"
    );
    let id: u64 = resp.headers()["x-headroom-decision-id"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    resp.text().await.unwrap();
    let mut rec = Value::Null;
    for _ in 0..100 {
        rec = r.get_json(&format!("/debug/decisions/{id}")).await;
        if rec["measured"].is_object() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let measured = &rec["measured"];
    let (wait, ttft) = (
        measured["router_wait_ms"].as_f64().unwrap(),
        measured["ttft_ms"].as_f64().unwrap(),
    );
    assert!(wait >= 350.0 && ttft > wait, "{measured}");
    let metrics = r.metrics_text().await;
    // The waited request's TTFT falls past the 0.3 s bucket (it started at arrival).
    let over = |line: &str| {
        line.starts_with("headroom_ttft_seconds_bucket") && line.contains("le=\"0.3\"")
    };
    let below: f64 = metrics
        .lines()
        .filter(|l| over(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let count: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("headroom_ttft_seconds_count"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(count >= 1.0 && below < count, "{metrics}");
    assert!(
        metrics.contains("headroom_router_wait_seconds_count"),
        "{metrics}"
    );
}
