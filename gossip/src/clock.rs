//! Wall-clock helpers for value timestamps (ms since the Unix epoch).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Local time minus `published_at_ms`, zero if the publisher's clock is ahead.
pub fn age_since(published_at_ms: u64) -> Duration {
    Duration::from_millis(now_ms().saturating_sub(published_at_ms))
}
