//! Encode/decode cost of the wire values: binary frame (datagram path) and base64 text
//! (chitchat value path), for the sizes the router will actually send.
//!
//! `cargo bench -p headroom-gossip --bench wire`

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use headroom_gossip::wire::{self, *};
use std::hint::black_box;

fn inflight(replicas: usize) -> WireValue {
    WireValue::Inflight(InflightVector {
        seq: 1,
        at_ms: 2,
        loads: (0..replicas as u64)
            .map(|r| ReplicaLoad {
                replica: r,
                requests: 3,
                queued_prefill_tokens: 2048,
                decoding_requests: 2,
                decode_context_tokens: 9000,
                prefill_inflow_tps: 1200.0,
                queued_requests: 0,
                queued_attention_pairs: 0.0,
                decode_remaining_tokens: 0,
                min_tpot_slo_ms: 0.0,
            })
            .collect(),
    })
}

fn scrape() -> WireValue {
    WireValue::Scrape(ReplicaScrape {
        replica: replica_key("http://10.0.0.7:8000"),
        url: "http://10.0.0.7:8000".into(),
        running: 12,
        waiting: 3,
        kv_usage: 0.61,
        num_gpu_blocks: 20_000,
        block_size: 16,
        prefix_hits: 1 << 30,
        prefix_queries: 1 << 31,
        preemptions: 4,
        scraped_at_ms: 1,
        healthy: true,
    })
}

fn prefix() -> WireValue {
    WireValue::Prefix(PrefixDelta {
        replica: 9,
        hashes: (0..PREFIX_DELTA_CAP as u64)
            .map(|h| h.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect(),
    })
}

fn predictor(blocks: usize, dim: u8) -> WireValue {
    let d = dim as usize;
    WireValue::Predictor(PredictorSlot {
        blocks: (0..blocks as u64)
            .map(|g| StatBlock {
                group: g,
                target: (g % 2) as u8,
                dim,
                a_upper: vec![0.5; d * (d + 1) / 2],
                b: vec![0.25; d],
                sum_w: 100.0,
                sum_wyy: 40.0,
                n: 100,
                landmark_s: 1.0,
            })
            .collect(),
    })
}

fn bench(c: &mut Criterion) {
    let cases = [
        ("inflight16", inflight(16)),
        ("inflight128", inflight(128)),
        ("scrape", scrape()),
        ("prefix512", prefix()),
        ("predictor4x12", predictor(4, 12)),
    ];
    let cap = HARD_MAX_VALUE_BYTES;
    let mut g = c.benchmark_group("wire");
    for (name, v) in &cases {
        let bin = wire::encode(v, 1, cap).unwrap();
        let text = wire::encode_text(v, 1, cap).unwrap();
        eprintln!("{name}: {} B binary, {} B base64", bin.len(), text.len());
        g.throughput(Throughput::Bytes(bin.len() as u64));
        g.bench_with_input(BenchmarkId::new("encode", name), v, |b, v| {
            b.iter(|| wire::encode(black_box(v), 1, cap).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("decode", name), &bin, |b, bin| {
            b.iter(|| wire::decode(black_box(bin), cap).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("encode_text", name), v, |b, v| {
            b.iter(|| wire::encode_text(black_box(v), 1, cap).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("decode_text", name), &text, |b, t| {
            b.iter(|| wire::decode_text(black_box(t), cap).unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
