//! Fleet simulator, workloads, live runner, proxy bench, capacity planner and reports.
//! The engine model is `headroom-engine` (`bench/engine/`), the replica emulator
//! `headroom-replica` (`bench/replica/`); this crate depends on them, never the reverse.

pub mod live;
pub mod plan;
pub mod report;
pub mod sim;
pub mod workload;
