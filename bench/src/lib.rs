//! Engine model, replica emulator, fleet simulator and workloads.

pub mod engine;
