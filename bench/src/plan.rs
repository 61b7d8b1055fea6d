//! Capacity planning from the operator's own traffic: the smallest number of replicas
//! of each class that serves a recorded workload (the router's `request_log`, or any
//! trace `headroom-bench sim` reads) at its own objectives.
//!
//! For each class the fleet `class:n` is simulated (the binary's routing code in
//! virtual time, `crate::sim::simulate`) and `n` searched: doubling from 1 until the
//! attainment target is met, then bisecting between the last miss and the first hit.
//! That assumes attainment does not fall as replicas are added (true of the `slo`
//! policy on every trace in `bench/results`, not proven); the answer reports the
//! attainment at `n` and at `n − 1`, so a reader sees the step it rests on. Cost:
//! ≈ 2·log2(n) simulations per class, each O(requests · replicas) decisions.

use serde::Serialize;

use crate::{
    sim::{SimConfig, SimError, config::FleetGroup, result::RunResult, simulate},
    workload::Workload,
};

/// What is asked.
#[derive(Clone, Debug)]
pub struct PlanAsk {
    /// Engine profiles (fleet classes) to size, each on its own.
    pub classes: Vec<String>,
    /// Share of requests that must meet both objectives (0–1].
    pub target: f64,
    /// Largest fleet tried per class.
    pub max_replicas: u32,
    /// The simulation's settings apart from the fleet (policy, seed, clocks).
    pub base: SimConfig,
}

/// One class's answer.
#[derive(Clone, Debug, Serialize)]
pub struct ClassAnswer {
    pub class: String,
    /// Smallest count meeting the target; `None`: not within `max_replicas`.
    pub replicas: Option<u32>,
    /// Attainment at that count (at `max_replicas` when none met it).
    pub attainment: f64,
    /// Attainment with one replica fewer (`None` for 1 or when not met).
    pub attainment_one_fewer: Option<f64>,
    pub ttft_p90_ms: Option<f64>,
    pub tpot_p90_ms: Option<f64>,
    /// Every (count, attainment) simulated, in order.
    pub tried: Vec<(u32, f64)>,
}

/// Share of records meeting both objectives.
pub fn attainment(run: &RunResult) -> f64 {
    if run.records.is_empty() {
        return 0.0;
    }
    run.records.iter().filter(|r| r.met_both()).count() as f64 / run.records.len() as f64
}

fn p90_ms(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * 0.9).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i] * 1e3)
}

/// Sizes every class of `ask` for `wl`.
pub fn plan(wl: &Workload, ask: &PlanAsk) -> Result<Vec<ClassAnswer>, SimError> {
    ask.classes.iter().map(|c| plan_class(wl, ask, c)).collect()
}

fn plan_class(wl: &Workload, ask: &PlanAsk, class: &str) -> Result<ClassAnswer, SimError> {
    let mut tried: Vec<(u32, f64, RunResult)> = Vec::new();
    let run = |n: u32, tried: &mut Vec<(u32, f64, RunResult)>| -> Result<f64, SimError> {
        if let Some(t) = tried.iter().find(|t| t.0 == n) {
            return Ok(t.1);
        }
        let cfg = SimConfig {
            fleet: vec![FleetGroup {
                profile: class.to_string(),
                count: n,
                region: None,
                role: headroom_core::view::Role::Both,
            }],
            ..ask.base.clone()
        };
        let r = simulate(wl, cfg)?;
        let a = attainment(&r);
        tried.push((n, a, r));
        Ok(a)
    };
    let max = ask.max_replicas.max(1);
    // Doubling, then bisection in (lo, hi]: lo misses (or is 0), hi meets.
    let (mut lo, mut hi) = (0u32, None);
    let mut n = 1;
    loop {
        if run(n, &mut tried)? >= ask.target {
            hi = Some(n);
            break;
        }
        lo = n;
        if n >= max {
            break;
        }
        n = (n * 2).min(max);
    }
    if let Some(mut h) = hi {
        while h - lo > 1 {
            let mid = lo + (h - lo) / 2;
            if run(mid, &mut tried)? >= ask.target {
                h = mid;
            } else {
                lo = mid;
            }
        }
        hi = Some(h);
    }
    let at = hi.unwrap_or(max);
    let one_fewer = match hi {
        Some(h) if h > 1 => Some(run(h - 1, &mut tried)?),
        _ => None,
    };
    let chosen = tried.iter().find(|t| t.0 == at).map(|t| &t.2);
    let col = |f: fn(&crate::sim::result::RequestRecord) -> Option<f64>| {
        chosen.and_then(|r| p90_ms(r.records.iter().filter_map(f).collect()))
    };
    Ok(ClassAnswer {
        class: class.to_string(),
        replicas: hi,
        attainment: tried.iter().find(|t| t.0 == at).map_or(0.0, |t| t.1),
        attainment_one_fewer: one_fewer,
        ttft_p90_ms: col(|r| r.ttft_s),
        tpot_p90_ms: col(|r| r.tpot_s),
        tried: tried.iter().map(|t| (t.0, t.1)).collect(),
    })
}

/// The answer as a Markdown table.
pub fn markdown(answers: &[ClassAnswer], target: f64, requests: usize) -> String {
    let mut s = format!(
        "Replicas needed for {requests} requests at their own objectives, ≥ {:.0}% meeting both:\n\n\
         | class | replicas | attainment | with one fewer | TTFT p90 (ms) | TPOT p90 (ms) |\n|---|---|---|---|---|---|\n",
        target * 100.0
    );
    let f = |v: Option<f64>, d: usize| v.map_or("–".to_string(), |v| format!("{v:.d$}"));
    for a in answers {
        s += &format!(
            "| {} | {} | {:.1}% | {} | {} | {} |\n",
            a.class,
            a.replicas
                .map_or_else(|| "not within the limit".to_string(), |n| n.to_string()),
            a.attainment * 100.0,
            a.attainment_one_fewer
                .map_or("–".to_string(), |v| format!("{:.1}%", v * 100.0)),
            f(a.ttft_p90_ms, 0),
            f(a.tpot_p90_ms, 1),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ten times the traffic needs more slow replicas than fast ones, and the answer
    /// is the smallest count: one fewer misses the target.
    #[test]
    fn sizes_each_class_to_the_smallest_count_meeting_the_target() {
        let wl = Workload::from_spec(
            "poisson:rate=20,duration=20,input=lognormal(600,0.6),output=lognormal(60,0.5),seed=3,slo_ttft=600,slo_tpot=100",
        )
        .expect("generator spec");
        let ask = PlanAsk {
            classes: vec!["h100-llama3-8b".into(), "l4-llama3-8b".into()],
            target: 0.9,
            max_replicas: 16,
            base: SimConfig::default(),
        };
        let answers = plan(&wl, &ask).expect("simulates");
        let n = |i: usize| answers[i].replicas.expect("within the limit");
        assert!(n(1) > n(0), "an L4 fleet needs more replicas: {answers:?}");
        for a in &answers {
            assert!(a.attainment >= 0.9, "{a:?}");
            if let Some(fewer) = a.attainment_one_fewer {
                assert!(fewer < 0.9, "one fewer would do: {a:?}");
            }
        }
    }
}
