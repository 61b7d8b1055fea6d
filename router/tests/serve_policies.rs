//! The peer reference policies run in the binary: `headroom serve --policy <name>`
//! under the simulator's names, as a real process on loopback against mock replicas.
//! Cache-aware policies send a repeated prompt back to the replica that holds it, and
//! the node's metrics name the policy that decided.

mod common;

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{Proc, client, free_tcp, mock};
use serde_json::json;

fn serve(policy: &str, http: SocketAddr, replicas: &[String]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_headroom"));
    cmd.args(["serve", "--listen", &http.to_string(), "--policy", policy])
        .env("HEADROOM_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    for r in replicas {
        cmd.args(["--replica", r]);
    }
    Proc(cmd.spawn().expect("spawn headroom serve"))
}

/// Sends one completion; the replica that served it, or `None` while none can.
async fn complete(http: SocketAddr, prompt: &str) -> Option<String> {
    let resp = client()
        .post(format!("http://{http}/v1/completions"))
        .timeout(Duration::from_secs(10))
        .json(&json!({"model": "m", "prompt": prompt, "max_tokens": 4}))
        .send()
        .await
        .ok()?;
    if resp.status() != 200 {
        return None;
    }
    let replica = resp
        .headers()
        .get(headroom::REPLICA_HEADER)?
        .to_str()
        .ok()?
        .to_string();
    resp.bytes().await.ok()?;
    Some(replica)
}

/// Every replica is up (both answer), so a choice between them is the policy's.
async fn until_both_serve(http: SocketAddr) {
    let start = Instant::now();
    let mut seen = std::collections::HashSet::new();
    let mut i = 0;
    while seen.len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "both replicas never served (saw {seen:?})"
        );
        // Short distinct prompts: nothing to stick to, so load spreads them.
        if let Some(r) = complete(http, &format!("warm-up {i}")).await {
            seen.insert(r);
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        i += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_reference_policies_run_in_headroom_serve() {
    let (a, b) = (mock("m").await, mock("m").await);
    let replicas = [a.url(), b.url()];
    for policy in ["dynamo-kv", "sglang-cache-aware"] {
        let http = free_tcp();
        let _node = serve(policy, http, &replicas);
        until_both_serve(http).await;
        // A long prompt placed once is then held by that replica; its repeats follow it.
        let prompt = format!("{policy}: {}", "the same long document ".repeat(200));
        let first = complete(http, &prompt).await.expect("first placement");
        for n in 0..6 {
            let again = complete(http, &prompt).await.expect("repeat placement");
            assert_eq!(
                again, first,
                "{policy}: repeat {n} left the replica holding the prompt"
            );
        }
        let metrics = client()
            .get(format!("http://{http}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains(&format!(
                "headroom_decision_seconds_count{{policy=\"{policy}\"}}"
            )),
            "{policy} did not decide"
        );
    }
}

#[test]
fn an_unknown_policy_is_refused_with_the_names() {
    let out = Command::new(env!("CARGO_BIN_EXE_headroom"))
        .args([
            "serve",
            "--policy",
            "llm-d",
            "--replica",
            "http://127.0.0.1:9",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run headroom serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for name in [
        "dynamo-kv",
        "llmd-weighted",
        "llmd-predicted",
        "sglang-cache-aware",
    ] {
        assert!(err.contains(name), "{name} missing from: {err}");
    }
}
