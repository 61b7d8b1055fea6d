//! Why a class is warm or cold, label by label: replays a learner journal
//! (`predictor_journal`) and prints the TTFT and TPOT gates after every labelled sample.
//!
//! `cargo run -p headroom-predictor --example gate_trace -- JOURNAL.jsonl`
//!
//! Columns: label time (s), class, label (ms), issued forecast (ms), then per target
//! `warm n model_err/load_err conc model/load cover`.

use std::{fs::File, io::BufReader};

use headroom_predictor::{
    GateView, JournalEntry, Learner, PredictorConfig, TARGET_TPOT, TARGET_TTFT,
    features::{TPOT_FEATURE_NAMES, TTFT_FEATURE_NAMES},
    read_journal,
};

fn fmt(g: Option<GateView>) -> String {
    g.map_or("-".into(), |g| {
        format!(
            "{} n={:<3} err {:.2}/{:.2} conc {:.2}/{:.2} cover {:.2}",
            if g.warm { "WARM" } else { "cold" },
            g.labels,
            g.model_log_err,
            g.load_log_err,
            g.model_concordance,
            g.load_concordance,
            g.coverage
        )
    })
}

fn main() -> Result<(), String> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: gate_trace JOURNAL.jsonl")?;
    let f = File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
    // Journals kept in `bench/results` are gzipped.
    let es = if path.ends_with(".gz") {
        read_journal(BufReader::new(flate2::read::GzDecoder::new(f)))?
    } else {
        read_journal(BufReader::new(f))?
    };
    let mut learner = Learner::new(PredictorConfig::default());
    for e in &es {
        e.apply(&mut learner);
        if let JournalEntry::Sample {
            key,
            at_s,
            ttft_ms,
            tpot_ms,
            issued,
            ..
        } = e
        {
            let (label, forecast, target) = match (ttft_ms, tpot_ms) {
                (Some(t), _) => (*t, issued.map(|i| i.ttft_ms), "ttft"),
                (None, Some(t)) => (*t, issued.map(|i| i.tpot_ms), "tpot"),
                _ => continue,
            };
            println!(
                "{at_s:9.2} class {:016x} {target} {label:8.1} ms (issued {:>8}) | TTFT {} | TPOT {}",
                key.class,
                forecast.map_or("-".into(), |f| format!("{f:.1}")),
                fmt(learner.gate(key.class, TARGET_TTFT)),
                fmt(learner.gate(key.class, TARGET_TPOT)),
            );
        }
    }
    // The fits as they ended: each class's coefficients, in the feature names' units.
    let mut classes: Vec<u64> = es
        .iter()
        .filter_map(|e| match e {
            JournalEntry::Sample { key, .. } => Some(key.class),
            _ => None,
        })
        .collect();
    classes.sort_unstable();
    classes.dedup();
    for c in classes {
        for (name, target, names) in [
            ("TTFT", TARGET_TTFT, &TTFT_FEATURE_NAMES[..]),
            ("TPOT", TARGET_TPOT, &TPOT_FEATURE_NAMES[..]),
        ] {
            if let Some(theta) = learner.coefficients(c, target) {
                println!("class {c:016x} {name} fit:");
                for (n, v) in names.iter().zip(theta) {
                    println!("    {v:10.3}  {n}");
                }
            }
        }
    }
    Ok(())
}
