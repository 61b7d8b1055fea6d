//! Test 6: forecast accuracy on the heterogeneous real pair, scored prequentially.
//!
//! Each seed starts a fresh router (`round-robin`, so both servers get the same number
//! of labels while the predictor forecasts every request) and sends a Poisson stream
//! of streamed requests: prompts of 50-3,000 tokens with every third repeating an
//! earlier one, 16-128 output tokens, completions and chat alternating. The rate is
//! set from a short calibration so the slower server runs at about `UTILISATION` of
//! its one-at-a-time capacity. Each request's forecast (the router's headers) is
//! scored against what happened: the client's TTFT, and the engine's own mean
//! inter-token latency (vLLM `--enable-per-request-metrics`) for TPOT. Requests are
//! scored only after the first `skip` labels of their server's class.
//!
//! `HEADROOM_REAL_VLLM_ACCURACY=full`: 3 seeds × 500 requests, scored after 100 labels
//! per class (≈ 150 scored per server: a p90 coverage measured on n requests has a
//! standard error of √(0.09/n), ±0.04 at 50 and ±0.025 at 150, so the 0.85-0.95 band
//! is a test of the bound and not of the sample), asserting the bars (TTFT median error ≤ 15% and MAPE ≤ 25%, p90
//! coverage 0.85-0.95 for TTFT and TPOT, warm within 40 labels and never cold after).
//! Otherwise (CI): 1 seed × 150 requests, scored after 40 labels; it asserts that
//! every request succeeds and that the TPOT the router measures from the stream
//! agrees with the engine's (at least half within 15%, at most a quarter of them
//! below a quarter of it), and prints the forecast figures.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{
    harness::{Env, RouterProc, Streamed, get_json, index_of, metric, stream},
    prompts,
    requests::{body, path},
};

/// Target load of the slower server, as a share of its one-at-a-time capacity.
const UTILISATION: f64 = 0.55;
/// Requests in flight at most (arrivals past it wait: the test stays bounded).
const MAX_IN_FLIGHT: usize = 32;
const CALIBRATION: usize = 16;

pub struct Plan {
    pub seeds: Vec<u64>,
    pub requests: usize,
    pub skip: usize,
    pub full: bool,
}

impl Plan {
    pub fn from_env() -> Plan {
        if std::env::var("HEADROOM_REAL_VLLM_ACCURACY").ok().as_deref() == Some("full") {
            Plan {
                seeds: vec![1, 2, 3],
                requests: 500,
                skip: 100,
                full: true,
            }
        } else {
            Plan {
                seeds: vec![1],
                requests: 150,
                skip: 40,
                full: false,
            }
        }
    }
}

/// One request as scored.
#[derive(Clone, Debug)]
struct Rec {
    server: usize,
    done_at: f64,
    ttft_ms: f64,
    pred_ttft_ms: f64,
    pred_ttft_upper_ms: f64,
    itl_ms: Option<f64>,
    /// The engine's own TTFT for the request (ms), where it reports one.
    engine_ttft_ms: Option<f64>,
    /// The stream's reads (time, tokens), when the client asked for per-chunk usage.
    reads: Vec<(f64, u32)>,
    pred_tpot_ms: f64,
    pred_tpot_upper_ms: f64,
}

fn rec(s: &Streamed, done_at: f64) -> Option<Rec> {
    Some(Rec {
        server: index_of(s.replica.as_deref()?),
        done_at,
        ttft_ms: s.first_content_s? * 1e3,
        pred_ttft_ms: s.header_f64("x-headroom-predicted-ttft-ms")?,
        pred_ttft_upper_ms: s.header_f64("x-headroom-predicted-ttft-upper-ms")?,
        itl_ms: s.engine_itl_ms,
        engine_ttft_ms: s.engine_ttft_ms,
        reads: s.reads.clone(),
        pred_tpot_ms: s.header_f64("x-headroom-predicted-tpot-ms")?,
        pred_tpot_upper_ms: s.header_f64("x-headroom-predicted-tpot-upper-ms")?,
    })
}

/// Deterministic draws for a seed (xorshift64*).
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The k-th request of seed `seed`: (chat, prompt seed, prompt tokens, output tokens).
fn shape_of(d: &mut Draw, k: usize, firsts: &mut Vec<(u64, usize)>) -> (bool, u64, usize, u32) {
    let out = 16 + (d.next() * 113.0) as u32;
    let (pseed, len) = if k % 3 == 2 && !firsts.is_empty() {
        firsts[(d.next() * firsts.len() as f64) as usize % firsts.len()]
    } else {
        let p = (k as u64, 50 + (d.next() * 2950.0) as usize);
        firsts.push(p);
        p
    };
    (k % 2 == 1, pseed, len, out.min(128))
}

/// Per replica name: the label count at which its TTFT model first turned warm, and
/// whether it was seen otherwise after that. TTFT's state is what sends `slo` to its
/// cold-model fallback (`min_warm_fraction` counts TTFT states); the TPOT model's state
/// is reported beside it (its coverage collapsing makes it `stale` for a while: seen
/// on the release router, 2026-12-06), not asserted.
#[derive(Clone, Debug, Default)]
struct Warmth {
    warm_at: Option<u64>,
    cold_after: bool,
    /// The TTFT report and label count at the first poll that found it not warm after
    /// warm: the gate's inputs say why.
    left_warm: Option<(String, u64)>,
    /// The TTFT report this poll found (truncated), and the label count.
    now: (String, u64),
    /// TPOT: warm seen, and the first state other than warm seen after it.
    tpot_warm: bool,
    tpot_left: Option<String>,
    tpot_now: String,
}

/// Scores of one server's scored requests.
#[derive(Debug)]
struct Score {
    n: usize,
    ttft_median: f64,
    ttft_mape: f64,
    ttft_cover: f64,
    tpot_n: usize,
    tpot_median: f64,
    tpot_cover: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn score(xs: &[Rec]) -> Score {
    let rel: Vec<f64> = xs
        .iter()
        .map(|r| (r.pred_ttft_ms - r.ttft_ms).abs() / r.ttft_ms)
        .collect();
    let n = xs.len().max(1) as f64;
    let tp: Vec<&Rec> = xs
        .iter()
        .filter(|r| r.itl_ms.is_some_and(|v| v > 0.0))
        .collect();
    let tp_rel: Vec<f64> = tp
        .iter()
        .map(|r| {
            let y = r.itl_ms.unwrap_or(f64::NAN);
            (r.pred_tpot_ms - y).abs() / y
        })
        .collect();
    Score {
        n: xs.len(),
        ttft_median: median(rel.clone()),
        ttft_mape: rel.iter().sum::<f64>() / n,
        ttft_cover: xs
            .iter()
            .filter(|r| r.ttft_ms <= r.pred_ttft_upper_ms)
            .count() as f64
            / n,
        tpot_n: tp.len(),
        tpot_median: median(tp_rel),
        tpot_cover: tp
            .iter()
            .filter(|r| r.itl_ms.unwrap_or(f64::INFINITY) <= r.pred_tpot_upper_ms)
            .count() as f64
            / tp.len().max(1) as f64,
    }
}

/// Ways to measure TPOT from a stream's reads (time s, tokens so far), compared with
/// the engine's own figure: from the first read (what the router does when the engine
/// reports no timings of its own), from a third of the way in (tried: worse on real
/// vLLM, whose last tokens leave in a flush), and as the client saw it (first content
/// to last over all tokens).
fn estimators(reads: &[(f64, u32)]) -> [Option<f64>; 3] {
    let (Some(&(t1, n1)), Some(&(t2, n2))) = (reads.first(), reads.last()) else {
        return [None; 3];
    };
    let rate = |from: usize| -> Option<f64> {
        let (tk, nk) = reads[from];
        let later = &reads[from + 1..];
        let span = n2.checked_sub(nk)?;
        let mut prev = nk;
        let biggest = later
            .iter()
            .map(|&(_, n)| {
                let d = n.saturating_sub(prev);
                prev = n;
                d
            })
            .max()
            .unwrap_or(0);
        (span >= 2 && later.len() >= 2 && 2 * biggest <= span && t2 > tk)
            .then(|| (t2 - tk) / f64::from(span))
    };
    let third = f64::from(n1) + f64::from(n2.saturating_sub(n1)) / 3.0;
    let k = reads.iter().position(|&(_, n)| f64::from(n) >= third);
    let client = (n2 >= 2 && reads.len() >= 2).then(|| (t2 - t1) / f64::from(n2 - 1));
    [rate(0), k.and_then(rate), client]
}

/// Per estimator: (share within 15% of the engine's ITL, count below a quarter, n).
fn compare_estimators(xs: &[Rec]) -> Vec<(f64, usize, usize)> {
    (0..3)
        .map(|e| {
            let ratios: Vec<f64> = xs
                .iter()
                .filter_map(|r| {
                    let itl = r.itl_ms.filter(|v| *v > 0.0)?;
                    Some(estimators(&r.reads)[e]? * 1e3 / itl)
                })
                .collect();
            let within = ratios.iter().filter(|q| (0.85..=1.15).contains(*q)).count();
            let below = ratios.iter().filter(|q| **q < 0.25).count();
            (
                within as f64 / ratios.len().max(1) as f64,
                below,
                ratios.len(),
            )
        })
        .collect()
}

/// The share of the router's stream-measured TPOT within ±15% of the engine's, and
/// the count below a quarter of it, for replica `name` (from its ratio histogram).
fn label_honesty(m: &str, name: &str) -> (f64, f64, f64) {
    let b = |le: &str| {
        metric(
            m,
            "headroom_tpot_label_ratio_bucket",
            &[("replica", name), ("le", le)],
        )
        .unwrap_or(0.0)
    };
    let total = b("+Inf");
    let within = b("1.15") - b("0.85");
    (within / total.max(1.0), b("0.25"), total)
}

/// One seed's run: per server its scores and stream-TPOT honesty; the full mode's
/// missed bars are appended to `misses`.
async fn one_seed(
    env: &Env,
    plan: &Plan,
    seed: u64,
    misses: &mut Vec<String>,
) -> (Vec<Score>, Vec<(f64, f64, f64)>) {
    let r = RouterProc::start(env, "round-robin", "").await;
    let probe = RouterProbe(r.base.clone());
    let tag = format!("acc{seed}");
    let mut d = Draw(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut firsts = Vec::new();
    let t0 = Instant::now();
    let recs = Arc::new(Mutex::new(Vec::<Rec>::new()));
    // Calibration: one at a time, round-robin, for each server's service time.
    let mut e2e: HashMap<usize, Vec<f64>> = HashMap::new();
    for k in 0..CALIBRATION {
        let (chat, ps, len, out) = shape_of(&mut d, k, &mut firsts);
        let s = probe.send(&tag, chat, ps, len, out).await;
        assert!(s.ok(), "calibration request failed: {s:?}");
        if let Some(x) = rec(&s, t0.elapsed().as_secs_f64()) {
            e2e.entry(x.server)
                .or_default()
                .push(s.last_content_s.unwrap_or(0.0));
            recs.lock().expect("lock").push(x);
        }
    }
    let slowest = e2e
        .values()
        .map(|v| v.iter().sum::<f64>() / v.len().max(1) as f64)
        .fold(0.0f64, f64::max)
        .max(0.05);
    // Round-robin: each of the n servers sees rate / n.
    let rate = UTILISATION * env.urls.len() as f64 / slowest;
    println!(
        "  seed {seed}: slowest server {:.0} ms per request alone; Poisson rate {rate:.2}/s",
        slowest * 1e3
    );
    let warmth: Arc<Mutex<HashMap<String, Warmth>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (warmth, stop, probe) = (warmth.clone(), stop.clone(), probe.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let now = probe.warmth().await;
                {
                    let mut w = warmth.lock().expect("lock");
                    for (k, v) in now {
                        let e = w.entry(k).or_default();
                        if v.tpot_now == "warm" {
                            e.tpot_warm = true;
                        } else if e.tpot_warm && e.tpot_left.is_none() {
                            e.tpot_left = Some(v.tpot_now.clone());
                        }
                        match (e.warm_at, v.warm_at) {
                            (None, Some(at)) => e.warm_at = Some(at),
                            (Some(_), None) => {
                                if !e.cold_after {
                                    e.left_warm = Some(v.now.clone());
                                }
                                e.cold_after = true;
                            }
                            _ => {}
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut tasks = Vec::new();
    let mut at = 0.0;
    let start = tokio::time::Instant::now();
    for k in CALIBRATION..plan.requests {
        at += -(1.0 - d.next()).ln() / rate;
        let (chat, ps, len, out) = shape_of(&mut d, k, &mut firsts);
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        let permit = slots.clone().acquire_owned().await.expect("semaphore");
        let (recs, tag, probe) = (recs.clone(), tag.clone(), probe.clone());
        tasks.push(tokio::spawn(async move {
            let s = probe.send(&tag, chat, ps, len, out).await;
            drop(permit);
            assert!(s.ok(), "workload request failed: {s:?}");
            if let Some(x) = rec(&s, t0.elapsed().as_secs_f64()) {
                recs.lock().expect("lock").push(x);
            }
        }));
    }
    for t in tasks {
        t.await.expect("request task");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    watcher.await.expect("watcher");
    let m = r.metrics().await;
    // The router's own share of every TTFT (arrival → dispatch), included in the
    // forecasts the headers carry.
    let waited = |k: &str| metric(&m, &format!("headroom_router_wait_seconds_{k}"), &[]);
    if let (Some(sum), Some(n)) = (waited("sum"), waited("count")) {
        println!(
            "  seed {seed}: router wait (arrival → dispatch) mean {:.2} ms over {n} requests",
            sum / n.max(1.0) * 1e3
        );
    }
    let mut all = recs.lock().expect("lock").clone();
    all.sort_by(|a, b| a.done_at.total_cmp(&b.done_at));
    let warmth = warmth.lock().expect("lock").clone();
    if let Ok(dir) = std::env::var("HEADROOM_ROUTER_JOURNAL_DIR") {
        // What the client saw, beside the router's journal of the same run.
        let mut out = String::new();
        for x in &all {
            out.push_str(
                &serde_json::json!({
                    "server": x.server, "done_at_s": x.done_at, "ttft_ms": x.ttft_ms,
                    "engine_ttft_ms": x.engine_ttft_ms, "engine_itl_ms": x.itl_ms,
                    "pred_ttft_ms": x.pred_ttft_ms, "pred_ttft_upper_ms": x.pred_ttft_upper_ms,
                    "pred_tpot_ms": x.pred_tpot_ms,
                })
                .to_string(),
            );
            out.push('\n');
        }
        let p = std::path::Path::new(&dir).join(format!("client-seed{seed}.jsonl"));
        std::fs::write(&p, out).expect("write the client records");
    }
    let mut scores = Vec::new();
    let mut honesty = Vec::new();
    for i in 0..env.urls.len() {
        let name = format!("vllm-{i}");
        let mine: Vec<Rec> = all.iter().filter(|x| x.server == i).cloned().collect();
        let scored = &mine[plan.skip.min(mine.len())..];
        let sc = score(scored);
        let w = warmth.get(&name).cloned().unwrap_or_default();
        let h = label_honesty(&m, &name);
        println!(
            "  seed {seed} {name} ({}): {} requests, {} scored; TTFT median err {:.1}%, MAPE {:.1}%, p90 coverage {:.2}; \
             TPOT (vs engine ITL, {} requests) median err {:.1}%, p90 coverage {:.2}; TTFT warm at {:?} labels, cold again after: {} (first seen {:?}); TPOT model left warm: {:?}; \
             stream TPOT within 15% of the engine's: {:.0}% of {} (below a quarter: {})",
            env.class_of(i),
            mine.len(),
            sc.n,
            sc.ttft_median * 100.0,
            sc.ttft_mape * 100.0,
            sc.ttft_cover,
            sc.tpot_n,
            sc.tpot_median * 100.0,
            sc.tpot_cover,
            w.warm_at,
            w.cold_after,
            w.left_warm,
            w.tpot_left,
            h.0 * 100.0,
            h.2,
            h.1,
        );
        if plan.full {
            // Collected, not asserted here: every seed and server is measured and
            // printed before the test fails.
            let mut miss = |ok: bool, what: String| {
                if !ok {
                    misses.push(format!("seed {seed} {name}: {what}"));
                }
            };
            miss(sc.n >= 20, format!("too few scored requests ({})", sc.n));
            miss(
                sc.ttft_median <= 0.15,
                format!("TTFT median error {:.3}", sc.ttft_median),
            );
            miss(
                sc.ttft_mape <= 0.25,
                format!("TTFT MAPE {:.3}", sc.ttft_mape),
            );
            for (what, c) in [("TTFT", sc.ttft_cover), ("TPOT", sc.tpot_cover)] {
                miss(
                    (0.85..=0.95).contains(&c),
                    format!("{what} p90 coverage {c:.2}"),
                );
            }
            miss(
                w.warm_at.is_some_and(|n| n <= 40) && !w.cold_after,
                format!(
                    "warm at {:?}, cold after: {} (first seen {:?})",
                    w.warm_at, w.cold_after, w.left_warm
                ),
            );
        }
        // Where the TTFT goes: the engine's own share, and what the API server and the
        // network add on top (client TTFT − engine TTFT), as p10 / p50 / p90.
        let mut extra: Vec<f64> = scored
            .iter()
            .filter_map(|x| Some(x.ttft_ms - x.engine_ttft_ms?))
            .collect();
        extra.sort_by(f64::total_cmp);
        let q = |p: f64| {
            extra
                .get(((extra.len() as f64 - 1.0) * p) as usize)
                .copied()
        };
        println!(
            "    client TTFT − engine TTFT (ms) p10 / p50 / p90: {:.1?} / {:.1?} / {:.1?}; client TTFT p50 {:.1} ms",
            q(0.1),
            q(0.5),
            q(0.9),
            median(scored.iter().map(|x| x.ttft_ms).collect()),
        );
        let est = compare_estimators(&mine);
        println!(
            "    client-side stream TPOT vs the engine's (within 15% / below a quarter / n): \
             from the first read (the router's) {:.0}% / {} / {}; from a third in {:.0}% / {} / {}; as the client saw it {:.0}% / {} / {}",
            est[0].0 * 100.0,
            est[0].1,
            est[0].2,
            est[1].0 * 100.0,
            est[1].1,
            est[1].2,
            est[2].0 * 100.0,
            est[2].1,
            est[2].2
        );
        scores.push(sc);
        honesty.push(h);
    }
    (scores, honesty)
}

/// A router's base URL, for tasks that outlive a borrow of the [`RouterProc`].
#[derive(Clone)]
struct RouterProbe(String);

impl RouterProbe {
    /// Per replica: warm now (at how many TTFT labels), from `/debug/predictor`.
    async fn warmth(&self) -> HashMap<String, Warmth> {
        let v: Value = get_json(&format!("{}/debug/predictor", self.0)).await;
        let mut out = HashMap::new();
        for rep in v["replicas"].as_array().into_iter().flatten() {
            let name = rep["replica"].as_str().unwrap_or_default().to_string();
            let ttft = &rep["report"]["ttft"];
            let state = ttft["state"].as_str().unwrap_or("?");
            let labels = ttft["labels"].as_u64().unwrap_or(0);
            out.insert(
                name,
                Warmth {
                    warm_at: (state == "warm").then_some(labels),
                    now: (ttft.to_string().chars().take(700).collect(), labels),
                    tpot_now: rep["report"]["tpot"]["state"]
                        .as_str()
                        .unwrap_or("?")
                        .to_string(),
                    ..Warmth::default()
                },
            );
        }
        out
    }

    async fn send(&self, tag: &str, chat: bool, pseed: u64, len: usize, out: u32) -> Streamed {
        let mut b = body(chat, &prompts::text(tag, pseed, len), out);
        b["stream"] = Value::Bool(true);
        // Usage (and with it the engine's timings) reaches the client only if it asks;
        // every other request also asks for per-chunk counts, which the router then
        // passes through, so the client can time the tokens as the router does.
        b["stream_options"] = if len.is_multiple_of(2) {
            serde_json::json!({ "include_usage": true, "continuous_usage_stats": true })
        } else {
            serde_json::json!({ "include_usage": true })
        };
        stream(&format!("{}{}", self.0, path(chat)), &b, &[]).await
    }
}

pub async fn run(env: &Env) {
    let plan = Plan::from_env();
    println!(
        "  accuracy mode: {} ({} seeds × {} requests, scored after {} labels per class)",
        if plan.full { "full" } else { "short" },
        plan.seeds.len(),
        plan.requests,
        plan.skip
    );
    let mut misses = Vec::new();
    for &seed in &plan.seeds {
        let (_, honesty) = one_seed(env, &plan, seed, &mut misses).await;
        for (i, (within, below, total)) in honesty.iter().enumerate() {
            if *total < 10.0 {
                continue;
            }
            // The router learns the engine's own ITL where vLLM reports it; the stream's
            // measurement is for engines that report none. Here each server's API
            // process shares one core with the engine's spinning OpenMP threads and
            // flushes tokens in rushes, so the stream's timing is often lost: over 4 runs
            // 59-79% came within 15% (33-46% with the machine's load average at 13) and
            // 1-17% fell below a quarter. The bar catches a broken measurement (counting
            // chunks, or labelling one-read bursts, puts most of them far off).
            assert!(
                *within >= 0.5,
                "vllm-{i}: only {:.0}% of stream TPOT within 15% of the engine's",
                within * 100.0
            );
            assert!(
                *below <= 0.25 * total,
                "vllm-{i}: {below} of {total} stream TPOT below a quarter of the engine's"
            );
        }
    }
    assert!(
        misses.is_empty(),
        "accuracy bars missed:\n  {}",
        misses.join("\n  ")
    );
}
