//! The router's request log (`request_log = "PATH"`): one JSON line per finished
//! request, in the workload form `headroom-bench sim` replays
//! (`bench/src/workload/jsonl.rs`, Mooncake-style):
//!
//! ```json
//! {"timestamp": 1764600000123, "input_length": 812, "output_length": 96,
//!  "hash_ids": [..], "block_size": 16, "tenant": "default",
//!  "slo_ttft_ms": 1000.0, "slo_tpot_ms": 50.0,
//!  "replica": "gpu-3", "status": "ok", "ttft_ms": 143.2, "tpot_ms": 21.4,
//!  "cached_tokens": 512, "output_estimated": false}
//! ```
//!
//! `timestamp` is the arrival (ms since the Unix epoch; the simulator makes it
//! relative); `input_length` the engine's prompt count where it reported one, else the
//! router's; `hash_ids` the router's chained prefix blocks of `block_size` tokens,
//! padded with hashes unique to the request so they cover the prompt (the simulator
//! requires it; a tail the router did not hash is never shared); `output_length` the
//! engine's count, or the router's estimate when the request failed before reporting
//! one (`output_estimated`). The fields after `slo_tpot_ms` are what was measured; the
//! simulator ignores them.
//!
//! Invariant: writing never blocks a request. Lines go through a bounded channel
//! (`QUEUE` lines) to one writer thread; when it is full the line is dropped and
//! counted (`headroom_request_log_dropped_total`). The thread flushes after each
//! burst and ends when the node is dropped.

use std::{
    io::Write,
    path::Path,
    sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel},
};

use anyhow::Context;
use serde::Serialize;

use crate::decisions::Record;

/// Lines queued for the writer at most.
pub const QUEUE: usize = 8192;

#[derive(Serialize)]
struct Row<'a> {
    timestamp: u64,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
    block_size: u32,
    tenant: &'a str,
    slo_ttft_ms: f64,
    slo_tpot_ms: f64,
    replica: &'a str,
    status: &'a str,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    cached_tokens: Option<u32>,
    output_estimated: bool,
}

pub struct RequestLog {
    tx: SyncSender<String>,
    block_tokens: u32,
}

impl RequestLog {
    /// Opens (appends to) `path` and starts the writer thread.
    pub fn open(path: &Path, block_tokens: u32) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open request_log {}", path.display()))?;
        let (tx, rx) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("request-log".into())
            .spawn(move || write_lines(rx, std::io::BufWriter::new(file)))
            .context("cannot start the request log writer")?;
        Ok(Self { tx, block_tokens })
    }

    /// Queues the line of a finished request; `false` when the queue was full (or
    /// the writer gone) and the line was dropped.
    pub fn log(&self, r: &Record) -> bool {
        let Some(line) = line(r, self.block_tokens) else {
            return true;
        };
        match self.tx.try_send(line) {
            Ok(()) => true,
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => false,
        }
    }
}

fn write_lines(rx: Receiver<String>, mut out: impl Write) {
    while let Ok(first) = rx.recv() {
        let mut ok = writeln!(out, "{first}").is_ok();
        while let Ok(more) = rx.try_recv() {
            ok &= writeln!(out, "{more}").is_ok();
        }
        if !(ok && out.flush().is_ok()) {
            tracing::warn!("request log: write failed; lines lost");
        }
    }
}

/// A chained hash for padding block `k` of request `id` (SplitMix64 finaliser):
/// unique per request, so a padded tail never matches another request's.
fn pad_hash(id: u64, k: u64) -> u64 {
    let mut z = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k.wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The JSON line of a finished record; `None` before it is finished.
pub fn line(r: &Record, block_tokens: u32) -> Option<String> {
    let m = r.measured.as_ref()?;
    let q = &r.request;
    let input_length = m.prompt_tokens.unwrap_or(q.prompt_tokens).max(1);
    let (output_length, output_estimated) = match m.output_tokens.filter(|n| *n > 0) {
        Some(n) => (n, false),
        None => (q.expected_output_tokens.max(1), true),
    };
    let block = block_tokens.max(1);
    let need = input_length.div_ceil(block) as usize;
    let mut hash_ids = q.blocks.clone();
    hash_ids.truncate(need);
    for k in hash_ids.len()..need {
        hash_ids.push(pad_hash(r.id ^ r.at_unix_ms.rotate_left(20), k as u64));
    }
    serde_json::to_string(&Row {
        timestamp: r.at_unix_ms,
        input_length,
        output_length,
        hash_ids,
        block_size: block,
        tenant: &q.tenant,
        slo_ttft_ms: q.slo_ttft_ms,
        slo_tpot_ms: q.slo_tpot_ms,
        replica: &m.replica,
        status: m.status,
        ttft_ms: m.ttft_ms,
        tpot_ms: m.tpot_ms,
        cached_tokens: m.cached_tokens,
        output_estimated,
    })
    .ok()
}
