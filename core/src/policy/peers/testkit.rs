//! Hand-built candidates and requests for the peer policies' tests.

use std::sync::Arc;

use rand::SeedableRng;

use crate::{
    ledger::Load,
    policy::{Candidate, Choice, DecideCtx, Policy, RequestProfile, Slo},
    scraped::{EngineKind, Scraped},
    view::{PlainReplica, ServedModels, key_of},
};

/// A replica named as the router names one given only its URL, its model list not yet
/// known and its health not yet probed.
pub fn replica(i: u32) -> PlainReplica {
    let url = format!("http://127.0.0.1:{}", 9000 + i);
    let name = format!("127.0.0.1:{}", 9000 + i);
    let mut r = PlainReplica::new(i, &name, &format!("replica:{name}"), "m", None);
    r.key = headroom_predictor::ReplicaKey::new(key_of(&url), key_of(&format!("replica:{name}")));
    r.models = ServedModels::default();
    r.routable = false;
    r
}

pub fn replicas(n: u32) -> Vec<PlainReplica> {
    (0..n).map(replica).collect()
}

/// An engine scrape with the given waiting queue, running count and KV usage (0..1).
pub fn scraped(waiting: f64, running: f64, kv_usage: f64) -> Arc<Scraped> {
    Arc::new(Scraped {
        at_s: 0.0,
        engine: EngineKind::Vllm,
        running,
        waiting,
        kv_usage: Some(kv_usage),
        num_gpu_blocks: Some(10_000),
        block_size: Some(16),
        prefix_queries: 0.0,
        prefix_hits: 0.0,
        preemptions: 0.0,
        preemption_rate: 0.0,
        rejected_values: 0,
    })
}

/// A candidate holding `cached` prompt tokens, with this node's `own` load and no scrape.
pub fn cand(r: &PlainReplica, cached: u32, own: Load) -> Candidate<'_> {
    Candidate {
        replica: r,
        index: r.id as usize,
        cached_tokens: cached,
        own,
        peers: Load::default(),
        peers_age_s: 0.0,
        scraped: None,
        scraped_age_s: f64::INFINITY,
        kv_capacity_tokens: None,
    }
}

/// As [`cand`], with a fresh scrape.
pub fn cand_s(r: &PlainReplica, cached: u32, own: Load, s: Arc<Scraped>) -> Candidate<'_> {
    Candidate {
        kv_capacity_tokens: s.kv_capacity_tokens(),
        scraped: Some(*s),
        scraped_age_s: 0.5,
        ..cand(r, cached, own)
    }
}

pub fn requests(n: f64) -> Load {
    Load {
        requests: n,
        ..Load::default()
    }
}

pub fn req(prompt: u32) -> RequestProfile {
    RequestProfile {
        model: "m".into(),
        prompt_tokens: prompt,
        blocks: vec![],
        max_tokens: Some(100),
        expected_output_tokens: 100,
        slo: Slo {
            ttft_ms: 1000.0,
            tpot_ms: 50.0,
        },
        priority: 0,
        fallback: Default::default(),
        stream: true,
        exact_cached: Vec::new(),
    }
}

/// The full ranking for one seeded decision; asserts it routes every candidate once.
pub fn ranking(p: &dyn Policy, r: &RequestProfile, c: &[Candidate<'_>], seed: u64) -> Vec<usize> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut ctx = DecideCtx {
        now_s: 0.0,
        rng: &mut rng,
        top: usize::MAX,
    };
    match p.decide(r, c, &mut ctx).choice {
        Choice::Route(o) => {
            let mut sorted = o.clone();
            sorted.sort_unstable();
            assert_eq!(
                sorted,
                (0..c.len()).collect::<Vec<_>>(),
                "not a permutation: {o:?}"
            );
            o
        }
        other => panic!("expected a route, got {other:?}"),
    }
}

/// How often each candidate is chosen first over `n` seeds.
pub fn first_counts(p: &dyn Policy, r: &RequestProfile, c: &[Candidate<'_>], n: u64) -> Vec<u32> {
    let mut counts = vec![0; c.len()];
    for seed in 0..n {
        counts[ranking(p, r, c, seed)[0]] += 1;
    }
    counts
}
