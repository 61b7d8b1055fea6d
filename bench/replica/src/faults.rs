//! Fault knobs of the emulator, settable at start and through `/admin/faults`.
//!
//! Semantics (the contract chaos tests and routers rely on):
//! - `error_rate` p: each completion request fails with HTTP 500 (OpenAI error JSON)
//!   before any byte is sent, with probability p (seeded draw).
//! - `stall`: the engine stops stepping. Requests queue and hang, `/health` hangs
//!   until the stall clears (a router's health-check timeout detects it), and
//!   `/metrics` keeps answering with frozen gauges (no progress is visible).
//! - `slowdown` F: every step takes F times longer.
//! - `midstream_error_rate` p: a streaming request is cut, with probability p, after
//!   about half its tokens by an SSE `data: {"error": ...}` event and `data: [DONE]`;
//!   a non-streaming one gets a 500 at that point. The engine request is aborted.

use serde::{Deserialize, Serialize};

/// Current fault settings. Every field is validated by [`Faults::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    /// Probability of a 500 before the first byte.
    pub error_rate: f64,
    /// Engine stops stepping while true.
    pub stall: bool,
    /// Step-duration multiplier (1 = normal).
    pub slowdown: f64,
    /// Probability that a request fails mid-generation.
    pub midstream_error_rate: f64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            error_rate: 0.0,
            stall: false,
            slowdown: 1.0,
            midstream_error_rate: 0.0,
        }
    }
}

/// A partial update, as posted to `/admin/faults`; absent fields stay unchanged.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultsPatch {
    pub error_rate: Option<f64>,
    pub stall: Option<bool>,
    pub slowdown: Option<f64>,
    pub midstream_error_rate: Option<f64>,
}

impl Faults {
    /// Checks ranges: rates in [0, 1], slowdown in (0, 1000].
    pub fn validate(&self) -> Result<(), String> {
        let rate = |name: &str, v: f64| {
            if v.is_finite() && (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} must be a number in [0, 1], got {v}"))
            }
        };
        rate("error_rate", self.error_rate)?;
        rate("midstream_error_rate", self.midstream_error_rate)?;
        if !(self.slowdown.is_finite() && self.slowdown > 0.0 && self.slowdown <= 1000.0) {
            return Err(format!(
                "slowdown must be in (0, 1000], got {}",
                self.slowdown
            ));
        }
        Ok(())
    }

    /// These settings with `patch` applied, validated.
    pub fn patched(&self, patch: &FaultsPatch) -> Result<Faults, String> {
        let next = Faults {
            error_rate: patch.error_rate.unwrap_or(self.error_rate),
            stall: patch.stall.unwrap_or(self.stall),
            slowdown: patch.slowdown.unwrap_or(self.slowdown),
            midstream_error_rate: patch
                .midstream_error_rate
                .unwrap_or(self.midstream_error_rate),
        };
        next.validate()?;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_validate_and_keep_unset_fields() {
        let f = Faults::default();
        let p = FaultsPatch {
            slowdown: Some(2.0),
            ..FaultsPatch::default()
        };
        let g = f.patched(&p).expect("valid");
        assert_eq!(g.slowdown, 2.0);
        assert_eq!(g.error_rate, 0.0);
        for bad in [
            FaultsPatch {
                error_rate: Some(1.5),
                ..FaultsPatch::default()
            },
            FaultsPatch {
                slowdown: Some(0.0),
                ..FaultsPatch::default()
            },
            FaultsPatch {
                midstream_error_rate: Some(f64::NAN),
                ..FaultsPatch::default()
            },
        ] {
            assert!(f.patched(&bad).is_err(), "{bad:?}");
        }
    }
}
