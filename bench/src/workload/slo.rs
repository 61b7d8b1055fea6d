//! Objectives for requests whose trace carries none.
//!
//! Public traces record arrivals and lengths, never objectives, yet attainment needs
//! one per request. An [`SloRule`] fills in whatever a request lacks (fields a trace or
//! generator did set are kept) from a per-tenant [`SloClass`]:
//!
//! - TTFT objective = `ttft_base_ms + ttft_per_token_ms × input_tokens`, so a long
//!   prompt gets time in proportion to the prefill work it asks for, and a short one
//!   still gets a fixed floor for queueing and network;
//! - TPOT objective = `tpot_ms`, fixed: decode speed per token does not depend on the
//!   prompt much, and users perceive it directly.
//!
//! Presets and why (numbers from `reference/engine-and-traces.md`): a cold prefill of
//! Llama-3-8B costs ≈ 0.066 ms/token on an A100 and ≈ 0.021 ms/token on an H100, and a
//! lone decode step ≈ 10 ms (A100) / 6.5 ms (H100). The presets give a few times the
//! A100's cold cost, so a well-routed fleet of either class meets them at moderate
//! load and a badly routed one visibly misses them under load, which is the contrast the
//! benchmark has to show.
//!
//! - [`SloClass::MOONCAKE`] (long, document-like prompts, mean ≈ 12k tokens): 1 s +
//!   0.25 ms/token (p50 prompt 6.9k → 2.7 s, mean 12k → 4 s, 126k → 32.5 s); TPOT
//!   100 ms (10 tokens/s, about reading speed).
//! - [`SloClass::AZURE_CONV`] (chat, mean ≈ 1.2k tokens): 300 ms + 0.2 ms/token
//!   (1.2k → 540 ms), TPOT 50 ms: an interactive chat must start fast and stream
//!   faster than people read.
//! - [`SloClass::AZURE_CODE`] (code completion, mean ≈ 2k-token context, ≈ 28 output
//!   tokens): 200 ms + 0.15 ms/token (2k → 500 ms); TPOT 100 ms since the whole
//!   (short) completion matters more than its pace.
//! - [`SloClass::GENERIC`]: 500 ms + 0.2 ms/token, TPOT 100 ms.
//!
//! These sit in the range the serving literature uses for chat (sub-second TTFT,
//! 50–200 ms TPOT) and for summarisation (many seconds of TTFT).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{Workload, WorkloadError};

/// Objectives of one class of traffic.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SloClass {
    pub ttft_base_ms: f64,
    pub ttft_per_token_ms: f64,
    pub tpot_ms: f64,
}

impl SloClass {
    pub const MOONCAKE: SloClass = SloClass::new(1_000.0, 0.25, 100.0);
    pub const AZURE_CONV: SloClass = SloClass::new(300.0, 0.2, 50.0);
    pub const AZURE_CODE: SloClass = SloClass::new(200.0, 0.15, 100.0);
    pub const GENERIC: SloClass = SloClass::new(500.0, 0.2, 100.0);

    pub const fn new(ttft_base_ms: f64, ttft_per_token_ms: f64, tpot_ms: f64) -> Self {
        SloClass {
            ttft_base_ms,
            ttft_per_token_ms,
            tpot_ms,
        }
    }

    /// TTFT objective for a prompt of `input_tokens`.
    pub fn ttft_ms(&self, input_tokens: u32) -> f64 {
        self.ttft_base_ms + self.ttft_per_token_ms * f64::from(input_tokens)
    }

    /// A preset by name: `mooncake`, `azure-conv`, `azure-code`, `generic`.
    pub fn preset(name: &str) -> Option<SloClass> {
        match name.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "mooncake" => Some(Self::MOONCAKE),
            "azure-conv" | "conv" => Some(Self::AZURE_CONV),
            "azure-code" | "code" => Some(Self::AZURE_CODE),
            "generic" | "default" => Some(Self::GENERIC),
            _ => None,
        }
    }

    /// A preset name, or `ttft=BASE[+PER/tok],tpot=MS` (milliseconds).
    pub fn parse(text: &str) -> Result<SloClass, WorkloadError> {
        if let Some(c) = Self::preset(text) {
            return Ok(c);
        }
        let err = |m: &str| WorkloadError::spec(text, m);
        let (mut ttft, mut tpot) = (None, None);
        for part in text.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| err("expected a preset or `ttft=BASE+PER/tok,tpot=MS`"))?;
            match k.trim() {
                "ttft" => {
                    let v = v.trim();
                    let (base, per) = match v.split_once('+') {
                        Some((b, p)) => (b, p.trim().trim_end_matches("/tok")),
                        None => (v, "0"),
                    };
                    let base = positive_or_zero(base).ok_or_else(|| err("bad ttft base"))?;
                    let per = positive_or_zero(per).ok_or_else(|| err("bad ttft per-token"))?;
                    ttft = Some((base, per));
                }
                "tpot" => tpot = Some(positive_or_zero(v).ok_or_else(|| err("bad tpot"))?),
                other => return Err(err(&format!("unknown key `{other}`"))),
            }
        }
        match (ttft, tpot) {
            (Some((b, p)), Some(t)) if b + p > 0.0 && t > 0.0 => Ok(SloClass::new(b, p, t)),
            _ => Err(err("needs positive ttft and tpot")),
        }
    }
}

fn positive_or_zero(s: &str) -> Option<f64> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
}

impl fmt::Display for SloClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ttft={}+{}/tok,tpot={}",
            self.ttft_base_ms, self.ttft_per_token_ms, self.tpot_ms
        )
    }
}

/// Which [`SloClass`] applies to which request: per-tenant overrides, else a default.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SloRule {
    pub default: SloClass,
    #[serde(default)]
    pub tenants: BTreeMap<String, SloClass>,
}

impl Default for SloRule {
    fn default() -> Self {
        SloRule::uniform(SloClass::GENERIC)
    }
}

impl SloRule {
    pub fn uniform(default: SloClass) -> Self {
        SloRule {
            default,
            tenants: BTreeMap::new(),
        }
    }

    pub fn with_tenant(mut self, tenant: &str, class: SloClass) -> Self {
        self.tenants.insert(tenant.to_string(), class);
        self
    }

    /// The preset that fits a trace, guessed from its name: Mooncake conversation
    /// traces, Azure `code` and `conv`, else [`SloClass::GENERIC`].
    pub fn for_trace(name: &str) -> SloRule {
        let n = name.to_ascii_lowercase();
        let class = if n.contains("mooncake") || n.contains("conversation_trace") {
            SloClass::MOONCAKE
        } else if n.contains("code") {
            SloClass::AZURE_CODE
        } else if n.contains("conv") {
            SloClass::AZURE_CONV
        } else {
            SloClass::GENERIC
        };
        SloRule::uniform(class)
    }

    /// `CLASS[;TENANT=CLASS]*`, each CLASS as in [`SloClass::parse`], e.g.
    /// `azure-conv;batch=ttft=10000,tpot=200`.
    pub fn parse(text: &str) -> Result<SloRule, WorkloadError> {
        let mut parts = text.split(';');
        let default = SloClass::parse(parts.next().unwrap_or_default())?;
        let mut rule = SloRule::uniform(default);
        for part in parts {
            let (tenant, class) = part
                .split_once('=')
                .ok_or_else(|| WorkloadError::spec(text, "expected `TENANT=CLASS`"))?;
            rule.tenants
                .insert(tenant.trim().to_string(), SloClass::parse(class)?);
        }
        Ok(rule)
    }

    pub fn class_for(&self, tenant: Option<&str>) -> &SloClass {
        tenant
            .and_then(|t| self.tenants.get(t))
            .unwrap_or(&self.default)
    }

    /// Fills every missing objective; objectives already present are kept.
    pub fn apply(&self, workload: &mut Workload) {
        for r in &mut workload.requests {
            let class = *self.class_for(r.tenant.as_deref());
            if r.slo_ttft_ms.is_none() {
                r.slo_ttft_ms = Some(class.ttft_ms(r.input_tokens));
            }
            if r.slo_tpot_ms.is_none() {
                r.slo_tpot_ms = Some(class.tpot_ms);
            }
        }
    }
}
