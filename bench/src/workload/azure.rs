//! The Azure LLM inference trace CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`).
//!
//! Timestamps are absolute wall-clock times such as `2023-11-16 18:17:03.9799600`; they
//! are parsed exactly into integer nanoseconds (no float rounding, no time-zone
//! guessing: all rows share one clock, and only differences matter). The trace has no
//! prefix information, so every request gets empty `hash_ids`.

use std::io::BufRead;
use std::path::Path;

use super::jsonl::DEFAULT_BLOCK_TOKENS;
use super::{Request, WorkloadError};

/// Reads every row; arrival seconds are relative to the earliest row of the file.
pub fn read(reader: impl BufRead, origin: &Path) -> Result<Vec<Request>, WorkloadError> {
    let mut rows: Vec<(i128, u32, u32)> = Vec::new();
    let mut header_seen = false;
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
        if !header_seen {
            check_header(text).map_err(fail)?;
            header_seen = true;
            continue;
        }
        rows.push(parse_row(text).map_err(fail)?);
    }
    let Some(first) = rows.iter().map(|r| r.0).min() else {
        return Ok(Vec::new());
    };
    Ok(rows
        .into_iter()
        .enumerate()
        .map(|(i, (ns, input, output))| Request {
            id: i as u64,
            arrival_s: (ns - first) as f64 / 1e9,
            input_tokens: input,
            output_tokens: output,
            hash_ids: Vec::new(),
            block_tokens: DEFAULT_BLOCK_TOKENS,
            tenant: None,
            slo_ttft_ms: None,
            slo_tpot_ms: None,
        })
        .collect())
}

fn check_header(text: &str) -> Result<(), String> {
    let cols: Vec<String> = text
        .split(',')
        .map(|c| c.trim().to_ascii_lowercase())
        .collect();
    if cols == ["timestamp", "contexttokens", "generatedtokens"] {
        Ok(())
    } else {
        Err(format!(
            "expected header `TIMESTAMP,ContextTokens,GeneratedTokens`, found `{text}`"
        ))
    }
}

fn parse_row(text: &str) -> Result<(i128, u32, u32), String> {
    let mut cols = text.split(',');
    let (Some(ts), Some(ctx), Some(generated), None) =
        (cols.next(), cols.next(), cols.next(), cols.next())
    else {
        return Err(format!("expected 3 comma-separated fields, found `{text}`"));
    };
    let ns = parse_timestamp_ns(ts.trim())?;
    let input = parse_count("ContextTokens", ctx)?;
    let output = parse_count("GeneratedTokens", generated)?;
    Ok((ns, input, output))
}

fn parse_count(name: &str, field: &str) -> Result<u32, String> {
    let v: u32 = field
        .trim()
        .parse()
        .map_err(|_| format!("{name} `{}` is not a non-negative integer", field.trim()))?;
    if v == 0 {
        return Err(format!("{name} must be at least 1"));
    }
    Ok(v)
}

/// `YYYY-MM-DD HH:MM:SS[.fffffffff]` (or with a `T`) → nanoseconds since 1970-01-01,
/// proleptic Gregorian calendar, no leap seconds.
pub fn parse_timestamp_ns(ts: &str) -> Result<i128, String> {
    let bad = || format!("timestamp `{ts}` is not `YYYY-MM-DD HH:MM:SS[.fraction]`");
    let (date, time) = ts
        .split_once(' ')
        .or_else(|| ts.split_once('T'))
        .ok_or_else(bad)?;
    let mut d = date.split('-');
    let (Some(y), Some(mo), Some(da), None) = (d.next(), d.next(), d.next(), d.next()) else {
        return Err(bad());
    };
    let (hms, frac) = match time.split_once('.') {
        Some((hms, frac)) => (hms, frac),
        None => (time, ""),
    };
    let mut t = hms.split(':');
    let (Some(h), Some(mi), Some(s), None) = (t.next(), t.next(), t.next(), t.next()) else {
        return Err(bad());
    };
    let num = |s: &str, lo: i64, hi: i64| -> Result<i64, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let v: i64 = s.parse().map_err(|_| bad())?;
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(bad())
        }
    };
    let (y, mo, da) = (num(y, 0, 9999)?, num(mo, 1, 12)?, num(da, 1, 31)?);
    let (h, mi, s) = (num(h, 0, 23)?, num(mi, 0, 59)?, num(s, 0, 60)?);
    if da > days_in_month(y, mo) {
        return Err(bad());
    }
    if frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let mut nanos: i64 = 0;
    for (i, b) in frac.bytes().enumerate() {
        nanos += i64::from(b - b'0') * 10_i64.pow(8 - i as u32);
    }
    let secs = days_from_civil(y, mo, da) * 86_400 + h * 3_600 + mi * 60 + s;
    Ok(i128::from(secs) * 1_000_000_000 + i128::from(nanos))
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a civil date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_exact_nanoseconds() {
        let a = parse_timestamp_ns("2023-11-16 18:15:46.6805900").expect("valid");
        let b = parse_timestamp_ns("2023-11-16 18:15:50.9951690").expect("valid");
        assert_eq!(b - a, 4_314_579_000);
        // 2023-11-16 is day 19,677 since the epoch.
        let midnight = parse_timestamp_ns("2023-11-16 00:00:00").expect("valid");
        assert_eq!(midnight, 19_677_i128 * 86_400 * 1_000_000_000);
        let leap = parse_timestamp_ns("2024-03-01 00:00:00").expect("valid")
            - parse_timestamp_ns("2024-02-28 00:00:00").expect("valid");
        assert_eq!(leap, 2 * 86_400 * 1_000_000_000);
    }

    #[test]
    fn malformed_timestamps_are_rejected() {
        for bad in [
            "2023-11-16",
            "2023-13-01 00:00:00",
            "2023-02-29 00:00:00",
            "2023-11-16 25:00:00",
            "2023-11-16 18:15:46.12345678901",
            "2023-11-16 18:15:4x",
            "",
        ] {
            assert!(parse_timestamp_ns(bad).is_err(), "{bad}");
        }
    }
}
