//! Mid-stream failover through a real router node: a replica that breaks a stream after
//! sending tokens, and another that continues it (`router/src/proxy/failover.rs`).

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering::SeqCst},
    },
    time::Duration,
};

use axum::{
    Json, Router,
    body::{Body, Bytes},
    extract::State,
    response::Response,
    routing::{get, post},
};
use common::{client, router};
use futures_util::{StreamExt, stream};
use headroom::{config::TenantConfig, policy::PolicyName};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// How a scripted replica breaks the streams it is asked to break.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Break {
    /// The connection drops after two content chunks.
    Reset,
    /// An SSE error event and `[DONE]` after two content chunks (the emulator's fault).
    ErrorEvent,
    /// The whole stream, `[DONE]` included, then the connection stays open past the
    /// router's idle timeout.
    HangAfterDone,
}

/// A replica that breaks streams while the shared `breaks` count lasts and serves the
/// rest whole, recording every request body.
struct Scripted {
    addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Value>>>,
    cancel: CancellationToken,
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

#[derive(Clone)]
struct St {
    tag: &'static str,
    how: Break,
    breaks: Arc<AtomicUsize>,
    bodies: Arc<Mutex<Vec<Value>>>,
}

/// One chunk as vLLM sends it with per-chunk usage: cumulative `completion_tokens`.
fn chunk(chat: bool, id: &str, i: usize, done: usize, last: bool, usage: bool) -> String {
    let finish = if last { "\"length\"" } else { "null" };
    let choice = if chat {
        let role = if i == 0 {
            "\"role\":\"assistant\","
        } else {
            ""
        };
        format!(
            "{{\"index\":0,\"delta\":{{{role}\"content\":\" w{i}\"}},\"finish_reason\":{finish}}}"
        )
    } else {
        format!("{{\"index\":0,\"text\":\" w{i}\",\"finish_reason\":{finish}}}")
    };
    let u = if usage {
        format!(
            ",\"usage\":{{\"prompt_tokens\":9,\"completion_tokens\":{done},\"total_tokens\":{}}}",
            9 + done
        )
    } else {
        String::new()
    };
    format!(
        "data: {{\"id\":\"{id}\",\"object\":\"x\",\"created\":5,\"model\":\"m\",\"choices\":[{choice}]{u}}}\n\n"
    )
}

async fn complete(State(s): State<St>, chat: bool, body: Bytes) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    s.bodies.lock().unwrap().push(v.clone());
    let n = v["max_tokens"]
        .as_u64()
        .or(v["max_completion_tokens"].as_u64())
        .unwrap_or(4) as usize;
    let per_chunk = v["stream_options"]["continuous_usage_stats"] == true;
    let final_usage = v["stream_options"]["include_usage"] == true;
    let id = format!("{}-{}", s.tag, s.bodies.lock().unwrap().len());
    let breaking = s
        .breaks
        .fetch_update(SeqCst, SeqCst, |b| b.checked_sub(1))
        .is_ok()
        && s.how != Break::HangAfterDone;
    let mut items: Vec<Result<Bytes, std::io::Error>> = Vec::new();
    let shown = if breaking { 2.min(n) } else { n };
    for i in 0..shown {
        let ev = chunk(chat, &id, i, i + 1, !breaking && i + 1 == n, per_chunk);
        items.push(Ok(Bytes::from(ev)));
    }
    if breaking {
        match s.how {
            Break::Reset => items.push(Err(std::io::Error::other("replica died"))),
            Break::HangAfterDone => {}
            Break::ErrorEvent => {
                items.push(Ok(Bytes::from(
                    "data: {\"error\":{\"message\":\"engine died\",\"code\":500}}\n\ndata: [DONE]\n\n",
                )));
            }
        }
    } else {
        if final_usage {
            items.push(Ok(Bytes::from(format!(
                "data: {{\"id\":\"{id}\",\"object\":\"x\",\"created\":5,\"model\":\"m\",\"choices\":[],\"usage\":{{\"prompt_tokens\":9,\"completion_tokens\":{n},\"total_tokens\":{}}}}}\n\n",
                9 + n
            ))));
        }
        items.push(Ok(Bytes::from("data: [DONE]\n\n")));
    }
    let hang = s.how == Break::HangAfterDone;
    let body = stream::iter(items)
        .then(|x| async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            x
        })
        .chain(stream::once(async move {
            if hang {
                tokio::time::sleep(Duration::from_millis(1_500)).await;
            }
            Ok(Bytes::new())
        }));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(body))
        .unwrap()
}

async fn scripted(tag: &'static str, how: Break, breaks: Arc<AtomicUsize>) -> Scripted {
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let st = St {
        tag,
        how,
        breaks,
        bodies: bodies.clone(),
    };
    let app = Router::new()
        .route("/v1/completions", post(|s: State<St>, b: Bytes| complete(s, false, b)))
        .route("/v1/chat/completions", post(|s: State<St>, b: Bytes| complete(s, true, b)))
        .route(
            "/v1/models",
            get(|| async { Json(json!({"object":"list","data":[{"id":"m","object":"model","max_model_len":4096}]})) }),
        )
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(|| async { "vllm:num_requests_running{engine=\"0\"} 0\nvllm:num_requests_waiting{engine=\"0\"} 0\n" }))
        .with_state(st);
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
    Scripted {
        addr,
        bodies,
        cancel,
    }
}

/// The stream's data payloads, parsed where JSON (`[DONE]` kept as a string).
async fn events(resp: reqwest::Response) -> Vec<Value> {
    assert_eq!(resp.status(), 200);
    let text = tokio::time::timeout(Duration::from_secs(5), resp.text())
        .await
        .expect("no hang")
        .unwrap();
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let d = e.strip_prefix("data: ").expect("data events only");
            serde_json::from_str(d).unwrap_or(Value::String(d.into()))
        })
        .collect()
}

fn text_of(evs: &[Value]) -> String {
    evs.iter()
        .flat_map(|e| e["choices"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| {
            c["text"]
                .as_str()
                .or(c["delta"]["content"].as_str())
                .map(str::to_string)
        })
        .collect()
}

async fn metric(r: &common::TestRouter, line: &str) -> f64 {
    let text = r.metrics_text().await;
    text.lines()
        .find_map(|l| l.strip_prefix(line).map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0.0)
}

/// Two scripted replicas of which the first to serve a stream breaks it; the request
/// goes to whichever round-robin picks and continues on the other.
async fn pair(how: Break) -> (Scripted, Scripted) {
    let breaks = Arc::new(AtomicUsize::new(1));
    (
        scripted("a", how, breaks.clone()).await,
        scripted("b", how, breaks).await,
    )
}

fn continuation_of(a: &Scripted, b: &Scripted) -> Value {
    let (a, b) = (a.bodies.lock().unwrap(), b.bodies.lock().unwrap());
    assert_eq!(a.len() + b.len(), 2, "one attempt, one continuation");
    if a.len() == 2 || b.len() == 2 {
        panic!("the continuation went back to the replica that broke the stream");
    }
    // The continuation is the second request either replica saw; tell it by its budget.
    [a[0].clone(), b[0].clone()]
        .into_iter()
        .min_by_key(|v| {
            v["max_tokens"]
                .as_u64()
                .or(v["max_completion_tokens"].as_u64())
        })
        .unwrap()
}

#[tokio::test]
async fn a_completion_cut_by_a_dying_replica_completes_on_another() {
    let (a, b) = pair(Break::Reset).await;
    let r = router(
        &[format!("http://{}", a.addr), format!("http://{}", b.addr)],
        PolicyName::RoundRobin,
        |_| {},
    )
    .await;
    let resp = client()
        .post(r.url("/v1/completions"))
        .json(&json!({"model":"m","prompt":"Once","max_tokens":6,"stream":true}))
        .send()
        .await
        .unwrap();
    let evs = events(resp).await;
    // The two tokens from the broken replica, then four from the continuation.
    assert_eq!(text_of(&evs), " w0 w1 w0 w1 w2 w3");
    assert_eq!(evs.last().unwrap(), "[DONE]");
    assert!(evs.iter().all(|e| e.get("error").is_none()), "{evs:?}");
    assert!(
        evs.iter().all(|e| !e.to_string().contains("usage")),
        "{evs:?}"
    );
    let ids: std::collections::BTreeSet<_> = evs.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), 1, "one completion id: {ids:?}");
    let cont = continuation_of(&a, &b);
    assert_eq!(cont["prompt"], "Once w0 w1");
    assert_eq!(cont["max_tokens"], 4);
    assert_eq!(
        metric(&r, "headroom_failover_total{outcome=\"resumed\"}").await,
        1.0
    );
    assert_eq!(metric(&r, "headroom_failover_seconds_count").await, 1.0);
}

#[tokio::test]
async fn a_chat_cut_by_an_error_event_completes_with_one_role_one_id_and_summed_usage() {
    let (a, b) = pair(Break::ErrorEvent).await;
    let r = router(
        &[format!("http://{}", a.addr), format!("http://{}", b.addr)],
        PolicyName::RoundRobin,
        |_| {},
    )
    .await;
    let resp = client()
        .post(r.url("/v1/chat/completions"))
        .json(
            &json!({"model":"m","messages":[{"role":"user","content":"hi"}],
            "max_completion_tokens":5,"stream":true,"stream_options":{"include_usage":true}}),
        )
        .send()
        .await
        .unwrap();
    let evs = events(resp).await;
    assert!(evs.iter().all(|e| e.get("error").is_none()), "{evs:?}");
    assert_eq!(text_of(&evs), " w0 w1 w0 w1 w2");
    let roles = evs
        .iter()
        .filter(|e| !e["choices"][0]["delta"]["role"].is_null())
        .count();
    assert_eq!(roles, 1, "{evs:?}");
    let ids: std::collections::BTreeSet<_> = evs.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    // The usage the client asked for covers the whole stream and its own prompt.
    let usage: Vec<&Value> = evs
        .iter()
        .filter(|e| e["choices"].as_array().is_some_and(|c| c.is_empty()))
        .map(|e| &e["usage"])
        .collect();
    assert_eq!(usage.len(), 1, "{evs:?}");
    assert_eq!(usage[0]["completion_tokens"], 5);
    assert_eq!(usage[0]["prompt_tokens"], 9);
    assert_eq!(evs.iter().filter(|e| *e == "[DONE]").count(), 1);
    let cont = continuation_of(&a, &b);
    let msgs = cont["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[1], json!({"role":"assistant","content":" w0 w1"}));
    assert_eq!(cont["continue_final_message"], true);
    assert_eq!(cont["add_generation_prompt"], false);
    assert_eq!(cont["max_completion_tokens"], 3);
}

#[tokio::test]
async fn a_tenant_that_opts_out_and_a_lone_replica_end_with_one_error_and_done() {
    for (replicas, opt_out, outcome) in [(2, true, None), (1, false, Some("failed"))] {
        let (a, b) = pair(Break::ErrorEvent).await;
        let urls: Vec<String> = [&a, &b][..replicas]
            .iter()
            .map(|s| format!("http://{}", s.addr))
            .collect();
        let r = router(&urls, PolicyName::RoundRobin, |c| {
            c.tenants = vec![TenantConfig {
                failover: !opt_out,
                ..TenantConfig::default_tenant()
            }];
        })
        .await;
        let resp = client()
            .post(r.url("/v1/completions"))
            .json(&json!({"model":"m","prompt":"p","max_tokens":6,"stream":true}))
            .send()
            .await
            .unwrap();
        let evs = events(resp).await;
        assert_eq!(text_of(&evs), " w0 w1", "{evs:?}");
        assert_eq!(evs.len(), 4, "two tokens, one error, [DONE]: {evs:?}");
        assert!(evs[2].get("error").is_some());
        assert_eq!(evs[3], "[DONE]");
        let sent = a.bodies.lock().unwrap().len() + b.bodies.lock().unwrap().len();
        assert_eq!(sent, 1, "nothing was continued");
        if let Some(o) = outcome {
            let line = format!("headroom_failover_total{{outcome=\"{o}\"}}");
            assert_eq!(metric(&r, &line).await, 1.0);
        }
    }
}

#[tokio::test]
async fn a_stream_cut_twice_is_continued_twice_within_the_budget() {
    let breaks = Arc::new(AtomicUsize::new(2));
    let a = scripted("a", Break::Reset, breaks.clone()).await;
    let b = scripted("b", Break::Reset, breaks).await;
    let r = router(
        &[format!("http://{}", a.addr), format!("http://{}", b.addr)],
        PolicyName::RoundRobin,
        |c| c.proxy.failover_attempts = 2,
    )
    .await;
    let resp = client()
        .post(r.url("/v1/completions"))
        .json(&json!({"model":"m","prompt":"p","max_tokens":6,"stream":true}))
        .send()
        .await
        .unwrap();
    let evs = events(resp).await;
    assert_eq!(text_of(&evs), " w0 w1 w0 w1 w0 w1", "{evs:?}");
    assert!(evs.iter().all(|e| e.get("error").is_none()), "{evs:?}");
    assert_eq!(
        metric(&r, "headroom_failover_total{outcome=\"resumed\"}").await,
        2.0
    );
}

#[tokio::test]
async fn a_finished_stream_whose_connection_lingers_ends_once() {
    let (a, b) = pair(Break::HangAfterDone).await;
    let r = router(
        &[format!("http://{}", a.addr), format!("http://{}", b.addr)],
        PolicyName::RoundRobin,
        |c| c.proxy.idle_timeout_ms = 500,
    )
    .await;
    let resp = client()
        .post(r.url("/v1/completions"))
        .json(
            &json!({"model":"m","prompt":"p","max_tokens":3,"stream":true,
            "stream_options":{"include_usage":true}}),
        )
        .send()
        .await
        .unwrap();
    let evs = events(resp).await;
    assert_eq!(text_of(&evs), " w0 w1 w2");
    assert_eq!(evs.iter().filter(|e| *e == "[DONE]").count(), 1, "{evs:?}");
    assert_eq!(evs.last().unwrap(), "[DONE]");
    let usage = evs.iter().filter(|e| e["usage"].is_object()).count();
    assert_eq!(usage, 1, "{evs:?}");
    let sent = a.bodies.lock().unwrap().len() + b.bodies.lock().unwrap().len();
    assert_eq!(sent, 1, "nothing to continue");
}
