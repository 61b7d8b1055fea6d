//! OpenTelemetry traces through the HTTP front: a tiny OTLP/HTTP collector on loopback
//! receives the router's protobuf exports; one request's spans (request, admit, decide,
//! upstream, first token) arrive under one trace id with the decision's attributes, a
//! client's `traceparent` makes them children of its span, the replica is sent the
//! router's own `traceparent`, and a refused request's span says so.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod common;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, body::Bytes, extract::State, routing::post};
use common::{client, mock, router};
use headroom::policy::PolicyName;
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::{AnyValue, any_value::Value as V},
    trace::v1::{Span, status::StatusCode as SpanStatus},
};
use prost::Message;
use serde_json::json;

/// Spans received, with their resource's `service.name`.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

async fn collector() -> (String, Received) {
    async fn traces(State(got): State<Received>, body: Bytes) -> &'static str {
        let req = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
        let mut g = got.lock().unwrap();
        for rs in req.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| text(a.value.as_ref()))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    g.push((service.clone(), s));
                }
            }
        }
        ""
    }
    let got: Received = Default::default();
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .with_state(got.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.ok() });
    (url, got)
}

fn text(v: Option<&AnyValue>) -> Option<String> {
    match v?.value.as_ref()? {
        V::StringValue(s) => Some(s.clone()),
        V::IntValue(i) => Some(i.to_string()),
        V::DoubleValue(d) => Some(d.to_string()),
        V::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

fn attrs(s: &Span) -> HashMap<String, String> {
    s.attributes
        .iter()
        .filter_map(|a| Some((a.key.clone(), text(a.value.as_ref())?)))
        .collect()
}

/// Waits (bounded) until the spans of `trace_id` include every name in `names`.
async fn spans_of(got: &Received, trace_id: &[u8], names: &[&str]) -> HashMap<String, Span> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found: HashMap<String, Span> = got
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, s)| s.trace_id == trace_id)
            .map(|(_, s)| (s.name.clone(), s.clone()))
            .collect();
        if names.iter().all(|n| found.contains_key(*n)) {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "spans {names:?} never arrived; got {:?}",
            found.keys().collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

const ROOT: &str = "POST /v1/chat/completions";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_one_trace_under_the_clients_span_with_the_decision() {
    let (endpoint, got) = collector().await;
    let (a, b) = (mock("m").await, mock("m").await);
    let r = router(&[a.url(), b.url()], PolicyName::Slo, |c| {
        c.tracing.otlp_endpoint = Some(endpoint.clone());
        c.tracing.export_interval_ms = 50;
        c.tracing.service_name = "headroom-test".into();
    })
    .await;
    let (trace_hex, client_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let resp = client()
        .post(r.url("/v1/chat/completions"))
        .header("traceparent", format!("00-{trace_hex}-{client_span}-01"))
        .json(&json!({"model":"m","stream":true,"max_tokens":5,
            "messages":[{"role":"user","content":"trace me"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let served = resp.headers()["x-headroom-replica"]
        .to_str()
        .unwrap()
        .to_string();
    let decision = resp.headers()["x-headroom-decision-id"]
        .to_str()
        .unwrap()
        .to_string();
    resp.text().await.unwrap();

    let spans = spans_of(
        &got,
        &hex(trace_hex),
        &[ROOT, "admit", "decide", "upstream", "first_token"],
    )
    .await;
    let root = &spans[ROOT];
    assert_eq!(
        root.parent_span_id,
        hex(client_span),
        "a child of the client's span"
    );
    for name in ["admit", "decide", "upstream"] {
        assert_eq!(
            spans[name].parent_span_id, root.span_id,
            "{name} under the request"
        );
    }
    assert_eq!(
        spans["first_token"].parent_span_id,
        spans["upstream"].span_id
    );
    assert!(
        got.lock()
            .unwrap()
            .iter()
            .all(|(svc, _)| svc == "headroom-test"),
        "service.name from the config"
    );

    // The decision's key attributes, on `decide` and on the request's span.
    let d = attrs(&spans["decide"]);
    for want in [attrs(root), d.clone()] {
        assert_eq!(want["headroom.replica"], served);
        assert_eq!(want["headroom.policy"], "slo");
        assert_eq!(
            want["headroom.fallback"], "cold-model",
            "a fresh router is cold"
        );
        assert!(want["headroom.predicted.ttft_ms"].parse::<f64>().unwrap() > 0.0);
        assert!(want.contains_key("headroom.predicted.tpot_upper_ms"));
        assert!(["0", "1", "2"].contains(&want["headroom.tier"].as_str()));
    }
    let ra = attrs(root);
    assert_eq!(ra["headroom.tenant"], "default");
    assert_eq!(ra["gen_ai.request.model"], "m");
    assert_eq!(ra["headroom.decision_id"], decision);
    assert_eq!(ra["headroom.outcome"], "ok");
    assert_eq!(ra["headroom.output_tokens"], "5");
    assert!(ra["headroom.ttft_ms"].parse::<f64>().unwrap() > 0.0);
    assert!(root.events.iter().any(|e| e.name == "end"));
    assert_eq!(attrs(&spans["upstream"])["headroom.replica"], served);
    // Spans nest in time: the stream's end closes the request.
    let (first, up) = (&spans["first_token"], &spans["upstream"]);
    assert!(up.start_time_unix_nano <= first.start_time_unix_nano);
    assert!(first.end_time_unix_nano <= up.end_time_unix_nano);
    assert!(up.end_time_unix_nano <= root.end_time_unix_nano);

    // The replica got the router's traceparent: same trace, the upstream span.
    let m = if served == a.addr.to_string() { &a } else { &b };
    let sent = m
        .traceparent
        .lock()
        .unwrap()
        .clone()
        .expect("a traceparent upstream");
    let up_id: String = up.span_id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(sent, format!("00-{trace_hex}-{up_id}-01"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_trace_without_traceparent_and_a_refusal_is_an_error_span() {
    let (endpoint, got) = collector().await;
    let a = mock("m").await;
    let r = router(&[a.url()], PolicyName::Slo, |c| {
        c.tracing.otlp_endpoint = Some(endpoint.clone());
        c.tracing.export_interval_ms = 50;
    })
    .await;
    let resp = client()
        .post(r.url("/v1/chat/completions"))
        .json(&json!({"model":"no-such-model","messages":[{"role":"user","content":"x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    resp.text().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let root = loop {
        let found = got
            .lock()
            .unwrap()
            .iter()
            .find(|(_, s)| s.name == ROOT)
            .map(|(_, s)| s.clone());
        if let Some(s) = found {
            break s;
        }
        assert!(tokio::time::Instant::now() < deadline, "no request span");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(root.parent_span_id.is_empty(), "a trace of its own");
    assert_eq!(root.trace_id.len(), 16);
    let a = attrs(&root);
    assert_eq!(a["http.response.status_code"], "404");
    let status = root.status.as_ref().expect("a status");
    assert_eq!(status.code, SpanStatus::Error as i32);
    assert!(status.message.contains("404"), "{}", status.message);
    let spans = spans_of(&got, &root.trace_id, &[ROOT, "decide"]).await;
    let d = &spans["decide"];
    assert_eq!(
        d.status.as_ref().map(|s| s.code),
        Some(SpanStatus::Error as i32)
    );
}

#[tokio::test]
async fn tracing_is_off_unless_an_endpoint_is_set() {
    let a = mock("m").await;
    let r = router(&[a.url()], PolicyName::Slo, |_| {}).await;
    assert!(r.node.outcomes.traces.is_none());
    let resp = client()
        .post(r.url("/v1/chat/completions"))
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .json(&json!({"model":"m","max_tokens":2,"messages":[{"role":"user","content":"x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Off, the client's traceparent passes to the replica untouched.
    assert_eq!(
        a.traceparent.lock().unwrap().as_deref(),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );
}
