//! Headroom's latency predictor: a pure library (no I/O, no clocks).
