//! The router's estimate of a request's output length: exact under `ignore_eos`,
//! else the model's observed mean (EWMA over completions), capped by `max_tokens`.
//!
//! Invariant: an estimate is always ≥ 1 and never above `max_tokens` when one is given.

use std::collections::HashMap;

use parking_lot::Mutex;

/// Default output estimate when a model has no history yet and no max_tokens.
pub const DEFAULT_OUTPUT_TOKENS: f64 = 256.0;

#[derive(Debug, Default)]
pub struct OutputEstimator {
    mean: Mutex<HashMap<String, f64>>,
}

impl OutputEstimator {
    pub fn estimate(&self, model: &str, max_tokens: Option<u32>, ignore_eos: bool) -> u32 {
        if let (true, Some(m)) = (ignore_eos, max_tokens) {
            return m.max(1);
        }
        let mean = self
            .mean
            .lock()
            .get(model)
            .copied()
            .unwrap_or(DEFAULT_OUTPUT_TOKENS);
        let est = mean.round().max(1.0) as u32;
        max_tokens.map_or(est, |m| m.min(est).max(1))
    }

    pub fn observe(&self, model: &str, output_tokens: u32) {
        let mut means = self.mean.lock();
        let e = means
            .entry(model.to_string())
            .or_insert(output_tokens as f64);
        *e = 0.95 * *e + 0.05 * output_tokens as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_follows_completions_within_max_tokens() {
        let e = OutputEstimator::default();
        assert_eq!(e.estimate("m", None, false), 256);
        assert_eq!(e.estimate("m", Some(100), false), 100);
        assert_eq!(e.estimate("m", Some(40), true), 40);
        for _ in 0..200 {
            e.observe("m", 10);
        }
        assert_eq!(e.estimate("m", Some(100), false), 10);
        assert_eq!(e.estimate("other", None, false), 256);
    }
}
