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
    let metrics = c
        .get(r.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
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
