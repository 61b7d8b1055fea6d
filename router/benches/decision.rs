//! Decision cost: time per routing decision against candidate count.
//!
//! `route/slo/N` is the whole I/O-free decision the proxy makes per request —
//! candidate filtering, prefix matching, feature building, prediction for every
//! candidate, ranking — for N replicas; `policy/slo/N` is the policy alone, and the
//! token-load rows are the cheapest baseline for comparison.
//! Criterion reports means; after it, `tail` times 20,000 single `route/slo` decisions
//! per fleet size one by one and prints p50/p99/p99.9 (the bound is on the p99).
//! `DECISION_TAIL_SIZES` (e.g. `100,1024`) and `DECISION_TAIL_DECISIONS` narrow the
//! `tail` run, so that callgrind can count one size's instructions in reasonable time;
//! `DECISION_TAIL_DIGEST=1` prints a digest of every decision made (targets, forecasts,
//! labels), to check that a change to the decision code left its decisions as they were.
//! `DECISION_TAIL_SHORTLIST=k` sets `slo.shortlist` (0: every candidate forecast, the
//! full evaluation), so both can be timed side by side from one binary.
//! `prefix/*` times matching a 131k-token conversation turn (bisection past the exact
//! head against the block-by-block walk).
//! Run: `cargo bench -p headroom --bench decision`.

use std::sync::Arc;

/// The router binary's allocator: the decision's buffers cost what they cost there.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use headroom::{
    config::ReplicaConfig,
    decide::{RouteInputs, route},
    fleet::{EngineKind, ModelEntry, Replica, Scraped, ServedModels},
    ledger::BookingSpec,
    policy::{
        self, DecideCtx, Policy, PolicyName, RequestProfile, Slo, build_candidates,
        candidates::CandidateParams,
    },
    prefix::PrefixIndex,
    tokens,
};
use headroom_predictor::{
    Learner, Observation, PredictorConfig, ReplicaKey, Sample, SharedPredictor,
};
use rand::{SeedableRng, rngs::SmallRng};

fn fleet(n: usize) -> Vec<Arc<Replica>> {
    (0..n)
        .map(|i| {
            let class = if i % 2 == 0 { "h100" } else { "a100" };
            let r = Replica::new(
                i as u32,
                &ReplicaConfig {
                    url: format!("http://10.0.{}.{}:8000", i / 250, i % 250),
                    name: None,
                    class: Some(class.into()),
                    region: None,
                    max_batched_tokens: Some(8192),
                    ..Default::default()
                },
                "local",
                &Default::default(),
            )
            .expect("valid replica");
            r.models.store(Arc::new(ServedModels {
                models: vec![ModelEntry {
                    id: "m".into(),
                    parent: None,
                    max_model_len: Some(32768),
                }],
                known: true,
            }));
            r.health
                .on_success(headroom::fleet::Signal::Probe, 0, &Default::default());
            r.scraped.store(Some(Scraped {
                at_s: 0.0,
                engine: EngineKind::Vllm,
                running: (i % 17) as f64,
                waiting: (i % 5) as f64,
                kv_usage: Some((i % 10) as f64 / 10.0),
                num_gpu_blocks: Some(27_000),
                block_size: Some(16),
                prefix_queries: 0.0,
                prefix_hits: 0.0,
                preemptions: 0.0,
                preemption_rate: 0.0,
                rejected_values: 0,
            }));
            // Some in-flight work so features are not all zero.
            for k in 0..(i % 4) {
                std::mem::forget(r.ledger.book(
                    BookingSpec {
                        prompt_tokens: 1000 + 100 * k as u32,
                        cached_tokens: 0,
                        expected_output_tokens: 200,
                        tpot_slo_ms: Some(50.0),
                        expected_ttft_s: None,
                        stream: true,
                    },
                    0.0,
                ));
            }
            Arc::new(r)
        })
        .collect()
}

/// A predictor that has learned (warm) for every replica of the fleet.
fn warm_predictor(replicas: &[Arc<Replica>]) -> Arc<SharedPredictor> {
    let mut l = Learner::new(PredictorConfig::default());
    for round in 0..60 {
        for r in replicas.iter().take(64) {
            let q = (round % 7) as f64 * 2000.0;
            let obs = Observation {
                prompt_tokens: 1000.0,
                queued_prefill_tokens: q,
                max_batched_tokens: 8192.0,
                ..Default::default()
            };
            l.observe(&Sample {
                key: ReplicaKey::new(r.key, r.class_key),
                obs,
                at_s: round as f64,
                ttft_ms: Some(30.0 + q * 0.03),
                tpot_ms: Some(12.0),
                output_tokens: 100,
                censored: false,
                predicted: None,
            });
        }
    }
    l.tick(60.0);
    Arc::new(SharedPredictor::new(l.snapshot(60.0)))
}

fn request() -> RequestProfile {
    let prompt: Vec<u32> = (0..2048).collect();
    let shape = tokens::shape_of_ids(&prompt, 16, 8192);
    RequestProfile {
        model: "m".into(),
        prompt_tokens: shape.tokens,
        blocks: shape.blocks,
        max_tokens: Some(256),
        expected_output_tokens: 200,
        slo: Slo {
            ttft_ms: 800.0,
            tpot_ms: 50.0,
        },
        priority: 0,
        fallback: Default::default(),
        stream: true,
        exact_cached: Vec::new(),
    }
}

fn params() -> CandidateParams {
    CandidateParams {
        block_tokens: 16,
        stale_after_s: 1e9,
    }
}

/// Half the fleet holds the first 64 blocks of the request's prompt.
fn half_fleet_holds_prefix(replicas: &[Arc<Replica>], req: &RequestProfile) -> PrefixIndex {
    let prefix = PrefixIndex::new(1 << 20);
    for r in replicas.iter().step_by(2) {
        prefix.record(&r.prefix_cursor, r.id, &req.blocks[..64], 0);
    }
    prefix
}

/// A warm fleet of `n` replicas, half holding the request's prefix.
struct Setup {
    replicas: Vec<Arc<Replica>>,
    predictor: Arc<SharedPredictor>,
    prefix: PrefixIndex,
}

impl Setup {
    fn new(n: usize, req: &RequestProfile) -> Self {
        let replicas = fleet(n);
        let predictor = warm_predictor(&replicas);
        let prefix = half_fleet_holds_prefix(&replicas, req);
        Self {
            replicas,
            predictor,
            prefix,
        }
    }

    fn inputs<'a>(&'a self, pol: &'a dyn Policy) -> RouteInputs<'a, Arc<Replica>> {
        RouteInputs {
            policy: pol,
            predictor: &self.predictor,
            prefix: &self.prefix,
            replicas: &self.replicas,
            params: params(),
            max_targets: 3,
        }
    }
}

fn bench(c: &mut Criterion) {
    let (req, params) = (request(), params());
    let mut g = c.benchmark_group("decision");
    for n in [8usize, 64, 100, 256, 1024] {
        let setup = Setup::new(n, &req);
        g.throughput(Throughput::Elements(1));
        for name in [PolicyName::Slo, PolicyName::TokenLoad] {
            let pol = policy::build(name, setup.predictor.clone(), &Default::default());
            let inputs = setup.inputs(pol.as_ref());
            let mut rng = SmallRng::seed_from_u64(1);
            g.bench_with_input(BenchmarkId::new(format!("route/{name}"), n), &n, |b, _| {
                b.iter(|| route(&inputs, &req, 1.0, &mut rng).expect("routable"))
            });
            if name == PolicyName::Slo {
                g.bench_with_input(BenchmarkId::new("candidates", n), &n, |b, _| {
                    b.iter(|| {
                        build_candidates(&req, &setup.replicas, &setup.prefix, params, 1.0)
                            .expect("candidates")
                    })
                });
            }
            let cands = build_candidates(&req, &setup.replicas, &setup.prefix, params, 1.0)
                .expect("candidates");
            g.bench_with_input(BenchmarkId::new(format!("policy/{name}"), n), &n, |b, _| {
                b.iter(|| {
                    pol.decide(
                        &req,
                        &cands,
                        &mut DecideCtx {
                            now_s: 1.0,
                            rng: &mut rng,
                            top: usize::MAX,
                        },
                    )
                })
            });
        }
    }
    g.finish();
}

/// Per-decision percentiles of the whole `route` with the `slo` policy, one decision at a
/// time on this thread (criterion only reports means of batches).
fn tail(_c: &mut Criterion) {
    // Criterion's filter (the first free argument) selects this one only by name.
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if filter.is_some_and(|f| !f.contains("tail")) {
        return;
    }
    let req = request();
    let env = |k: &str| std::env::var(k).ok();
    let sizes: Vec<usize> = env("DECISION_TAIL_SIZES")
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![8, 64, 100, 256, 1024]);
    let decisions: u64 = env("DECISION_TAIL_DECISIONS")
        .and_then(|d| d.parse().ok())
        .unwrap_or(20_000);
    for n in sizes {
        let setup = Setup::new(n, &req);
        let mut settings = policy::PolicySettings::default();
        if let Some(k) = env("DECISION_TAIL_SHORTLIST").and_then(|k| k.parse().ok()) {
            settings.slo.shortlist = k;
        }
        let pol = policy::build(PolicyName::Slo, setup.predictor.clone(), &settings);
        let inputs = setup.inputs(pol.as_ref());
        let mut rng = SmallRng::seed_from_u64(2);
        let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
        let digest = env("DECISION_TAIL_DIGEST").is_some_and(|d| d == "1");
        let mut sum = std::hash::DefaultHasher::new();
        let warm_up = decisions / 10;
        let mut fallbacks = std::collections::BTreeMap::new();
        for i in 0..decisions + warm_up {
            let t = std::time::Instant::now();
            let r = route(&inputs, &req, 1.0, &mut rng).expect("routable");
            let ns = t.elapsed().as_nanos() as u64;
            if digest {
                use std::hash::Hash;
                format!("{:?} {:?} {:?}", r.verdict, r.targets, r.fallback).hash(&mut sum);
            }
            if i >= warm_up {
                *fallbacks
                    .entry(r.fallback.unwrap_or("none"))
                    .or_insert(0u64) += 1;
            }
            std::hint::black_box(r);
            // The first tenth (2,000 by default) warms caches and the allocator.
            if i >= warm_up {
                h.record(ns).expect("in range");
            }
        }
        println!(
            "decision/tail/route/slo/{n}: {}, max {:.1} µs ({} decisions)",
            spread(&h),
            h.max() as f64 / 1e3,
            h.len()
        );
        println!("decision/tail/route/slo/{n}: fallbacks {fallbacks:?}");
        let floor = machine_floor(h.value_at_quantile(0.5), decisions);
        println!(
            "decision/tail/route/slo/{n}: the machine alone: a fixed computation of that p50 timed alike: {}",
            spread(&floor)
        );
        if digest {
            use std::hash::Hasher;
            println!("decision/tail/route/slo/{n}: digest {:016x}", sum.finish());
        }
    }
}

/// p50, p90, p99 and p99.9 of a histogram of nanoseconds, in µs.
fn spread(h: &hdrhistogram::Histogram<u64>) -> String {
    let q = |p: f64| h.value_at_quantile(p) as f64 / 1e3;
    format!(
        "p50 {:.1} µs, p90 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs",
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999)
    )
}

/// A fixed computation (a dependent multiply chain, no memory traffic) sized to take
/// about `target_ns`, timed `count` times exactly as the decisions are: its spread is
/// what the machine alone adds to a percentile (preemption, interrupts, a
/// hypervisor's stalls). On the shared 2-core VM a fixed 5.6 µs took 13–14 µs at the
/// p99, so a decision's p99 there is bounded below by its p50 plus that.
fn machine_floor(target_ns: u64, count: u64) -> hdrhistogram::Histogram<u64> {
    fn work(steps: u64) -> u64 {
        let mut x = std::hint::black_box(1u64);
        for i in 0..steps {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(i ^ (x >> 7));
        }
        std::hint::black_box(x)
    }
    // Steps per ns from the median of short runs, then the steps for the target.
    let mut runs: Vec<u64> = (0..201)
        .map(|_| {
            let t = std::time::Instant::now();
            work(10_000);
            t.elapsed().as_nanos().max(1) as u64
        })
        .collect();
    runs.sort_unstable();
    let steps = (target_ns as f64 * 10_000.0 / runs[100] as f64).max(1.0) as u64;
    let mut h = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    for i in 0..count + count / 10 {
        let t = std::time::Instant::now();
        work(steps);
        let ns = t.elapsed().as_nanos() as u64;
        if i >= count / 10 {
            h.record(ns).expect("in range");
        }
    }
    h
}

/// Prefix matching of a long conversation turn (8,192 blocks = 131k tokens) on 16
/// replicas, 8 holding all of it and 8 the first half: bisection past the exact head
/// against the block-by-block walk.
fn prefix_walk(c: &mut Criterion) {
    use headroom::prefix::Cursor;
    use std::sync::atomic::AtomicU64;
    let chain: Vec<u64> = (0..8_192u64)
        .map(|j| (j + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let idx = PrefixIndex::new(1 << 20);
    let cursors: Vec<AtomicU64> = (0..16).map(|_| AtomicU64::new(0)).collect();
    for (r, cur) in cursors.iter().enumerate() {
        let n = if r % 2 == 0 {
            chain.len()
        } else {
            chain.len() / 2
        };
        idx.record(cur, r as u32, &chain[..n], 0);
    }
    let view: Vec<Cursor> = cursors
        .iter()
        .enumerate()
        .map(|(r, c)| Cursor {
            replica: r as u32,
            seq: c.load(std::sync::atomic::Ordering::Relaxed),
            capacity: u64::MAX,
        })
        .collect();
    let mut out = vec![0u32; view.len()];
    let mut g = c.benchmark_group("prefix");
    g.bench_function("bisect/8192", |b| {
        b.iter(|| idx.match_lengths(&chain, &view, &mut out))
    });
    g.bench_function("exact/8192", |b| {
        b.iter(|| idx.match_lengths_exact(&chain, &view, &mut out))
    });
    g.finish();
}

criterion_group!(benches, bench, tail, prefix_walk);
criterion_main!(benches);
