//! Forward-decayed weighted least-squares sufficient statistics (Cormode et al., ICDE'09).
//!
//! A sample at time t carries decay weight g = exp((t − L)/τ) for a landmark L shared by
//! every node (L is a multiple of the configured landmark interval, so it depends only on
//! time, not on who computed it). Sums of such statistics are exactly the statistics of the
//! pooled data, which is what makes per-node federation slots mergeable. Invariants: all
//! fields finite; `a` is symmetric positive semi-definite (only the upper triangle is
//! maintained); `landmark_s` only moves forward (rebasing rescales every sum).

// Index loops mirror the matrix algebra they implement; iterator forms would obscure it.
#![allow(clippy::needless_range_loop)]

/// Landmark for time `t`: the start of its landmark interval. Same for every node.
#[inline]
pub(crate) fn landmark_for(t: f64, interval_s: f64) -> f64 {
    (t / interval_s).floor() * interval_s
}

/// Σ g·w·x·xᵀ, Σ g·w·x·y, Σ g, Σ g·w·y², n, relative to `landmark_s`.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct DecayStats<const D: usize> {
    pub(crate) a: [[f64; D]; D],
    pub(crate) b: [f64; D],
    /// Σ g: forward-decayed sample count.
    pub(crate) sum_g: f64,
    /// Σ g·w·y²: with relative weights this is ≈ Σ g; used for the residual variance.
    pub(crate) sum_wyy: f64,
    /// Raw (undecayed) sample count.
    pub(crate) n: u64,
    pub(crate) landmark_s: f64,
    /// Newest sample time seen (seconds), −∞ when empty.
    pub(crate) last_at_s: f64,
}

impl<const D: usize> Default for DecayStats<D> {
    fn default() -> Self {
        Self {
            a: [[0.0; D]; D],
            b: [0.0; D],
            sum_g: 0.0,
            sum_wyy: 0.0,
            n: 0,
            landmark_s: f64::NEG_INFINITY,
            last_at_s: f64::NEG_INFINITY,
        }
    }
}

impl<const D: usize> DecayStats<D> {
    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0 && self.sum_g == 0.0
    }

    /// Multiply every sum by exp(−(new − L)/τ) and move the landmark to `new` (if later).
    pub(crate) fn rebase(&mut self, new_landmark_s: f64, tau_s: f64) {
        if self.landmark_s == f64::NEG_INFINITY {
            self.landmark_s = new_landmark_s;
            return;
        }
        if new_landmark_s <= self.landmark_s {
            return;
        }
        let f = (-(new_landmark_s - self.landmark_s) / tau_s).exp();
        for i in 0..D {
            for j in i..D {
                self.a[i][j] *= f;
            }
            self.b[i] *= f;
        }
        self.sum_g *= f;
        self.sum_wyy *= f;
        self.landmark_s = new_landmark_s;
    }

    /// Add one sample `(x, y)` with regression weight `w` observed at `at_s`.
    #[inline]
    pub(crate) fn add(
        &mut self,
        x: &[f64; D],
        y: f64,
        w: f64,
        at_s: f64,
        tau_s: f64,
        interval_s: f64,
    ) {
        let lm = landmark_for(at_s, interval_s);
        if lm > self.landmark_s {
            self.rebase(lm, tau_s);
        }
        let g = ((at_s - self.landmark_s) / tau_s).exp();
        let gw = g * w;
        if !gw.is_finite() {
            return;
        }
        for i in 0..D {
            let gwx = gw * x[i];
            for j in i..D {
                self.a[i][j] += gwx * x[j];
            }
            self.b[i] += gwx * y;
        }
        self.sum_g += g;
        self.sum_wyy += gw * y * y;
        self.n += 1;
        self.last_at_s = self.last_at_s.max(at_s);
    }

    /// Add `other` into `self` (both rebased to the later landmark).
    pub(crate) fn merge_from(&mut self, other: &Self, tau_s: f64) {
        if other.is_empty() {
            return;
        }
        let mut o = other.clone();
        let lm = self.landmark_s.max(o.landmark_s);
        self.rebase(lm, tau_s);
        o.rebase(lm, tau_s);
        for i in 0..D {
            for j in i..D {
                self.a[i][j] += o.a[i][j];
            }
            self.b[i] += o.b[i];
        }
        self.sum_g += o.sum_g;
        self.sum_wyy += o.sum_wyy;
        self.n += o.n;
        self.last_at_s = self.last_at_s.max(o.last_at_s);
    }

    /// Decayed sample count as of `now_s`.
    pub(crate) fn decayed_count(&self, now_s: f64, tau_s: f64) -> f64 {
        if self.is_empty() {
            return 0.0;
        }
        self.sum_g * (-(now_s - self.landmark_s) / tau_s).exp()
    }

    /// Solve for θ: non-negative physics coefficients, ridge `δ·tr(A)/D` toward `prior`,
    /// plus `kappa` pseudo-samples at `prior` (A₀ = κ·diag(A)/Σg, b₀ = A₀·prior).
    /// Scale-invariant in the decay factor, so no clock is needed. `None` if unsolvable.
    ///
    /// `anchor[i]` adds that many pseudo-samples of unit relative weight (`w·x_i² = 1`, at
    /// the mean decay factor `Σg/n`) on coefficient i whatever the data excite: for a
    /// coefficient that multiplies a measured time (physically 1 ms per ms), a handful of
    /// barely-excited labels must not move it, while κ·diag(A) scales with the excitation
    /// and would leave it to the first label that touches the feature.
    pub(crate) fn solve_anchored(
        &self,
        ridge: f64,
        prior: &[f64; D],
        kappa: f64,
        anchor: &[f64; D],
    ) -> Option<[f64; D]> {
        if self.is_empty() || self.sum_g <= 0.0 || self.n == 0 {
            return None;
        }
        let mean_g = self.sum_g / self.n as f64;
        let mut extra = [0.0; D];
        for i in 0..D {
            extra[i] = anchor[i] * mean_g;
        }
        self.solve_with(ridge, prior, kappa, &extra)
    }

    #[cfg(test)]
    pub(crate) fn solve(&self, ridge: f64, prior: &[f64; D], kappa: f64) -> Option<[f64; D]> {
        self.solve_with(ridge, prior, kappa, &[0.0; D])
    }

    fn solve_with(
        &self,
        ridge: f64,
        prior: &[f64; D],
        kappa: f64,
        extra: &[f64; D],
    ) -> Option<[f64; D]> {
        if self.is_empty() || self.sum_g <= 0.0 {
            return None;
        }
        let mut m = self.a;
        let mut rhs = self.b;
        let mut trace = 0.0;
        for (i, row) in m.iter().enumerate() {
            trace += row[i];
        }
        if !(trace > 0.0 && trace.is_finite()) {
            return None;
        }
        let rho = ridge * trace / D as f64;
        for i in 0..D {
            let pseudo = kappa * self.a[i][i] / self.sum_g;
            let add = rho + pseudo + extra[i];
            m[i][i] += add;
            rhs[i] += add * prior[i];
        }
        crate::linalg::solve_nonneg(&m, &rhs)
    }

    /// Weighted relative residual variance Σg·w·(y − xθ)² / Σg for coefficients θ.
    pub(crate) fn residual_variance(&self, theta: &[f64; D]) -> f64 {
        if self.sum_g <= 0.0 {
            return 0.0;
        }
        let mut quad = 0.0;
        for i in 0..D {
            for j in 0..D {
                let (a, b) = (i.min(j), i.max(j));
                quad += theta[i] * self.a[a][b] * theta[j];
            }
        }
        let rss = self.sum_wyy - 2.0 * crate::features::dot(theta, &self.b) + quad;
        (rss / self.sum_g).max(0.0)
    }

    /// Upper triangle of A, row-major (length D(D+1)/2).
    pub(crate) fn a_upper(&self) -> Vec<f64> {
        let mut v = Vec::with_capacity(D * (D + 1) / 2);
        for i in 0..D {
            for j in i..D {
                v.push(self.a[i][j]);
            }
        }
        v
    }

    /// Inverse of [`Self::a_upper`]; `None` on a wrong length.
    pub(crate) fn a_from_upper(upper: &[f64]) -> Option<[[f64; D]; D]> {
        if upper.len() != D * (D + 1) / 2 {
            return None;
        }
        let mut a = [[0.0; D]; D];
        let mut k = 0;
        for i in 0..D {
            for j in i..D {
                a[i][j] = upper[k];
                a[j][i] = upper[k];
                k += 1;
            }
        }
        Some(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAU: f64 = 120.0;
    const IV: f64 = 600.0;

    #[test]
    fn recovers_exact_linear_model() {
        let mut s = DecayStats::<3>::default();
        for i in 0..50 {
            let t = i as f64;
            let x = [1.0, t, (t * 0.37).sin() + 2.0];
            let y = 3.0 + 0.5 * x[1] + 2.0 * x[2];
            s.add(&x, y, 1.0 / (y * y), t, TAU, IV);
        }
        let th = s.solve(1e-12, &[0.0; 3], 0.0).expect("solvable");
        assert!(
            (th[0] - 3.0).abs() < 1e-6 && (th[1] - 0.5).abs() < 1e-6 && (th[2] - 2.0).abs() < 1e-6
        );
        assert!(s.residual_variance(&th) < 1e-12);
    }

    #[test]
    fn rebase_across_landmarks_preserves_the_solution_and_decays_count() {
        let mut s = DecayStats::<2>::default();
        for i in 0..2000 {
            let t = i as f64;
            let x = [1.0, (i % 17) as f64];
            s.add(&x, 1.0 + 2.0 * x[1], 1.0, t, TAU, IV);
        }
        assert_eq!(s.landmark_s, 1800.0);
        let th = s.solve(1e-12, &[0.0; 2], 0.0).expect("solvable");
        assert!((th[1] - 2.0).abs() < 1e-9);
        // One sample per second with τ = 120 s keeps ≈ 120 effective samples.
        let c = s.decayed_count(1999.0, TAU);
        assert!((c - 120.0).abs() < 2.0, "{c}");
    }

    #[test]
    fn empty_or_unexcited_directions_fall_back_to_the_prior() {
        let s = DecayStats::<2>::default();
        assert!(s.solve(1e-6, &[1.0, 2.0], 0.0).is_none());
        let mut s = DecayStats::<2>::default();
        for i in 0..10 {
            s.add(&[1.0, 0.0], 5.0, 1.0, i as f64, TAU, IV);
        }
        let th = s
            .solve(1e-6, &[1.0, 2.0], 0.0)
            .expect("ridge makes it solvable");
        assert!((th[0] - 5.0).abs() < 1e-4);
        assert_eq!(
            th[1], 2.0,
            "a feature never seen keeps its prior coefficient"
        );
    }
}
