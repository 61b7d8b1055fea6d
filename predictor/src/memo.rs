//! `ln` and `exp` memoised per thread, for arguments that repeat across the candidates
//! of one decision: a band's guard widening `exp(g · err)` is one value per (entry,
//! regime), and a forecast's bound/median ratio is its band's constant up to the
//! rounding of the point forecast (a few neighbouring floats). At 1,024 candidates
//! these were a tenth of a decision.
//!
//! Exact: a hit returns the function's own earlier result for a bit-identical argument;
//! a miss (or a NaN) computes it. Direct-mapped, 64 slots per function, no locks.

use std::cell::Cell;

const SLOTS: usize = 64;

/// (argument bits, result); the empty key is a NaN, which is never cached.
type Table = [Cell<(u64, f64)>; SLOTS];

thread_local! {
    static LN: Table = const { [const { Cell::new((u64::MAX, f64::NAN)) }; SLOTS] };
    static EXP: Table = const { [const { Cell::new((u64::MAX, f64::NAN)) }; SLOTS] };
}

#[inline(always)]
fn cached(table: &'static std::thread::LocalKey<Table>, x: f64, f: fn(f64) -> f64) -> f64 {
    if x.is_nan() {
        return f(x);
    }
    let bits = x.to_bits();
    let slot = (bits.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % SLOTS;
    table.with(|t| {
        let (k, v) = t[slot].get();
        if k == bits {
            return v;
        }
        let v = f(x);
        t[slot].set((bits, v));
        v
    })
}

/// `x.ln()`, from this thread's cache when `x` was seen before.
#[inline]
pub fn ln(x: f64) -> f64 {
    cached(&LN, x, f64::ln)
}

/// `x.exp()`, from this thread's cache when `x` was seen before.
#[inline]
pub fn exp(x: f64) -> f64 {
    cached(&EXP, x, f64::exp)
}

#[cfg(test)]
mod tests {
    /// Hits, misses, collisions and the edge values all return the function's bits.
    #[test]
    fn memoised_values_are_the_functions_own() {
        let xs = [
            0.0,
            -0.0,
            1.0,
            f64::MIN_POSITIVE,
            1e-300,
            -1.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            709.8,
            -745.2,
        ];
        for round in 0..3 {
            for i in 0..500 {
                let x = 0.001 * f64::from(i) + f64::from(round);
                for x in [x, x.next_up(), -x] {
                    assert_eq!(super::ln(x).to_bits(), x.ln().to_bits(), "ln {x}");
                    assert_eq!(super::exp(x).to_bits(), x.exp().to_bits(), "exp {x}");
                }
            }
            for x in xs {
                assert_eq!(super::ln(x).to_bits(), x.ln().to_bits(), "ln {x}");
                assert_eq!(super::exp(x).to_bits(), x.exp().to_bits(), "exp {x}");
            }
        }
    }
}
