//! Prequential evaluation on the synthetic step-level engine: predict at dispatch, learn
//! only when a label would reach the router (TTFT after TTFT, TPOT at request end), on a
//! heterogeneous fleet where two replicas slow down half-way. Compares configurations.
//!
//! Run: `cargo run --release -p headroom-predictor --example eval [-- requests seed]`.

#[path = "../tests/support/synth.rs"]
mod synth;

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use headroom_predictor::{
    CorrectionMode, Learner, Prediction, PredictorConfig, ReplicaKey, Sample,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use synth::{Engine, Load};

const REPLICAS: u64 = 8;
const DRIFTED: [u64; 2] = [0, 4];
const NOISE: f64 = 0.2;

struct Req {
    key: ReplicaKey,
    dispatch_s: f64,
    sample: Sample,
    ttft: f64,
    tpot: f64,
    p: Prediction,
}

/// A label arriving at `at`; ordered so the heap pops the earliest first.
struct Arrival {
    at: f64,
    idx: usize,
    ttft: bool,
}
impl PartialEq for Arrival {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at
    }
}
impl Eq for Arrival {}
impl PartialOrd for Arrival {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Arrival {
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.total_cmp(&self.at)
    }
}

fn engine(r: u64, drifted: bool) -> Engine {
    let e = if r < 4 {
        Engine::h100()
    } else {
        Engine::a100()
    };
    if drifted && DRIFTED.contains(&r) {
        e.slowed(1.35)
    } else {
        e
    }
}

fn run(cfg: PredictorConfig, n: usize, seed: u64) -> Vec<Req> {
    let mut l = Learner::new(cfg);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut reqs: Vec<Req> = Vec::with_capacity(n);
    let mut heap = BinaryHeap::new();
    let rate = 8.0; // requests per second over the fleet
    let mut t = 0.0;
    let mut snap = l.snapshot(0.0);
    let mut last_snap = 0.0;
    for i in 0..n {
        t += -(1.0 - rng.random::<f64>()).ln() / rate;
        while heap.peek().is_some_and(|a: &Arrival| a.at <= t) {
            let Some(a) = heap.pop() else { break };
            let r: &Req = &reqs[a.idx];
            let mut s = r.sample;
            s.at_s = a.at;
            if a.ttft {
                s.tpot_ms = None;
            } else {
                s.ttft_ms = None;
            }
            l.observe(&s);
        }
        if t - last_snap >= 0.1 {
            l.tick(t);
            snap = l.snapshot(t);
            last_snap = t;
        }
        let r = rng.random_range(0..REPLICAS);
        let key = ReplicaKey::new(r, u64::from(r >= 4));
        let eng = engine(r, i >= n / 2);
        let load = Load {
            max_queue: 8,
            ..Load::moderate()
        };
        let s = synth::situation(&mut rng, &eng, &load);
        let ttft = synth::ttft(&mut rng, &eng, &s);
        let ttft = synth::noisy(&mut rng, ttft, NOISE);
        let tpot = synth::tpot(&mut rng, &eng, &s);
        let tpot = synth::noisy(&mut rng, tpot, NOISE);
        let p = snap.predict(key, &s.obs);
        let out = 200.0;
        let sample = Sample {
            key,
            obs: s.obs,
            at_s: 0.0,
            ttft_ms: Some(ttft),
            tpot_ms: Some(tpot),
            output_tokens: out as u32,
            censored: false,
            predicted: Some(p),
        };
        heap.push(Arrival {
            at: t + ttft / 1000.0,
            idx: reqs.len(),
            ttft: true,
        });
        heap.push(Arrival {
            at: t + (ttft + tpot * out) / 1000.0,
            idx: reqs.len(),
            ttft: false,
        });
        reqs.push(Req {
            key,
            dispatch_s: t,
            sample,
            ttft,
            tpot,
            p,
        });
    }
    reqs
}

fn pct(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q) as usize]
}

struct Metrics {
    ttft_mape: f64,
    ttft_mdape: f64,
    ttft_mdape_drifted: f64,
    tpot_mdape: f64,
    tpot_mdape_drifted: f64,
    tpot_mdape_healthy: f64,
    ttft_mdape_healthy: f64,
    ttft_cov: f64,
    ttft_cov_worst: f64,
    tpot_cov: f64,
    tpot_cov_worst: f64,
    ttft_width: f64,
    tpot_width: f64,
}

fn metrics(reqs: &[Req]) -> Metrics {
    let t_end = reqs.last().map_or(0.0, |r| r.dispatch_s);
    let warm: Vec<&Req> = reqs.iter().filter(|r| r.dispatch_s >= 60.0).collect();
    let half = reqs.len() / 2;
    let drifted: Vec<&Req> = reqs[half..]
        .iter()
        .filter(|r| DRIFTED.contains(&r.key.replica))
        .collect();
    let healthy: Vec<&Req> = warm
        .iter()
        .copied()
        .filter(|r| !DRIFTED.contains(&r.key.replica))
        .collect();
    let ape = |v: &[&Req], f: fn(&Req) -> (f64, f64)| -> Vec<f64> {
        v.iter()
            .map(|r| {
                let (p, y) = f(r);
                (p - y).abs() / y
            })
            .collect()
    };
    let ttft = |r: &Req| (r.p.ttft_ms, r.ttft);
    let tpot = |r: &Req| (r.p.tpot_ms, r.tpot);
    let cov = |v: &[&Req], f: fn(&Req) -> bool| {
        v.iter().filter(|r| f(r)).count() as f64 / v.len().max(1) as f64
    };
    let tcov = |r: &Req| r.ttft <= r.p.ttft_upper_ms;
    let pcov = |r: &Req| r.tpot <= r.p.tpot_upper_ms;
    let mut worst_t: f64 = 1.0;
    let mut worst_p: f64 = 1.0;
    for rep in 0..REPLICAS {
        // After the drift, skipping the first minute of adaptation for every replica alike.
        let v: Vec<&Req> = reqs[half..]
            .iter()
            .filter(|r| r.key.replica == rep && r.dispatch_s > reqs[half].dispatch_s + 60.0)
            .collect();
        worst_t = worst_t.min(cov(&v, tcov));
        worst_p = worst_p.min(cov(&v, pcov));
    }
    let _ = t_end;
    let e = ape(&warm, ttft);
    Metrics {
        ttft_mape: e.iter().sum::<f64>() / e.len() as f64,
        ttft_mdape: pct(e, 0.5),
        ttft_mdape_drifted: pct(ape(&drifted, ttft), 0.5),
        tpot_mdape: pct(ape(&warm, tpot), 0.5),
        tpot_mdape_drifted: pct(ape(&drifted, tpot), 0.5),
        tpot_mdape_healthy: pct(ape(&healthy, tpot), 0.5),
        ttft_mdape_healthy: pct(ape(&healthy, ttft), 0.5),
        ttft_cov: cov(&warm, tcov),
        ttft_cov_worst: worst_t,
        tpot_cov: cov(&warm, pcov),
        tpot_cov_worst: worst_p,
        ttft_width: pct(
            warm.iter().map(|r| r.p.ttft_upper_ms / r.ttft).collect(),
            0.5,
        ),
        tpot_width: pct(
            warm.iter().map(|r| r.p.tpot_upper_ms / r.tpot).collect(),
            0.5,
        ),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let seed: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(1);
    let base = PredictorConfig::default();
    let variants: Vec<(&str, PredictorConfig)> = vec![
        ("default (TTFT corr, TPOT corr on drift)", base.clone()),
        (
            "TPOT correction always",
            PredictorConfig {
                tpot_correction: CorrectionMode::Always,
                ..base.clone()
            },
        ),
        (
            "TPOT correction off",
            PredictorConfig {
                tpot_correction: CorrectionMode::Off,
                ..base.clone()
            },
        ),
        (
            "no per-replica correction",
            PredictorConfig {
                ttft_correction: false,
                tpot_correction: CorrectionMode::Off,
                ..base.clone()
            },
        ),
        (
            "tau 120 s",
            PredictorConfig {
                tau_s: 120.0,
                ..base.clone()
            },
        ),
    ];
    println!(
        "{n} requests at 8 req/s, 8 replicas (4 H100-like class 0, 4 A100-like class 1), replicas 0 and 4 slowed 1.35x half-way, {NOISE} log-sd request noise, labels delayed by the latency itself; seed {seed}"
    );
    println!(
        "| configuration | TTFT MAPE | TTFT MdAPE (healthy, drifted) | TPOT MdAPE (healthy, drifted) | TTFT cov (worst replica) | TPOT cov (worst replica) | median U/y TTFT, TPOT |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, cfg) in variants {
        let m = metrics(&run(cfg, n, seed));
        println!(
            "| {name} | {:.1}% | {:.1}% ({:.1}%, {:.1}%) | {:.1}% ({:.1}%, {:.1}%) | {:.3} ({:.3}) | {:.3} ({:.3}) | {:.2}, {:.2} |",
            100.0 * m.ttft_mape,
            100.0 * m.ttft_mdape,
            100.0 * m.ttft_mdape_healthy,
            100.0 * m.ttft_mdape_drifted,
            100.0 * m.tpot_mdape,
            100.0 * m.tpot_mdape_healthy,
            100.0 * m.tpot_mdape_drifted,
            m.ttft_cov,
            m.ttft_cov_worst,
            m.tpot_cov,
            m.tpot_cov_worst,
            m.ttft_width,
            m.tpot_width
        );
    }
}
