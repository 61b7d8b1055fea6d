//! Cost of the mesh's value frame: binary (datagram path) and base64 text (chitchat
//! value path), for payload sizes the router sends (its schema's codec is benched in
//! the router: `router/src/mesh/schema.rs` tests report its sizes).
//!
//! `cargo bench -p headroom-gossip --bench wire`

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use headroom_gossip::wire::{self, HARD_MAX_VALUE_BYTES, Value};
use std::hint::black_box;

fn payload(n: usize) -> Value {
    Value::new(
        2,
        0,
        (0..n).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>(),
    )
}

fn bench(c: &mut Criterion) {
    // ≈ an in-flight vector of 16 and 128 replicas, a scrape, a full prefix delta.
    let cases = [
        ("inflight16", payload(24 + 16 * 48)),
        ("inflight128", payload(24 + 128 * 48)),
        ("scrape", payload(128)),
        ("prefix512", payload(16 + 512 * 8)),
    ];
    let cap = HARD_MAX_VALUE_BYTES;
    let mut g = c.benchmark_group("wire");
    for (name, v) in &cases {
        let bin = Bytes::from(wire::encode(v, 1, cap).unwrap());
        let text = wire::encode_text(v, 1, cap).unwrap();
        eprintln!("{name}: {} B binary, {} B base64", bin.len(), text.len());
        g.throughput(Throughput::Bytes(bin.len() as u64));
        g.bench_with_input(BenchmarkId::new("encode", name), v, |b, v| {
            b.iter(|| wire::encode(black_box(v), 1, cap).unwrap())
        });
        g.bench_with_input(BenchmarkId::new("decode", name), &bin, |b, bin| {
            b.iter(|| wire::decode(black_box(bin.clone()), cap).unwrap())
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
