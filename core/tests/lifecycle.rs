//! The request lifecycle through the public API, as a host drives it: route, admit
//! (go / wait / reject within the defer budget and limit), book and remember, finish.

use std::sync::Arc;

use headroom_core::{
    Admission, Admit, DeferLimits, Deferrals, Fallback, Finished, PlainReplica, Reported,
    RequestProfile, RouteInputs, Slo, lifecycle,
    policy::{
        Candidate, Choice, DecideCtx, Decision, NoFit, Policy, PolicyName, build,
        candidates::CandidateParams,
    },
    prefix::PrefixIndex,
    route,
};
use headroom_predictor::{Prediction, SharedPredictor};
use rand::{SeedableRng, rngs::SmallRng};

fn fleet(n: u32) -> Vec<PlainReplica> {
    (0..n)
        .map(|i| PlainReplica::new(i, &format!("r{i}"), "h100", "m", Some(8192)))
        .collect()
}

fn profile(fallback: Fallback) -> RequestProfile {
    RequestProfile {
        model: "m".into(),
        prompt_tokens: 64,
        blocks: (1..=4).collect(),
        max_tokens: Some(16),
        expected_output_tokens: 16,
        slo: Slo {
            ttft_ms: 1000.0,
            tpot_ms: 50.0,
        },
        priority: 0,
        fallback,
        stream: true,
        exact_cached: Vec::new(),
    }
}

/// Decides as scripted, with a recognisable prediction for every candidate.
struct Scripted {
    choice: Choice,
}

fn marked() -> Prediction {
    Prediction {
        ttft_ms: 123.0,
        tpot_ms: 7.0,
        ..Prediction::default()
    }
}

impl Policy for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }
    fn decide(&self, _: &RequestProfile, c: &[Candidate<'_>], _: &mut DecideCtx<'_>) -> Decision {
        Decision {
            choice: self.choice.clone(),
            predictions: vec![marked(); c.len()],
            evals: Vec::new(),
            fallback: None,
        }
    }
}

fn defer_all() -> Scripted {
    Scripted {
        choice: Choice::Defer {
            retry_after_s: 0.02,
            reason: "full".into(),
            fallback_order: vec![1, 0],
        },
    }
}

fn routed(policy: &dyn Policy, replicas: &[PlainReplica], now_s: f64) -> headroom_core::Routed {
    let predictor = SharedPredictor::default();
    let prefix = PrefixIndex::new(1024);
    let inputs = RouteInputs {
        policy,
        predictor: &predictor,
        prefix: &prefix,
        replicas,
        params: CandidateParams {
            block_tokens: 16,
            stale_after_s: 1.0,
        },
        max_targets: 2,
    };
    let mut rng = SmallRng::seed_from_u64(1);
    route(&inputs, &profile(Fallback::Defer), now_s, &mut rng).expect("candidates")
}

const LIMITS: DeferLimits = DeferLimits {
    budget: 0.5,
    max_deferred: 1,
    max_wait_s: f64::INFINITY,
};

#[test]
fn targets_carry_the_policys_own_prediction() {
    let rs = fleet(2);
    let r = routed(&defer_all(), &rs, 0.0);
    assert_eq!(r.targets.len(), 2);
    assert_eq!(r.targets[0].index, 1, "the fallback order, first first");
    for t in &r.targets {
        assert_eq!(t.learn.prediction.ttft_ms, 123.0);
        assert_eq!(t.learn.prediction.tpot_ms, 7.0);
    }
}

#[test]
fn a_deferred_request_waits_within_its_deadline_then_goes_least_bad() {
    let rs = fleet(2);
    let deferrals = Deferrals::new();
    let p = profile(Fallback::Defer);
    // Deadline: 0.5 × 1000 ms after arrival at t = 10.
    let mut adm = Admission::new(&p, 10.0, LIMITS, deferrals.clone());
    match adm.admit(routed(&defer_all(), &rs, 10.0), 10.0) {
        Admit::Wait(s) => assert_eq!(s, 0.02),
        other => panic!("{other:?}"),
    }
    assert_eq!(deferrals.waiting(), 1);
    assert!(matches!(
        adm.admit(routed(&defer_all(), &rs, 10.4), 10.4),
        Admit::Wait(_)
    ));
    match adm.admit(routed(&defer_all(), &rs, 10.49), 10.49) {
        Admit::Go { targets, fallback } => {
            assert_eq!(fallback, Some(lifecycle::DEFER_EXPIRED));
            assert_eq!(targets[0].index, 1);
        }
        other => panic!("{other:?}"),
    }
    drop(adm);
    assert_eq!(
        deferrals.waiting(),
        0,
        "the slot is released with the admission"
    );
}

#[test]
fn max_wait_bounds_deferral_whatever_the_objective() {
    let rs = fleet(2);
    let mut p = profile(Fallback::Defer);
    // An hour's TTFT objective would allow half an hour deferred; max_wait says 0.3 s.
    p.slo.ttft_ms = 3_600_000.0;
    let limits = DeferLimits {
        max_wait_s: 0.3,
        ..LIMITS
    };
    assert_eq!(limits.deadline_s(&p, 10.0), 10.3);
    let mut adm = Admission::new(&p, 10.0, limits, Deferrals::new());
    assert!(matches!(
        adm.admit(routed(&defer_all(), &rs, 10.0), 10.0),
        Admit::Wait(_)
    ));
    match adm.admit(routed(&defer_all(), &rs, 10.29), 10.29) {
        Admit::Go { fallback, .. } => assert_eq!(fallback, Some(lifecycle::DEFER_EXPIRED)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn beyond_max_deferred_a_request_goes_at_once_and_a_waiter_is_labelled() {
    let rs = fleet(2);
    let deferrals = Deferrals::new();
    let p = profile(Fallback::Defer);
    let mut first = Admission::new(&p, 0.0, LIMITS, deferrals.clone());
    assert!(matches!(
        first.admit(routed(&defer_all(), &rs, 0.0), 0.0),
        Admit::Wait(_)
    ));
    let mut second = Admission::new(&p, 0.0, LIMITS, deferrals.clone());
    match second.admit(routed(&defer_all(), &rs, 0.0), 0.0) {
        Admit::Go { fallback, .. } => assert_eq!(fallback, Some(lifecycle::DEFER_FULL)),
        other => panic!("{other:?}"),
    }
    // Capacity came back: the waiter goes, labelled as having waited.
    let go = Scripted {
        choice: Choice::Route(vec![0, 1]),
    };
    match first.admit(routed(&go, &rs, 0.1), 0.1) {
        Admit::Go { fallback, targets } => {
            assert_eq!(fallback, Some(lifecycle::DEFERRED));
            assert_eq!(targets[0].index, 0);
        }
        other => panic!("{other:?}"),
    }
    let reject = Scripted {
        choice: Choice::Reject(NoFit::new("no".into(), 2.5)),
    };
    let mut third = Admission::new(&p, 0.0, LIMITS, deferrals);
    assert!(matches!(
        third.admit(routed(&reject, &rs, 0.0), 0.0),
        Admit::Reject(r) if r.reason == "no" && r.retry_after_secs() == 3
    ));
}

#[test]
fn dispatch_books_the_ledger_and_remembers_the_prefix() {
    let rs = fleet(2);
    let go = Scripted {
        choice: Choice::Route(vec![1, 0]),
    };
    let r = routed(&go, &rs, 0.0);
    let t = &r.targets[0];
    let p = profile(Fallback::LeastBad);
    let booking = lifecycle::book(&rs[t.index], &p, t, 0.0);
    assert_eq!(rs[1].ledger.load(0.0).requests, 1.0);
    let prefix = PrefixIndex::new(1024);
    lifecycle::remember_prefix(&prefix, &rs[1], &p, t, 16);
    // The next decision sees replica 1 holding the prompt.
    let predictor = Arc::new(SharedPredictor::default());
    let policy = build(
        PolicyName::TokenLoad,
        predictor.clone(),
        &Default::default(),
    );
    let inputs = RouteInputs {
        policy: policy.as_ref(),
        predictor: &predictor,
        prefix: &prefix,
        replicas: rs.as_slice(),
        params: CandidateParams {
            block_tokens: 16,
            stale_after_s: 1.0,
        },
        max_targets: 2,
    };
    let again = route(&inputs, &p, 0.0, &mut SmallRng::seed_from_u64(3)).unwrap();
    let held = again.targets.iter().find(|t| t.index == 1).unwrap();
    assert_eq!(
        held.cached_tokens, 63,
        "all of it but the last token, which is computed"
    );
    drop(booking);
    assert_eq!(rs[1].ledger.load(0.0).requests, 0.0);
}

#[test]
fn finishing_gives_exact_or_censored_labels() {
    let rs = fleet(1);
    let go = Scripted {
        choice: Choice::Route(vec![0]),
    };
    let learn = routed(&go, &rs, 0.0).targets[0].learn;
    let ok = Finished {
        ok: true,
        ttft_ms: Some(80.0),
        ttft_learned: false,
        upstream_ms: 500.0,
        tpot_ms: Some(9.0),
        output_tokens: 40,
        reported: Reported {
            prompt_tokens: Some(70),
            cached_tokens: Some(32),
        },
    };
    let s = ok.samples(&learn, 1.0);
    assert_eq!(s.len(), 1, "both exact: one sample");
    assert_eq!((s[0].ttft_ms, s[0].tpot_ms), (Some(80.0), Some(9.0)));
    assert!(!s[0].censored);
    assert_eq!(
        (s[0].obs.prompt_tokens, s[0].obs.cached_tokens),
        (70.0, 32.0)
    );
    assert_eq!(s[0].predicted.map(|p| p.ttft_ms), Some(123.0));
    // TTFT already learned at the first token: only TPOT remains.
    let s = Finished {
        ttft_learned: true,
        ..ok
    }
    .samples(&learn, 1.0);
    assert_eq!((s.len(), s[0].ttft_ms, s[0].tpot_ms), (1, None, Some(9.0)));
    // No token came and the attempt failed: TTFT is at least the wait, censored; no TPOT.
    let failed = Finished {
        ok: false,
        ttft_ms: None,
        tpot_ms: Some(9.0),
        ..ok
    };
    let lb = failed.labels();
    assert_eq!(
        (lb.ttft_ms, lb.censored, lb.tpot_ms),
        (Some(500.0), true, None)
    );
    let s = failed.samples(&learn, 1.0);
    assert_eq!(s.len(), 1);
    assert!(s[0].censored && s[0].ttft_ms == Some(500.0));
    // A clean end with nothing measured teaches nothing.
    let nothing = Finished {
        ttft_ms: None,
        tpot_ms: None,
        ..ok
    };
    assert!(nothing.samples(&learn, 1.0).is_empty());
}

#[test]
fn each_decision_is_asked_for_the_ttft_objective_left_since_arrival() {
    let p = profile(Fallback::LeastBad);
    let adm = Admission::new(&p, 10.0, LIMITS, Deferrals::new());
    // At arrival the whole objective; 250 ms later (gate, tokenizing, a deferral) the
    // rest; TPOT is per token and untouched.
    assert_eq!(adm.remaining(p.slo, 10.0).ttft_ms, 1000.0);
    let later = adm.remaining(p.slo, 10.25);
    assert!((later.ttft_ms - 750.0).abs() < 1e-6, "{later:?}");
    assert_eq!(later.tpot_ms, 50.0);
    // Past the objective: a positive floor, so nothing fits and the fallback decides.
    let past = adm.remaining(p.slo, 12.0);
    assert_eq!(past.ttft_ms, lifecycle::MIN_TTFT_LEFT_MS);
    // A clock read before arrival (another thread's) never adds budget.
    assert_eq!(adm.remaining(p.slo, 9.9).ttft_ms, 1000.0);
}
