//! Issue 15's fairness, in the simulator (deterministic for a seed): with the admission
//! gate on, a noisy tenant sending ten times what its fair share serves leaves the
//! quiet tenant at least 90% of the SLO attainment it gets alone, and is itself refused
//! with 429s; without the gate the same neighbour takes the quiet tenant's attainment
//! down. The same `headroom_core::admission::Gate` as `headroom serve` runs.

use headroom_bench::{
    sim::{SimConfig, parse_fleet, result::RunResult, simulate},
    workload::{Request, Workload},
};
use headroom_core::admission::GateConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SECS: f64 = 20.0;
/// Requests each replica runs before tenants are held to their shares.
const PER_REPLICA: u32 = 8;
const REPLICAS: u32 = 2;
/// Mean time a request holds its slot at low load (512-token prompt, 64 tokens out on
/// an H100-class engine: ≈ 64 × 8 ms + prefill).
const HOLD_S: f64 = 0.6;

/// Poisson arrivals of `tenant` at `rate` per second.
fn arrivals(tenant: &str, rate: f64, seed: u64) -> Vec<Request> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = 0.0;
    let mut out = Vec::new();
    loop {
        t += -(1.0 - rng.random::<f64>()).ln() / rate;
        if t >= SECS {
            return out;
        }
        out.push(Request {
            id: 0,
            arrival_s: t,
            input_tokens: 512,
            output_tokens: 64,
            hash_ids: vec![],
            block_tokens: 16,
            tenant: Some(tenant.into()),
            slo_ttft_ms: Some(500.0),
            slo_tpot_ms: Some(50.0),
        });
    }
}

fn workload(noisy: bool) -> Workload {
    let capacity = f64::from(PER_REPLICA * REPLICAS);
    // Quiet runs a quarter of the capacity; noisy's share is half: it sends ten times
    // what that half serves (Little: share / hold per second).
    let mut reqs = arrivals("quiet", capacity / 4.0 / HOLD_S, 1);
    if noisy {
        reqs.extend(arrivals("noisy", 10.0 * capacity / 2.0 / HOLD_S, 2));
    }
    Workload::from_requests(if noisy { "quiet+noisy" } else { "quiet" }, reqs)
}

fn run(noisy: bool, gate: bool) -> RunResult {
    let cfg = SimConfig {
        fleet: parse_fleet(&format!("h100-llama3-8b:{REPLICAS}")).expect("fleet"),
        policy: "least-request".into(),
        admission: GateConfig {
            per_replica: if gate { PER_REPLICA } else { 0 },
            max_queued: 256,
            max_wait_s: 1.0,
            poll_s: 0.005,
        },
        seed: 7,
        ..SimConfig::default()
    };
    simulate(&workload(noisy), cfg).expect("simulation runs")
}

fn attainment(r: &RunResult, tenant: &str) -> f64 {
    let mine: Vec<_> = r
        .records
        .iter()
        .filter(|x| x.tenant.as_deref() == Some(tenant))
        .collect();
    mine.iter().filter(|x| x.met_both()).count() as f64 / mine.len().max(1) as f64
}

fn refused(r: &RunResult, tenant: &str, label: &str) -> usize {
    r.records
        .iter()
        .filter(|x| {
            x.tenant.as_deref() == Some(tenant)
                && x.rejected
                && x.fallback.as_deref().is_some_and(|f| f.starts_with(label))
        })
        .count()
}

#[test]
fn a_noisy_tenant_cannot_take_the_quiet_tenants_attainment() {
    let alone = run(false, true);
    assert_eq!(
        run(false, true).records,
        alone.records,
        "deterministic for a seed"
    );
    let shared = run(true, true);
    let ungated = run(true, false);
    let (a, s, u) = (
        attainment(&alone, "quiet"),
        attainment(&shared, "quiet"),
        attainment(&ungated, "quiet"),
    );
    let noisy_n = shared
        .records
        .iter()
        .filter(|x| x.tenant.as_deref() == Some("noisy"))
        .count();
    let noisy_429 = refused(&shared, "noisy", "429");
    eprintln!(
        "sim fairness: quiet attainment alone {a:.3}, with noisy at 10x {s:.3} (gate), \
         {u:.3} (no gate); noisy {noisy_n} requests, {noisy_429} refused 429, attainment {:.3}",
        attainment(&shared, "noisy")
    );
    assert!(a >= 0.9, "quiet alone should meet its SLO: {a}");
    assert!(s >= 0.9 * a, "quiet fell from {a} to {s} with the gate on");
    assert!(noisy_429 > noisy_n / 2, "{noisy_429} of {noisy_n} refused");
    assert_eq!(
        refused(&shared, "quiet", "429"),
        0,
        "quiet is never over its share"
    );
    assert!(
        u < 0.9 * a,
        "without the gate the neighbour should hurt: {u} vs {a}"
    );
    assert_eq!(
        run(true, true).records,
        shared.records,
        "deterministic for a seed"
    );
}
