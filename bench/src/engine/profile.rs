//! Hardware/model profiles: scheduler limits, KV capacity and step-time constants.
//!
//! Profiles are data: one row of [`PROFILES`] per name. Every constant cites where it
//! comes from (see `bench/CALIBRATION.md` and `shared/reference/engine-and-traces.md`
//! §2.3). A [`Profile`] is a plain value so callers may override fields (for example
//! `--num-gpu-blocks`) and then [`Profile::validate`] it.

use super::error::EngineError;

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
        Ok(())
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
    fn validate_rejects_model_len_larger_than_kv() {
        let mut p = Profile::by_name("rtx4090-llama3-8b").expect("exists");
        p.max_model_len = 131_072;
        assert!(p.validate().is_err());
    }
}
