//! Shared test support: the synthetic engine that provides ground truth.
pub mod synth;
