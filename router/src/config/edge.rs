//! `[edge]`: how the router faces its clients — the settings and their checks (the
//! listener that applies them is `crate::edge`).

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use super::RouterConfig;

/// `[edge]`: how the router faces its clients.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeConfig {
    /// Time for a new connection to complete its TLS handshake and first request head.
    pub header_read_timeout_ms: u64,
    /// Time a kept-alive connection may sit between requests (and send the next head).
    pub idle_timeout_ms: u64,
    /// Time for a whole request body to arrive once its head has (408 after).
    pub body_read_timeout_ms: u64,
    /// Open client connections at most (each admin connection counts too).
    pub max_connections: usize,
    /// Largest request head (hyper's read buffer per connection).
    pub max_header_bytes: usize,
    /// PEM certificate chain and private key: the client listener speaks TLS only.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Serve `/metrics` and `/debug/*` here instead of on the client listener.
    pub admin_listen: Option<SocketAddr>,
    /// Require `Authorization: Bearer <token>` on `/metrics` and `/debug/*`.
    pub admin_token: Option<String>,
    /// The tenant that serves requests with a missing, unknown or malformed API key
    /// when some tenant has keys; without it those requests get 401.
    pub anonymous_tenant: Option<String>,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: 10_000,
            idle_timeout_ms: 60_000,
            body_read_timeout_ms: 30_000,
            max_connections: 4_096,
            max_header_bytes: 64 * 1024,
            tls_cert: None,
            tls_key: None,
            admin_listen: None,
            admin_token: None,
            anonymous_tenant: None,
        }
    }
}

impl EdgeConfig {
    pub fn header_read_timeout(&self) -> Duration {
        Duration::from_millis(self.header_read_timeout_ms)
    }
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms)
    }
    pub fn body_read_timeout(&self) -> Duration {
        Duration::from_millis(self.body_read_timeout_ms)
    }
}

/// Range and consistency checks for `[edge]`; problems go to `bad(field, message)`.
pub fn validate(e: &EdgeConfig, cfg: &RouterConfig, bad: &mut dyn FnMut(&str, String)) {
    let max = super::validate::MAX_MS;
    for (f, v) in [
        ("edge.header_read_timeout_ms", e.header_read_timeout_ms),
        ("edge.idle_timeout_ms", e.idle_timeout_ms),
        ("edge.body_read_timeout_ms", e.body_read_timeout_ms),
    ] {
        if v == 0 || v > max {
            bad(f, format!("= {v} must be in 1..={max} ms"));
        }
    }
    if !(1..=1_000_000).contains(&e.max_connections) {
        bad(
            "edge.max_connections",
            format!("= {} must be in 1..=1000000", e.max_connections),
        );
    }
    if !(8 * 1024..=16 << 20).contains(&e.max_header_bytes) {
        bad(
            "edge.max_header_bytes",
            format!("= {} must be in 8192..=16777216", e.max_header_bytes),
        );
    }
    match (&e.tls_cert, &e.tls_key) {
        (Some(c), Some(k)) => {
            for (f, p) in [("edge.tls_cert", c), ("edge.tls_key", k)] {
                if let Err(err) = std::fs::metadata(p) {
                    bad(f, format!("`{}` cannot be read: {err}", p.display()));
                }
            }
        }
        (None, None) => {}
        _ => bad(
            "edge.tls_cert",
            "and edge.tls_key must be given together".into(),
        ),
    }
    if e.admin_listen
        .is_some_and(|a| a == cfg.listen && a.port() != 0)
    {
        bad(
            "edge.admin_listen",
            "must differ from `listen` (leave it unset to keep admin endpoints there)".into(),
        );
    }
    if e.admin_token
        .as_deref()
        .is_some_and(|t| t.trim().len() < 8 || t.chars().any(char::is_control))
    {
        bad(
            "edge.admin_token",
            "must be at least 8 characters, without control characters".into(),
        );
    }
    if let Some(a) = &e.anonymous_tenant
        && a != "default"
        && !cfg.tenants.iter().any(|t| &t.name == a)
    {
        bad(
            "edge.anonymous_tenant",
            format!("names `{a}`, which is not a configured tenant"),
        );
    }
}
