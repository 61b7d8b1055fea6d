//! The admission gate's async driver: a request enters the node's
//! [`headroom_core::admission::Gate`] after its tenant is known and before routing,
//! waits there (bounded by its deadline) while its tenant is over its share or limits,
//! and holds its permit until the response body ends ([`PermitBody`]). Refusals are
//! OpenAI-shaped with `Retry-After`: 429 (`rate_limit_exceeded`) when the tenant is
//! over its rate, concurrency or share, 503 (`service_unavailable`) when the fleet is.
//! Every outcome is counted in `headroom_admission_total{tenant, outcome, reason}`.

use std::{
    pin::Pin,
    task::{Context, Poll as TaskPoll},
    time::{Duration, Instant},
};

use axum::body::Body as AxumBody;
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};

use headroom_core::admission::{Ask, Over, Permit, Poll, Refusal};

use crate::{
    clock, error::ApiError, lifecycle::DeferLimits, node::RequestPath, policy::RequestProfile,
    tenant::TenantClass,
};

/// The refusal as the client sees it.
fn refused(r: &Refusal) -> ApiError {
    let e = match r.over {
        Over::Tenant => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            r.message.clone(),
        ),
        Over::Fleet => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            r.message.clone(),
        ),
    };
    e.with_retry_after(r.retry_after_secs())
}

/// The deferral limits every wait of a request shares (gate and placement).
pub fn defer_limits(path: &RequestPath) -> DeferLimits {
    DeferLimits {
        budget: path.cfg.slo.defer_budget,
        max_deferred: path.cfg.slo.max_deferred,
        max_wait_s: path.cfg.admission.max_wait_ms as f64 / 1e3,
    }
}

fn routable_replicas(path: &RequestPath) -> usize {
    path.fleet
        .replicas()
        .iter()
        .filter(|r| r.health.routable())
        .count()
}

/// Waits for the tenant's turn; the permit must live as long as the response.
pub async fn admit(
    path: &RequestPath,
    tenant: &TenantClass,
    profile: &RequestProfile,
    arrived: Instant,
) -> Result<Permit, ApiError> {
    let count = |outcome: &str, reason: &str| {
        path.metrics
            .admission
            .with_label_values(&[&tenant.name, outcome, reason])
            .inc();
    };
    let arrived_s = clock::at_s(arrived);
    let ask = Ask {
        tenant: &tenant.name,
        limits: tenant.limits,
        tokens: profile
            .prompt_tokens
            .saturating_add(profile.expected_output_tokens),
        deadline_s: defer_limits(path).deadline_s(profile, arrived_s),
        replicas: routable_replicas(path),
    };
    let mut ticket = path.gate.arrive(&ask, clock::now_s()).map_err(|r| {
        count("rejected", r.reason);
        refused(&r)
    })?;
    loop {
        match ticket.poll(clock::now_s()) {
            Poll::Go(p) => {
                count("admitted", if p.waited() { "queued" } else { "direct" });
                return Ok(p);
            }
            Poll::Wait(s) => {
                if !ticket.waited() {
                    count("queued", "wait");
                }
                tokio::time::sleep(Duration::from_secs_f64(s)).await;
                ticket.set_replicas(routable_replicas(path));
            }
            Poll::Refuse(r) => {
                count("rejected", r.reason);
                return Err(refused(&r));
            }
        }
    }
}

/// Sets the gate's gauges (running and waiting requests per tenant) for a scrape.
pub fn publish(path: &RequestPath) {
    for l in path.gate.load() {
        let m = &path.metrics;
        m.admission_running
            .with_label_values(&[&l.tenant])
            .set(i64::from(l.running));
        m.admission_queued
            .with_label_values(&[&l.tenant])
            .set(l.queued as i64);
    }
}

/// A response body that holds the request's admission permit until it ends (or the
/// client goes away), then releases it at that time.
pub struct PermitBody {
    inner: AxumBody,
    permit: Option<Permit>,
}

impl PermitBody {
    pub fn wrap(resp: Response<AxumBody>, permit: Permit) -> Response<AxumBody> {
        resp.map(|inner| {
            AxumBody::new(PermitBody {
                inner,
                permit: Some(permit),
            })
        })
    }

    fn release(&mut self) {
        if let Some(p) = self.permit.take() {
            p.release(clock::now_s());
        }
    }
}

impl HttpBody for PermitBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> TaskPoll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(r, TaskPoll::Ready(None | Some(Err(_)))) {
            self.release();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for PermitBody {
    fn drop(&mut self) {
        self.release();
    }
}
