//! One request's spans:
//!
//! ```text
//! POST /v1/chat/completions   (server; arrival → last byte; the decision's key
//! │                            attributes and what was measured, event `end`)
//! ├── admit                   (the tenant's turn at the node's gate)
//! ├── decide                  (placement, deferrals included: replica, predicted
//! │                            TTFT/TPOT with bounds, tier, violation probability,
//! │                            fallback)
//! └── upstream                (client; one per attempt: send → end of its body)
//!     └── first_token         (send → first content token; streams)
//! ```
//!
//! Invariant: every span ends exactly once — explicitly at its event, or, on a path
//! that drops the request (client gone, error), when it is dropped (the SDK ends a
//! dropped span). The trace lives in `Option<Box<RequestTrace>>`: `None` when
//! tracing is off, so the hooks cost one test.

use http::HeaderMap;
use opentelemetry::{
    Context, KeyValue,
    propagation::TextMapPropagator as _,
    trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _},
};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_sdk::{
    propagation::TraceContextPropagator,
    trace::{SdkTracer, Span},
};

use super::Traces;
use crate::{decide::RoutedTarget, fleet::Replica, policy::RequestProfile, request::Endpoint};

/// The spans of one request in flight.
pub struct RequestTrace {
    tracer: SdkTracer,
    /// Holds the request's (root) span.
    root: Context,
    /// The attempt in flight or streaming, and its first-token span.
    upstream: Option<Context>,
    first_token: Option<Span>,
}

impl Traces {
    /// Opens the request's span now, as a child of the client's `traceparent` where it
    /// sent one.
    pub fn request(&self, endpoint: Endpoint, headers: &HeaderMap) -> Box<RequestTrace> {
        let parent = self.propagator().extract(&HeaderExtractor(headers));
        let span = self
            .tracer
            .span_builder(format!("POST {}", endpoint.path()))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.request.method", "POST"),
                KeyValue::new("http.route", endpoint.path()),
            ])
            .start_with_context(&self.tracer, &parent);
        Box::new(RequestTrace {
            tracer: self.tracer.clone(),
            root: parent.with_span(span),
            upstream: None,
            first_token: None,
        })
    }
}

impl RequestTrace {
    /// The trace id, hex (for logs and tests).
    pub fn trace_id(&self) -> String {
        self.root.span().span_context().trace_id().to_string()
    }

    /// Writes the upstream span's `traceparent` into `headers` (replacing the client's),
    /// so the engine's own spans join the trace.
    pub fn inject(&self, headers: &mut HeaderMap) {
        if let Some(cx) = &self.upstream {
            TraceContextPropagator::new().inject_context(cx, &mut HeaderInjector(headers));
        }
    }

    fn child(&self, name: &'static str, kind: SpanKind, parent: &Context) -> Span {
        self.tracer
            .span_builder(name)
            .with_kind(kind)
            .start_with_context(&self.tracer, parent)
    }

    /// What routing knows of the request (after parsing and tokenization).
    pub fn asked(&self, tenant: &str, profile: &RequestProfile) {
        let s = self.root.span();
        s.set_attribute(KeyValue::new("headroom.tenant", tenant.to_string()));
        s.set_attribute(KeyValue::new("gen_ai.request.model", profile.model.clone()));
        s.set_attribute(KeyValue::new(
            "headroom.prompt_tokens",
            i64::from(profile.prompt_tokens),
        ));
        s.set_attribute(KeyValue::new("headroom.stream", profile.stream));
        s.set_attribute(KeyValue::new("headroom.slo.ttft_ms", profile.slo.ttft_ms));
        s.set_attribute(KeyValue::new("headroom.slo.tpot_ms", profile.slo.tpot_ms));
    }

    /// Starts the admission span.
    pub fn admit(&self) -> Span {
        self.child("admit", SpanKind::Internal, &self.root)
    }

    /// Ends the admission span: admitted, or refused with `why`.
    pub fn admitted(mut span: Span, refused: Option<&str>) {
        if let Some(why) = refused {
            span.set_status(Status::error(why.to_string()));
        }
        span.end();
    }

    pub fn decision_id(&self, id: Option<u64>) {
        if let Some(id) = id {
            self.root
                .span()
                .set_attribute(KeyValue::new("headroom.decision_id", id as i64));
        }
    }

    /// Starts the placement span.
    pub fn decide(&self) -> Span {
        self.child("decide", SpanKind::Internal, &self.root)
    }

    /// Ends the placement span with the choice; its key attributes go on the request's
    /// span too, so a trace search by replica, tier or fallback finds the request.
    pub fn decided(
        &self,
        mut span: Span,
        policy: &str,
        chosen: Option<(&Replica, &RoutedTarget)>,
        candidates: usize,
        fallback: Option<&str>,
        profile: &RequestProfile,
    ) {
        let mut kv = vec![
            KeyValue::new("headroom.policy", policy.to_string()),
            KeyValue::new("headroom.targets", candidates as i64),
            KeyValue::new("headroom.fallback", fallback.unwrap_or("none").to_string()),
        ];
        if let Some((r, t)) = chosen {
            let p = &t.learn.prediction;
            let eval = headroom_core::policy::slo::evaluate(
                p,
                profile.slo.ttft_ms,
                profile.slo.tpot_ms,
                None,
            );
            kv.extend([
                KeyValue::new("headroom.replica", r.name.clone()),
                KeyValue::new("headroom.replica.class", r.class.clone()),
                KeyValue::new("headroom.cached_tokens", i64::from(t.cached_tokens)),
                KeyValue::new("headroom.predicted.ttft_ms", p.ttft_ms),
                KeyValue::new("headroom.predicted.ttft_upper_ms", p.ttft_upper_ms),
                KeyValue::new("headroom.predicted.tpot_ms", p.tpot_ms),
                KeyValue::new("headroom.predicted.tpot_upper_ms", p.tpot_upper_ms),
                KeyValue::new("headroom.tier", i64::from(eval.tier)),
                KeyValue::new("headroom.p_violate", eval.p_violate),
            ]);
        } else {
            span.set_status(Status::error("no placement"));
        }
        let root = self.root.span();
        for a in &kv {
            root.set_attribute(a.clone());
        }
        span.set_attributes(kv);
        span.end();
    }

    /// An attempt on `replica` starts now (number `attempt`, from 0); `stream`: a
    /// first-token span runs until the first token.
    pub fn upstream(&mut self, replica: &Replica, attempt: usize, stream: bool) {
        let mut span = self.child("upstream", SpanKind::Client, &self.root);
        span.set_attributes([
            KeyValue::new("headroom.replica", replica.name.clone()),
            KeyValue::new("headroom.attempt", attempt as i64),
            KeyValue::new("server.address", crate::fleet::redact_url(&replica.url)),
        ]);
        let cx = self.root.with_span(span);
        self.first_token = stream.then(|| self.child("first_token", SpanKind::Internal, &cx));
        self.upstream = Some(cx);
    }

    /// The attempt ended before streaming: retried elsewhere or passed through (`why`).
    pub fn attempt_failed(&mut self, why: &str, status: Option<u16>) {
        self.first_token = None;
        if let Some(cx) = self.upstream.take() {
            let s = cx.span();
            if let Some(code) = status {
                s.set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
            }
            s.set_status(Status::error(why.to_string()));
            s.end();
        }
    }

    /// A continuation on `replica` took the stream over (its first byte came).
    pub fn resumed(&mut self, replica: &Replica) {
        self.upstream(replica, 0, true);
        if let Some(cx) = &self.upstream {
            cx.span()
                .set_attribute(KeyValue::new("headroom.failover", true));
        }
    }

    /// The first content token reached the router.
    pub fn first_token(&mut self, ttft_s: f64) {
        if let Some(mut s) = self.first_token.take() {
            s.set_attribute(KeyValue::new("headroom.ttft_ms", ttft_s * 1e3));
            s.end();
        }
    }

    /// The stream broke and a continuation is sought on another replica.
    pub fn cut(&mut self, why: &str) {
        self.attempt_failed(why, None);
        self.root.span().add_event(
            "failover",
            vec![KeyValue::new("headroom.cut", why.to_string())],
        );
    }

    /// The response ended: what was measured, on the upstream and request spans.
    pub fn end(mut self: Box<Self>, m: &Measured) {
        let mut kv = vec![KeyValue::new("headroom.outcome", m.outcome)];
        if let Some(v) = m.ttft_s {
            kv.push(KeyValue::new("headroom.ttft_ms", v * 1e3));
        }
        if let Some(v) = m.tpot_s {
            kv.push(KeyValue::new("headroom.tpot_ms", v * 1e3));
        }
        if let Some(v) = m.output_tokens {
            kv.push(KeyValue::new("headroom.output_tokens", i64::from(v)));
        }
        if let Some(v) = m.cached_tokens {
            kv.push(KeyValue::new(
                "headroom.reported_cached_tokens",
                i64::from(v),
            ));
        }
        self.first_token = None;
        let failed = m.outcome != "ok";
        if let Some(cx) = self.upstream.take() {
            let s = cx.span();
            s.set_attribute(KeyValue::new("http.response.status_code", 200));
            if failed {
                s.set_status(Status::error(m.outcome));
            }
            s.end();
        }
        let root = self.root.span();
        root.set_attribute(KeyValue::new("http.response.status_code", 200));
        if failed {
            root.set_status(Status::error(m.outcome));
        }
        root.add_event("end", kv.clone());
        for a in kv {
            root.set_attribute(a);
        }
        root.end();
    }

    /// The request ended without a routed stream: an error of the router's, or a
    /// replica's answer passed through, with its status.
    pub fn end_status(mut self: Box<Self>, status: u16, why: Option<&str>) {
        if self.upstream.is_some() {
            self.attempt_failed(why.unwrap_or("passed through"), Some(status));
        }
        let root = self.root.span();
        root.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 400 {
            root.set_status(Status::error(why.unwrap_or("error").to_string()));
        }
        root.end();
    }
}

/// What the request's end says (from the proxy's outcome).
pub struct Measured {
    pub outcome: &'static str,
    pub ttft_s: Option<f64>,
    pub tpot_s: Option<f64>,
    pub output_tokens: Option<u32>,
    pub cached_tokens: Option<u32>,
}
