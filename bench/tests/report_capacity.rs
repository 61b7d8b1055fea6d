//! Capacity search against synthetic closures with known thresholds.

use std::cell::Cell;

use headroom_bench::report::{CapacitySearch, CapacityStatus};
use headroom_bench::sim::result::{RequestRecord, RunResult};

/// A run of 1000 requests over 100 s / scale, of which `attainment × 1000` meet both.
fn run_with(scale: f64, attainment: f64) -> RunResult {
    let n = 1000;
    let good = (attainment.clamp(0.0, 1.0) * n as f64).round() as usize;
    let records = (0..n)
        .map(|i| RequestRecord {
            id: i as u64,
            arrival_s: i as f64 * 0.1 / scale,
            replica: Some(0),
            ttft_s: Some(if i < good { 0.1 } else { 1.0 }),
            slo_ttft_ms: 500.0,
            slo_tpot_ms: 50.0,
            ..RequestRecord::default()
        })
        .collect();
    RunResult {
        rate_scale: scale,
        records,
        ..RunResult::default()
    }
}

#[test]
fn finds_a_step_threshold_within_tolerance() {
    let runs = Cell::new(0);
    let search = CapacitySearch::default();
    let c = search.search(|s| {
        runs.set(runs.get() + 1);
        run_with(s, if s <= 3.7 { 0.95 } else { 0.5 })
    });
    assert_eq!(c.status, CapacityStatus::Converged);
    assert!(c.monotone);
    assert!(
        c.capacity <= 3.7 && c.capacity >= 3.7 / 1.05,
        "{}",
        c.capacity
    );
    assert!(
        c.lowest_failing
            .is_some_and(|f| f > 3.7 && f <= c.capacity * 1.05 + 1e-12)
    );
    assert_eq!(c.probes.len(), runs.get(), "every run is kept as a probe");
    assert!(runs.get() <= search.max_runs + search.verify.len());
    // The verification probe at 0.8 × capacity was run and passed.
    assert!(
        c.probes
            .iter()
            .any(|p| (p.rate_scale - 0.8 * c.capacity).abs() < 1e-9 && p.passed)
    );
    // Offered rate at the capacity: 1000 requests over 99.9 s / scale.
    assert!((c.capacity_rps - 1000.0 / (99.9 / c.capacity)).abs() < 1e-6);
    let curve = c.curve();
    assert!(curve.windows(2).all(|w| w[0].rate_scale <= w[1].rate_scale));
}

#[test]
fn finds_a_smooth_threshold_and_brackets_downwards() {
    // Attainment 1 / (1 + (s/5)^4) crosses 0.9 at s = 5 / 9^(1/4) ≈ 2.887.
    let att = |s: f64| 1.0 / (1.0 + (s / 5.0).powi(4));
    let truth = 5.0 / 9f64.powf(0.25);
    let search = CapacitySearch {
        start: 20.0,
        rel_tol: 0.01,
        max_runs: 20,
        ..CapacitySearch::default()
    };
    let c = search.search(|s| run_with(s, att(s)));
    assert_eq!(c.status, CapacityStatus::Converged);
    assert!(
        (c.capacity / truth - 1.0).abs() < 0.015,
        "{} vs {truth}",
        c.capacity
    );
    assert!(c.probes[0].rate_scale == 20.0 && !c.probes[0].passed);
}

#[test]
fn a_dip_below_the_answer_is_reported_not_hidden() {
    // Passes up to 4 except in a dip at [3.0, 3.4]; the 0.8× verification probe lands in it.
    let att = |s: f64| {
        if (3.0..=3.4).contains(&s) || s > 4.0 {
            0.5
        } else {
            0.95
        }
    };
    let c = CapacitySearch::default().search(|s| run_with(s, att(s)));
    assert_eq!(c.status, CapacityStatus::NonMonotone);
    assert!(!c.monotone);
    // Conservative answer: the highest pass below the lowest failure (the 2× probe).
    assert_eq!(c.capacity, 2.0);
    assert!(c.probes.iter().any(|p| p.passed && p.rate_scale > 3.8));
}

#[test]
fn all_failing_and_never_failing_are_flagged() {
    let search = CapacitySearch {
        max_runs: 8,
        ..CapacitySearch::default()
    };
    let c = search.search(|s| run_with(s, 0.1));
    assert_eq!(
        (c.status, c.capacity, c.capacity_rps),
        (CapacityStatus::AllFailed, 0.0, 0.0)
    );
    assert!(c.probes.len() <= 8);
    assert!(c.probes.iter().all(|p| p.rate_scale >= search.min_scale));

    let search = CapacitySearch {
        max_scale: 16.0,
        ..CapacitySearch::default()
    };
    let c = search.search(|s| run_with(s, 1.0));
    assert_eq!(c.status, CapacityStatus::NeverFailed);
    assert_eq!(c.capacity, 16.0);
}

#[test]
fn errors_stop_the_search_and_progress_sees_every_probe() {
    let mut calls = 0;
    let r: Result<_, String> = CapacitySearch::default().try_search_with(
        |s| {
            calls += 1;
            if calls == 3 {
                Err(format!("run at {s} failed"))
            } else {
                Ok(run_with(s, 0.95))
            }
        },
        |_, _, _| {},
    );
    assert_eq!(r.err().as_deref(), Some("run at 4 failed"));

    let mut seen = Vec::new();
    let c = CapacitySearch::default()
        .try_search_with(
            |s| Ok::<_, String>(run_with(s, if s <= 1.5 { 0.95 } else { 0.0 })),
            |p, done, budget| seen.push((p.rate_scale, done, budget)),
        )
        .expect("no errors");
    assert_eq!(seen.len(), c.probes.len());
    assert!(
        seen.iter()
            .enumerate()
            .all(|(i, &(s, done, budget))| done == i + 1
                && budget == 13
                && s == c.probes[i].rate_scale)
    );
}
