//! What the request path estimates from finished requests: each model's output length
//! and, for a model without a configured tokenizer, its prompt bytes per token.
//!
//! Shared by the two halves of a node: the [`super::RequestPath`] reads it to measure a
//! request, the [`super::Outcomes`] sink writes it when a request ends.

use std::collections::{HashMap, HashSet};

use parking_lot::Mutex;

use headroom_core::output::OutputEstimator;

use crate::tokens;

pub struct Estimates {
    outputs: OutputEstimator,
    /// Models with a configured tokenizer: their prompts are counted, never estimated
    /// from a ratio, so no ratio is learned for them.
    tokenized: HashSet<String>,
    /// Per model: prompt bytes per token, learned from replicas' usage reports.
    text_ratio: Mutex<HashMap<String, f64>>,
}

impl Estimates {
    pub fn new(tokenized: impl IntoIterator<Item = String>) -> Self {
        Self {
            outputs: OutputEstimator::default(),
            tokenized: tokenized.into_iter().collect(),
            text_ratio: Mutex::new(HashMap::new()),
        }
    }

    /// Expected output tokens (see [`OutputEstimator`]).
    pub fn output(&self, model: &str, max_tokens: Option<u32>, ignore_eos: bool) -> u32 {
        self.outputs.estimate(model, max_tokens, ignore_eos)
    }

    /// The bytes-per-token ratio that estimates `model`'s text prompts.
    pub fn text_ratio(&self, model: &str) -> f64 {
        self.text_ratio
            .lock()
            .get(model)
            .copied()
            .unwrap_or(tokens::EST_BYTES_PER_TOKEN)
    }

    /// A completed request's output length.
    pub fn observe_output(&self, model: &str, output_tokens: u32) {
        self.outputs.observe(model, output_tokens);
    }

    /// Refines a model's bytes-per-token ratio from a usage report (estimated models
    /// only).
    pub fn observe_prompt(&self, model: &str, bytes: usize, tokens: u32, messages: u32) {
        if self.tokenized.contains(model) {
            return;
        }
        let mut m = self.text_ratio.lock();
        let prev = m.get(model).copied();
        if let Some(r) = next_text_ratio(prev, bytes, tokens, messages) {
            m.insert(model.to_string(), r);
        }
    }
}

/// The next bytes-per-token estimate after a usage report: an EWMA of bytes over the
/// prompt's text tokens (chat templates' ~4 tokens per message removed); `None` when
/// the report is too small to say anything.
pub fn next_text_ratio(prev: Option<f64>, bytes: usize, tokens: u32, messages: u32) -> Option<f64> {
    let text_tokens = tokens.saturating_sub(4 * messages) as f64;
    if text_tokens < 8.0 || bytes < 32 {
        return None;
    }
    let r = (bytes as f64 / text_tokens).clamp(0.5, 16.0);
    Some(prev.map_or(r, |p| 0.9 * p + 0.1 * r))
}

#[cfg(test)]
mod tests {
    #[test]
    fn text_ratio_converges_to_what_replicas_report() {
        let mut r = None;
        for _ in 0..60 {
            r = super::next_text_ratio(r, 3000, 1000 + 8, 2).or(r);
        }
        assert!((r.unwrap() - 3.0).abs() < 0.01, "{r:?}");
        assert_eq!(super::next_text_ratio(Some(3.0), 10, 2, 0), None);
        // Absurd reports are clamped, never NaN.
        assert_eq!(super::next_text_ratio(None, 1_000_000, 10, 0), Some(16.0));
    }

    #[test]
    fn no_ratio_is_learned_for_a_model_with_a_tokenizer() {
        let e = super::Estimates::new(["counted".to_string()]);
        for _ in 0..60 {
            e.observe_prompt("counted", 3000, 1008, 2);
            e.observe_prompt("estimated", 3000, 1008, 2);
        }
        assert_eq!(e.text_ratio("counted"), crate::tokens::EST_BYTES_PER_TOKEN);
        assert!((e.text_ratio("estimated") - 3.0).abs() < 0.01);
    }
}
