//! The pair as one candidate and the unified-or-disaggregated choice, on hand-built
//! fleets with a predictor trained on a known linear engine.

use headroom_predictor::{Learner, Observation, PredictorConfig, Sample, SharedPredictor};
use rand::SeedableRng;

use super::*;
use crate::{
    ledger::BookingSpec,
    policy::{Slo, candidates::CandidateParams},
    prefix::PrefixIndex,
    view::PlainReplica,
};

/// The engine every replica runs: TTFT = 20 ms + 0.1 ms per uncached or queued prompt
/// token; TPOT = 10 ms + 1 ms per running request.
fn ttft_ms(o: &Observation) -> f64 {
    20.0 + 0.1 * (o.prompt_tokens - o.cached_tokens + o.queued_prefill_tokens)
}
fn tpot_ms(o: &Observation) -> f64 {
    10.0 + o.decoding_requests
}

fn fleet(roles: &[Role]) -> Vec<PlainReplica> {
    roles
        .iter()
        .enumerate()
        .map(|(i, &role)| {
            let name = format!("r{i}");
            let mut r = PlainReplica::new(i as u32, &name, "gpu", "m", Some(32_768));
            r.role = role;
            r
        })
        .collect()
}

fn trained(replicas: &[PlainReplica]) -> SharedPredictor {
    let mut l = Learner::new(PredictorConfig::default());
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    use rand::Rng;
    for k in 0..600 {
        for r in replicas {
            let prompt = rng.random_range(16.0..8000.0f64).floor();
            let obs = Observation {
                prompt_tokens: prompt,
                cached_tokens: (prompt * rng.random_range(0.0..0.5f64)).floor(),
                expected_output_tokens: 64.0,
                queued_prefill_tokens: rng.random_range(0.0..6000.0f64).floor(),
                queued_requests: rng.random_range(0.0..3.0f64).floor(),
                decoding_requests: rng.random_range(0.0..8.0f64).floor(),
                ..Observation::default()
            };
            l.observe(&Sample {
                key: r.key,
                obs,
                at_s: k as f64 * 0.01,
                ttft_ms: Some(ttft_ms(&obs)),
                tpot_ms: Some(tpot_ms(&obs)),
                output_tokens: 64,
                censored: false,
                predicted: None,
            });
        }
    }
    SharedPredictor::new(l.snapshot(6.0))
}

fn req(prompt: u32, ttft: f64) -> RequestProfile {
    RequestProfile {
        model: "m".into(),
        prompt_tokens: prompt,
        blocks: Vec::new(),
        max_tokens: Some(64),
        expected_output_tokens: 64,
        slo: Slo {
            ttft_ms: ttft,
            tpot_ms: 40.0,
        },
        priority: 0,
        fallback: crate::policy::Fallback::LeastBad,
        stream: true,
        exact_cached: Vec::new(),
    }
}

fn run(
    replicas: &[PlainReplica],
    predictor: &SharedPredictor,
    profile: &RequestProfile,
    seed: u64,
) -> Option<PdPlan> {
    let policy = crate::policy::baselines::RoundRobin::default();
    let prefix = PrefixIndex::new(1024);
    let inp = RouteInputs {
        policy: &policy,
        predictor,
        prefix: &prefix,
        replicas,
        params: CandidateParams {
            block_tokens: 16,
            stale_after_s: 1.0,
        },
        max_targets: 3,
    };
    let cfg = PdConfig::default();
    let slo = SloConfig::default();
    let links = Links::new(cfg.link_model());
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    plan(
        &inp,
        &PdInputs {
            cfg: &cfg,
            slo: &slo,
            links: &links,
        },
        profile,
        10.0,
        &mut rng,
    )
    .expect("candidates")
}

/// Queues `tokens` of prefill on `r` (this node's ledger), held while the bookings live.
fn load(r: &PlainReplica, tokens: u32, n: usize) -> Vec<crate::ledger::Booking> {
    (0..n)
        .map(|_| {
            r.ledger.book(
                BookingSpec {
                    prompt_tokens: tokens,
                    cached_tokens: 0,
                    expected_output_tokens: 64,
                    tpot_slo_ms: None,
                    expected_ttft_s: None,
                    stream: true,
                },
                10.0,
            )
        })
        .collect()
}

#[test]
fn the_pair_forecast_adds_prefill_transfer_and_a_decode_step() {
    let p = Prediction {
        ttft_ms: 300.0,
        ttft_upper_ms: 360.0,
        ttft_median_ms: 300.0,
        ..Prediction::default()
    };
    let d = Prediction {
        tpot_ms: 20.0,
        tpot_upper_ms: 25.0,
        tpot_median_ms: 20.0,
        ..Prediction::default()
    };
    let t = TransferEstimate {
        bytes: 0.0,
        seconds: 0.05,
        upper_s: 0.075,
        measured: 0,
    };
    let x = pair_prediction(&p, &d, &t);
    assert!((x.ttft_ms - 370.0).abs() < 1e-9);
    assert!((x.ttft_upper_ms - 460.0).abs() < 1e-9);
    assert_eq!((x.tpot_ms, x.tpot_upper_ms), (20.0, 25.0), "TPOT is D's");
    // Its p90 is the bound: the lognormal with this spread puts 10% above it.
    let tail = headroom_predictor::lognormal_tail(x.ttft_median_ms, x.ttft_log_sigma, 460.0);
    assert!((tail - 0.1).abs() < 0.01, "{tail}");
}

#[test]
fn short_prompts_and_fleets_without_both_stages_run_unified() {
    let rs = fleet(&[Role::Prefill, Role::Decode, Role::Both]);
    let pred = trained(&rs);
    assert!(
        run(&rs, &pred, &req(200, 2000.0), 1).is_none(),
        "short prompt"
    );
    let no_decode = fleet(&[Role::Prefill, Role::Both]);
    assert!(run(&no_decode, &trained(&no_decode), &req(4000, 2000.0), 1).is_none());
}

#[test]
fn a_cold_fleet_disaggregates_long_prompts_onto_the_least_loaded_pair() {
    let rs = fleet(&[Role::Prefill, Role::Prefill, Role::Decode, Role::Decode]);
    let pred = SharedPredictor::default();
    let _busy_p = load(&rs[0], 3000, 2);
    let _busy_d = load(&rs[3], 100, 4);
    let plan = run(&rs, &pred, &req(4000, 2000.0), 3).expect("disaggregated");
    assert_eq!(plan.fallback, Some("cold-model"));
    assert_eq!(plan.prefill[0].index, 1, "the idle prefill replica");
    assert_eq!(plan.decode[0].index, 2, "the idle decode replica");
    // Retries go to the other replica of the same role, never across roles.
    assert_eq!(
        plan.prefill.iter().map(|t| t.index).collect::<Vec<_>>(),
        [1, 0]
    );
    assert_eq!(
        plan.decode.iter().map(|t| t.index).collect::<Vec<_>>(),
        [2, 3]
    );
    // D learns as if the prompt arrived cached; P as one output token.
    assert_eq!(plan.decode[0].cached_tokens, 3999);
    assert_eq!(plan.prefill[0].learn.obs.expected_output_tokens, 1.0);
    assert_eq!(plan.transfer_tokens, 4000);
}

#[test]
fn a_unified_replica_with_headroom_keeps_the_request_whole() {
    let rs = fleet(&[Role::Prefill, Role::Decode, Role::Both]);
    let pred = trained(&rs);
    // Idle unified replica: TTFT ≈ 20 + 400 ms within 2 s: no reason to disaggregate.
    assert!(run(&rs, &pred, &req(4000, 2000.0), 1).is_none());
}

#[test]
fn a_busy_unified_fleet_sends_long_prompts_to_the_pair_that_fits() {
    let rs = fleet(&[
        Role::Prefill,
        Role::Prefill,
        Role::Decode,
        Role::Decode,
        Role::Both,
    ]);
    let pred = trained(&rs);
    // The unified replica has 24,000 tokens queued (≈ 2.4 s): it misses 1.2 s.
    let _u = load(&rs[4], 6000, 4);
    // One prefill replica is busy too (≈ 1.2 s queued): the pair uses the other.
    let _p = load(&rs[0], 6000, 2);
    let mut seen_p = std::collections::HashSet::new();
    for seed in 0..20 {
        let plan = run(&rs, &pred, &req(4000, 1200.0), seed).expect("disaggregated");
        assert_eq!(plan.fallback, None, "the pair meets both objectives");
        assert_eq!(plan.eval.tier, 0);
        assert_eq!(plan.prefill[0].index, 1);
        seen_p.insert(plan.decode[0].index);
        // TTFT ≈ P's 420 ms + 53 ms transfer + D's step, within the objective.
        let t = plan.prediction.ttft_ms;
        assert!((400.0..700.0).contains(&t), "{t}");
        assert!((plan.transfer.seconds - 0.0534).abs() < 1e-3);
    }
    // Two equal decode replicas: the choice is spread (no herd).
    assert_eq!(seen_p.len(), 2, "{seen_p:?}");
}

#[test]
fn the_running_requests_guard_applies_on_the_decode_side() {
    let rs = fleet(&[Role::Prefill, Role::Decode, Role::Decode, Role::Both]);
    let pred = trained(&rs);
    let _u = load(&rs[3], 6000, 4);
    // A request running on D1 needs TPOT ≤ 5 ms: no placement may go there.
    let _tight = rs[1].ledger.book(
        BookingSpec {
            prompt_tokens: 16,
            cached_tokens: 0,
            expected_output_tokens: 64,
            tpot_slo_ms: Some(5.0),
            expected_ttft_s: None,
            stream: true,
        },
        10.0,
    );
    for seed in 0..10 {
        let plan = run(&rs, &pred, &req(4000, 1200.0), seed).expect("disaggregated");
        assert_eq!(plan.decode[0].index, 2);
    }
}

/// A fleet no pair fits (every prefill replica ≈ 2.4 s queued, the objective 1.2 s),
/// and the plan for it.
fn unfit() -> (
    Vec<PlainReplica>,
    SharedPredictor,
    Vec<crate::ledger::Booking>,
) {
    let rs = fleet(&[Role::Prefill, Role::Prefill, Role::Decode, Role::Decode]);
    let pred = trained(&rs);
    let mut held = load(&rs[0], 6000, 4);
    held.extend(load(&rs[1], 6000, 4));
    (rs, pred, held)
}

fn with_fallback(mut r: RequestProfile, f: crate::policy::Fallback) -> RequestProfile {
    r.fallback = f;
    r
}

#[test]
fn an_unfit_pair_waits_within_the_defer_budget_then_goes_least_bad() {
    use crate::lifecycle::{Admission, DEFER_EXPIRED, DeferLimits, Deferrals};
    let (rs, pred, _held) = unfit();
    let profile = with_fallback(req(4000, 1200.0), crate::policy::Fallback::Defer);
    let limits = DeferLimits {
        budget: 0.5,
        max_deferred: 8,
        max_wait_s: 5.0,
    };
    let deferrals = Deferrals::new();
    let slo = SloConfig::default();
    // Arrived at 10 s: the deadline is 10 + 0.5 × 1.2 s.
    let mut adm = Admission::new(&profile, 10.0, limits, deferrals.clone());
    let mut now = 10.0;
    let mut waits = 0;
    let plan = loop {
        let plan = run(&rs, &pred, &profile, waits).expect("disaggregated");
        assert!(plan.eval.tier > 0, "no pair fits");
        match admit(&mut adm, plan, &profile, &slo, now) {
            PdAdmit::Wait(s) => {
                assert!((s - slo.defer_poll_ms as f64 / 1e3).abs() < 1e-9);
                assert_eq!(deferrals.waiting(), 1, "one slot while it waits");
                now += s;
                waits += 1;
                assert!(waits < 100, "the deadline bounds the waits");
            }
            PdAdmit::Go(plan) => break plan,
            PdAdmit::Reject(no) => panic!("defer never rejects: {no:?}"),
        }
    };
    assert_eq!(plan.fallback, Some(DEFER_EXPIRED));
    assert!(now <= 10.6 + 1e-9 && now > 10.5, "{now}");
    assert!(waits >= 20, "{waits} waits of 20 ms in 0.6 s");
    drop(adm);
    assert_eq!(deferrals.waiting(), 0, "the slot is released");
}

#[test]
fn an_unfit_pair_follows_the_tenants_fallback() {
    use crate::lifecycle::{Admission, DEFER_FULL, DEFERRED, DeferLimits, Deferrals};
    let (rs, pred, held) = unfit();
    let slo = SloConfig::default();
    let limits = DeferLimits {
        budget: 1.0,
        max_deferred: 0,
        max_wait_s: 5.0,
    };
    let fresh = |p: &RequestProfile| Admission::new(p, 10.0, limits, Deferrals::new());
    // Least-bad goes at once with the policy's label.
    let p = req(4000, 1200.0);
    let plan = run(&rs, &pred, &p, 1).expect("disaggregated");
    match admit(&mut fresh(&p), plan, &p, &slo, 10.0) {
        PdAdmit::Go(plan) => assert_eq!(plan.fallback, Some("no-fit")),
        other => panic!("{other:?}"),
    }
    // Reject: the pair's bounds and a Retry-After of at least a second.
    let p = with_fallback(req(4000, 1200.0), crate::policy::Fallback::Reject);
    let plan = run(&rs, &pred, &p, 1).expect("disaggregated");
    match admit(&mut fresh(&p), plan, &p, &slo, 10.0) {
        PdAdmit::Reject(no) => {
            assert!(no.reason.contains("prefill/decode pair"), "{}", no.reason);
            assert!(no.retry_after_s >= 1.0);
        }
        other => panic!("{other:?}"),
    }
    // Defer on a node already full of deferred requests: least-bad, `defer-full`.
    let p = with_fallback(req(4000, 1200.0), crate::policy::Fallback::Defer);
    let plan = run(&rs, &pred, &p, 1).expect("disaggregated");
    match admit(&mut fresh(&p), plan, &p, &slo, 10.0) {
        PdAdmit::Go(plan) => assert_eq!(plan.fallback, Some(DEFER_FULL)),
        other => panic!("{other:?}"),
    }
    // A request that waited and then finds a pair that fits goes `deferred`.
    let limits = DeferLimits {
        max_deferred: 8,
        ..limits
    };
    let mut adm = Admission::new(&p, 10.0, limits, Deferrals::new());
    let plan = run(&rs, &pred, &p, 1).expect("disaggregated");
    assert!(matches!(
        admit(&mut adm, plan, &p, &slo, 10.0),
        PdAdmit::Wait(_)
    ));
    drop(held);
    let plan = run(&rs, &pred, &p, 1).expect("disaggregated");
    assert_eq!(plan.eval.tier, 0, "the queues drained");
    match admit(&mut adm, plan, &p, &slo, 10.02) {
        PdAdmit::Go(plan) => assert_eq!(plan.fallback, Some(DEFERRED)),
        other => panic!("{other:?}"),
    }
}
