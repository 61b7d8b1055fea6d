//! Headroom's mesh: chitchat (scuttlebutt) state over QUIC with mutual TLS.
//!
//! - [`Mesh`] — start a node, publish typed values, subscribe to changes, list members.
//! - [`wire`] — the values it carries: opaque payloads tagged with a kind and the kind's
//!   schema version ([`Value`]); the schema and its codec belong to the user (the router),
//!   which sets each kind's [`KindPolicy`] (measurement, cross-region) in [`MeshConfig`].
//! - [`write_dev_certs`] / [`TlsIdentity`] — cluster CA and node certificates.
//! - [`FaultInjector`] — drop traffic between groups of nodes (tests, chaos drills).
//!
//! Each region is one chitchat cluster (`<cluster_id>/<region>`) carrying full state; a
//! second, slower cluster (`<cluster_id>/global`) carries only region summaries and
//! predictor slots across regions. Both share one QUIC endpoint (one UDP port) per node.

pub mod certs;
pub mod clock;
mod config;
mod error;
mod events;
mod fault;
pub mod keys;
mod mesh;
mod observer;
mod seeds;
mod skew;
mod stats;
pub mod tls;
mod transport;
pub mod wire;

pub use certs::{DevCertReport, write_dev_certs};
pub use config::{CrossRegion, FailureDetection, MeshConfig};
pub use error::MeshError;
pub use events::{MemberInfo, MeshEvent, Scope};
pub use fault::FaultInjector;
pub use mesh::Mesh;
pub use seeds::{DnsResolver, SeedResolver};
pub use stats::MeshStats;
pub use tls::{TlsError, TlsIdentity};
pub use transport::MAX_DATAGRAM_PAYLOAD;
pub use wire::{KindPolicies, KindPolicy, Value};
