//! The scenario's load: an open-loop Poisson arrival schedule, fixed up front from the
//! seed (so a seed names the exact requests sent), played against the router nodes
//! with [`run_request`].
//!
//! Invariants: arrivals do not wait for answers (a stalled system gets the same
//! offered load as a healthy one); at most `max_inflight` requests are open at once
//! (bounded tasks; a full pool delays sends and the delay is reported); every
//! scheduled request yields exactly one [`Record`]; the driver returns within the
//! schedule's length plus one request deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use headroom_bench::live::client::http_client;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::{ClientSettings, Kind, Record, RequestSpec, run_request};

/// Shape of the offered load.
#[derive(Clone, Debug, Serialize)]
pub struct LoadShape {
    /// Mean arrivals per second.
    pub rate_per_s: f64,
    /// Seconds of arrivals.
    pub duration_s: f64,
    /// `max_tokens` drawn uniformly from this range (inclusive).
    pub max_tokens: (u32, u32),
    /// Prompt length in filler words, uniform (inclusive).
    pub prompt_words: (u32, u32),
    /// Share of streamed chat requests and of non-streamed completions; the rest are
    /// streamed completions.
    pub chat_share: f64,
    pub whole_share: f64,
    pub max_inflight: usize,
    /// Share of streamed requests sent in `abandon_window` (s) whose client walks away
    /// after a random number of tokens (up to half of `max_tokens`).
    pub abandon_share: f64,
    pub abandon_window: (f64, f64),
    /// Arrivals at `rate` per second instead within `[from_s, to_s)` (overload).
    pub burst: Option<Burst>,
}

/// A window of a different arrival rate.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Burst {
    pub from_s: f64,
    pub to_s: f64,
    pub rate_per_s: f64,
}

/// The schedule: every request, due time ascending.
pub fn schedule(shape: &LoadShape, nodes: usize, seed: u64) -> Vec<RequestSpec> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut t = 0.0f64;
    let base = shape.rate_per_s.max(1e-6);
    loop {
        // Exponential gaps in units of arrival intensity: −ln(U) with U in (0, 1].
        let u: f64 = 1.0 - rng.random::<f64>();
        t = advance(t, -u.ln(), base, shape.burst);
        if t >= shape.duration_s {
            return out;
        }
        let pick: f64 = rng.random();
        let kind = if pick < shape.whole_share {
            Kind::Whole
        } else if pick < shape.whole_share + shape.chat_share {
            Kind::StreamChat
        } else {
            Kind::StreamCompletion
        };
        let (lo, hi) = shape.max_tokens;
        let (plo, phi) = shape.prompt_words;
        let max_tokens = rng.random_range(lo.min(hi)..=hi.max(lo)).max(1);
        // Drawn for every request so the schedule does not depend on the abandon knobs.
        let (quit, after) = (
            rng.random::<f64>(),
            rng.random_range(1..=max_tokens.div_ceil(2)),
        );
        let (w0, w1) = shape.abandon_window;
        let abandon_after =
            (kind != Kind::Whole && t >= w0 && t < w1 && quit < shape.abandon_share)
                .then_some(after);
        out.push(RequestSpec {
            id: out.len() as u64,
            kind,
            due_s: t,
            max_tokens,
            prompt_words: rng.random_range(plo.min(phi)..=phi.max(plo)),
            primary: rng.random_range(0..nodes.max(1)),
            abandon_after,
        });
    }
}

/// The time at which `e` units of arrival intensity past `t` are used up, at `base`
/// per second outside the burst and the burst's rate inside it (a Poisson process
/// with a piecewise-constant rate: exact across the rate changes).
fn advance(mut t: f64, mut e: f64, base: f64, burst: Option<Burst>) -> f64 {
    loop {
        let (rate, until) = match burst {
            Some(b) if t < b.from_s => (base, b.from_s),
            Some(b) if t < b.to_s => (b.rate_per_s.max(1e-6), b.to_s),
            _ => (base, f64::INFINITY),
        };
        if t + e / rate < until {
            return t + e / rate;
        }
        e -= (until - t) * rate;
        t = until;
    }
}

/// What the driver produced.
#[derive(Clone, Debug, Default)]
pub struct LoadResult {
    /// One per scheduled request, in schedule order.
    pub records: Vec<Record>,
    /// Largest delay of a send behind its due time (s).
    pub max_send_lag_s: f64,
}

/// Plays `plan` against `nodes`; times relative to `t0` (the scenario start, at which
/// the schedule's time 0 is).
pub async fn drive(
    plan: Vec<RequestSpec>,
    nodes: Vec<String>,
    settings: ClientSettings,
    max_inflight: usize,
    t0: Instant,
) -> LoadResult {
    let client = http_client();
    let nodes = Arc::new(nodes);
    let settings = Arc::new(settings);
    let pool = Arc::new(Semaphore::new(max_inflight.max(1)));
    let mut tasks: JoinSet<Record> = JoinSet::new();
    let mut max_lag = 0.0f64;
    let total = plan.len();
    for spec in plan {
        let due = t0 + Duration::from_secs_f64(spec.due_s);
        tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
        let Ok(permit) = pool.clone().acquire_owned().await else {
            break;
        };
        max_lag = max_lag.max(Instant::now().saturating_duration_since(due).as_secs_f64());
        let (client, nodes, settings) = (client.clone(), nodes.clone(), settings.clone());
        tasks.spawn(async move {
            let rec = run_request(&client, &nodes, &spec, &settings, t0).await;
            drop(permit);
            rec
        });
    }
    let mut records = Vec::with_capacity(total);
    while let Some(done) = tasks.join_next().await {
        // A request task cannot panic on input; a join error would be a harness bug.
        if let Ok(r) = done {
            records.push(r);
        }
    }
    records.sort_by_key(|r| r.id);
    LoadResult {
        records,
        max_send_lag_s: max_lag,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> LoadShape {
        LoadShape {
            rate_per_s: 50.0,
            duration_s: 10.0,
            max_tokens: (8, 16),
            prompt_words: (5, 10),
            chat_share: 0.2,
            whole_share: 0.1,
            max_inflight: 8,
            abandon_share: 0.5,
            abandon_window: (2.0, 4.0),
            burst: None,
        }
    }

    #[test]
    fn a_burst_multiplies_arrivals_in_its_window_only() {
        let mut s = shape();
        s.burst = Some(Burst {
            from_s: 4.0,
            to_s: 6.0,
            rate_per_s: 250.0,
        });
        let a = schedule(&s, 3, 7);
        let count =
            |from: f64, to: f64| a.iter().filter(|r| r.due_s >= from && r.due_s < to).count();
        // Expected 500 in the burst and 200 in each 4 s outside it (±20%).
        assert!((400..600).contains(&count(4.0, 6.0)), "{}", count(4.0, 6.0));
        assert!((160..240).contains(&count(0.0, 4.0)), "{}", count(0.0, 4.0));
        assert!(
            (160..240).contains(&count(6.0, 10.0)),
            "{}",
            count(6.0, 10.0)
        );
    }

    #[test]
    fn schedule_is_seeded_and_poisson_like() {
        let a = schedule(&shape(), 3, 7);
        let b = schedule(&shape(), 3, 7);
        let c = schedule(&shape(), 3, 8);
        assert_eq!(
            a.iter().map(|r| r.due_s).collect::<Vec<_>>(),
            b.iter().map(|r| r.due_s).collect::<Vec<_>>()
        );
        assert_ne!(a.len(), 0);
        assert!(a.iter().zip(&c).any(|(x, y)| x.due_s != y.due_s));
        // 500 expected arrivals; a Poisson count is within ±20% with overwhelming odds.
        assert!((400..600).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].due_s <= w[1].due_s));
        assert!(
            a.iter()
                .all(|r| (8..=16).contains(&r.max_tokens) && r.primary < 3)
        );
        let whole = a.iter().filter(|r| r.kind == Kind::Whole).count() as f64 / a.len() as f64;
        let quits: Vec<&RequestSpec> = a.iter().filter(|r| r.abandon_after.is_some()).collect();
        assert!(
            quits
                .iter()
                .all(|r| (2.0..4.0).contains(&r.due_s) && r.kind != Kind::Whole)
        );
        assert!(quits.iter().all(|r| {
            r.abandon_after
                .is_some_and(|k| k >= 1 && k <= r.max_tokens.div_ceil(2))
        }));
        assert!(quits.len() > 20, "{}", quits.len());
        assert!((0.03..0.2).contains(&whole), "{whole}");
    }
}
