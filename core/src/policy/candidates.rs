//! Candidate filtering: model or adapter, context length, health, readiness; then
//! each survivor's load and prefix match.

use std::sync::atomic::Ordering::Relaxed;

use super::{
    Candidate, RequestProfile,
    shortlist::{self, Entry, Shortlist},
};
use crate::{
    prefix::{Cursor, PrefixIndex},
    scraped::Scraped,
    view::{ReplicaView, Role, Serving},
};

/// Why no candidate is left.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CandidateError {
    #[error("no replica serves model `{0}`")]
    UnknownModel(String),
    #[error("no healthy replica serves model `{0}`")]
    NoHealthy(String),
    #[error(
        "prompt ({prompt} tokens) leaves no room for output in the longest context ({max} tokens) of any replica serving `{model}`"
    )]
    ContextTooLong {
        model: String,
        prompt: u32,
        max: u32,
    },
}

/// Knobs of candidate construction.
#[derive(Clone, Copy, Debug)]
pub struct CandidateParams {
    /// Tokens per prefix block in the index.
    pub block_tokens: u32,
    /// Scraped state older than this is ignored.
    pub stale_after_s: f64,
}

/// Builds the eligible candidates for `req` at `now_s` for a whole (unified) request:
/// the `both` replicas; where none can take it, the decode replicas too (a decode
/// engine prefills locally), so a pure prefill/decode fleet still serves short
/// prompts and stream continuations. Prefill replicas never take a whole request.
pub fn build_candidates<'a, R: ReplicaView>(
    req: &RequestProfile,
    replicas: &'a [R],
    prefix: &PrefixIndex,
    params: CandidateParams,
    now_s: f64,
) -> Result<Vec<Candidate<'a>>, CandidateError> {
    build_unified(req, replicas, prefix, params, now_s, None).map(|(c, _)| c)
}

/// [`build_candidates`], keeping only the policy's [`Shortlist`] of them when more are
/// eligible ([`super::shortlist`]); also says how many were eligible. The rows of the
/// dropped candidates are never built: ranking them needs only their outstanding
/// tokens and prefix match, and at 1,024 replicas the full rows (≈ 390 bytes each,
/// the ledger's whole load with its decay `exp`) were half the decision. The kept rows
/// are exactly [`build_candidates`]'s.
pub fn build_shortlisted<'a, R: ReplicaView>(
    req: &RequestProfile,
    replicas: &'a [R],
    prefix: &PrefixIndex,
    params: CandidateParams,
    now_s: f64,
    s: Shortlist,
    rng: &mut dyn rand::RngCore,
) -> Result<(Vec<Candidate<'a>>, usize), CandidateError> {
    build_unified(req, replicas, prefix, params, now_s, Some((s, rng)))
}

fn build_unified<'a, R: ReplicaView>(
    req: &RequestProfile,
    replicas: &'a [R],
    prefix: &PrefixIndex,
    params: CandidateParams,
    now_s: f64,
    mut shortlist: Option<(Shortlist, &mut dyn rand::RngCore)>,
) -> Result<(Vec<Candidate<'a>>, usize), CandidateError> {
    let both = eligible(req, replicas, |r| r.role() == Role::Both);
    let idx = match both {
        Err(e) if replicas.iter().any(|r| r.role() == Role::Decode) => {
            eligible(req, replicas, |r| r.role().serves_unified()).map_err(|_| e)?
        }
        other => other?,
    };
    let n = idx.len();
    let rows = match shortlist.as_mut() {
        Some((s, rng)) if n > s.size.max(1) => {
            shortlisted(req, replicas, &idx, prefix, params, now_s, *s, &mut **rng)
        }
        _ => rows(req, replicas, &idx, prefix, params, now_s),
    };
    Ok((rows, n))
}

/// The eligible candidates of one role for a disaggregated request's stage.
pub fn build_role_candidates<'a, R: ReplicaView>(
    req: &RequestProfile,
    replicas: &'a [R],
    prefix: &PrefixIndex,
    params: CandidateParams,
    now_s: f64,
    role: Role,
) -> Result<Vec<Candidate<'a>>, CandidateError> {
    let idx = eligible(req, replicas, |r| r.role() == role)?;
    Ok(rows(req, replicas, &idx, prefix, params, now_s))
}

/// Full rows for the replicas at `idx`, with their prefix matches.
fn rows<'a, R: ReplicaView>(
    req: &RequestProfile,
    replicas: &'a [R],
    idx: &[usize],
    prefix: &PrefixIndex,
    params: CandidateParams,
    now_s: f64,
) -> Vec<Candidate<'a>> {
    let mut out = Vec::with_capacity(idx.len());
    for &i in idx {
        out.push(candidate(&replicas[i], i, params, now_s));
    }
    fill_prefix_matches(req, &mut out, prefix, params.block_tokens);
    out
}

/// The shortlist of the replicas at `idx` (more than its size), ranked from light
/// reads, and the full rows of those kept.
#[allow(clippy::too_many_arguments)]
fn shortlisted<'a, R: ReplicaView>(
    req: &RequestProfile,
    replicas: &'a [R],
    idx: &[usize],
    prefix: &PrefixIndex,
    params: CandidateParams,
    now_s: f64,
    s: Shortlist,
    rng: &mut dyn rand::RngCore,
) -> Vec<Candidate<'a>> {
    let mut holders = Vec::with_capacity(idx.len());
    let mut entries = Vec::with_capacity(idx.len());
    for &i in idx {
        let r = &replicas[i];
        let light = r.light();
        let shape = light.scrape;
        let fresh = shape.filter(|sc| (now_s - sc.at_s).max(0.0) <= params.stale_after_s);
        holders.push(Holder::of(
            r,
            shape.and_then(|sc| sc.kv_capacity_tokens),
            fresh.and_then(|sc| sc.block_size),
            params.block_tokens,
        ));
        // As `Candidate::load().outstanding_tokens()` sums them: own plus peers' per term.
        let (oq, od) = r.ledger().outstanding(now_s);
        entries.push(Entry {
            id: r.id(),
            outstanding: (oq + light.peer_queued_prefill_tokens)
                + (od + light.peer_decode_remaining_tokens),
            cached: 0,
            group: (r.predictor_key().class, r.remote_rtt_ms().is_none()),
        });
    }
    let cached = cached_tokens(req, &holders, prefix, params.block_tokens);
    for (e, c) in entries.iter_mut().zip(&cached) {
        e.cached = *c;
    }
    let kept = shortlist::choose(req, &entries, s, rng);
    // Sized up front: a filtered collect would grow (and copy) the ~390-byte rows.
    let mut out = Vec::with_capacity(s.size.max(1).min(idx.len()));
    for ((&i, _), c) in idx.iter().zip(kept).zip(cached).filter(|((_, k), _)| *k) {
        out.push(Candidate {
            cached_tokens: c,
            ..candidate(&replicas[i], i, params, now_s)
        });
    }
    out
}

/// Indices of the replicas `keep` admits that can take `req` (model or adapter,
/// context length, routable); the others do not count as serving.
fn eligible<R: ReplicaView>(
    req: &RequestProfile,
    replicas: &[R],
    keep: impl Fn(&R) -> bool,
) -> Result<Vec<usize>, CandidateError> {
    let mut serving = 0usize;
    // Replicas whose `/v1/models` never answered might serve the model: until every
    // list is known an absent model is "not yet", a retryable 503, never a 404.
    let mut unknown_lists = 0usize;
    let mut longest: Option<u32> = None;
    let need = req
        .prompt_tokens
        .saturating_add(req.max_tokens.unwrap_or(1).max(1));
    // vLLM serves a prompt whose max_tokens overruns its context and stops the output
    // at the context's end (real vLLM 0.32: 3,933 prompt tokens, max_tokens 256,
    // 163 generated). So a replica that fits the whole request is preferred, one that
    // fits the prompt and one output token is next, and only a prompt that fits
    // nowhere is refused.
    let min_need = req.prompt_tokens.saturating_add(1);
    let mut short_fit: Vec<usize> = Vec::new();
    let mut out = Vec::with_capacity(replicas.len());
    for (index, r) in replicas.iter().enumerate() {
        if !keep(r) {
            continue;
        }
        let max_len = match r.serving(&req.model) {
            Serving::NotYetKnown => {
                unknown_lists += 1;
                continue;
            }
            Serving::No => continue,
            Serving::Yes { max_model_len } => max_model_len,
        };
        serving += 1;
        if let Some(m) = max_len {
            longest = Some(longest.map_or(m, |l| l.max(m)));
            if need > m {
                if min_need <= m && r.routable() {
                    short_fit.push(index);
                }
                continue;
            }
        }
        if !r.routable() {
            continue;
        }
        out.push(index);
    }
    if out.is_empty() {
        out = short_fit;
    }
    if serving == 0 {
        if unknown_lists > 0 {
            return Err(CandidateError::NoHealthy(req.model.clone()));
        }
        return Err(CandidateError::UnknownModel(req.model.clone()));
    }
    if out.is_empty() {
        if let Some(max) = longest.filter(|m| min_need > *m) {
            return Err(CandidateError::ContextTooLong {
                model: req.model.clone(),
                prompt: req.prompt_tokens,
                max,
            });
        }
        return Err(CandidateError::NoHealthy(req.model.clone()));
    }
    Ok(out)
}

/// One replica's candidate row at `now_s`: its own and its peers' load, its scrape where
/// fresh. Prefix matches are filled in afterwards, over all candidates at once. Inlined
/// into the push, so the ~380-byte row is written in place rather than copied.
#[inline(always)]
fn candidate<R: ReplicaView>(
    r: &R,
    index: usize,
    params: CandidateParams,
    now_s: f64,
) -> Candidate<'_> {
    let scraped = r.scraped();
    let scraped_age_s = scraped
        .as_ref()
        .map_or(f64::INFINITY, |s| (now_s - s.at_s).max(0.0));
    let peer = r.peer_load();
    let kv_capacity_tokens = scraped.as_ref().and_then(Scraped::kv_capacity_tokens);
    Candidate {
        replica: r,
        index,
        cached_tokens: 0,
        own: r.ledger().load(now_s),
        peers: peer.load,
        peers_age_s: (now_s - peer.updated_s).max(0.0),
        scraped: scraped.filter(|_| scraped_age_s <= params.stale_after_s),
        scraped_age_s,
        kv_capacity_tokens,
    }
}

/// What the prefix match needs of one replica.
struct Holder {
    id: u32,
    seq: u64,
    /// KV capacity in router blocks (`u64::MAX` unknown).
    capacity: u64,
    /// The engine's own cache block (tokens; 1 unknown), from a fresh scrape.
    engine_block: u32,
}

impl Holder {
    /// `kv_capacity_tokens` from the last scrape however old; `fresh_block` the engine
    /// block of the scrape where recent enough to use.
    fn of(
        r: &(impl ReplicaView + ?Sized),
        kv_capacity_tokens: Option<u64>,
        fresh_block: Option<u32>,
        block_tokens: u32,
    ) -> Self {
        Self {
            id: r.id(),
            seq: r.prefix_cursor().load(Relaxed),
            capacity: kv_capacity_tokens
                .map_or(u64::MAX, |t| (t / block_tokens.max(1) as u64).max(1)),
            engine_block: fresh_block.filter(|b| *b > 0).unwrap_or(1),
        }
    }
}

/// Sets each candidate's `cached_tokens` from the prefix index, then from the
/// engine's own KV events where the host has them (`req.exact_cached`).
pub fn fill_prefix_matches(
    req: &RequestProfile,
    cands: &mut [Candidate<'_>],
    prefix: &PrefixIndex,
    block_tokens: u32,
) {
    let holders: Vec<Holder> = cands
        .iter()
        .map(|c| {
            Holder::of(
                c.replica,
                c.kv_capacity_tokens,
                c.scraped.as_ref().and_then(|s| s.block_size),
                block_tokens,
            )
        })
        .collect();
    let counts = cached_tokens(req, &holders, prefix, block_tokens);
    for (c, n) in cands.iter_mut().zip(counts) {
        c.cached_tokens = n;
    }
}

/// Each holder's cached tokens for `req`: the prefix index's estimate, then the
/// engine's KV events where known.
fn cached_tokens(
    req: &RequestProfile,
    holders: &[Holder],
    prefix: &PrefixIndex,
    block_tokens: u32,
) -> Vec<u32> {
    let mut counts = estimate_prefix_matches(req, holders, prefix, block_tokens);
    for (h, n) in holders.iter().zip(counts.iter_mut()) {
        if let Some(e) = req.exact_cached.iter().find(|e| e.replica == h.id) {
            *n = if e.complete {
                e.tokens
            } else {
                e.tokens.max(*n)
            };
        }
    }
    counts
}

/// The prefix index's estimate of each holder's cached tokens.
fn estimate_prefix_matches(
    req: &RequestProfile,
    holders: &[Holder],
    prefix: &PrefixIndex,
    block_tokens: u32,
) -> Vec<u32> {
    let mut matched = vec![0u32; holders.len()];
    if req.blocks.is_empty() || holders.is_empty() {
        return matched;
    }
    let cursors: Vec<Cursor> = holders
        .iter()
        .map(|h| Cursor {
            replica: h.id,
            seq: h.seq,
            capacity: h.capacity,
        })
        .collect();
    prefix.match_lengths(&req.blocks, &cursors, &mut matched);
    for (h, m) in holders.iter().zip(matched.iter_mut()) {
        // vLLM always computes at least one prompt token, and caches whole blocks of its
        // own size (read from its `cache_config_info`), which may be larger than ours.
        let cached = (m.saturating_mul(block_tokens)).min(req.prompt_tokens.saturating_sub(1));
        *m = cached / h.engine_block * h.engine_block;
    }
    matched
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        policy::{Load, peers::testkit},
        view::{ModelEntry, PlainReplica, ServedModels},
    };

    fn params() -> CandidateParams {
        CandidateParams {
            block_tokens: 16,
            stale_after_s: 1.0,
        }
    }

    fn serving(r: &mut PlainReplica, model: &str) {
        r.models = ServedModels {
            models: vec![ModelEntry {
                id: model.into(),
                parent: None,
                max_model_len: Some(4096),
            }],
            known: true,
        };
    }

    #[test]
    fn cached_estimate_is_whole_engine_blocks_and_never_the_whole_prompt() {
        // Router blocks of 16, an engine caching blocks of 32 (its cache_config_info).
        let r = testkit::replica(0);
        let prefix = PrefixIndex::new(1024);
        let blocks: Vec<u64> = (1..=6).collect();
        prefix.record(&r.prefix_cursor, r.id, &blocks[..5], 0);
        let mut req = testkit::req(96);
        req.blocks = blocks;
        let mut s = *testkit::scraped(0.0, 0.0, 0.1);
        s.block_size = Some(32);
        let mut cands = vec![testkit::cand_s(&r, 0, Load::default(), Arc::new(s))];
        fill_prefix_matches(&req, &mut cands, &prefix, 16);
        // 5 router blocks = 80 tokens held, of which the engine caches 2 whole blocks.
        assert_eq!(cands[0].cached_tokens, 64);
        // A fully held prompt still computes its last token: 95 → 64 in blocks of 32.
        prefix.record(&r.prefix_cursor, r.id, &req.blocks, 5);
        fill_prefix_matches(&req, &mut cands, &prefix, 16);
        assert_eq!(cands[0].cached_tokens, 64);
        // Unknown engine block: the router's own granularity.
        cands[0].scraped = None;
        fill_prefix_matches(&req, &mut cands, &prefix, 16);
        assert_eq!(cands[0].cached_tokens, 95);
    }

    #[test]
    fn engine_event_counts_replace_the_estimate_and_bound_it_while_recovering() {
        use crate::policy::ExactCached;
        let (a, b, c) = (
            testkit::replica(0),
            testkit::replica(1),
            testkit::replica(2),
        );
        let prefix = PrefixIndex::new(1024);
        let blocks: Vec<u64> = (1..=6).collect();
        // The estimate believes every replica holds 4 router blocks (64 tokens).
        for r in [&a, &b, &c] {
            prefix.record(&r.prefix_cursor, r.id, &blocks[..4], 0);
        }
        let mut req = testkit::req(96);
        req.blocks = blocks;
        req.exact_cached = vec![
            // Precise: the engine evicted them, the count is what it will report.
            ExactCached {
                replica: a.id,
                tokens: 0,
                complete: true,
            },
            // Recovering: a lower bound; the estimate is larger, so it stands.
            ExactCached {
                replica: b.id,
                tokens: 32,
                complete: false,
            },
        ];
        let mut cands: Vec<_> = [&a, &b, &c]
            .iter()
            .map(|r| testkit::cand_s(r, 0, Load::default(), testkit::scraped(0.0, 0.0, 0.1)))
            .collect();
        fill_prefix_matches(&req, &mut cands, &prefix, 16);
        assert_eq!(cands[0].cached_tokens, 0);
        assert_eq!(cands[1].cached_tokens, 64);
        assert_eq!(cands[2].cached_tokens, 64, "no events: the estimate");
        // A recovering count above the estimate wins; exact counts apply without blocks.
        req.exact_cached[1].tokens = 80;
        fill_prefix_matches(&req, &mut cands, &prefix, 16);
        assert_eq!(cands[1].cached_tokens, 80);
        req.blocks.clear();
        req.exact_cached[0].tokens = 48;
        fill_prefix_matches(&req, &mut cands, &prefix, 16);
        assert_eq!(cands[0].cached_tokens, 48);
    }

    fn serving_len(r: &mut PlainReplica, max_model_len: u32) {
        serving(r, "m");
        r.models.models[0].max_model_len = Some(max_model_len);
        r.routable = true;
    }

    #[test]
    fn a_request_that_overruns_max_tokens_goes_where_it_fits_best_and_is_refused_only_when_the_prompt_does_not_fit()
     {
        let mut rs = testkit::replicas(2);
        serving_len(&mut rs[0], 4096);
        serving_len(&mut rs[1], 8192);
        let prefix = PrefixIndex::new(64);
        let mut req = testkit::req(4000);
        req.max_tokens = Some(256);
        // Only the long-context replica holds the whole request.
        let c = build_candidates(&req, &rs, &prefix, params(), 0.0).unwrap();
        assert_eq!(c.iter().map(|c| c.index).collect::<Vec<_>>(), vec![1]);
        // Where no replica holds prompt + max_tokens, the engine stops at its context's
        // end (vLLM does), so the request still goes out rather than failing here.
        serving_len(&mut rs[1], 4096);
        let c = build_candidates(&req, &rs, &prefix, params(), 0.0).unwrap();
        assert_eq!(c.len(), 2);
        // A prompt that fills the whole context leaves no room for one token: a 400.
        req.prompt_tokens = 4096;
        let err = build_candidates(&req, &rs, &prefix, params(), 0.0).unwrap_err();
        assert!(
            matches!(err, CandidateError::ContextTooLong { max: 4096, .. }),
            "{err}"
        );
    }

    /// The shortlisted build keeps the rows the full build followed by the shortlist
    /// keeps, identical, and draws the same random numbers: building only the kept
    /// rows changes the cost of a decision, not the decision.
    #[test]
    fn the_shortlisted_build_is_the_full_build_then_the_shortlist() {
        use crate::{ledger::BookingSpec, policy::shortlist, view::PeerLoad};
        use rand::{Rng, SeedableRng, rngs::SmallRng};
        let mut rs = testkit::replicas(40);
        let mut bookings = Vec::new();
        for (i, r) in rs.iter_mut().enumerate() {
            serving_len(r, 32_768);
            r.key.class = (i % 3) as u64;
            r.remote_rtt_ms = (i % 7 == 0).then_some(40.0);
            r.scraped = (i % 5 != 0).then(|| testkit::scraped(1.0, 2.0, 0.3));
            r.peer_load = PeerLoad {
                load: Load {
                    queued_prefill_tokens: (i * 37 % 11) as f64 * 100.0,
                    decode_remaining_tokens: (i % 4) as f64 * 50.0,
                    ..Load::default()
                },
                updated_s: 0.5,
            };
            for k in 0..(i % 3) {
                bookings.push(r.ledger.book(
                    BookingSpec {
                        prompt_tokens: 500 + 300 * k as u32,
                        cached_tokens: 0,
                        expected_output_tokens: 100,
                        tpot_slo_ms: None,
                        expected_ttft_s: None,
                        stream: true,
                    },
                    0.0,
                ));
            }
        }
        let mut req = testkit::req(2048);
        req.blocks = (1..=128).collect();
        let prefix = PrefixIndex::new(1 << 12);
        for r in rs.iter().step_by(3) {
            prefix.record(
                &r.prefix_cursor,
                r.id,
                &req.blocks[..(r.id as usize % 64)],
                0,
            );
        }
        req.exact_cached = vec![crate::policy::ExactCached {
            replica: 4,
            tokens: 1024,
            complete: true,
        }];
        for seed in 0..20 {
            let s = shortlist::Shortlist {
                size: 8,
                keep: Some(seed as u32),
            };
            let mut a = SmallRng::seed_from_u64(seed);
            let mut b = SmallRng::seed_from_u64(seed);
            let full = build_candidates(&req, &rs, &prefix, params(), 1.0).unwrap();
            let want = shortlist::select(&req, full, s, &mut a);
            let (got, eligible) =
                build_shortlisted(&req, &rs, &prefix, params(), 1.0, s, &mut b).unwrap();
            assert_eq!(eligible, 40);
            assert_eq!(got.len(), 8);
            let row = |c: &Candidate<'_>| {
                (
                    c.index,
                    c.cached_tokens,
                    format!("{:?} {:?} {:?}", c.own, c.peers, c.scraped),
                    c.kv_capacity_tokens,
                )
            };
            assert_eq!(
                got.iter().map(row).collect::<Vec<_>>(),
                want.iter().map(row).collect::<Vec<_>>()
            );
            assert_eq!(a.random::<u64>(), b.random::<u64>(), "same draws");
        }
        assert!(
            build_shortlisted(
                &req,
                &rs,
                &prefix,
                params(),
                1.0,
                shortlist::Shortlist {
                    size: 8,
                    keep: None
                },
                &mut SmallRng::seed_from_u64(1)
            )
            .unwrap()
            .0
            .iter()
            .any(|c| c.cached_tokens > 0),
            "the largest prefix holders are kept"
        );
    }

    #[test]
    fn absent_model_is_not_yet_while_a_list_is_unknown() {
        // A restarted node has not heard `/v1/models` yet: "try again", not "no such model".
        let mut rs = testkit::replicas(2);
        let prefix = PrefixIndex::new(64);
        let req = testkit::req(10);
        let err = build_candidates(&req, &rs, &prefix, params(), 0.0).unwrap_err();
        assert_eq!(err, CandidateError::NoHealthy("m".into()));
        // Once every list is known, an absent model is a definite 404.
        serving(&mut rs[0], "other");
        serving(&mut rs[1], "other");
        let err = build_candidates(&req, &rs, &prefix, params(), 0.0).unwrap_err();
        assert_eq!(err, CandidateError::UnknownModel("m".into()));
    }
}
