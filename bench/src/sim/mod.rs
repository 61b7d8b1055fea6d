//! The discrete-event fleet simulator: engine models for the replicas and the
//! router's own policy code for each router node, in virtual time.

pub mod result;
