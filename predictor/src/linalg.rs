//! Small dense solves for d ≤ 8: Cholesky on a masked subsystem, and a non-negative
//! least-squares active-set loop on top of it.
//!
//! Invariant: never panics and never returns non-finite coefficients; a singular or
//! non-finite system yields `None` and the caller keeps its previous θ.

// Index loops mirror the matrix algebra they implement; iterator forms would obscure it.
#![allow(clippy::needless_range_loop)]

/// Solve `m[F,F]·x[F] = rhs[F]` over the free set `F` (where `free[i]`); entries outside `F`
/// are 0 in the result. `m` must be symmetric (only the upper triangle is read).
pub(crate) fn cholesky_solve<const D: usize>(
    m: &[[f64; D]; D],
    rhs: &[f64; D],
    free: &[bool; D],
) -> Option<[f64; D]> {
    let mut idx = [0usize; D];
    let mut k = 0;
    for (i, &f) in free.iter().enumerate() {
        if f {
            idx[k] = i;
            k += 1;
        }
    }
    let mut l = [[0.0f64; D]; D];
    for r in 0..k {
        for c in 0..=r {
            let (i, j) = (idx[c].min(idx[r]), idx[c].max(idx[r]));
            let mut s = m[i][j];
            for t in 0..c {
                s -= l[r][t] * l[c][t];
            }
            if r == c {
                if s <= 0.0 || !s.is_finite() {
                    return None;
                }
                l[r][r] = s.sqrt();
            } else {
                l[r][c] = s / l[c][c];
            }
        }
    }
    let mut z = [0.0f64; D];
    for r in 0..k {
        let mut s = rhs[idx[r]];
        for t in 0..r {
            s -= l[r][t] * z[t];
        }
        z[r] = s / l[r][r];
    }
    let mut x = [0.0f64; D];
    for r in (0..k).rev() {
        let mut s = z[r];
        for t in r + 1..k {
            s -= l[t][r] * x[idx[t]];
        }
        x[idx[r]] = s / l[r][r];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

/// Minimise `½θᵀMθ − rhsᵀθ` subject to θ_i ≥ 0 for every `i ≥ 1` (index 0, the bias, is
/// free). Lawson–Hanson-style active set: clip negatives, re-solve, and release a clipped
/// coefficient whose gradient says it wants to grow. `M` must be positive definite.
pub(crate) fn solve_nonneg<const D: usize>(m: &[[f64; D]; D], rhs: &[f64; D]) -> Option<[f64; D]> {
    let mut free = [true; D];
    let mut x = cholesky_solve(m, rhs, &free)?;
    for _ in 0..(3 * D) {
        let mut clipped_any = false;
        for i in 1..D {
            if free[i] && x[i] < 0.0 {
                free[i] = false;
                clipped_any = true;
            }
        }
        if clipped_any {
            x = cholesky_solve(m, rhs, &free)?;
            continue;
        }
        // KKT check: a clipped coefficient with positive gradient (rhs − Mθ)_i wants to grow.
        let mut best = None;
        let mut best_g = 0.0;
        for i in 1..D {
            if !free[i] {
                let mut g = rhs[i];
                for j in 0..D {
                    let (a, b) = (i.min(j), i.max(j));
                    g -= m[a][b] * x[j];
                }
                let scale = m[i][i].abs().max(f64::MIN_POSITIVE).sqrt();
                if g / scale > best_g + 1e-12 {
                    best_g = g / scale;
                    best = Some(i);
                }
            }
        }
        match best {
            Some(i) => {
                free[i] = true;
                let trial = cholesky_solve(m, rhs, &free)?;
                if trial[i] <= 0.0 {
                    // Releasing it does not help; keep the current optimum.
                    break;
                }
                x = trial;
            }
            None => break,
        }
    }
    Some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solves_a_spd_system() {
        let m = [[4.0, 2.0, 0.0], [2.0, 3.0, 1.0], [0.0, 1.0, 2.0]];
        let truth = [1.0, -2.0, 0.5];
        let mut rhs = [0.0; 3];
        for i in 0..3 {
            for j in 0..3 {
                rhs[i] += m[i][j] * truth[j];
            }
        }
        let x = cholesky_solve(&m, &rhs, &[true; 3]).expect("spd");
        for i in 0..3 {
            assert!((x[i] - truth[i]).abs() < 1e-12);
        }
    }

    #[test]
    fn singular_system_is_refused_not_nan() {
        let m = [[1.0, 1.0], [1.0, 1.0]];
        assert!(cholesky_solve(&m, &[1.0, 1.0], &[true; 2]).is_none());
    }

    #[test]
    fn nonneg_clips_physics_coefficients_but_not_the_bias() {
        // Unconstrained optimum is (−1, −2, 3); constrained must keep x1 ≥ 0.
        let m = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
        let x = solve_nonneg(&m, &[-1.0, -2.0, 3.0]).expect("pd");
        assert_eq!(x, [-1.0, 0.0, 3.0]);
    }

    #[test]
    fn nonneg_matches_unconstrained_when_feasible() {
        let m = [[2.0, 0.5], [0.5, 1.0]];
        let rhs = [1.0, 2.0];
        assert_eq!(solve_nonneg(&m, &rhs), cholesky_solve(&m, &rhs, &[true; 2]));
    }
}
