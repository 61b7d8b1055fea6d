//! Replay of a real router's learner journal (`predictor_journal`): the labels two real
//! vLLM CPU servers of different speed gave the router in the real-vLLM suite's
//! accuracy mode (`HEADROOM_ROUTER_JOURNAL_DIR=… HEADROOM_REAL_VLLM_ACCURACY=full
//! scripts/vllm/test-real.sh t4b`; the files in `tests/data/real-cpu-hetero/`).
//!
//! Each journal is fed, in the order the trainer received it, to a fresh learner. A
//! TTFT label's request was dispatched `ttft` before the label arrived; its forecast is
//! made then, from the snapshot the trainer last published (the journal's `tick`
//! entries), exactly as the live router would have, and is handed back with the label
//! as the issued prediction. The TPOT label of the same request (the same observation
//! and key, at its stream's end) is scored against that forecast. Scored: every label
//! after the first `SKIP` TTFT labels of its replica.
//!
//! This is what lets a change to the features or the learner be judged on real labels in
//! seconds. The figures are printed (`cargo test -p headroom-predictor --test
//! real_cpu_journal -- --nocapture`); the assertions are the floor the model must not
//! fall below on these labels, not the bars.

// Test code may unwrap: a panic is its failure report (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

use std::{collections::HashMap, io::BufReader, path::PathBuf};

use headroom_predictor::{
    JournalEntry, Learner, Observation, Prediction, PredictorConfig, ReplicaKey, Snapshot,
    read_journal,
};

const SKIP: usize = 100;

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/real-cpu-hetero")
}

/// The journal sets replayed: the first suite runs (servers floating over both cores),
/// the side-by-side runs with each server pinned to its own core at 2.4 and 3.2
/// req/s (`bench/results/real-vllm/2026-12-02/`), where queues build on a KV cache of
/// 8,192 tokens, and `slo`'s journals at 9 req/s, the pair's knee, where a third to a
/// half of the requests queue behind another (`bench/results/real-vllm/2026-12-06/` §9;
/// the router that wrote `seed103-slo.jsonl` ran an intermediate weighting of the
/// learner, which decided where each request went, not what the router observed).
const SETS: [&str; 3] = ["real-cpu-hetero", "real-cpu-pinned", "real-cpu-knee"];

/// `HEADROOM_REPLAY_DIRS` (directories, `:`-separated) replaces the committed sets, to
/// judge a change on journals a run just wrote (`HEADROOM_SBS_JOURNAL_DIR`).
fn journals() -> Vec<(String, Vec<JournalEntry>)> {
    let mut out = Vec::new();
    let dirs: Vec<(String, PathBuf)> = match std::env::var("HEADROOM_REPLAY_DIRS") {
        Ok(v) if !v.is_empty() => v
            .split(':')
            .map(|d| (d.to_string(), PathBuf::from(d)))
            .collect(),
        _ => SETS
            .iter()
            .map(|set| {
                let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/data")
                    .join(set);
                (set.to_string(), dir)
            })
            .collect(),
    };
    for (set, dir) in dirs {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            panic!("no journals in {dir:?}");
        };
        let mut paths: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let n = p.to_string_lossy();
                n.ends_with(".jsonl") || n.ends_with(".jsonl.gz")
            })
            .collect();
        paths.sort();
        assert!(!paths.is_empty(), "no journals in {dir:?}");
        for p in paths {
            let f = std::fs::File::open(&p).expect("open journal");
            let es = if p.extension().is_some_and(|x| x == "gz") {
                read_journal(BufReader::new(flate2::read::GzDecoder::new(f)))
            } else {
                read_journal(BufReader::new(f))
            }
            .unwrap_or_else(|e| panic!("{p:?}: {e}"));
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            out.push((format!("{set}/{name}"), es));
        }
    }
    out
}

/// One scored forecast.
#[derive(Clone, Copy, Debug)]
struct Scored {
    pred: f64,
    upper: f64,
    actual: f64,
    cold: bool,
    /// A request was queued for prefill ahead of this one.
    queued: bool,
}

#[derive(Default, Debug)]
struct Scores {
    ttft: Vec<Scored>,
    tpot: Vec<Scored>,
    /// The live router's issued TTFT forecasts for the same scored labels.
    live_ttft: Vec<Scored>,
    /// Every forecast's (TTFT warm, TPOT warm), in dispatch order.
    states: Vec<(bool, bool)>,
}

impl Scores {
    /// Forecasts before the first warm one, and warm → not-warm flips after it.
    fn warmth(&self, pick: fn(&(bool, bool)) -> bool) -> (Option<usize>, usize) {
        let first = self.states.iter().position(pick);
        let flips = first.map_or(0, |f| {
            self.states[f..]
                .windows(2)
                .filter(|w| pick(&w[0]) && !pick(&w[1]))
                .count()
        });
        (first, flips)
    }
}

fn obs_key(key: ReplicaKey, o: &Observation) -> (u64, u64, [u64; 6]) {
    (
        key.replica,
        key.class,
        [
            o.prompt_tokens.to_bits(),
            o.cached_tokens.to_bits(),
            o.queued_prefill_tokens.to_bits(),
            o.decoding_requests.to_bits(),
            o.decode_context_tokens.to_bits(),
            o.step_residual_ms.to_bits(),
        ],
    )
}

/// Replays one journal; per replica its scores.
fn replay(
    es: &[JournalEntry],
    cfg: &PredictorConfig,
    view: fn(&mut Observation),
) -> HashMap<u64, Scores> {
    // The observation as the variant under test would have seen it.
    let es: Vec<JournalEntry> = es
        .iter()
        .map(|e| {
            let mut e = *e;
            if let JournalEntry::Sample { obs, .. } = &mut e {
                view(obs);
            }
            e
        })
        .collect();
    let es = &es[..];
    // Forecast times: each TTFT label's dispatch, in time order.
    let mut forecasts: Vec<(f64, usize)> = es
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            JournalEntry::Sample {
                at_s,
                ttft_ms: Some(t),
                ..
            } => Some((at_s - t / 1e3, i)),
            _ => None,
        })
        .collect();
    forecasts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut learner = Learner::new(cfg.clone());
    let first_at = es.first().map_or(0.0, |e| e.at_s());
    let mut snap: Snapshot = learner.snapshot(first_at);
    let mut issued: HashMap<usize, Prediction> = HashMap::new();
    let mut by_obs: HashMap<(u64, u64, [u64; 6]), Prediction> = HashMap::new();
    let mut labels: HashMap<u64, usize> = HashMap::new();
    let mut out: HashMap<u64, Scores> = HashMap::new();
    let mut next = 0;
    for (i, e) in es.iter().enumerate() {
        // Forecasts due before this entry arrived, from the last published snapshot.
        while next < forecasts.len() && forecasts[next].0 <= e.at_s() {
            let j = forecasts[next].1;
            if let JournalEntry::Sample { key, obs, .. } = &es[j] {
                let p = snap.predict(*key, obs);
                use headroom_predictor::ModelState::Warm;
                out.entry(key.replica)
                    .or_default()
                    .states
                    .push((p.ttft_state == Warm, p.tpot_state == Warm));
                issued.insert(j, p);
                by_obs.insert(obs_key(*key, obs), p);
            }
            next += 1;
        }
        match e {
            JournalEntry::Tick { at_s } => {
                learner.tick(*at_s);
                snap = learner.snapshot(*at_s);
            }
            JournalEntry::Sample {
                key,
                obs,
                ttft_ms,
                tpot_ms,
                issued: live,
                ..
            } => {
                let mine = issued
                    .get(&i)
                    .copied()
                    .or_else(|| by_obs.get(&obs_key(*key, obs)).copied());
                let seen = labels.entry(key.replica).or_default();
                let scored = *seen >= SKIP;
                let sc = out.entry(key.replica).or_default();
                if let (Some(y), Some(p)) = (ttft_ms, mine) {
                    *seen += 1;
                    if scored && !e_censored(e) {
                        sc.ttft.push(Scored {
                            pred: p.ttft_ms,
                            upper: p.ttft_upper_ms,
                            actual: *y,
                            cold: p.ttft_state != headroom_predictor::ModelState::Warm,
                            queued: obs.queued_requests >= 1.0,
                        });
                        if let Some(l) = live {
                            sc.live_ttft.push(Scored {
                                pred: l.ttft_ms,
                                upper: l.ttft_upper_ms,
                                actual: *y,
                                cold: false,
                                queued: obs.queued_requests >= 1.0,
                            });
                        }
                    }
                }
                if let (Some(y), Some(p)) = (tpot_ms, mine)
                    && scored
                    && !e_censored(e)
                {
                    sc.tpot.push(Scored {
                        pred: p.tpot_ms,
                        upper: p.tpot_upper_ms,
                        actual: *y,
                        cold: p.tpot_state != headroom_predictor::ModelState::Warm,
                        queued: obs.queued_requests >= 1.0,
                    });
                }
                let mut s = e.sample().expect("a sample entry");
                s.predicted = mine;
                learner.observe(&s);
            }
            other => other.apply(&mut learner),
        }
    }
    out
}

fn e_censored(e: &JournalEntry) -> bool {
    matches!(e, JournalEntry::Sample { censored: true, .. })
}

/// (median APE, MAPE, p90 coverage, cold share).
fn figures(v: &[Scored]) -> (f64, f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN, f64::NAN);
    }
    let mut ape: Vec<f64> = v
        .iter()
        .map(|s| (s.pred - s.actual).abs() / s.actual.max(1e-9))
        .collect();
    ape.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    (
        ape[ape.len() / 2],
        ape.iter().sum::<f64>() / n,
        v.iter().filter(|s| s.actual <= s.upper).count() as f64 / n,
        v.iter().filter(|s| s.cold).count() as f64 / n,
    )
}

/// Median log(actual / forecast) of the forecasts made behind a queue and of those
/// made with none (positive: forecasts low), with their counts.
fn bias_by_queue(v: &[Scored]) -> [(f64, usize); 2] {
    [true, false].map(|q| {
        let mut l: Vec<f64> = v
            .iter()
            .filter(|s| s.queued == q)
            .map(|s| (s.actual / s.pred.max(1e-9)).ln())
            .collect();
        l.sort_by(f64::total_cmp);
        (l.get(l.len() / 2).copied().unwrap_or(f64::NAN), l.len())
    })
}

/// The variants replayed side by side on the same labels: a candidate input is judged
/// by adding a row that changes the observation as the new router would have seen it.
/// (Tried and removed this way: the replica's `/metrics` response time as a front-end
/// lag feature — median TTFT error 63.9% / 41.9% with it, 62.3% / 39.1% without, on
/// `lag-seed1.jsonl`; and the KV the admission wait reads counted by the router
/// (`kv_usage` 0) or as the larger of that and the scrape — on the 9 req/s journals of
/// `bench/results/real-vllm/2026-12-06` §9, mean over replicas 51.2% / 57.0% against
/// 47.7% as recorded (seed 89), 34.0% / 42.6% against 30.1% (seed 103).)
type View = fn(&mut Observation);
const VARIANTS: [(&str, View); 1] = [("as recorded", |_| {})];

#[test]
fn real_cpu_labels_replay_prequentially() {
    let cfg = PredictorConfig::default();
    // Per variant: the worst per-replica TTFT median error, and the mean of them.
    let mut worst = [0.0f64; VARIANTS.len()];
    let mut sum = [0.0f64; VARIANTS.len()];
    let mut n = 0usize;
    let mut worst_cover_gap: f64 = 0.0;
    // The pinned pair, where the testbed's own noise is small: worst TTFT median error,
    // and replicas whose TTFT model never warmed.
    let mut pinned_worst: f64 = 0.0;
    let mut pinned_never_warm = 0usize;
    // The knee: forecasts made behind a queue, median log(actual/forecast) per replica.
    let mut knee_queue_bias: Vec<f64> = Vec::new();
    for (name, es) in journals() {
        let runs: Vec<HashMap<u64, Scores>> = VARIANTS
            .iter()
            .map(|(_, v)| replay(&es, &cfg, *v))
            .collect();
        let mut ids: Vec<_> = runs[0].keys().copied().collect();
        ids.sort();
        for id in ids {
            for (k, (vname, _)) in VARIANTS.iter().enumerate() {
                let sc = &runs[k][&id];
                let (tm, tmape, tcov, tcold) = figures(&sc.ttft);
                let (pm, pmape, pcov, pcold) = figures(&sc.tpot);
                println!(
                    "{name} replica {id:016x} [{vname}]: TTFT n={} median err {:.1}% MAPE {:.1}% p90 cover {:.2} (not warm {:.0}%); \
                     TPOT n={} median err {:.1}% MAPE {:.1}% cover {:.2} (not warm {:.0}%)",
                    sc.ttft.len(),
                    tm * 100.0,
                    tmape * 100.0,
                    tcov,
                    tcold * 100.0,
                    sc.tpot.len(),
                    pm * 100.0,
                    pmape * 100.0,
                    pcov,
                    pcold * 100.0,
                );
                if k == 0 {
                    let (tw, tf) = sc.warmth(|s| s.0);
                    if name.starts_with("real-cpu-pinned/") && sc.ttft.len() >= 30 {
                        pinned_worst = pinned_worst.max(tm);
                        pinned_never_warm += usize::from(tw.is_none());
                    }
                    let (pw, pf) = sc.warmth(|s| s.1);
                    println!(
                        "    TTFT warm from forecast {tw:?}, {tf} flips back; TPOT warm from {pw:?}, {pf} flips back"
                    );
                    let [(bq, nq), (bn, nn)] = bias_by_queue(&sc.ttft);
                    if name.starts_with("real-cpu-knee/") && nq >= 30 {
                        knee_queue_bias.push(bq);
                    }
                    println!(
                        "    TTFT median log(actual/forecast): {bq:+.2} behind a queue (n={nq}), {bn:+.2} with none (n={nn})"
                    );
                    let (lm, lmape, lcov, _) = figures(&sc.live_ttft);
                    println!(
                        "    live router's issued TTFT forecasts: median err {:.1}% MAPE {:.1}% p90 cover {:.2}",
                        lm * 100.0,
                        lmape * 100.0,
                        lcov
                    );
                    if sc.ttft.len() >= 30 {
                        worst_cover_gap = worst_cover_gap.max((tcov - 0.9).abs());
                    }
                }
                if sc.ttft.len() >= 30 {
                    worst[k] = worst[k].max(tm);
                    sum[k] += tm;
                    if k == 0 {
                        n += 1;
                    }
                }
            }
        }
    }
    for (k, (vname, _)) in VARIANTS.iter().enumerate() {
        println!(
            "[{vname}] TTFT median error: mean over replicas {:.1}%, worst {:.1}%",
            sum[k] / n.max(1) as f64 * 100.0,
            worst[k] * 100.0
        );
    }
    if std::env::var("HEADROOM_REPLAY_DIRS").is_ok_and(|v| !v.is_empty()) {
        return; // other journals: the figures are the result; the floors are these sets'
    }
    // Floors on these labels (the figures above are the measurement).
    assert!(n >= 2, "too few replicas scored");
    assert!(
        worst[0] <= 0.70,
        "TTFT median error {:.3} on real labels",
        worst[0]
    );
    // Before the engine's own KV usage replaced the router's running context in the
    // admission wait, the slow class at 3.2 req/s never warmed (39.9% median error).
    assert_eq!(
        pinned_never_warm, 0,
        "a pinned replica's TTFT model never warmed"
    );
    assert!(
        pinned_worst <= 0.35,
        "TTFT median error {pinned_worst:.3} on the pinned pair's labels"
    );
    // Behind a queue at the knee the forecasts ran e^0.81 ≈ 2.2× low on average over the
    // four replicas (+0.59 to +1.10) while each label weighed 1/y² (`learn_target`), and
    // e^0.45 with the fit-scaled weight alone; with `kv_deficit` too, e^0.27.
    assert_eq!(knee_queue_bias.len(), 4, "{knee_queue_bias:?}");
    let mean_bias = knee_queue_bias.iter().sum::<f64>() / knee_queue_bias.len() as f64;
    assert!(
        mean_bias <= 0.4,
        "forecasts behind a queue at the knee low by e^{mean_bias:.2}: {knee_queue_bias:?}"
    );
    assert!(
        worst_cover_gap <= 0.25,
        "TTFT p90 coverage off 0.9 by {worst_cover_gap:.2} on real labels"
    );
}

/// One request as the accuracy test's client saw it (`clients/*.jsonl`).
#[derive(serde::Deserialize)]
struct ClientRec {
    server: usize,
    ttft_ms: f64,
    engine_ttft_ms: Option<f64>,
    pred_ttft_ms: f64,
}

/// The floor on these machines: a forecaster that knew each request's engine-side TTFT
/// exactly (vLLM's own `time_to_first_token_ms`) and added the median of what the rest
/// of the path took (the API server, the router, the client) still misses the client's
/// TTFT by the median error printed here, because that rest is independent from one
/// request to the next (lag-1 autocorrelation ≈ 0.05 on these runs) and as large as the
/// engine's part. No router input can predict it; the 15% bar is below this
/// floor on this 2-core machine.
#[test]
fn the_engine_side_oracle_bounds_what_any_forecast_reaches_here() {
    let dir = data_dir().join("clients");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("client records")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    paths.sort();
    assert!(!paths.is_empty());
    for p in paths {
        let text = std::fs::read_to_string(&p).expect("read");
        let recs: Vec<ClientRec> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).expect("client record"))
            .collect();
        for server in 0..2 {
            let mine: Vec<&ClientRec> = recs
                .iter()
                .filter(|r| r.server == server && r.engine_ttft_ms.is_some())
                .collect();
            let mut rest: Vec<f64> = mine
                .iter()
                .map(|r| r.ttft_ms - r.engine_ttft_ms.unwrap_or(0.0))
                .collect();
            rest.sort_by(f64::total_cmp);
            let med_rest = rest[rest.len() / 2];
            let ape = |pred: &dyn Fn(&ClientRec) -> f64| {
                let mut v: Vec<f64> = mine
                    .iter()
                    .skip(50)
                    .map(|r| (pred(r) - r.ttft_ms).abs() / r.ttft_ms)
                    .collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let oracle = ape(&|r| r.engine_ttft_ms.unwrap_or(0.0) + med_rest);
            let router = ape(&|r| r.pred_ttft_ms);
            let engine_share = mine
                .iter()
                .map(|r| r.engine_ttft_ms.unwrap_or(0.0) / r.ttft_ms)
                .sum::<f64>()
                / mine.len() as f64;
            println!(
                "{} server {server}: {} requests; engine's share of the client TTFT {:.0}%; \
                 median error of the engine-side oracle {:.1}%, of the router's forecast {:.1}%",
                p.file_name().unwrap().to_string_lossy(),
                mine.len(),
                engine_share * 100.0,
                oracle * 100.0,
                router * 100.0
            );
            // The claim above, checked on each run: the oracle is no better than 25%.
            assert!(
                oracle > 0.25,
                "the engine-side oracle reached {oracle:.3}: the floor claim no longer holds"
            );
        }
    }
}
