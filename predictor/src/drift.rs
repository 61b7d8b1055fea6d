//! Two-sided Page–Hinkley change detection on a replica's log residuals.
//!
//! Residuals are standardised by the replica's tracked spread σ̂, so the tolerance δ and
//! threshold λ are in σ units. After an alarm the cumulative sums restart; the caller
//! moves its correction to the recent residuals, so the next alarm is the next change.
//! Alarms are suppressed (`armed` false) until the replica's σ̂ has settled.

use crate::config::DriftConfig;

/// Standardised residuals are clipped to ±this before accumulating.
const Z_CLIP: f64 = 3.0;

#[derive(
    Clone, Copy, Debug, Default, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct PageHinkley {
    mean: f64,
    up: f64,
    up_min: f64,
    down: f64,
    down_max: f64,
    n: u64,
}

impl PageHinkley {
    /// Feed one residual; `armed` false suppresses alarms (σ̂ not settled yet). Returns
    /// true on an alarm.
    pub fn update(&mut self, r: f64, sigma: f64, armed: bool, cfg: &DriftConfig) -> bool {
        if self.n == 0 {
            self.mean = r;
        }
        // Winsorised: one outlier cannot raise an alarm on its own (residuals are heavy-tailed).
        let z = ((r - self.mean) / sigma.max(1e-3)).clamp(-Z_CLIP, Z_CLIP);
        self.mean = crate::calibration::ewma(self.mean, r, cfg.mean_rate, self.n);
        self.n += 1;
        if !armed {
            self.reset_sums();
            return false;
        }
        self.up += z - cfg.tolerance_sigmas;
        self.up_min = self.up_min.min(self.up);
        self.down += z + cfg.tolerance_sigmas;
        self.down_max = self.down_max.max(self.down);
        let alarm = self.up - self.up_min > cfg.threshold_sigmas
            || self.down_max - self.down > cfg.threshold_sigmas;
        if alarm {
            self.reset_sums();
        }
        alarm
    }

    fn reset_sums(&mut self) {
        self.up = 0.0;
        self.up_min = 0.0;
        self.down = 0.0;
        self.down_max = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn noise(rng: &mut ChaCha8Rng) -> f64 {
        // Sum of uniforms ≈ normal with σ = 0.3.
        (0..12).map(|_| rng.random::<f64>()).sum::<f64>() * 0.3 - 6.0 * 0.3
    }

    #[test]
    fn quiet_on_stationary_noise_and_fast_on_a_doubling() {
        let cfg = DriftConfig::default();
        let mut ph = PageHinkley::default();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let false_alarms = (0..5000)
            .filter(|_| ph.update(noise(&mut rng), 0.3, true, &cfg))
            .count();
        assert!(false_alarms <= 2, "{false_alarms} false alarms in 5000");
        let shift = 2f64.ln();
        let delay = (1..100).find(|_| ph.update(noise(&mut rng) + shift, 0.3, true, &cfg));
        assert!(matches!(delay, Some(d) if d <= 15), "{delay:?}");
    }
}
