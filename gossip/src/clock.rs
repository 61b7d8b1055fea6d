//! Wall-clock helpers for value timestamps (ms since the Unix epoch).
//!
//! `HEADROOM_CLOCK_OFFSET_MS` (a signed integer, |offset| ≤ one day) shifts this
//! process's wall clock: a test knob that makes one node's clock run ahead (> 0) or
//! behind (< 0) its peers', as an unsynchronised host's would. It is read once; the
//! router refuses to start on a malformed or out-of-range value ([`offset_from_env`]).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable that shifts the wall clock.
pub const OFFSET_ENV: &str = "HEADROOM_CLOCK_OFFSET_MS";
/// Largest accepted shift either way (one day, ms).
pub const MAX_OFFSET_MS: i64 = 86_400_000;

/// Parses a clock offset (ms): a signed integer within ±[`MAX_OFFSET_MS`].
pub fn parse_offset(text: &str) -> Result<i64, String> {
    let v: i64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{OFFSET_ENV} = {text:?} is not an integer number of ms"))?;
    if v.abs() > MAX_OFFSET_MS {
        return Err(format!(
            "{OFFSET_ENV} = {v} must be within ±{MAX_OFFSET_MS} ms"
        ));
    }
    Ok(v)
}

/// The offset from the environment (0 when unset), or why it is invalid.
pub fn offset_from_env() -> Result<i64, String> {
    match std::env::var(OFFSET_ENV) {
        Ok(t) => parse_offset(&t),
        Err(std::env::VarError::NotPresent) => Ok(0),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{OFFSET_ENV} is not UTF-8")),
    }
}

/// The offset in force (an invalid value counts as 0; the router rejects it at start).
pub fn offset_ms() -> i64 {
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| offset_from_env().unwrap_or(0))
}

/// This process's wall clock (shifted by the offset), ms since the Unix epoch.
pub fn now_ms() -> u64 {
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    real.saturating_add(offset_ms()).max(0) as u64
}

/// Local time minus `published_at_ms`, zero if the publisher's clock is ahead.
pub fn age_since(published_at_ms: u64) -> Duration {
    Duration::from_millis(now_ms().saturating_sub(published_at_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_parse_within_a_day_either_way() {
        assert_eq!(parse_offset("5000"), Ok(5000));
        assert_eq!(parse_offset(" -7000 "), Ok(-7000));
        assert!(parse_offset("86400001").is_err());
        assert!(parse_offset("-86400001").is_err());
        assert!(parse_offset("5s").unwrap_err().contains(OFFSET_ENV));
        assert!(parse_offset("").is_err());
    }
}
