//! Identity and configuration at the edge (issue 15): with keys configured, a missing,
//! unknown or malformed API key is 401 unless an anonymous tenant is named; tenants
//! and keys reload on SIGHUP without dropping streams; a config with a number out of
//! range does not start, and says which field.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    io::Write,
    net::SocketAddr,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{Proc, client, mock, router};
use headroom::{config::TenantConfig, policy::PolicyName};
use serde_json::{Value, json};

fn tenant(name: &str, key: &str) -> TenantConfig {
    TenantConfig {
        api_keys: vec![key.into()],
        name: name.into(),
        ..TenantConfig::default_tenant()
    }
}

fn body() -> Value {
    json!({"model": "m", "prompt": "hello", "max_tokens": 2})
}

#[tokio::test]
async fn unknown_missing_or_malformed_keys_are_401_when_tenants_have_keys() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.tenants = vec![tenant("gold", "k-gold")];
    })
    .await;
    let c = client();
    let url = r.url("/v1/completions");
    let ok = c
        .post(&url)
        .bearer_auth("k-gold")
        .json(&body())
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let hits = m.hits.load(std::sync::atomic::Ordering::SeqCst);
    for req in [
        c.post(&url).json(&body()),
        c.post(&url).bearer_auth("k-wrong").json(&body()),
        c.post(&url).header("authorization", "k-gold").json(&body()),
        c.post(&url)
            .header("authorization", "Basic azpn")
            .json(&body()),
        c.post(&url).header("x-api-key", "nope").json(&body()),
    ] {
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401);
        let v: Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["type"], "authentication_error", "{v}");
        assert_eq!(v["error"]["code"], 401, "{v}");
    }
    assert_eq!(
        m.hits.load(std::sync::atomic::Ordering::SeqCst),
        hits,
        "a refused request reached a replica"
    );
}

#[tokio::test]
async fn a_named_anonymous_tenant_serves_requests_without_a_key() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.tenants = vec![
            tenant("gold", "k-gold"),
            TenantConfig {
                name: "free".into(),
                ..TenantConfig::default_tenant()
            },
        ];
        c.edge.anonymous_tenant = Some("free".into());
    })
    .await;
    let c = client();
    for req in [
        c.post(r.url("/v1/completions")).json(&body()),
        c.post(r.url("/v1/completions"))
            .bearer_auth("k-unknown")
            .json(&body()),
    ] {
        assert_eq!(req.send().await.unwrap().status(), 200);
    }
}

#[tokio::test]
async fn reload_keeps_streams_and_swaps_keys() {
    let m = mock("m").await;
    let r = router(&[m.url()], PolicyName::LeastRequest, |c| {
        c.tenants = vec![tenant("gold", "k-old")];
    })
    .await;
    let c = client();
    // A stream of 400 tokens (~1 s) admitted under the old key.
    let mut stream = c
        .post(r.url("/v1/completions"))
        .bearer_auth("k-old")
        .json(&json!({"model": "m", "prompt": "x", "max_tokens": 400, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.unwrap().unwrap();
    assert!(!first.is_empty());
    r.node.path.tenants.reload(&[tenant("gold", "k-new")], None);
    let old = c
        .post(r.url("/v1/completions"))
        .bearer_auth("k-old")
        .json(&body())
        .send()
        .await
        .unwrap();
    assert_eq!(old.status(), 401);
    let new = c
        .post(r.url("/v1/completions"))
        .bearer_auth("k-new")
        .json(&body())
        .send()
        .await
        .unwrap();
    assert_eq!(new.status(), 200);
    let mut rest = Vec::new();
    while let Some(b) = stream.chunk().await.unwrap() {
        rest.extend_from_slice(&b);
    }
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "the stream was cut: {text}"
    );
    assert!(!text.contains("\"error\""), "{text}");
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn write(path: &std::path::Path, text: &str) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

#[tokio::test]
async fn sighup_reloads_tenants_in_a_running_process() {
    let m = mock("m").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("router.toml");
    let listen = free_port();
    let cfg = |key: &str| {
        format!(
            "listen = \"{listen}\"\npolicy = \"least-request\"\n[[replicas]]\nurl = \"{}\"\n[[tenants]]\nname = \"gold\"\napi_keys = [\"{key}\"]\n",
            m.url()
        )
    };
    write(&path, &cfg("k-one"));
    let child = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(["serve", "--config", path.to_str().unwrap()])
        .env("HEADROOM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let proc = Proc(child);
    let c = client();
    let url = format!("http://{listen}/v1/completions");
    let status = |key: &'static str| {
        let c = c.clone();
        let url = url.clone();
        async move {
            c.post(&url)
                .bearer_auth(key)
                .json(&body())
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    };
    let t0 = Instant::now();
    while status("k-one").await != 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "router never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status("k-two").await, 401);
    write(&path, &cfg("k-two"));
    let pid = proc.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let t0 = Instant::now();
    while status("k-two").await != 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "SIGHUP did not reload keys"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status("k-one").await, 401);
    // A broken file is refused and changes nothing.
    write(
        &path,
        &format!("{}[slo]\ndefer_budget = -1\n", cfg("k-three")),
    );
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status("k-two").await, 200);
    assert_eq!(status("k-three").await, 401);
}

/// `headroom serve` on `toml` must exit non-zero, naming `field`.
fn refuses(toml: &str, field: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    write(&path, &format!("listen = \"127.0.0.1:0\"\n{toml}"));
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args(["serve", "--config", path.to_str().unwrap()])
        .args(["--replica", "http://127.0.0.1:9"])
        .env("HEADROOM_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with {toml:?}");
    assert!(
        err.contains(field),
        "{toml:?}: error does not name {field}: {err}"
    );
}

#[test]
fn numbers_out_of_range_stop_the_node_at_start() {
    for (toml, field) in [
        ("[slo]\ndefer_budget = -1", "slo.defer_budget"),
        ("[slo]\ndefer_budget = nan", "slo.defer_budget"),
        ("[slo]\ndefer_budget = inf", "slo.defer_budget"),
        ("[slo]\nexplore = 5", "slo.explore"),
        ("[slo]\nnear_equal = -1", "slo.near_equal"),
        ("[slo]\nmin_warm_fraction = nan", "slo.min_warm_fraction"),
        ("[slo]\ncost_tolerance = -0.5", "slo.cost_tolerance"),
        ("[slo]\nprobe_idle_s = nan", "slo.probe_idle_s"),
        (
            "[proxy]\nfirst_byte_timeout_ms = 0",
            "proxy.first_byte_timeout_ms",
        ),
        ("[proxy]\nmax_body_bytes = 0", "proxy.max_body_bytes"),
        (
            "[proxy]\nretry_backoff_ms = 18446744073709551615",
            "proxy.retry_backoff_ms",
        ),
        ("[scrape]\ntimeout_ms = 0", "scrape.timeout_ms"),
        (
            "[health]\neject_after_failures = 0",
            "health.eject_after_failures",
        ),
        ("[health]\nbackoff_max_ms = 10", "health.backoff_max_ms"),
        (
            "[prefix_affinity]\npeak_prefill_tps = 0",
            "prefix_affinity.peak_prefill_tps",
        ),
        ("[edge]\nmax_connections = 0", "edge.max_connections"),
        (
            "[edge]\nheader_read_timeout_ms = 0",
            "edge.header_read_timeout_ms",
        ),
        (
            "[edge]\nanonymous_tenant = \"ghost\"",
            "edge.anonymous_tenant",
        ),
        ("[mesh]\nscrape_owners = 0", "mesh.scrape_owners"),
        ("[[tenants]]\nname = \"t\"\nslo_ttft_ms = inf", "tenant `t`"),
        ("[predictor]\ntau_s = -1", "tau_s"),
    ] {
        refuses(toml, field);
    }
}
