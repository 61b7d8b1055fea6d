//! Engine model, replica emulator, fleet simulator and workloads.

pub mod engine;
pub mod live;
pub mod plan;
pub mod replica;
pub mod report;
pub mod sim;
pub mod workload;
