//! Prequential replay of learner journals (`predictor_journal`): every labelled TTFT
//! sample is first forecast by the snapshot the trainer last published (as the router
//! would have, minus the time between dispatch and label), then learned. Prints, per
//! class and per regime, the forecast's median |log error|, median and mean absolute
//! percentage error, p90 bound coverage, the median width of the bound (upper ÷ point)
//! and the share of forecasts from a warm model,
//! after the first `--skip` labels of each class. The features are today's code, not the
//! journal's, so a feature change can be judged on recorded real-engine traffic.
//!
//! `cargo run --release -p headroom-predictor --example replay -- [--skip N] [--trace] JOURNAL.jsonl…`
//!
//! `--trace` also prints one line per forecast (from the first label): time, class,
//! regime, the score log(y/ŷ), the bound's width U/ŷ, whether the guard widened it, and
//! the band it came from (`bound_source`, the free and queued upper log quantiles), so a
//! bound that stays wide can be traced to the labels that widened it.
//!
//! Regimes: `idle` (nothing queued ahead, room in the KV cache, the engine waits on
//! nothing: the predictor's free regime), `kv-full` (nothing queued, but the placement's
//! KV footprint reaches capacity), `queue` (the router has requests queued there),
//! `engine-wait` (the engine reports more requests waiting than the router has queued:
//! KV full, preempted, or traffic from elsewhere).

use std::{collections::BTreeMap, fs::File, io::BufReader};

use headroom_predictor::{JournalEntry, Learner, ModelState, PredictorConfig, read_journal};

#[derive(Default)]
struct Acc {
    log_err: Vec<f64>,
    ape: Vec<f64>,
    /// Issued bound over point forecast: how much room a bound leaves an objective.
    width: Vec<f64>,
    covered: usize,
    warm: usize,
}

impl Acc {
    fn push(&mut self, label: f64, point: f64, upper: f64, warm: bool) {
        self.log_err.push((label / point).ln().abs());
        self.ape.push((label - point).abs() / label);
        self.width.push(upper / point);
        self.covered += usize::from(label <= upper);
        self.warm += usize::from(warm);
    }

    fn line(&mut self) -> String {
        let n = self.ape.len();
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let mape = self.ape.iter().sum::<f64>() / n.max(1) as f64;
        format!(
            "n={n:5}  mdlog {:.3}  MdAPE {:5.1}%  MAPE {:5.1}%  cover {:.3}  U/μ p50 {:.2}  warm {:.2}",
            med(&mut self.log_err),
            100.0 * med(&mut self.ape),
            100.0 * mape,
            self.covered as f64 / n.max(1) as f64,
            med(&mut self.width),
            self.warm as f64 / n.max(1) as f64,
        )
    }
}

fn main() -> Result<(), String> {
    let mut skip = 100usize;
    let mut trace = false;
    let mut paths = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--skip" {
            skip = args
                .next()
                .and_then(|v| v.parse().ok())
                .ok_or("--skip takes a count")?;
        } else if a == "--trace" {
            trace = true;
        } else {
            paths.push(a);
        }
    }
    if paths.is_empty() {
        return Err("usage: replay [--skip N] [--trace] JOURNAL.jsonl…".into());
    }
    let mut table: BTreeMap<(String, &str), Acc> = BTreeMap::new();
    for path in &paths {
        let f = File::open(path).map_err(|e| format!("open {path}: {e}"))?;
        // Journals kept in `bench/results` are gzipped.
        let es = if path.ends_with(".gz") {
            read_journal(BufReader::new(flate2::read::GzDecoder::new(f)))?
        } else {
            read_journal(BufReader::new(f))?
        };
        let mut learner = Learner::new(PredictorConfig::default());
        let mut snap = learner.snapshot(0.0);
        let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
        for e in &es {
            match e {
                JournalEntry::Tick { at_s } => {
                    e.apply(&mut learner);
                    snap = learner.snapshot(*at_s);
                    continue;
                }
                JournalEntry::Sample {
                    key,
                    obs,
                    ttft_ms: Some(label),
                    censored: false,
                    ..
                } if *label > 0.0 => {
                    let n = seen.entry(key.class).or_default();
                    *n += 1;
                    let p = snap.predict(*key, obs);
                    let full = obs.kv_capacity_tokens > 0.0
                        && obs.kv_footprint_tokens() >= obs.kv_capacity_tokens;
                    let regime = if obs.scraped_waiting > obs.queued_requests {
                        "engine-wait"
                    } else if obs.queued_requests > 0.0 {
                        "queue"
                    } else if full {
                        "kv-full"
                    } else {
                        "idle"
                    };
                    if trace && let Some(r) = snap.replica_report(key.replica) {
                        let t = &r.ttft;
                        println!(
                            "trace {:9.2} {:016x} {regime:11} s {:+.2} U/ŷ {:6.2} guard {:5} src {:?} hi {:+.2}/{:+.2}",
                            e.at_s(),
                            key.class,
                            (label / p.ttft_ms).ln(),
                            p.ttft_upper_ms / p.ttft_ms,
                            p.ttft_guarded,
                            t.bound_source,
                            t.upper_log_quantile,
                            t.queued_upper_log_quantile,
                        );
                    }
                    if *n > skip {
                        let warm = p.ttft_state == ModelState::Warm;
                        let class = format!("{:016x}", key.class);
                        for r in ["all", regime] {
                            table.entry((class.clone(), r)).or_default().push(
                                *label,
                                p.ttft_ms,
                                p.ttft_upper_ms,
                                warm,
                            );
                        }
                    }
                }
                _ => {}
            }
            e.apply(&mut learner);
        }
    }
    for ((class, regime), acc) in &mut table {
        println!("class {class} {regime:11} {}", acc.line());
    }
    Ok(())
}
