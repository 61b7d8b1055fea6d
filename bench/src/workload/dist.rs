//! Token-length distributions for generated requests.
//!
//! Every sample is an integer in `1..=MAX_TOKENS`, so a generated request is always a
//! valid one. `lognormal(mean, sigma)` is parameterised by its *mean* (not its median)
//! because trace summaries report means: `mu = ln(mean) − sigma²/2`.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rand::Rng;
use rand_distr::{Distribution, LogNormal};

use super::{Workload, WorkloadError};

/// Largest length a distribution yields (longer than any context window we model).
pub const MAX_TOKENS: u32 = 1 << 20;

/// Which column of a trace an empirical distribution resamples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    Input,
    Output,
}

#[derive(Clone, Debug)]
pub enum LengthDist {
    Const(u32),
    /// Uniform on `lo..=hi`.
    Uniform {
        lo: u32,
        hi: u32,
    },
    LogNormal {
        mean: f64,
        sigma: f64,
        dist: LogNormal<f64>,
    },
    /// Resampled (with replacement) from observed lengths; `source` is for display.
    Empirical {
        source: String,
        values: Arc<Vec<u32>>,
    },
}

impl PartialEq for LengthDist {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl LengthDist {
    pub fn constant(n: u32) -> Result<Self, String> {
        if (1..=MAX_TOKENS).contains(&n) {
            Ok(LengthDist::Const(n))
        } else {
            Err(format!("length {n} outside 1..={MAX_TOKENS}"))
        }
    }

    pub fn uniform(lo: u32, hi: u32) -> Result<Self, String> {
        if lo >= 1 && lo <= hi && hi <= MAX_TOKENS {
            Ok(LengthDist::Uniform { lo, hi })
        } else {
            Err(format!(
                "uniform({lo},{hi}) needs 1 <= lo <= hi <= {MAX_TOKENS}"
            ))
        }
    }

    pub fn lognormal(mean: f64, sigma: f64) -> Result<Self, String> {
        if !(mean.is_finite() && mean >= 1.0 && sigma.is_finite() && (0.0..=4.0).contains(&sigma)) {
            return Err(format!(
                "lognormal({mean},{sigma}) needs mean >= 1 and 0 <= sigma <= 4"
            ));
        }
        let mu = mean.ln() - sigma * sigma / 2.0;
        let dist = LogNormal::new(mu, sigma).map_err(|e| e.to_string())?;
        Ok(LengthDist::LogNormal { mean, sigma, dist })
    }

    pub fn empirical(source: impl Into<String>, values: Vec<u32>) -> Result<Self, String> {
        let values: Vec<u32> = values.into_iter().map(|v| v.clamp(1, MAX_TOKENS)).collect();
        if values.is_empty() {
            return Err("no values to resample".into());
        }
        Ok(LengthDist::Empirical {
            source: source.into(),
            values: Arc::new(values),
        })
    }

    /// Resamples one column of a workload file.
    pub fn from_trace(path: &Path, column: Column) -> Result<Self, WorkloadError> {
        let w = Workload::load(path)?;
        let values = w
            .requests
            .iter()
            .map(|r| match column {
                Column::Input => r.input_tokens,
                Column::Output => r.output_tokens,
            })
            .collect();
        LengthDist::empirical(path.display().to_string(), values)
            .map_err(|m| WorkloadError::spec(&path.display().to_string(), m))
    }

    /// `N`, `const(N)`, `uniform(LO,HI)`, `lognormal(MEAN,SIGMA)` or `trace(PATH)`.
    pub fn parse(text: &str, column: Column) -> Result<Self, WorkloadError> {
        let t = text.trim();
        let err = |m: String| WorkloadError::spec(t, m);
        if let Ok(n) = t.parse::<u32>() {
            return LengthDist::constant(n).map_err(err);
        }
        let (name, args) = t
            .strip_suffix(')')
            .and_then(|s| s.split_once('('))
            .ok_or_else(|| {
                err(
                    "expected N, const(N), uniform(LO,HI), lognormal(MEAN,SIGMA) or trace(PATH)"
                        .into(),
                )
            })?;
        let nums = || -> Result<Vec<f64>, WorkloadError> {
            args.split(',')
                .map(|a| {
                    a.trim()
                        .parse::<f64>()
                        .map_err(|_| err(format!("`{a}` is not a number")))
                })
                .collect()
        };
        let as_u32 = |v: f64| -> Result<u32, WorkloadError> {
            if v.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&v) {
                Ok(v as u32)
            } else {
                Err(err(format!("`{v}` is not a token count")))
            }
        };
        match (name.trim(), nums()) {
            ("trace", _) => LengthDist::from_trace(Path::new(args.trim()), column),
            ("const", Ok(v)) if v.len() == 1 => LengthDist::constant(as_u32(v[0])?).map_err(err),
            ("uniform", Ok(v)) if v.len() == 2 => {
                LengthDist::uniform(as_u32(v[0])?, as_u32(v[1])?).map_err(err)
            }
            ("lognormal", Ok(v)) if v.len() == 2 => LengthDist::lognormal(v[0], v[1]).map_err(err),
            (_, Err(e)) => Err(e),
            (other, Ok(_)) => Err(err(format!(
                "unknown distribution or wrong arguments: `{other}`"
            ))),
        }
    }

    pub fn sample(&self, rng: &mut impl Rng) -> u32 {
        match self {
            LengthDist::Const(n) => *n,
            LengthDist::Uniform { lo, hi } => rng.random_range(*lo..=*hi),
            LengthDist::LogNormal { dist, .. } => {
                dist.sample(rng).round().clamp(1.0, f64::from(MAX_TOKENS)) as u32
            }
            LengthDist::Empirical { values, .. } => values[rng.random_range(0..values.len())],
        }
    }

    /// Expected value (exact for the closed forms, sample mean for empirical).
    pub fn mean(&self) -> f64 {
        match self {
            LengthDist::Const(n) => f64::from(*n),
            LengthDist::Uniform { lo, hi } => (f64::from(*lo) + f64::from(*hi)) / 2.0,
            LengthDist::LogNormal { mean, .. } => *mean,
            LengthDist::Empirical { values, .. } => {
                values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len() as f64
            }
        }
    }
}

impl fmt::Display for LengthDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LengthDist::Const(n) => write!(f, "const({n})"),
            LengthDist::Uniform { lo, hi } => write!(f, "uniform({lo},{hi})"),
            LengthDist::LogNormal { mean, sigma, .. } => write!(f, "lognormal({mean},{sigma})"),
            LengthDist::Empirical { source, .. } => write!(f, "trace({source})"),
        }
    }
}
