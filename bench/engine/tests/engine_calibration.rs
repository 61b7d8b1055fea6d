//! Calibration against real vLLM 0.19 measurements (LLMServingSim, RTX 4090 and
//! RTX PRO 6000, Llama-3.1-8B, 300 ShareGPT requests at ~10 req/s): the engine
//! model replays the same arrivals and lengths in virtual time and must land near
//! the measured median TTFT and TPOT. Numbers and reasoning: `bench/CALIBRATION.md`.

use std::path::PathBuf;

use headroom_engine::{DEFAULT_STEP_NOISE, Engine, EngineRequest, Event, Frontend, Profile};

#[derive(serde::Deserialize)]
struct Measured {
    input_toks: u32,
    output_toks: u32,
    queued_ts: f64,
    first_token_ts: f64,
    last_token_ts: f64,
}

fn trace_dir(run: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../traces/llmservingsim-vllm-measured")
        .join(run)
}

fn load(run: &str) -> Vec<Measured> {
    let path = trace_dir(run).join("requests.jsonl");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("row"))
        .collect()
}

fn quantile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// (TTFT, TPOT) samples in seconds, one per request with > 1 output token, and
/// the makespan (first arrival to last token).
struct Samples {
    ttft: Vec<f64>,
    tpot: Vec<f64>,
    makespan: f64,
}

fn measured(rows: &[Measured]) -> Samples {
    Samples {
        ttft: rows
            .iter()
            .map(|r| r.first_token_ts - r.queued_ts)
            .collect(),
        tpot: rows
            .iter()
            .filter(|r| r.output_toks > 1)
            .map(|r| (r.last_token_ts - r.first_token_ts) / f64::from(r.output_toks - 1))
            .collect(),
        makespan: rows
            .iter()
            .map(|r| r.last_token_ts)
            .fold(f64::MIN, f64::max)
            - rows.iter().map(|r| r.queued_ts).fold(f64::MAX, f64::min),
    }
}

/// How a replay runs: exact (no noise, tokens seen at the step's end) or as the
/// simulator and emulator now run by default (step noise, tokens seen when the
/// profile's front end delivers them).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Exact,
    Default,
}

/// Replays the measured arrivals (queued_ts) through the engine in virtual time.
fn replay(rows: &[Measured], profile: &Profile, mode: Mode) -> (Samples, u64) {
    let mut e = Engine::new(profile, 42).expect("engine");
    let mut fe = Frontend::new(profile.stream_interval, profile.frontend).expect("front end");
    let mut due: Option<f64> = None;
    if mode == Mode::Default {
        e.set_step_noise(DEFAULT_STEP_NOISE).expect("noise");
    }
    let t0 = rows
        .iter()
        .map(|r| r.queued_ts)
        .fold(f64::INFINITY, f64::min);
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by(|&a, &b| rows[a].queued_ts.total_cmp(&rows[b].queued_ts));
    let mut first = vec![None; rows.len()];
    let mut last = vec![0.0; rows.len()];
    let mut next = 0;
    let arrival: Vec<f64> = rows.iter().map(|r| r.queued_ts - t0).collect();
    // Exact: engine-side stamps at the step's end. Default: delivery times of the
    // front end's chunks (first chunk, last chunk), as a client would see them.
    let mut record = |e: &Engine, first: &mut Vec<Option<f64>>, last: &mut Vec<f64>| {
        if mode == Mode::Exact {
            for ev in e.events() {
                match *ev {
                    Event::FirstToken { id, ttft_s } => first[id as usize] = Some(ttft_s),
                    Event::Finished { id, e2e_s, .. } => last[id as usize] = e2e_s,
                    _ => {}
                }
            }
            return;
        }
        let now = e.now_s();
        let deliver =
            |at: f64, fe: &mut Frontend, first: &mut Vec<Option<f64>>, last: &mut Vec<f64>| {
                let (chunks, next) = fe.complete();
                for c in chunks {
                    let i = c.id as usize;
                    if c.first {
                        first[i] = Some(at - arrival[i]);
                    }
                    if c.finish.is_some() {
                        last[i] = at - arrival[i];
                    }
                }
                next
            };
        while let Some(d) = due.filter(|d| *d <= now) {
            due = deliver(d, &mut fe, first, last);
        }
        if let Some(d) = fe.accept(now, e.events()) {
            due = Some(d);
        }
        if e.is_idle() {
            while let Some(d) = due {
                due = deliver(d, &mut fe, first, last);
            }
        }
    };
    while next < order.len() || !e.is_idle() {
        // Submit every arrival up to the engine clock (or jump to the next one).
        while next < order.len() {
            let i = order[next];
            let t = rows[i].queued_ts - t0;
            if t > e.now_s() && !e.is_idle() {
                break;
            }
            // ShareGPT replay runs with ignore_eos: exactly output_toks tokens.
            let req = EngineRequest::new(
                i as u64,
                rows[i].input_toks,
                vec![],
                rows[i].output_toks.max(1),
            );
            e.submit_at(req, t).expect("fits");
            next += 1;
        }
        e.step();
        record(&e, &mut first, &mut last);
    }
    let ttft: Vec<f64> = first
        .iter()
        .map(|f| f.expect("every request started"))
        .collect();
    let tpot = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.output_toks > 1)
        .map(|(i, r)| (last[i] - ttft[i]) / f64::from(r.output_toks - 1))
        .collect();
    let makespan = e.now_s();
    (
        Samples {
            ttft,
            tpot,
            makespan,
        },
        e.stats().preemptions,
    )
}

fn report(run: &str, profile: &Profile, mode: Mode) -> (Samples, Samples) {
    let rows = load(run);
    let real = measured(&rows);
    let (model, preemptions) = replay(&rows, profile, mode);
    let kind = if mode == Mode::Exact {
        "exact"
    } else {
        "noise+front end"
    };
    eprintln!(
        "{run} [{}, {kind}]: TTFT p50 {:.2}s vs {:.2}s, p90 {:.2}s vs {:.2}s; TPOT p50 {:.2}ms vs {:.2}ms, \
         p90 {:.2}ms vs {:.2}ms; makespan {:.1}s vs {:.1}s (model vs measured); \
         model preemptions {preemptions}",
        profile.name,
        quantile(&model.ttft, 0.5),
        quantile(&real.ttft, 0.5),
        quantile(&model.ttft, 0.9),
        quantile(&real.ttft, 0.9),
        quantile(&model.tpot, 0.5) * 1e3,
        quantile(&real.tpot, 0.5) * 1e3,
        quantile(&model.tpot, 0.9) * 1e3,
        quantile(&real.tpot, 0.9) * 1e3,
        model.makespan,
        real.makespan,
    );
    (model, real)
}

fn rel_err(a: f64, b: f64) -> f64 {
    (a - b).abs() / b
}

/// Relative errors of (median TTFT, median TPOT, makespan).
fn errors(run: &str, profile: &str) -> (f64, f64, f64) {
    errors_in(run, profile, Mode::Exact)
}

fn errors_in(run: &str, profile: &str, mode: Mode) -> (f64, f64, f64) {
    let p = Profile::by_name(profile).expect("profile");
    let (model, real) = report(run, &p, mode);
    (
        rel_err(quantile(&model.ttft, 0.5), quantile(&real.ttft, 0.5)),
        rel_err(quantile(&model.tpot, 0.5), quantile(&real.tpot, 0.5)),
        rel_err(model.makespan, real.makespan),
    )
}

/// The calibrated profile. TPOT within 15%; TTFT, which here is almost all queueing
/// in an overloaded run (p50 60 s) and amplifies throughput error ~1.3x, within 25%.
#[test]
fn rtx4090_replay_matches_measured_medians() {
    let (ttft, tpot, makespan) = errors("RTX4090-Llama-3.1-8B", "rtx4090-llama3-8b");
    assert!(tpot < 0.15, "median TPOT off by {:.0}%", tpot * 100.0);
    assert!(ttft < 0.25, "median TTFT off by {:.0}%", ttft * 100.0);
    assert!(makespan < 0.10, "makespan off by {:.0}%", makespan * 100.0);
}

/// Hold-out: the PRO 6000 profile comes from its datasheet alone (not tuned on this
/// run), so the bounds are wider; they still catch a broken model.
#[test]
fn rtxpro6000_datasheet_profile_is_close_to_measured() {
    let (ttft, tpot, makespan) = errors("RTXPRO6000-Llama-3.1-8B", "rtxpro6000-llama3-8b");
    assert!(tpot < 0.15, "median TPOT off by {:.0}%", tpot * 100.0);
    assert!(ttft < 0.35, "median TTFT off by {:.0}%", ttft * 100.0);
    assert!(makespan < 0.15, "makespan off by {:.0}%", makespan * 100.0);
}

/// The same replays as the simulator and the emulator now run them (step noise at its
/// default, tokens seen when the front end delivers them) stay within the same bounds:
/// noise is mean-1 and the front end adds about a millisecond at these batch sizes.
#[test]
fn replays_hold_with_default_step_noise_and_front_end() {
    let (ttft, tpot, makespan) =
        errors_in("RTX4090-Llama-3.1-8B", "rtx4090-llama3-8b", Mode::Default);
    assert!(tpot < 0.15, "median TPOT off by {:.0}%", tpot * 100.0);
    assert!(ttft < 0.25, "median TTFT off by {:.0}%", ttft * 100.0);
    assert!(makespan < 0.10, "makespan off by {:.0}%", makespan * 100.0);
    let (ttft, tpot, makespan) = errors_in(
        "RTXPRO6000-Llama-3.1-8B",
        "rtxpro6000-llama3-8b",
        Mode::Default,
    );
    assert!(tpot < 0.15, "median TPOT off by {:.0}%", tpot * 100.0);
    assert!(ttft < 0.35, "median TTFT off by {:.0}%", ttft * 100.0);
    assert!(makespan < 0.15, "makespan off by {:.0}%", makespan * 100.0);
}
