//! Index throughput (events/s: stored and removed blocks applied through
//! `ReplicaBlocks`, chain hashing included) and lookup cost, at 1M and 10M blocks.
//! Memory per block is printed from the index's own allocation count
//! (`heap_bytes`, entries + table, plus the per-replica engine-key maps).
//!
//! `cargo bench -p headroom-kv-events --bench index` (set `KV_BENCH_10M=0` to skip
//! the 10M case).

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use headroom_kv_events::chain::prompt_chain;
use headroom_kv_events::index::{BlockIndex, ReplicaId};
use headroom_kv_events::replica_blocks::ReplicaBlocks;
use headroom_kv_events::wire::{BlockRemoved, BlockStored, ExternalHash, KvEvent};

const BS: u32 = 16;
const REPLICAS: usize = 8;

/// Event `i`: an 8-block stored run of prompt `i` on replica `i % REPLICAS`
/// (distinct tokens per prompt), engine hashes = `i * 8 + j`.
fn stored(i: u64) -> KvEvent {
    let tokens: Vec<u32> = (0..8 * BS)
        .map(|t| (i.wrapping_mul(2_654_435_761) as u32) ^ t)
        .collect();
    KvEvent::Stored(BlockStored {
        block_hashes: (0..8).map(|j| ExternalHash::Int(i * 8 + j)).collect(),
        parent_block_hash: None,
        token_ids: tokens,
        block_size: BS,
        medium: Some("GPU".into()),
        ..Default::default()
    })
}

fn removed(i: u64) -> KvEvent {
    KvEvent::Removed(BlockRemoved {
        block_hashes: (0..8).map(|j| ExternalHash::Int(i * 8 + j)).collect(),
        medium: Some("GPU".into()),
        group_idx: None,
    })
}

struct Filled {
    index: BlockIndex,
    replicas: Vec<ReplicaBlocks>,
}

fn fill(blocks: usize) -> Filled {
    let mut index = BlockIndex::new(blocks);
    let mut replicas: Vec<ReplicaBlocks> = (0..REPLICAS)
        .map(|r| ReplicaBlocks::new(ReplicaId::new(r).expect("id"), BS, blocks))
        .collect();
    for i in 0..(blocks / 8) as u64 {
        let ev = stored(i);
        let _ = replicas[(i % REPLICAS as u64) as usize].apply(&mut index, &ev);
    }
    Filled { index, replicas }
}

fn report_memory(name: &str, f: &Filled) {
    let n = f.index.len().max(1);
    let idx = f.index.heap_bytes();
    let maps: usize = f.replicas.iter().map(|r| r.heap_bytes()).sum();
    println!(
        "{name}: {} blocks; index {:.1} B/block; + per-replica engine-key maps {:.1} B/block; total {:.1} MiB",
        f.index.len(),
        idx as f64 / n as f64,
        maps as f64 / n as f64,
        (idx + maps) as f64 / (1 << 20) as f64
    );
}

fn bench_at(c: &mut Criterion, blocks: usize, label: &str) {
    let mut f = fill(blocks);
    report_memory(label, &f);
    let mut g = c.benchmark_group(format!("index_{label}"));
    g.sample_size(10);
    // Steady state: each iteration stores 1,000 new 8-block runs and removes the
    // 1,000 oldest, on a full index (16,000 block events).
    let base = (blocks / 8) as u64;
    let mut next = base;
    g.throughput(Throughput::Elements(16_000));
    g.bench_function("store_and_remove_16k_block_events", |b| {
        b.iter(|| {
            for _ in 0..1000 {
                let r = (next % REPLICAS as u64) as usize;
                let _ = f.replicas[r].apply(&mut f.index, &stored(next));
                let old = next - base;
                let ro = (old % REPLICAS as u64) as usize;
                let _ = f.replicas[ro].apply(&mut f.index, &removed(old));
                next += 1;
            }
        })
    });
    // Lookup of a 128k-token prompt (8,192 blocks of 16) whose first 8 blocks are
    // cached on one replica, and of a fully matching 8-block chain.
    let i = next - 1;
    let KvEvent::Stored(s) = stored(i) else {
        unreachable!()
    };
    let mut long = s.token_ids.clone();
    long.extend((0..131_072 - long.len() as u32).map(|t| t ^ 0x5555_5555));
    let chain = prompt_chain(&long, BS as usize, 0);
    g.throughput(Throughput::Elements(1));
    g.bench_function("lookup_128k_token_prompt_8_blocks_cached", |b| {
        b.iter(|| f.index.longest_prefix(&chain))
    });
    // Worst case: the whole 8,192-block chain cached on replica 0 and the first
    // 8 blocks also on replica (next-1) % REPLICAS: every block is looked up.
    let all = KvEvent::Stored(BlockStored {
        block_hashes: (0..chain.len() as u64)
            .map(|j| ExternalHash::Int((1 << 60) + j))
            .collect(),
        parent_block_hash: None,
        token_ids: long[..chain.len() * BS as usize].to_vec(),
        block_size: BS,
        medium: Some("GPU".into()),
        ..Default::default()
    });
    let _ = f.replicas[0].apply(&mut f.index, &all);
    assert_eq!(
        f.index
            .longest_prefix(&chain)
            .blocks_for(ReplicaId::new(0).expect("id")),
        8192
    );
    g.bench_function("lookup_128k_token_prompt_fully_cached", |b| {
        b.iter(|| f.index.longest_prefix(&chain))
    });
    let hashing = chain.clone();
    g.bench_function("chain_hash_128k_token_prompt", |b| {
        b.iter_batched(
            || long.clone(),
            |t| {
                let c = prompt_chain(&t, BS as usize, 0);
                assert_eq!(c.len(), hashing.len());
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    bench_at(c, 1 << 20, "1M");
    if std::env::var("KV_BENCH_10M").as_deref() != Ok("0") {
        bench_at(c, 10 << 20, "10M");
    }
}

criterion_group!(index, benches);
criterion_main!(index);
