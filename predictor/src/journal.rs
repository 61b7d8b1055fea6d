//! The learner's journal: every input a [`Learner`] received, in the order it received
//! them, one JSON object per line. A router writes it (`predictor_journal` in its
//! config); a replay feeds it to a fresh learner, so a model change can be scored on
//! the labels a real engine gave without running the engine again.
//!
//! Invariants: an entry holds only what the learner was handed (router-observable
//! quantities and measured labels); applying the entries in file order to a learner
//! built with the same configuration reproduces the live learner's statistics, up to
//! the issued predictions (kept as their five numbers the learner reads).

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use crate::{Learner, Observation, Prediction, ReplicaKey, Sample};

/// The parts of an issued [`Prediction`] the learner reads back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Issued {
    pub ttft_ms: f64,
    pub ttft_upper_ms: f64,
    pub tpot_ms: f64,
    pub tpot_upper_ms: f64,
    pub ttft_wait_ms: f64,
}

impl From<&Prediction> for Issued {
    fn from(p: &Prediction) -> Self {
        Self {
            ttft_ms: p.ttft_ms,
            ttft_upper_ms: p.ttft_upper_ms,
            tpot_ms: p.tpot_ms,
            tpot_upper_ms: p.tpot_upper_ms,
            ttft_wait_ms: p.ttft_wait_ms,
        }
    }
}

impl Issued {
    /// A prediction carrying these numbers (the rest default).
    pub fn prediction(&self) -> Prediction {
        Prediction {
            ttft_ms: self.ttft_ms,
            ttft_upper_ms: self.ttft_upper_ms,
            tpot_ms: self.tpot_ms,
            tpot_upper_ms: self.tpot_upper_ms,
            ttft_wait_ms: self.ttft_wait_ms,
            ..Prediction::default()
        }
    }
}

/// One input of the learner.
// Written one at a time and read into a Vec only by offline replays: the size of the
// sample variant costs nothing that matters.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JournalEntry {
    /// A labelled sample ([`Learner::observe`]).
    Sample {
        key: ReplicaKey,
        obs: Observation,
        at_s: f64,
        ttft_ms: Option<f64>,
        tpot_ms: Option<f64>,
        output_tokens: u32,
        censored: bool,
        issued: Option<Issued>,
    },
    /// A measured decode step ([`Learner::observe_step_time`]).
    StepTime {
        key: ReplicaKey,
        at_s: f64,
        step_ms: f64,
    },
    /// Requests decoding on a replica ([`Learner::observe_running`]).
    Running {
        key: ReplicaKey,
        at_s: f64,
        decoding: f64,
    },
    /// The trainer re-solved and published a snapshot ([`Learner::tick`]).
    Tick { at_s: f64 },
}

impl JournalEntry {
    /// The entry of a sample.
    pub fn of_sample(s: &Sample) -> Self {
        JournalEntry::Sample {
            key: s.key,
            obs: s.obs,
            at_s: s.at_s,
            ttft_ms: s.ttft_ms,
            tpot_ms: s.tpot_ms,
            output_tokens: s.output_tokens,
            censored: s.censored,
            issued: s.predicted.as_ref().map(Issued::from),
        }
    }

    /// The sample of a `Sample` entry, with `predicted` as journalled.
    pub fn sample(&self) -> Option<Sample> {
        match *self {
            JournalEntry::Sample {
                key,
                obs,
                at_s,
                ttft_ms,
                tpot_ms,
                output_tokens,
                censored,
                issued,
            } => Some(Sample {
                key,
                obs,
                at_s,
                ttft_ms,
                tpot_ms,
                output_tokens,
                censored,
                predicted: issued.map(|i| i.prediction()),
            }),
            _ => None,
        }
    }

    /// When the learner received it (seconds, the learner's axis).
    pub fn at_s(&self) -> f64 {
        match *self {
            JournalEntry::Sample { at_s, .. }
            | JournalEntry::StepTime { at_s, .. }
            | JournalEntry::Running { at_s, .. }
            | JournalEntry::Tick { at_s } => at_s,
        }
    }

    /// Hands the entry to a learner, as the trainer did.
    pub fn apply(&self, learner: &mut Learner) {
        match *self {
            JournalEntry::Sample { .. } => {
                if let Some(s) = self.sample() {
                    learner.observe(&s);
                }
            }
            JournalEntry::StepTime { key, at_s, step_ms } => {
                learner.observe_step_time(key, at_s, step_ms)
            }
            JournalEntry::Running {
                key,
                at_s,
                decoding,
            } => learner.observe_running(key, at_s, decoding),
            JournalEntry::Tick { at_s } => learner.tick(at_s),
        }
    }

    /// Writes the entry as one JSON line.
    pub fn write_line(&self, w: &mut impl Write) -> std::io::Result<()> {
        serde_json::to_writer(&mut *w, self).map_err(std::io::Error::other)?;
        w.write_all(b"\n")
    }
}

/// Reads a journal; a line that does not parse is an error naming its number.
pub fn read_journal(r: impl BufRead) -> Result<Vec<JournalEntry>, String> {
    let mut out = Vec::new();
    for (i, line) in r.lines().enumerate() {
        let line = line.map_err(|e| format!("line {}: {e}", i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        out.push(serde_json::from_str(&line).map_err(|e| format!("line {}: {e}", i + 1))?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PredictorConfig;

    fn entries() -> Vec<JournalEntry> {
        let key = ReplicaKey::new(7, 3);
        let mut v = Vec::new();
        for i in 0..60 {
            let t = 100.0 + i as f64;
            let obs = Observation {
                prompt_tokens: 200.0 + 37.0 * (i % 9) as f64,
                expected_output_tokens: 32.0,
                queued_prefill_tokens: 150.0 * (i % 4) as f64,
                queued_requests: (i % 4) as f64,
                decoding_requests: (i % 5) as f64,
                ..Observation::default()
            };
            let ttft = 20.0 + 0.05 * obs.prompt_tokens + 0.04 * obs.queued_prefill_tokens;
            v.push(JournalEntry::StepTime {
                key,
                at_s: t,
                step_ms: 4.0 + (i % 3) as f64,
            });
            v.push(JournalEntry::Running {
                key,
                at_s: t,
                decoding: obs.decoding_requests,
            });
            v.push(JournalEntry::of_sample(&Sample {
                key,
                obs,
                at_s: t + 0.2,
                ttft_ms: Some(ttft),
                tpot_ms: Some(5.0 + obs.decoding_requests),
                output_tokens: 32,
                censored: false,
                predicted: Some(Prediction {
                    ttft_ms: ttft * 1.1,
                    ttft_upper_ms: ttft * 1.5,
                    tpot_ms: 6.0,
                    tpot_upper_ms: 9.0,
                    ..Prediction::default()
                }),
            }));
        }
        v
    }

    #[test]
    fn a_journal_round_trips_and_replays_to_the_same_learner() {
        let es = entries();
        let mut buf = Vec::new();
        for e in &es {
            e.write_line(&mut buf).unwrap();
        }
        let back = read_journal(std::io::Cursor::new(&buf)).unwrap();
        assert_eq!(back, es);
        let (mut live, mut replayed) = (
            Learner::new(PredictorConfig::default()),
            Learner::new(PredictorConfig::default()),
        );
        for e in &es {
            e.apply(&mut live);
        }
        for e in &back {
            e.apply(&mut replayed);
        }
        live.tick(200.0);
        replayed.tick(200.0);
        let obs = Observation {
            prompt_tokens: 900.0,
            queued_prefill_tokens: 300.0,
            ..Observation::default()
        };
        let key = ReplicaKey::new(7, 3);
        let (a, b) = (
            live.snapshot(200.0).predict(key, &obs),
            replayed.snapshot(200.0).predict(key, &obs),
        );
        assert_eq!(a.ttft_ms, b.ttft_ms);
        assert_eq!(a.tpot_upper_ms, b.tpot_upper_ms);
        assert!(a.ttft_ms > 0.0);
    }

    #[test]
    fn a_bad_line_is_named() {
        let text = "{\"kind\":\"running\",\"key\":{\"replica\":1,\"class\":2},\"at_s\":1.0,\"decoding\":3.0}\nnot json\n";
        let err = read_journal(std::io::Cursor::new(text)).unwrap_err();
        assert!(err.starts_with("line 2"), "{err}");
    }
}
