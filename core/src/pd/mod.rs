//! Prefill/decode disaggregation: the (prefill, decode) pair chosen as one candidate,
//! and per request whether disaggregating pays at all.
//!
//! Forecast of a pair (P, D) for a prompt of `n` tokens, `c_D` of them already cached
//! on D:
//!
//! ```text
//! TTFT = TTFT_P(queue + prefill of n, one output token)      predictor, P's model
//!      + transfer(P→D, (n − c_D) × kv_bytes_per_token)        link model, learned (link.rs)
//!      + TPOT_D                                                D's first decode step
//! TPOT = TPOT_D(with D's running requests, the prompt cached)  predictor, D's model
//! ```
//!
//! Bounds add the same way (P's effective TTFT bound + the link's upper bound + D's
//! TPOT bound); the pair is then judged by the `slo` policy's own [`evaluate`] (tiers,
//! violation probability, the running-requests TPOT guard on D) and chosen at random
//! among near-equals (`near_equal`, `cost_tolerance`), so nodes holding the same view
//! do not herd onto one pair.
//!
//! Unified or disaggregated, per request: a prompt whose uncached part is shorter than
//! `min_prompt_tokens` runs unified (the transfer and the second hop cost more than
//! they save; on a pure P/D fleet a decode replica prefills it); so does one a `both`
//! replica is predicted to serve within both objectives. Otherwise the best pair
//! wins if it is in a better tier, or equal and less likely to miss. While most
//! prefill models are cold the threshold alone decides, P by least queued prefill
//! and D by fewest running requests (`cold-model`).
//!
//! Cost: |P| + |D| predictions and |P|·|D| pair evaluations (64 × 64 = 4,096 cheap
//! evaluations, no predictor calls) per disaggregated decision.

pub mod admit;
pub mod link;

use headroom_predictor::{ModelState, Prediction};
use serde::{Deserialize, Serialize};

use crate::{
    decide::{Learn, RouteInputs, RoutedTarget},
    policy::{
        Candidate, CandidateError, RequestProfile, build_candidates,
        candidates::build_role_candidates,
        features,
        slo::{Eval, SloConfig, cost_near, evaluate, near_best, order, within_tier_key},
    },
    view::{ReplicaView, Role},
};
pub use admit::{PdAdmit, admit, no_fit};
pub use link::{LinkModel, Links, TransferEstimate};

/// `[pd]` in the config: when and how requests are disaggregated.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct PdConfig {
    /// Prompts with fewer uncached tokens than this run unified.
    pub min_prompt_tokens: u32,
    /// The served model's KV cache bytes per token (K and V, all layers).
    pub kv_bytes_per_token: f64,
    /// Configured P→D link bandwidth (GB/s), before any link is measured.
    pub link_gbytes_per_s: f64,
    /// Configured P→D link latency (ms).
    pub link_latency_ms: f64,
    /// Weight of each measured transfer in its link's correction (0..1].
    pub link_learning_rate: f64,
    /// How the engines move the KV from P to D.
    pub connector: KvConnector,
}

/// The engines' KV connector, which decides what the two stages' requests carry.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum KvConnector {
    /// vLLM's NixlConnector: P gets `kv_transfer_params: {"do_remote_decode": true}`
    /// and answers with the params D needs to pull the KV; D gets them.
    #[default]
    Nixl,
    /// vLLM's shared-storage connector (`ExampleConnector`, `kv_both` on one path): P
    /// stores the prompt's KV as it prefills, D finds it by the prompt's hash. Neither
    /// request carries `kv_transfer_params`.
    SharedStorage,
}

impl Default for PdConfig {
    fn default() -> Self {
        Self {
            min_prompt_tokens: 512,
            // Llama-3-8B in bf16: 2 × 32 layers × 8 KV heads × 128 × 2 bytes.
            kv_bytes_per_token: 131_072.0,
            link_gbytes_per_s: 10.0,
            link_latency_ms: 1.0,
            link_learning_rate: 0.2,
            connector: KvConnector::Nixl,
        }
    }
}

impl PdConfig {
    pub fn link_model(&self) -> LinkModel {
        LinkModel {
            kv_bytes_per_token: self.kv_bytes_per_token,
            bandwidth_bytes_per_s: self.link_gbytes_per_s * 1e9,
            latency_s: self.link_latency_ms / 1e3,
            learning_rate: self.link_learning_rate,
        }
    }
}

/// A disaggregated placement: prefill targets and decode targets, each ranked (the
/// chosen pair first in both; the rest are where retries go).
#[derive(Clone, Debug)]
pub struct PdPlan {
    /// Into the replica slice; `learn` is P's own TTFT model input and forecast.
    pub prefill: Vec<RoutedTarget>,
    /// Into the replica slice; `learn` is D's (the prompt arrives cached).
    pub decode: Vec<RoutedTarget>,
    /// The chosen pair's forecast (TTFT end to end, TPOT on D).
    pub prediction: Prediction,
    pub transfer: TransferEstimate,
    /// Tokens moved P→D (the prompt less what D holds).
    pub transfer_tokens: u32,
    pub eval: Eval,
    /// `cold-model` while the threshold alone decided; `no-fit` when no pair meets
    /// both objectives.
    pub fallback: Option<&'static str>,
}

/// Everything the P/D decision reads besides the ordinary route inputs.
pub struct PdInputs<'a> {
    pub cfg: &'a PdConfig,
    pub slo: &'a SloConfig,
    pub links: &'a Links,
}

/// The profile of the prefill stage: one output token, never streamed.
pub fn prefill_profile(profile: &RequestProfile) -> RequestProfile {
    let mut p = profile.clone();
    p.max_tokens = Some(1);
    p.expected_output_tokens = 1;
    p.stream = false;
    p
}

struct Stage<'a> {
    cands: Vec<Candidate<'a>>,
    preds: Vec<Prediction>,
    learn: Vec<Learn>,
}

fn stage<'a>(
    profile: &RequestProfile,
    mut cands: Vec<Candidate<'a>>,
    snap: &headroom_predictor::Snapshot,
    all_cached: bool,
) -> Stage<'a> {
    let mut preds = Vec::with_capacity(cands.len());
    let mut learn = Vec::with_capacity(cands.len());
    for c in cands.iter_mut() {
        if all_cached {
            // The transferred KV lands in D's cache: D computes the last token only.
            c.cached_tokens = profile.prompt_tokens.saturating_sub(1);
        }
        let key = features::key(c);
        let obs = features::observation(profile, c);
        let prediction = snap.predict(key, &obs);
        preds.push(prediction);
        // The stage's forecast is engine-side: no round trip is added for P/D
        // placements (pairs across regions are not modelled).
        learn.push(Learn {
            key,
            obs,
            prediction,
            rtt_ms: 0.0,
        });
    }
    Stage {
        cands,
        preds,
        learn,
    }
}

/// The pair's forecast from P's and D's and the link's.
pub fn pair_prediction(p: &Prediction, d: &Prediction, t: &TransferEstimate) -> Prediction {
    let t_ms = t.seconds * 1e3;
    let t_up = t.upper_s * 1e3;
    let p_bound = p.ttft_upper_ms.max(p.ttft_ms + p.ttft_recent_abs_err_ms);
    let d_bound = d.tpot_upper_ms.max(d.tpot_ms + d.tpot_recent_abs_err_ms);
    let median = p.ttft_median_ms + t_ms + d.tpot_median_ms;
    let upper = p_bound + t_up + d_bound;
    let mut out = *d;
    out.ttft_ms = p.ttft_ms + t_ms + d.tpot_ms;
    out.ttft_upper_ms = upper;
    out.ttft_median_ms = median.max(1e-6);
    // The spread that puts the pair's p90 at its bound (z₀.₉ = 1.2816).
    out.ttft_log_sigma = ((upper / out.ttft_median_ms).max(1.0)).ln() / 1.2816;
    out.ttft_recent_abs_err_ms = 0.0;
    out.ttft_state = p.ttft_state;
    out.ttft_wait_ms = p.ttft_wait_ms;
    out.ttft_guarded = p.ttft_guarded;
    out
}

/// Decides whether `profile` is disaggregated at `now_s`, and onto which pair.
/// `Ok(None)`: run it unified (no pair, a short prompt, or a unified replica fits).
pub fn plan<R: ReplicaView>(
    inp: &RouteInputs<'_, R>,
    pd: &PdInputs<'_>,
    profile: &RequestProfile,
    now_s: f64,
    rng: &mut dyn rand::RngCore,
) -> Result<Option<PdPlan>, CandidateError> {
    if profile.prompt_tokens < pd.cfg.min_prompt_tokens {
        return Ok(None);
    }
    let pre = prefill_profile(profile);
    let (Ok(pc), Ok(dc)) = (
        build_role_candidates(
            &pre,
            inp.replicas,
            inp.prefix,
            inp.params,
            now_s,
            Role::Prefill,
        ),
        build_role_candidates(
            profile,
            inp.replicas,
            inp.prefix,
            inp.params,
            now_s,
            Role::Decode,
        ),
    ) else {
        return Ok(None);
    };
    let snap = inp.predictor.load();
    // What each decode replica holds of the prompt decides how much moves.
    let d_cached: Vec<u32> = dc.iter().map(|c| c.cached_tokens).collect();
    let ps = stage(&pre, pc, &snap, false);
    let ds = stage(profile, dc, &snap, true);
    let unified = build_candidates(profile, inp.replicas, inp.prefix, inp.params, now_s).ok();
    // Only a `both` replica is an alternative to the pair: a decode replica that
    // prefilled a long prompt itself would stall the requests decoding there.
    let both: Vec<Candidate<'_>> = unified
        .iter()
        .flatten()
        .filter(|c| c.replica.role() == Role::Both)
        .cloned()
        .collect();
    let best_cached = unified
        .iter()
        .flatten()
        .map(|c| c.cached_tokens)
        .max()
        .unwrap_or(0);
    if profile.prompt_tokens.saturating_sub(best_cached) < pd.cfg.min_prompt_tokens {
        return Ok(None);
    }
    let n = profile.prompt_tokens;
    let transfer = |i: usize, j: usize| {
        let tokens = n.saturating_sub(d_cached[j]);
        (
            pd.links.estimate(ps.learn[i].key, ds.learn[j].key, tokens),
            tokens,
        )
    };
    let warm_p = ps
        .preds
        .iter()
        .filter(|p| p.ttft_state == ModelState::Warm)
        .count();
    if (warm_p as f64) < pd.slo.min_warm_fraction * ps.cands.len() as f64 {
        // Cold: the threshold decided; P by least queued prefill, D by fewest requests.
        let p_order = crate::policy::rank::by_cost(
            &ps.cands
                .iter()
                .map(|c| c.load().queued_prefill_tokens + f64::from(n - c.cached_tokens.min(n)))
                .collect::<Vec<_>>(),
            rng,
        );
        let d_order = crate::policy::rank::by_cost(
            &ds.cands
                .iter()
                .map(|c| c.load().requests)
                .collect::<Vec<_>>(),
            rng,
        );
        let (i, j) = (p_order[0], d_order[0]);
        let (t, tokens) = transfer(i, j);
        let prediction = pair_prediction(&ps.preds[i], &ds.preds[j], &t);
        let eval = evaluate(
            &prediction,
            profile.slo.ttft_ms,
            profile.slo.tpot_ms,
            ds.cands[j].load().min_tpot_slo_ms,
        );
        return Ok(Some(PdPlan {
            prefill: targets(&ps, &p_order, inp.max_targets),
            decode: targets(&ds, &d_order, inp.max_targets),
            prediction,
            transfer: t,
            transfer_tokens: tokens,
            eval,
            fallback: Some("cold-model"),
        }));
    }
    // Every pair, judged as one candidate.
    let mut pairs = Vec::with_capacity(ps.cands.len() * ds.cands.len());
    let mut evals = Vec::with_capacity(pairs.capacity());
    for i in 0..ps.cands.len() {
        for j in 0..ds.cands.len() {
            let (t, tokens) = transfer(i, j);
            let pred = pair_prediction(&ps.preds[i], &ds.preds[j], &t);
            let guard = ds.cands[j].load().min_tpot_slo_ms;
            evals.push(evaluate(
                &pred,
                profile.slo.ttft_ms,
                profile.slo.tpot_ms,
                guard,
            ));
            pairs.push((i, j, pred, t, tokens));
        }
    }
    let ranked = order(&evals, rng);
    let choice = pick_band(&evals, &ranked, pd.slo, rng);
    let best = evals[choice];
    // A unified placement that fits, or fares at least as well, keeps the request whole.
    if !both.is_empty() {
        let ub = best_unified(profile, &both, &snap);
        let pair_better = best.tier < ub.tier
            || (best.tier == ub.tier && best.p_violate + pd.slo.near_equal < ub.p_violate);
        if ub.tier == 0 || !pair_better {
            return Ok(None);
        }
    }
    let (ci, cj, prediction, t, tokens) = pairs[choice];
    // Each stage's retry order: the chosen one, then by the best pair it is part of.
    let mut p_order = vec![ci];
    let mut d_order = vec![cj];
    for &k in &ranked {
        let (i, j, ..) = pairs[k];
        if !p_order.contains(&i) {
            p_order.push(i);
        }
        if !d_order.contains(&j) {
            d_order.push(j);
        }
    }
    Ok(Some(PdPlan {
        prefill: targets(&ps, &p_order, inp.max_targets),
        decode: targets(&ds, &d_order, inp.max_targets),
        prediction,
        transfer: t,
        transfer_tokens: tokens,
        eval: best,
        fallback: (best.tier > 0).then_some("no-fit"),
    }))
}

fn targets(s: &Stage<'_>, order: &[usize], max: usize) -> Vec<RoutedTarget> {
    order
        .iter()
        .take(max.max(1))
        .map(|&i| RoutedTarget {
            index: s.cands[i].index,
            cached_tokens: s.cands[i].cached_tokens,
            learn: s.learn[i],
        })
        .collect()
}

/// The best unified candidate's evaluation (the `slo` policy's, without the cost
/// terms that only order candidates).
fn best_unified(
    profile: &RequestProfile,
    u: &[Candidate<'_>],
    snap: &headroom_predictor::Snapshot,
) -> Eval {
    u.iter()
        .map(|c| {
            let load = c.load();
            let p = snap.predict(
                features::key(c),
                &features::observation_with(profile, c, &load),
            );
            evaluate(
                &p,
                profile.slo.ttft_ms,
                profile.slo.tpot_ms,
                load.min_tpot_slo_ms,
            )
        })
        .min_by(|a, b| {
            a.tier
                .cmp(&b.tier)
                .then(within_tier_key(a).total_cmp(&within_tier_key(b)))
        })
        .unwrap_or(Eval {
            tier: 2,
            p_violate: 1.0,
            cost: f64::INFINITY,
            lateness: f64::INFINITY,
            ttft_ok: false,
            tpot_ok: false,
            ttft_headroom_ms: f64::NEG_INFINITY,
            tpot_headroom_ms: f64::NEG_INFINITY,
            kv_overflow: 0.0,
            wasted_prefill: 1.0,
        })
}

/// The `slo` policy's anti-herd rule over pairs: within the best tier, the tier's key
/// ([`within_tier_key`]: violation probability within `near_equal` of the best where it
/// fits, lateness within `cost_tolerance` where it does not), then cost near the
/// cheapest ([`cost_near`]), chosen at random.
fn pick_band(
    evals: &[Eval],
    ranked: &[usize],
    slo: &SloConfig,
    rng: &mut dyn rand::RngCore,
) -> usize {
    use rand::Rng;
    let first = evals[ranked[0]];
    let best = within_tier_key(&first);
    let band: Vec<usize> = ranked
        .iter()
        .copied()
        .filter(|&k| evals[k].tier == first.tier && near_best(&evals[k], best, slo, 0.0))
        .collect();
    let cheapest = band
        .iter()
        .map(|&k| evals[k].cost)
        .fold(f64::INFINITY, f64::min);
    let near: Vec<usize> = band
        .into_iter()
        .filter(|&k| cost_near(evals[k].cost, cheapest, slo, 0.0))
        .collect();
    near.get(rng.random_range(0..near.len().max(1)))
        .copied()
        .unwrap_or(ranked[0])
}

#[cfg(test)]
mod tests;
