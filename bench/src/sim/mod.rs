//! The discrete-event fleet simulator: engine models for the replicas and the
//! router's own policy code for each router node, in virtual time.

pub mod config;
pub mod node;
pub mod oracle;
pub mod queue;
pub mod result;
pub mod run;

pub use config::{Dark, SimConfig, parse_fleet};
pub use result::RunResult;
pub use run::{ALL_POLICIES, SimError, Simulator, simulate};
