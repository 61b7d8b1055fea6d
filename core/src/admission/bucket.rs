//! A token bucket refilled continuously: `rate` units per minute, holding at most one
//! minute's worth (so a tenant idle for a minute may spend its whole minute at once).
//!
//! Invariant: `0 ≤ level ≤ cap`; refill is `elapsed_s × rate / 60`, so the time until
//! `n` units are available is `(n − level) × 60 / rate` seconds.

/// A per-minute allowance (requests or tokens).
#[derive(Clone, Debug, PartialEq)]
pub struct Bucket {
    per_minute: f64,
    level: f64,
    at_s: f64,
}

impl Bucket {
    /// A full bucket of `per_minute` units (must be > 0 and finite: the host validates).
    pub fn per_minute(per_minute: f64, now_s: f64) -> Self {
        Self {
            per_minute,
            level: per_minute,
            at_s: now_s,
        }
    }

    pub fn rate(&self) -> f64 {
        self.per_minute
    }

    /// Changes the rate (a reload), keeping what is left within the new capacity.
    pub fn set_rate(&mut self, per_minute: f64, now_s: f64) {
        self.refill(now_s);
        self.per_minute = per_minute;
        self.level = self.level.min(per_minute);
    }

    fn refill(&mut self, now_s: f64) {
        let dt = (now_s - self.at_s).max(0.0);
        self.level = (self.level + dt * self.per_minute / 60.0).min(self.per_minute);
        self.at_s = self.at_s.max(now_s);
    }

    /// `Ok` when `n` units are there now; else the seconds until they will be
    /// (`f64::INFINITY` when `n` exceeds what the bucket can ever hold).
    pub fn check(&mut self, n: f64, now_s: f64) -> Result<(), f64> {
        self.refill(now_s);
        if n <= self.level {
            return Ok(());
        }
        if n > self.per_minute {
            return Err(f64::INFINITY);
        }
        Err((n - self.level) * 60.0 / self.per_minute)
    }

    /// Spends `n` units (after a successful [`Bucket::check`]).
    pub fn take(&mut self, n: f64, now_s: f64) {
        self.refill(now_s);
        self.level = (self.level - n).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_at_its_rate_and_says_when() {
        let mut b = Bucket::per_minute(60.0, 0.0); // one per second
        for _ in 0..60 {
            assert!(b.check(1.0, 0.0).is_ok());
            b.take(1.0, 0.0);
        }
        let wait = b.check(1.0, 0.0).unwrap_err();
        assert!((wait - 1.0).abs() < 1e-9, "{wait}");
        assert!(b.check(1.0, 0.5).is_err());
        assert!(b.check(1.0, 1.0).is_ok());
        // Never more than a minute's worth, however long it idles.
        assert!(b.check(61.0, 1e6).unwrap_err().is_infinite());
        assert!(b.check(60.0, 1e6).is_ok());
    }

    #[test]
    fn a_lower_rate_caps_what_is_left() {
        let mut b = Bucket::per_minute(600.0, 0.0);
        b.set_rate(6.0, 0.0);
        assert!(b.check(6.0, 0.0).is_ok());
        assert!(b.check(7.0, 0.0).is_err());
    }
}
