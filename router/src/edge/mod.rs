//! The client-facing edge: connection limits and timeouts, TLS, the admin surface,
//! the headers that go upstream, and live reload of tenants.
//!
//! Invariants:
//! - Every connection holds one permit of a semaphore of `max_connections`, so
//!   descriptors and memory stay bounded whatever clients do; at the cap the oldest
//!   connection that has not sent a request yet is closed to make room (a newcomer is
//!   refused only when every open connection has sent one). Per connection, hyper's
//!   read buffer is capped at `max_header_bytes`.
//! - A connection must deliver its first request's headers (after the TLS handshake)
//!   within `header_read_timeout_ms`, and each later request's headers within
//!   `idle_timeout_ms` of the previous response, else it is closed; a request body must
//!   arrive within `body_read_timeout_ms` (408).
//! - Defaults keep today's surface: admin endpoints on the client port, no token.

pub mod admin;
pub mod headers;
pub mod listen;
pub mod reload;
pub mod tls;

pub use crate::config::edge::{EdgeConfig, validate};
