//! What the emulated model "says": output length and filler text, both seeded.
//!
//! - With `ignore_eos: true` a request generates exactly `max_tokens` (finish
//!   reason `length`). Otherwise the EOS position is drawn from a lognormal with
//!   median [`MEDIAN_OUTPUT`] tokens and log-sd [`OUTPUT_SIGMA`] (mean ≈ 330, close to
//!   the Mooncake conversation trace's 343), at least `min_tokens`, capped at
//!   `max_tokens` (finish reason `stop` if EOS comes first, else `length`).
//! - Text is one filler word per token, a pure function of (request seed, index).

use headroom_engine::hashing::mix64;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::LogNormal;

/// Median drawn output length (tokens) when EOS is honoured.
pub const MEDIAN_OUTPUT: f64 = 200.0;
/// Log-standard-deviation of the drawn output length.
pub const OUTPUT_SIGMA: f64 = 1.0;

const WORDS: &[&str] = &[
    " the", " of", " and", " to", " in", " a", " is", " that", " for", " it", " as", " was",
    " with", " be", " by", " on", " not", " he", " this", " are", " or", " his", " from", " at",
    " which", " but", " have", " an", " had", " they", " you", " were", " their", " one", " all",
    " we", " can", " her", " has", " there", " been", " if", " more", " when", " will", " would",
    " who", " so", " no", " model", " token", " engine", " batch", " cache", " prefix", " block",
    " route", " replica", " latency", " stream", " request", " answer", " data", " time",
];

/// The word for output token `index` of a request seeded with `seed`.
pub fn filler_word(seed: u64, index: u32) -> &'static str {
    WORDS[(mix64(seed ^ u64::from(index).wrapping_mul(0x9e37_79b9)) % WORDS.len() as u64) as usize]
}

/// EOS position for a request (`None` = run to `max_tokens`).
pub fn eos_after(seed: u64, ignore_eos: bool, min_tokens: u32, max_tokens: u32) -> Option<u32> {
    if ignore_eos {
        return None;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let drawn = LogNormal::new(MEDIAN_OUTPUT.ln(), OUTPUT_SIGMA)
        .map(|d| rng.sample(d))
        .unwrap_or(MEDIAN_OUTPUT);
    let n = (drawn.round() as u64).clamp(1, u64::from(u32::MAX)) as u32;
    let n = n.max(min_tokens);
    (n < max_tokens).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_lengths_are_seeded_and_bounded() {
        assert_eq!(eos_after(1, true, 0, 50), None);
        assert_eq!(
            eos_after(7, false, 0, 10_000),
            eos_after(7, false, 0, 10_000)
        );
        let draws: Vec<u32> = (0..2000)
            .filter_map(|s| eos_after(s, false, 0, 100_000))
            .collect();
        let mean = draws.iter().map(|&d| f64::from(d)).sum::<f64>() / draws.len() as f64;
        assert!((250.0..420.0).contains(&mean), "mean {mean}");
        assert!((0..200).all(|s| eos_after(s, false, 0, 5).is_none_or(|n| n < 5)));
        assert!((0..200).all(|s| eos_after(s, false, 40, 100_000).is_none_or(|n| n >= 40)));
    }

    #[test]
    fn filler_is_deterministic() {
        assert_eq!(filler_word(3, 9), filler_word(3, 9));
        let distinct: std::collections::HashSet<_> = (0..100).map(|i| filler_word(3, i)).collect();
        assert!(distinct.len() > 20);
    }
}
