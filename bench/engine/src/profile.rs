//! Hardware/model profiles: scheduler limits, KV capacity and step-time constants.
//!
//! Profiles are data: one row of [`PROFILES`] per name. Every constant cites where it
//! comes from (see `bench/CALIBRATION.md` and `shared/reference/engine-and-traces.md`
//! §2.3). A [`Profile`] is a plain value so callers may override fields (for example
//! `--num-gpu-blocks`) and then [`Profile::validate`] it.

use super::error::EngineError;
use super::frontend::FrontendCost;

/// Default log-sd of the per-step lognormal noise factor (mean 1). Grounded in the
/// measured vLLM 0.19 runs (`shared/traces/llmservingsim-vllm-measured`): gaps between
/// consecutive distinct token timestamps that span one step have a log-sd of 0.033
/// (RTX 4090, 25 ms steps) and 0.085 (RTX PRO 6000, 27 ms steps). That spread also
/// holds real changes of batch composition, so it bounds the noise from above; 0.05
/// sits inside it (see `bench/CALIBRATION.md`, "Step noise").
pub const DEFAULT_STEP_NOISE: f64 = 0.05;

/// Default API-server cost (an assumption, not a measurement: Python's per-step output
/// handling and per-chunk detokenise + serialise + write; see `bench/CALIBRATION.md`,
/// "Token delivery"). At these costs a front end serving 200 streams spends 10 ms per
/// step, as long as a busy H100 decode step, and starts to merge steps into bursts.
pub const DEFAULT_FRONTEND: FrontendCost = FrontendCost {
    step_ms: 0.1,
    chunk_ms: 0.05,
};

/// vLLM's default `--stream-interval` (one token per chunk unless the front end merges).
pub const DEFAULT_STREAM_INTERVAL: u32 = 1;

/// How much KV a waiting request must find free before it is admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// vLLM's `scheduler_reserve_full_isl=True` (the default since 0.1x): the request's
    /// whole *current* sequence (prompt, plus tokens generated before a preemption)
    /// must fit; output growth is not reserved and is handled by preemption.
    FullInput,
    /// Conservative: prompt plus `max_output_tokens` must fit (no vLLM equivalent;
    /// TRT-LLM's GUARANTEED_NO_EVICT is similar). Useful for what-if experiments.
    FullSequence,
}

/// Step-time constants (milliseconds) of
/// `T = T0 + c_req·reqs + T_lin(N) + Σ attention`, with
/// `T_lin(N) = W + t_tok·max(0, N − N0)` for `N ≥ 1` and attention per scheduled
/// request `max(α·(k+c), β·(c·k + c²/2))` (a roofline: reading the KV of `k + c`
/// tokens, or computing `c·k + c²/2` query–key pairs). A decode (`c = 1`) costs
/// `α·(k+1)`, the brief's `α·context`; a long prefill chunk costs the brief's β term.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepCost {
    /// Fixed per-step CPU cost: scheduling, input prep, sampling launch.
    pub t0_ms: f64,
    /// Per scheduled request (metadata, sampler rows).
    pub c_req_ms: f64,
    /// Token-proportional work floor: reading the weights once.
    pub w_ms: f64,
    /// Marginal cost per token once compute-bound.
    pub t_tok_ms: f64,
    /// Tokens per step below which the linear layers stay memory-bound.
    pub n0_tokens: u32,
    /// Attention cost per KV token read (memory-bound).
    pub alpha_ms: f64,
    /// Attention cost per query–key pair (compute-bound).
    pub beta_ms: f64,
}

impl StepCost {
    /// `T_lin(N)` in milliseconds (0 for an empty step: no forward pass runs).
    pub fn t_lin_ms(&self, tokens: u64) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        let over = tokens.saturating_sub(u64::from(self.n0_tokens)) as f64;
        self.w_ms + self.t_tok_ms * over
    }

    /// Attention cost (ms) of scheduling `c` new tokens on top of `k` computed ones.
    pub fn attention_ms(&self, c: u64, k: u64) -> f64 {
        let (c, k) = (c as f64, k as f64);
        let read = self.alpha_ms * (k + c);
        if c <= 1.0 {
            return read;
        }
        read.max(self.beta_ms * (c * k + c * c / 2.0))
    }
}

/// One hardware + model configuration of the engine model.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// Name used on the command line (`--profile`).
    pub name: String,
    /// One line on where the numbers come from.
    pub summary: String,
    /// Tokens per KV block (vLLM default 16).
    pub block_size: u32,
    /// vLLM's `num_gpu_blocks`, including the reserved null block.
    pub num_gpu_blocks: u32,
    /// Token budget per step (`max_num_batched_tokens`).
    pub max_num_batched_tokens: u32,
    /// Cap on running requests (`max_num_seqs`).
    pub max_num_seqs: u32,
    /// Longest prompt + output accepted.
    pub max_model_len: u32,
    /// Admission rule for waiting requests.
    pub admission: Admission,
    /// Step-time constants.
    pub cost: StepCost,
    /// Tokens per streamed chunk (vLLM's `--stream-interval`).
    pub stream_interval: u32,
    /// The API server's CPU cost (what makes chunks arrive in bursts when it is busy).
    pub frontend: FrontendCost,
}

/// One row of the profile table.
struct Row {
    name: &'static str,
    summary: &'static str,
    num_gpu_blocks: u32,
    max_num_batched_tokens: u32,
    max_num_seqs: u32,
    max_model_len: u32,
    cost: StepCost,
}

/// The profile table. Derivations: `bench/CALIBRATION.md`.
const PROFILES: &[Row] = &[
    Row {
        name: "h100-llama3-8b",
        summary: "H100-80GB SXM, Llama-3-8B BF16 TP1; Vidur-derived T_lin, roofline attention, \
                  6.5 ms batch-1 decode (reference §2.3)",
        num_gpu_blocks: 27_500,
        max_num_batched_tokens: 8192,
        max_num_seqs: 1024,
        max_model_len: 131_072,
        cost: StepCost {
            t0_ms: 0.6,
            c_req_ms: 0.008,
            w_ms: 5.9,
            t_tok_ms: 0.0214,
            n0_tokens: 192,
            alpha_ms: 5.0e-5,
            beta_ms: 1.5e-6,
        },
    },
    Row {
        name: "a100-llama3-8b",
        summary: "A100-80GB SXM, Llama-3-8B BF16 TP1; Vidur mlp.csv T_lin, roofline attention, \
                  10.4 ms batch-1 decode (reference §2.3)",
        num_gpu_blocks: 27_500,
        max_num_batched_tokens: 2048,
        max_num_seqs: 256,
        max_model_len: 131_072,
        cost: StepCost {
            t0_ms: 0.6,
            c_req_ms: 0.008,
            w_ms: 9.7,
            t_tok_ms: 0.066,
            n0_tokens: 128,
            alpha_ms: 8.5e-5,
            beta_ms: 2.9e-6,
        },
    },
    Row {
        name: "l4-llama3-8b",
        summary: "L4-24GB, Llama-3-8B BF16 TP1; derived from the A100 row by datasheet ratios \
                  (300 GB/s, 121 TFLOPS BF16), ~2.1k KV blocks",
        num_gpu_blocks: 2_100,
        max_num_batched_tokens: 2048,
        max_num_seqs: 256,
        max_model_len: 32_768,
        cost: StepCost {
            t0_ms: 0.6,
            c_req_ms: 0.008,
            w_ms: 66.0,
            t_tok_ms: 0.170,
            n0_tokens: 384,
            alpha_ms: 5.8e-4,
            beta_ms: 7.5e-6,
        },
    },
    Row {
        name: "rtx4090-llama3-8b",
        summary: "RTX 4090-24GB, Llama-3.1-8B BF16 TP1; 2588 KV blocks measured (vLLM 0.19), \
                  datasheet roofline checked against the LLMServingSim measured run",
        num_gpu_blocks: 2_588,
        max_num_batched_tokens: 2048,
        max_num_seqs: 256,
        max_model_len: 32_768,
        cost: StepCost {
            t0_ms: 0.6,
            c_req_ms: 0.008,
            w_ms: 19.5,
            t_tok_ms: 0.090,
            n0_tokens: 216,
            alpha_ms: 1.7e-4,
            beta_ms: 5.5e-6,
        },
    },
    Row {
        name: "rtxpro6000-llama3-8b",
        summary: "RTX PRO 6000 Blackwell-96GB, Llama-3.1-8B BF16 TP1; datasheet roofline \
                  (1.79 TB/s, ~504 TFLOPS BF16), limits of the LLMServingSim measured run",
        num_gpu_blocks: 35_000,
        max_num_batched_tokens: 2048,
        max_num_seqs: 128,
        max_model_len: 131_072,
        cost: StepCost {
            t0_ms: 0.6,
            c_req_ms: 0.008,
            w_ms: 11.1,
            t_tok_ms: 0.042,
            n0_tokens: 264,
            alpha_ms: 9.5e-5,
            beta_ms: 2.1e-6,
        },
    },
];

impl Profile {
    /// Names of every built-in profile, in table order.
    pub fn names() -> Vec<&'static str> {
        PROFILES.iter().map(|r| r.name).collect()
    }

    /// The built-in profile called `name`, or an error listing the valid names.
    pub fn by_name(name: &str) -> Result<Profile, EngineError> {
        let row = PROFILES.iter().find(|r| r.name == name).ok_or_else(|| {
            EngineError::UnknownProfile {
                name: name.to_string(),
                valid: Profile::names().join(", "),
            }
        })?;
        Ok(Profile {
            name: row.name.to_string(),
            summary: row.summary.to_string(),
            block_size: 16,
            num_gpu_blocks: row.num_gpu_blocks,
            max_num_batched_tokens: row.max_num_batched_tokens,
            max_num_seqs: row.max_num_seqs,
            max_model_len: row.max_model_len,
            admission: Admission::FullInput,
            cost: row.cost,
            stream_interval: DEFAULT_STREAM_INTERVAL,
            frontend: DEFAULT_FRONTEND,
        })
    }

    /// Usable KV blocks: vLLM reserves one null block.
    pub fn usable_blocks(&self) -> u32 {
        self.num_gpu_blocks.saturating_sub(1)
    }

    /// Checks that the limits are coherent: positive sizes, finite non-negative costs,
    /// and one `max_model_len` sequence fits in KV (vLLM refuses to start otherwise).
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |msg: String| Err(EngineError::InvalidConfig(msg));
        if self.block_size == 0 || self.block_size > 1024 {
            return bad(format!("block_size {} not in 1..=1024", self.block_size));
        }
        if self.num_gpu_blocks < 2 {
            return bad(format!("num_gpu_blocks {} < 2", self.num_gpu_blocks));
        }
        if self.max_num_batched_tokens == 0 || self.max_num_seqs == 0 || self.max_model_len < 2 {
            return bad(
                "max_num_batched_tokens and max_num_seqs must be > 0, max_model_len >= 2".into(),
            );
        }
        let need = u64::from(self.max_model_len).div_ceil(u64::from(self.block_size));
        if need > u64::from(self.usable_blocks()) {
            return bad(format!(
                "max_model_len {} needs {need} KV blocks but only {} are usable; \
                 lower max_model_len or raise num_gpu_blocks",
                self.max_model_len,
                self.usable_blocks()
            ));
        }
        let c = &self.cost;
        let costs = [
            c.t0_ms, c.c_req_ms, c.w_ms, c.t_tok_ms, c.alpha_ms, c.beta_ms,
        ];
        if costs.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return bad("step-cost constants must be finite and >= 0".into());
        }
        if self.stream_interval == 0 || self.stream_interval > 4096 {
            return bad(format!(
                "stream_interval {} not in 1..=4096",
                self.stream_interval
            ));
        }
        self.frontend.validate()?;
        Ok(())
    }

    /// This profile with every step-time constant scaled by its own factor
    /// `1 ± mismatch` (the sign drawn per constant from `seed`): an engine whose true
    /// speed differs from the documented one by `mismatch` in each term, as a real
    /// deployment's does from published figures. `N0` and the limits are kept (the
    /// operator configures those). Deterministic for a seed.
    pub fn mismatched(&self, mismatch: f64, seed: u64) -> Result<Profile, EngineError> {
        if !mismatch.is_finite() || !(0.0..=0.9).contains(&mismatch) {
            return Err(EngineError::InvalidConfig(format!(
                "engine mismatch {mismatch} not in [0, 0.9]"
            )));
        }
        let mut p = self.clone();
        let c = &mut p.cost;
        let fields = [
            &mut c.t0_ms,
            &mut c.c_req_ms,
            &mut c.w_ms,
            &mut c.t_tok_ms,
            &mut c.alpha_ms,
            &mut c.beta_ms,
        ];
        for (k, v) in fields.into_iter().enumerate() {
            let bit =
                super::hashing::mix64(seed ^ (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                    & 1;
            let sign = if bit == 1 { 1.0 } else { -1.0 };
            *v *= 1.0 + sign * mismatch;
        }
        p.validate()?;
        Ok(p)
    }

    /// The built-in `base` (or this file's `base`) with a profile file's overrides.
    pub fn from_file(
        path: &std::path::Path,
        base: &str,
    ) -> Result<(Profile, ProfileFile), EngineError> {
        let file = ProfileFile::read(path)?;
        let p = file.apply(base)?;
        Ok((p, file))
    }
}

/// An engine profile file (TOML, or JSON when the name ends in `.json`): a built-in
/// profile with any of its constants overridden. Every field is optional; unknown
/// fields are refused (a typo must not silently leave a constant at its default).
///
/// ```toml
/// base = "h100-llama3-8b"   # default: the profile named on the command line
/// scale = 1.3               # multiplies every step-time constant (a slower engine)
/// w_ms = 7.0                # or set constants one by one (applied before `scale`)
/// stream_interval = 4
/// frontend_chunk_ms = 0.08
/// step_noise = 0.1
/// ```
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileFile {
    pub base: Option<String>,
    pub num_gpu_blocks: Option<u32>,
    pub max_num_batched_tokens: Option<u32>,
    pub max_num_seqs: Option<u32>,
    pub max_model_len: Option<u32>,
    pub t0_ms: Option<f64>,
    pub c_req_ms: Option<f64>,
    pub w_ms: Option<f64>,
    pub t_tok_ms: Option<f64>,
    pub n0_tokens: Option<u32>,
    pub alpha_ms: Option<f64>,
    pub beta_ms: Option<f64>,
    /// Multiplies t0, c_req, W, t_tok, α and β (after the per-constant overrides).
    pub scale: Option<f64>,
    pub stream_interval: Option<u32>,
    pub frontend_step_ms: Option<f64>,
    pub frontend_chunk_ms: Option<f64>,
    /// Log-sd of the step noise (the engine's noise knob, not part of [`Profile`]).
    pub step_noise: Option<f64>,
}

impl ProfileFile {
    /// Reads and parses `path`; errors name the file.
    pub fn read(path: &std::path::Path) -> Result<ProfileFile, EngineError> {
        let err = |msg: String| EngineError::ProfileFile {
            path: path.display().to_string(),
            msg,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let file: ProfileFile = if path.extension().is_some_and(|e| e == "json") {
            serde_json::from_str(&text).map_err(|e| err(e.to_string()))?
        } else {
            toml::from_str(&text).map_err(|e| err(e.to_string()))?
        };
        if let Some(s) = file.step_noise
            && (!s.is_finite() || !(0.0..=2.0).contains(&s))
        {
            return Err(err(format!("step_noise {s} not in [0, 2]")));
        }
        if let Some(s) = file.scale
            && (!s.is_finite() || s <= 0.0 || s > 100.0)
        {
            return Err(err(format!("scale {s} not in (0, 100]")));
        }
        Ok(file)
    }

    /// The profile `self.base` (else `base`) with these overrides, validated.
    pub fn apply(&self, base: &str) -> Result<Profile, EngineError> {
        let mut p = Profile::by_name(self.base.as_deref().unwrap_or(base))?;
        macro_rules! set {
            ($($f:ident => $($dst:ident).+),* $(,)?) => {
                $( if let Some(v) = self.$f { p.$($dst).+ = v; } )*
            };
        }
        set!(
            num_gpu_blocks => num_gpu_blocks,
            max_num_batched_tokens => max_num_batched_tokens,
            max_num_seqs => max_num_seqs,
            max_model_len => max_model_len,
            t0_ms => cost.t0_ms,
            c_req_ms => cost.c_req_ms,
            w_ms => cost.w_ms,
            t_tok_ms => cost.t_tok_ms,
            n0_tokens => cost.n0_tokens,
            alpha_ms => cost.alpha_ms,
            beta_ms => cost.beta_ms,
            stream_interval => stream_interval,
            frontend_step_ms => frontend.step_ms,
            frontend_chunk_ms => frontend.chunk_ms,
        );
        if let Some(k) = self.scale {
            let c = &mut p.cost;
            for v in [
                &mut c.t0_ms,
                &mut c.c_req_ms,
                &mut c.w_ms,
                &mut c.t_tok_ms,
                &mut c.alpha_ms,
                &mut c.beta_ms,
            ] {
                *v *= k;
            }
        }
        p.validate()?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_profile_is_valid() {
        for name in Profile::names() {
            let p = Profile::by_name(name).expect("listed profile exists");
            p.validate().expect("built-in profile valid");
        }
    }

    #[test]
    fn unknown_profile_lists_valid_names() {
        let err = Profile::by_name("tpu-v9").expect_err("unknown");
        let msg = err.to_string();
        assert!(
            msg.contains("tpu-v9") && msg.contains("h100-llama3-8b"),
            "{msg}"
        );
    }

    #[test]
    fn mismatch_moves_every_constant_by_the_given_share_and_repeats_for_a_seed() {
        let p = Profile::by_name("h100-llama3-8b").expect("exists");
        let m = p.mismatched(0.3, 5).expect("valid");
        assert_eq!(m, p.mismatched(0.3, 5).expect("valid"), "deterministic");
        let pairs = [
            (p.cost.t0_ms, m.cost.t0_ms),
            (p.cost.w_ms, m.cost.w_ms),
            (p.cost.t_tok_ms, m.cost.t_tok_ms),
            (p.cost.alpha_ms, m.cost.alpha_ms),
            (p.cost.beta_ms, m.cost.beta_ms),
        ];
        for (a, b) in pairs {
            let r = b / a;
            assert!(
                (r - 0.7).abs() < 1e-9 || (r - 1.3).abs() < 1e-9,
                "ratio {r}"
            );
        }
        let signs = |q: &Profile| {
            [
                q.cost.w_ms > p.cost.w_ms,
                q.cost.t_tok_ms > p.cost.t_tok_ms,
                q.cost.alpha_ms > p.cost.alpha_ms,
            ]
        };
        let differ = (0..16).any(|s| signs(&p.mismatched(0.3, s).expect("valid")) != signs(&m));
        assert!(differ, "other seeds draw other signs");
        assert_eq!(p.mismatched(0.0, 5).expect("valid"), p);
        assert!(p.mismatched(f64::NAN, 1).is_err());
        assert!(p.mismatched(-0.1, 1).is_err());
    }

    #[test]
    fn profile_files_override_constants_and_refuse_bad_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write");
            path
        };
        let ok = write(
            "slow.toml",
            "w_ms = 10.0\nscale = 2.0\nstream_interval = 4\nfrontend_chunk_ms = 0.1\nstep_noise = 0.2\n",
        );
        let (p, f) = Profile::from_file(&ok, "a100-llama3-8b").expect("loads");
        assert_eq!(p.name, "a100-llama3-8b");
        assert!((p.cost.w_ms - 20.0).abs() < 1e-12, "override then scale");
        assert!((p.cost.t0_ms - 1.2).abs() < 1e-12);
        assert_eq!(p.stream_interval, 4);
        assert_eq!(f.step_noise, Some(0.2));
        let json = write("x.json", r#"{"base": "l4-llama3-8b", "max_num_seqs": 64}"#);
        let (p, _) = Profile::from_file(&json, "h100-llama3-8b").expect("loads");
        assert_eq!((p.name.as_str(), p.max_num_seqs), ("l4-llama3-8b", 64));
        for (name, text) in [
            ("neg.toml", "stream_interval = -1\n"),
            ("zero.toml", "stream_interval = 0\n"),
            ("nan.toml", "step_noise = nan\n"),
            ("negcost.toml", "alpha_ms = -1.0\n"),
            ("typo.toml", "w_mss = 3.0\n"),
            ("fe.toml", "frontend_step_ms = inf\n"),
        ] {
            let path = write(name, text);
            let err = Profile::from_file(&path, "h100-llama3-8b").expect_err(name);
            assert!(!err.to_string().is_empty(), "{name}");
        }
        let missing = Profile::from_file(&dir.path().join("nope.toml"), "h100-llama3-8b")
            .expect_err("missing file");
        assert!(missing.to_string().contains("nope.toml"), "{missing}");
    }

    #[test]
    fn validate_rejects_model_len_larger_than_kv() {
        let mut p = Profile::by_name("rtx4090-llama3-8b").expect("exists");
        p.max_model_len = 131_072;
        assert!(p.validate().is_err());
    }
}
