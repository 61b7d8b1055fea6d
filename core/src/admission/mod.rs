//! Admission before routing: who may take fleet capacity now, who waits, who is
//! refused. Per-tenant rate limits (requests and tokens per minute, [`bucket`]),
//! per-tenant concurrency limits, per-tenant queues ordered by deadline ([`queue`])
//! within priority bands, and a weighted fair share of the node's capacity between
//! tenants under overload ([`Gate`]). Pure and synchronous: time comes in as `now_s`,
//! so the proxy and the simulator run the same gate.
//!
//! Capacity `C` = `per_replica` × replicas (0 = no cap: only the tenants' own limits
//! apply). Tenant `t` with weight `w_t` among the active tenants `A` (those with a
//! request running or waiting) has the share `s_t = ⌊C · w_t / Σ_A w⌋` requests. A
//! waiting request may start when its tenant is under its concurrency limit and either
//! the node runs fewer than `C` requests (work-conserving) or its tenant runs fewer
//! than `s_t` (its share is guaranteed, so at most `2C` run at once). Among those that
//! may start: the highest priority band first, then start-time fair queuing across
//! tenants (virtual start `max(v, F_t)`, then `F_t += 1 / w_t`, `v` the least tag among
//! tenants with waiters; an idle tenant banks no credit), then the earliest deadline.
//!
//! Invariants: every waiting request leaves by its deadline (the host passes
//! `arrival + min(TTFT objective × defer budget, max_wait)`), granted or refused;
//! waiters are at most `max_queued` on the node and at most
//! `⌈max_queued · w_t / Σ_A w⌉` (≥ 1) per tenant, so a noisy tenant cannot fill the
//! queue others need; at most [`MAX_TENANTS`] tenants are tracked. Refusals are
//! honest: [`Over::Tenant`] (429) when the tenant is over its rate, its concurrency
//! limit or its share while it has requests running; [`Over::Fleet`] (503) when a
//! tenant with nothing running still cannot start. `Retry-After` is computed: for a
//! rate, `(n − level) × 60 / rate`; for a share, the tenant's mean hold time `h_t` ×
//! (its waiters + 1) ÷ its running requests (its slots free at `running / h_t` per
//! second); for the fleet, the node's `h` × (waiters + 1) ÷ running. Hold times are
//! forward-decayed means (α = 0.2) of permit lifetimes, 1 s before any finished.

pub mod bucket;
mod gate;
pub mod queue;

pub use gate::{Gate, Permit, Ticket};

/// Most tenants the gate tracks (tenant names come from the configuration).
pub const MAX_TENANTS: usize = 4096;

/// One tenant's admission settings (`[[tenants]]` in the router's configuration).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TenantLimits {
    /// Relative share of capacity under overload (> 0).
    pub weight: f64,
    /// Priority band: a higher band's waiters start first.
    pub priority: i32,
    /// Requests per minute (0 = unlimited).
    pub rpm: f64,
    /// Tokens per minute, prompt + expected output (0 = unlimited).
    pub tpm: f64,
    /// Requests running at once (0 = unlimited).
    pub max_concurrency: u32,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self {
            weight: 1.0,
            priority: 0,
            rpm: 0.0,
            tpm: 0.0,
            max_concurrency: 0,
        }
    }
}

/// The node's admission settings (`[admission]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GateConfig {
    /// Requests per replica the node lets run before tenants are held to their
    /// shares (0 = no capacity cap).
    pub per_replica: u32,
    /// Most requests waiting at the gate on this node.
    pub max_queued: usize,
    /// Longest any request waits (s), whatever objective it asked for.
    pub max_wait_s: f64,
    /// How often a waiting request looks again (s).
    pub poll_s: f64,
}

impl Default for GateConfig {
    fn default() -> Self {
        Self {
            per_replica: 0,
            max_queued: 1024,
            max_wait_s: 5.0,
            poll_s: 0.005,
        }
    }
}

impl GateConfig {
    /// The node's capacity over `replicas` replicas, if capped.
    pub fn capacity(&self, replicas: usize) -> Option<usize> {
        (self.per_replica > 0).then(|| self.per_replica as usize * replicas)
    }
}

/// One request asking to be admitted.
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    pub tenant: &'a str,
    pub limits: TenantLimits,
    /// Tokens it is charged against `tpm`: prompt + expected output.
    pub tokens: u32,
    /// When it must have started or been refused (the node's axis, s).
    pub deadline_s: f64,
    /// Replicas the fleet has now (capacity = `per_replica` × this).
    pub replicas: usize,
}

/// Whose limit a refusal is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Over {
    /// The tenant's rate, concurrency or share: 429.
    Tenant,
    /// The fleet's capacity: 503.
    Fleet,
}

/// A refused request: why, and when trying again may succeed.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub over: Over,
    /// `rate_requests`, `rate_tokens`, `concurrency`, `share`, `queue_full`,
    /// `capacity` or `tenants`.
    pub reason: &'static str,
    /// Seconds until a retry may succeed (infinite: never, as it stands).
    pub retry_after_s: f64,
    pub message: String,
}

/// Longest `Retry-After` said (s).
pub const MAX_RETRY_AFTER_S: u64 = 3600;

impl Refusal {
    /// Whole seconds for a `Retry-After` header: rounded up, 1 s – 1 h.
    pub fn retry_after_secs(&self) -> u64 {
        if !self.retry_after_s.is_finite() {
            return MAX_RETRY_AFTER_S;
        }
        (self.retry_after_s.ceil() as u64).clamp(1, MAX_RETRY_AFTER_S)
    }
}

/// What a waiting request does now.
#[derive(Debug)]
pub enum Poll {
    /// Start: route it, holding the permit until it ends.
    Go(Permit),
    /// Look again after this many seconds.
    Wait(f64),
    Refuse(Refusal),
}
