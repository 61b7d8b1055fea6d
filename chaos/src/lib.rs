//! `headroom-chaos`: fault scenarios against real Headroom processes on loopback.
//!
//! Each scenario ([`scenarios::Scenario`]) starts its own emulated replicas
//! (`headroom-replica`, time-scaled) and router nodes (`headroom serve`; a 3-node
//! QUIC mesh where the scenario needs one), drives an open-loop load with its own
//! client ([`client`], [`load`]), injects a fault on schedule, and checks invariants
//! ([`check`]): no request hangs, every end is clean, no output is duplicated,
//! requests after the fault settles succeed, faulty replicas are ejected and
//! re-admitted, ledgers drain to zero, membership converges, nothing crashes and
//! nothing is left running. [`report`] writes the Markdown and JSON summaries.
//!
//! Everything talks to loopback only; every process runs under a kill-on-drop guard
//! and is checked gone after its scenario.

pub mod bad_metrics;
pub mod bins;
pub mod check;
pub mod client;
pub mod cluster;
mod error;
pub mod http;
pub mod load;
pub mod observe;
pub mod os;
pub mod relay;
pub mod report;
pub mod router_config;
pub mod scale;
pub mod scenario;
pub mod scenarios;
pub mod stream_check;

pub use bins::Binaries;
pub use error::ChaosError;
pub use scenario::{RunOptions, ScenarioReport, run};
pub use scenarios::Scenario;
