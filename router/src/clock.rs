//! The node's monotonic time axis, in seconds since the process started.
//!
//! The policy core takes `now_s: f64` everywhere so the simulator can drive the same
//! code in virtual time; the binary reads it from here.

use std::{sync::OnceLock, time::Instant};

static EPOCH: OnceLock<Instant> = OnceLock::new();

fn epoch() -> Instant {
    *EPOCH.get_or_init(Instant::now)
}

/// Seconds since the process epoch.
pub fn now_s() -> f64 {
    epoch().elapsed().as_secs_f64()
}

/// Milliseconds since the process epoch.
pub fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

/// Converts an `Instant` to the node's axis.
pub fn at_s(t: Instant) -> f64 {
    t.saturating_duration_since(epoch()).as_secs_f64()
}

/// Wall-clock milliseconds since the Unix epoch (for values shared between nodes),
/// shifted by `HEADROOM_CLOCK_OFFSET_MS` where set (a test knob: the mesh's clock, one
/// source for both crates).
pub fn unix_ms() -> u64 {
    headroom_gossip::clock::now_ms()
}
