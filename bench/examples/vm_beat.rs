//! The machine's own timing beat: one fixed piece of pure arithmetic (three passes of a
//! multiply-add over a 32 KB array: no allocation, no system call) timed 20,000 times,
//! with its percentiles and which of the first 300 runs took 30% over the median. On
//! the shared 2-core VM of `bench/PROXY_OVERHEAD.md` one run in 9–10 (≈ every 50 µs) is
//! slow, which is what a decision's p90 and p99 show beside its p50 there.
//! Run: `cargo run --release -p headroom-bench --example vm_beat`.

use std::time::Instant;

fn main() {
    let mut v: Vec<u64> = (0..4096).collect();
    let mut times = Vec::with_capacity(20_000);
    let mut acc = 0u64;
    for i in 0..22_000 {
        let t = Instant::now();
        for _ in 0..3 {
            for x in v.iter_mut() {
                *x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                acc ^= *x;
            }
        }
        let ns = t.elapsed().as_nanos() as u64;
        // The first 2,000 warm the caches.
        if i >= 2_000 {
            times.push(ns);
        }
    }
    let mut sorted = times.clone();
    sorted.sort_unstable();
    let q = |p: f64| sorted[((sorted.len() - 1) as f64 * p) as usize] as f64 / 1e3;
    println!(
        "µs p50 {:.1}, p90 {:.1}, p99 {:.1}, p99.9 {:.1} (checksum {acc:x})",
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999)
    );
    let slow = sorted[sorted.len() / 2] * 13 / 10;
    let beat: String = times[..300]
        .iter()
        .map(|&n| if n > slow { '1' } else { '0' })
        .collect();
    println!("first 300 runs, 1 = over 1.3 × the median:\n{beat}");
}
