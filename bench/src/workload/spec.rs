//! Command-line generator specs: `KIND:key=value,key=value,…`.
//!
//! Values may hold commas inside parentheses (`input=lognormal(1000,0.8)`). Unknown
//! keys are errors, so a typo never silently falls back to a default. Kinds and keys
//! (defaults in brackets; durations and times in seconds, rates in requests/s):
//!
//! - `poisson`: `rate`, `duration` [300], `input` [lognormal(1000,0.8)], `output`
//!   [lognormal(200,0.7)], `seed` [0], `block` [512], `tenant`, `slo_ttft`, `slo_tpot`
//!   (ms), `prompts` [0] shared system prompts of `prompt_blocks` [1] blocks.
//! - `bursty`: as `poisson` but `rate_on`, `rate_off` [0], `on` [10] and `off` [30]
//!   (mean sojourns) instead of `rate`.
//! - `mixed`: `rate`, `duration` [300], `chat_share` [0.7] (rest is `batch`), `seed`,
//!   `block`: the [`TenantSpec::chat`] and [`TenantSpec::batch`] tenants, each
//!   adjustable by `chat_…`/`batch_…` keys: `input`, `output`, `ttft`, `tpot` (ms),
//!   `prompts`, `prompt_blocks` (e.g. `batch_input=lognormal(1200,0.5)` to fit a
//!   small model's context).
//! - `incident`: `chat_rate` [10], `batch_rate` [1], `start` [60], `length` [120],
//!   `duration` [300], `seed`, `block`, `chat_input`, `chat_output`, `batch_input`,
//!   `batch_output` (see [`Incident`]).
//!
//! Length values are parsed by [`LengthDist::parse`].

use std::collections::BTreeMap;

use super::WorkloadError;
use super::dist::{Column, LengthDist};
use super::generator::{self as generator, Arrivals, GenSpec, Incident, TenantSpec};

/// Generator kinds [`parse`] knows.
pub const KINDS: [&str; 4] = ["poisson", "bursty", "mixed", "incident"];

/// Whether `text` names a generator (as opposed to a file path).
pub fn is_generator(text: &str) -> bool {
    text.split_once(':')
        .is_some_and(|(kind, _)| KINDS.contains(&kind.trim()))
}

pub fn parse(text: &str) -> Result<GenSpec, WorkloadError> {
    let (kind, rest) = text
        .split_once(':')
        .map_or((text, ""), |(k, r)| (k.trim(), r));
    let mut args = Args::split(text, rest)?;
    let spec = match kind {
        "poisson" => {
            let rate = args.required_f64("rate")?;
            let duration = args.f64_or("duration", 300.0)?;
            let seed = args.u64_or("seed", 0)?;
            let tenant = single_tenant(&mut args)?;
            generator::poisson(rate, duration, tenant, seed)
        }
        "bursty" => {
            let arrivals = Arrivals::OnOff {
                rate_on: args.required_f64("rate_on")?,
                rate_off: args.f64_or("rate_off", 0.0)?,
                mean_on_s: args.f64_or("on", 10.0)?,
                mean_off_s: args.f64_or("off", 30.0)?,
            };
            if arrivals.mean_rate() <= 0.0 {
                return Err(WorkloadError::spec(
                    text,
                    "mean rate must be positive (on, off > 0)",
                ));
            }
            let duration = args.f64_or("duration", 300.0)?;
            let seed = args.u64_or("seed", 0)?;
            let tenant = single_tenant(&mut args)?;
            generator::bursty(arrivals, duration, tenant, seed)
        }
        "mixed" => {
            let rate = args.required_f64("rate")?;
            let duration = args.f64_or("duration", 300.0)?;
            let share = args.f64_or("chat_share", 0.7)?;
            if !(0.0..=1.0).contains(&share) {
                return Err(WorkloadError::spec(text, "chat_share must be within 0..=1"));
            }
            let seed = args.u64_or("seed", 0)?;
            let chat = tenant_overrides(&mut args, "chat", share, TenantSpec::chat())?;
            let batch = tenant_overrides(&mut args, "batch", 1.0 - share, TenantSpec::batch())?;
            generator::mixed(rate, duration, vec![chat, batch], seed)
        }
        "incident" => {
            let d = Incident::default();
            let mut chat = d.chat.clone();
            let mut batch = d.batch.clone();
            chat.input = args.dist_or("chat_input", Column::Input, chat.input)?;
            chat.output = args.dist_or("chat_output", Column::Output, chat.output)?;
            batch.input = args.dist_or("batch_input", Column::Input, batch.input)?;
            batch.output = args.dist_or("batch_output", Column::Output, batch.output)?;
            let inc = Incident {
                chat_rate: args.f64_or("chat_rate", d.chat_rate)?,
                batch_rate: args.f64_or("batch_rate", d.batch_rate)?,
                start_s: args.f64_or("start", d.start_s)?,
                length_s: args.f64_or("length", d.length_s)?,
                duration_s: args.f64_or("duration", d.duration_s)?,
                chat,
                batch,
                seed: args.u64_or("seed", 0)?,
            };
            inc.spec()
        }
        other => {
            return Err(WorkloadError::spec(
                text,
                format!("unknown generator `{other}` (known: {})", KINDS.join(", ")),
            ));
        }
    };
    let block = args.u64_or("block", 512)?;
    if !(1..=1 << 20).contains(&block) {
        return Err(WorkloadError::spec(
            text,
            "block must be within 1..=1048576",
        ));
    }
    args.finish()?;
    let mut spec = spec;
    spec.block_tokens = block as u32;
    spec.name = text.trim().to_string();
    for s in &spec.streams {
        if !(s.end_s.is_finite() && s.start_s.is_finite() && s.start_s >= 0.0) {
            return Err(WorkloadError::spec(
                text,
                "times must be finite and non-negative",
            ));
        }
        if !(s.arrivals.mean_rate().is_finite() && s.arrivals.mean_rate() >= 0.0) {
            return Err(WorkloadError::spec(
                text,
                "rates must be finite and non-negative",
            ));
        }
        let expected = s.arrivals.mean_rate() * (s.end_s - s.start_s);
        if expected > generator::MAX_REQUESTS as f64 / 2.0 {
            return Err(WorkloadError::spec(
                text,
                format!("≈{expected:.0} requests is too many"),
            ));
        }
    }
    Ok(spec)
}

/// A preset tenant with its `NAME_input`, `NAME_output`, `NAME_ttft`, `NAME_tpot`
/// (ms), `NAME_prompts` and `NAME_prompt_blocks` keys applied where given.
fn tenant_overrides(
    args: &mut Args,
    name: &str,
    share: f64,
    preset: TenantSpec,
) -> Result<TenantSpec, WorkloadError> {
    let key = |k: &str| format!("{name}_{k}");
    Ok(TenantSpec {
        share,
        input: args.dist_or(&key("input"), Column::Input, preset.input)?,
        output: args.dist_or(&key("output"), Column::Output, preset.output)?,
        slo_ttft_ms: args.positive_opt(&key("ttft"))?.or(preset.slo_ttft_ms),
        slo_tpot_ms: args.positive_opt(&key("tpot"))?.or(preset.slo_tpot_ms),
        system_prompts: args
            .u64_or(&key("prompts"), u64::from(preset.system_prompts))?
            .min(1 << 16) as u32,
        system_prompt_blocks: args
            .u64_or(
                &key("prompt_blocks"),
                u64::from(preset.system_prompt_blocks),
            )?
            .min(1 << 10) as u32,
        ..preset
    })
}

fn single_tenant(args: &mut Args) -> Result<TenantSpec, WorkloadError> {
    let default = TenantSpec::plain(
        LengthDist::lognormal(1000.0, 0.8).expect("valid constant"),
        LengthDist::lognormal(200.0, 0.7).expect("valid constant"),
    );
    Ok(TenantSpec {
        name: args.take("tenant"),
        share: 1.0,
        input: args.dist_or("input", Column::Input, default.input)?,
        output: args.dist_or("output", Column::Output, default.output)?,
        slo_ttft_ms: args.positive_opt("slo_ttft")?,
        slo_tpot_ms: args.positive_opt("slo_tpot")?,
        system_prompts: args.u64_or("prompts", 0)?.min(1 << 16) as u32,
        system_prompt_blocks: args.u64_or("prompt_blocks", 1)?.min(1 << 10) as u32,
    })
}

/// `key=value` pairs of a spec, consumed key by key.
struct Args {
    spec: String,
    map: BTreeMap<String, String>,
}

impl Args {
    fn split(spec: &str, rest: &str) -> Result<Self, WorkloadError> {
        let mut map = BTreeMap::new();
        let (mut depth, mut start) = (0i32, 0usize);
        let mut parts = Vec::new();
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&rest[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
            if depth < 0 {
                return Err(WorkloadError::spec(spec, "unbalanced parentheses"));
            }
        }
        if depth != 0 {
            return Err(WorkloadError::spec(spec, "unbalanced parentheses"));
        }
        parts.push(&rest[start..]);
        for part in parts.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| WorkloadError::spec(spec, format!("`{part}` is not key=value")))?;
            if map
                .insert(k.trim().to_string(), v.trim().to_string())
                .is_some()
            {
                return Err(WorkloadError::spec(
                    spec,
                    format!("`{}` given twice", k.trim()),
                ));
            }
        }
        Ok(Args {
            spec: spec.to_string(),
            map,
        })
    }

    fn take(&mut self, key: &str) -> Option<String> {
        self.map.remove(key)
    }

    fn err(&self, m: String) -> WorkloadError {
        WorkloadError::spec(&self.spec, m)
    }

    fn f64_opt(&mut self, key: &str) -> Result<Option<f64>, WorkloadError> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => match v.parse::<f64>() {
                Ok(x) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
                _ => Err(self.err(format!("`{key}={v}` is not a non-negative number"))),
            },
        }
    }

    fn f64_or(&mut self, key: &str, default: f64) -> Result<f64, WorkloadError> {
        Ok(self.f64_opt(key)?.unwrap_or(default))
    }

    fn required_f64(&mut self, key: &str) -> Result<f64, WorkloadError> {
        self.f64_opt(key)?
            .ok_or_else(|| self.err(format!("`{key}` is required")))
    }

    fn positive_opt(&mut self, key: &str) -> Result<Option<f64>, WorkloadError> {
        match self.f64_opt(key)? {
            Some(x) if x <= 0.0 => Err(self.err(format!("`{key}` must be positive"))),
            v => Ok(v),
        }
    }

    fn u64_or(&mut self, key: &str, default: u64) -> Result<u64, WorkloadError> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v
                .parse::<u64>()
                .map_err(|_| self.err(format!("`{key}={v}` is not a non-negative integer"))),
        }
    }

    fn dist_or(
        &mut self,
        key: &str,
        column: Column,
        default: LengthDist,
    ) -> Result<LengthDist, WorkloadError> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => LengthDist::parse(&v, column),
        }
    }

    fn finish(self) -> Result<(), WorkloadError> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(k) => Err(self.err(format!("unknown key `{k}`"))),
        }
    }
}
