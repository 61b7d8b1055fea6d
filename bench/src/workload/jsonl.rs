//! The Mooncake-style JSON-lines form of `DESIGN.md` ("Workload files"), read and written.
//!
//! One object per line: `{"timestamp": ms, "input_length": n, "output_length": n,
//! "hash_ids": [..]}` plus the optional `"tenant"`, `"slo_ttft_ms"`, `"slo_tpot_ms"` and
//! `"block_size"` (tokens per hash id, 512 when absent). Unknown fields are ignored so
//! richer traces still load. Blank lines are skipped. Invariants of what is returned:
//! input lengths are ≥ 1, objectives are positive and finite, non-empty `hash_ids`
//! cover the whole prompt (`len × block_size ≥ input_length`, as the engine requires).

use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Request, WorkloadError};

/// Tokens per hash id when a row does not say (Mooncake's block size).
pub const DEFAULT_BLOCK_TOKENS: u32 = 512;

#[derive(Deserialize)]
struct Row {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    slo_ttft_ms: Option<f64>,
    #[serde(default)]
    slo_tpot_ms: Option<f64>,
    #[serde(default)]
    block_size: Option<u32>,
}

#[derive(Serialize)]
struct OutRow<'a> {
    timestamp: serde_json::Number,
    input_length: u32,
    output_length: u32,
    hash_ids: &'a [u64],
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    slo_ttft_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    slo_tpot_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    block_size: Option<u32>,
}

/// Reads every row of a JSON-lines workload; `origin` names the source in errors.
/// Rows come back in file order with raw arrival seconds (not yet made relative).
pub fn read(reader: impl BufRead, origin: &Path) -> Result<Vec<Request>, WorkloadError> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line_no = i + 1;
        let line = line.map_err(|e| WorkloadError::Io {
            path: origin.to_path_buf(),
            source: e,
        })?;
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        let fail = |message: String| WorkloadError::Parse {
            path: origin.to_path_buf(),
            line: line_no,
            message,
        };
        let row: Row = serde_json::from_str(text).map_err(|e| fail(e.to_string()))?;
        out.push(validate(row, out.len() as u64).map_err(fail)?);
    }
    Ok(out)
}

fn validate(row: Row, id: u64) -> Result<Request, String> {
    if !row.timestamp.is_finite() {
        return Err("timestamp is not a finite number".into());
    }
    if row.input_length == 0 {
        return Err("input_length must be at least 1".into());
    }
    if row.output_length == 0 {
        return Err("output_length must be at least 1".into());
    }
    let block = row.block_size.unwrap_or(DEFAULT_BLOCK_TOKENS);
    if block == 0 {
        return Err("block_size must be at least 1".into());
    }
    let cover = row.hash_ids.len() as u64 * u64::from(block);
    if !row.hash_ids.is_empty() && cover < u64::from(row.input_length) {
        return Err(format!(
            "{} hash_ids of {block} tokens cover {cover} tokens, fewer than input_length {}",
            row.hash_ids.len(),
            row.input_length
        ));
    }
    for (name, v) in [
        ("slo_ttft_ms", row.slo_ttft_ms),
        ("slo_tpot_ms", row.slo_tpot_ms),
    ] {
        if let Some(v) = v
            && !(v.is_finite() && v > 0.0)
        {
            return Err(format!("{name} must be a positive number, got {v}"));
        }
    }
    Ok(Request {
        id,
        arrival_s: row.timestamp / 1e3,
        input_tokens: row.input_length,
        output_tokens: row.output_length,
        hash_ids: row.hash_ids,
        block_tokens: block,
        tenant: row.tenant,
        slo_ttft_ms: row.slo_ttft_ms,
        slo_tpot_ms: row.slo_tpot_ms,
    })
}

/// Writes requests in the same form [`read`] accepts. Whole milliseconds are written as
/// integers, as in the Mooncake trace; `block_size` only when it is not 512.
pub fn write(requests: &[Request], mut out: impl Write) -> std::io::Result<()> {
    for r in requests {
        let ms = r.arrival_s * 1e3;
        // Undo the float noise of the ms→s→ms trip so integer timestamps stay integers.
        let rounded = ms.round();
        let timestamp = if (ms - rounded).abs() < 1e-6 && (0.0..9.0e15).contains(&rounded) {
            serde_json::Number::from(rounded as u64)
        } else {
            serde_json::Number::from_f64(ms).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "non-finite arrival time")
            })?
        };
        let row = OutRow {
            timestamp,
            input_length: r.input_tokens,
            output_length: r.output_tokens,
            hash_ids: &r.hash_ids,
            tenant: r.tenant.as_deref(),
            slo_ttft_ms: r.slo_ttft_ms,
            slo_tpot_ms: r.slo_tpot_ms,
            block_size: (r.block_tokens != DEFAULT_BLOCK_TOKENS).then_some(r.block_tokens),
        };
        serde_json::to_writer(&mut out, &row)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}
