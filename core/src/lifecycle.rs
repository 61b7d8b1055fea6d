//! One request's life in the routing core, the same for the proxy and the simulator:
//! **admit** (go / wait / reject, within the defer budget and the node's limit on
//! deferred requests), **dispatch** (book the placement in the replica's ledger;
//! remember the prefix once the replica accepted it), **finish** (the samples the
//! predictor learns from). The hosts only move bytes or virtual time between these.
//!
//! Invariants: a request holds at most one deferral slot, from its first "wait" until
//! its admission is dropped, so the node's count of deferred requests never exceeds
//! the requests waiting; a wait never reaches past the request's deadline (arrival +
//! `min(defer_budget × its TTFT objective, max_wait)`, the same deadline the admission
//! gate, [`crate::admission`], holds it to before routing); every admitted request carries the policy's
//! own fallback label, or the lifecycle's (`deferred`, `defer-full`,
//! `defer-expired`) when deferral decided; a TTFT label is censored exactly when no
//! token came and the attempt failed (the wait is then a lower bound); every decision
//! judges the TTFT objective that is left, `objective − (now − arrival)`, since the
//! client's clock started when the request reached the router (reading, tokenizing,
//! the tenant's gate and deferrals all spend it), while the TTFT label the model learns
//! is dispatch → first token, the replica's part alone.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering::Relaxed},
};

use headroom_predictor::{ModelState, Sample};

use crate::{
    decide::{Learn, Routed, RoutedTarget, Verdict},
    ledger::{Booking, BookingSpec},
    policy::{NoFit, RequestProfile, Slo},
    prefix::PrefixIndex,
    view::ReplicaView,
};

/// Label of a request placed after waiting (the policy had no label of its own).
pub const DEFERRED: &str = "deferred";
/// Label of a request placed least-bad because too many were deferred already.
pub const DEFER_FULL: &str = "defer-full";
/// Label of a request placed least-bad because its deadline came.
pub const DEFER_EXPIRED: &str = "defer-expired";

/// Least TTFT objective a decision is asked to meet (ms), however long the request
/// waited: positive, so the policy's arithmetic stays finite.
pub const MIN_TTFT_LEFT_MS: f64 = 1.0;
/// Shortest and longest single wait between two decisions (s).
const MIN_WAIT_S: f64 = 0.001;
const MAX_WAIT_S: f64 = 1.0;

/// The limits of deferral (from the `slo` settings).
#[derive(Clone, Copy, Debug)]
pub struct DeferLimits {
    /// Share of the TTFT objective a request may spend deferred.
    pub budget: f64,
    /// Most requests deferred at once on a node.
    pub max_deferred: usize,
    /// Longest any request waits (s), whatever its objective (`admission.max_wait_ms`).
    pub max_wait_s: f64,
}

impl DeferLimits {
    /// When a request that arrived at `arrived_s` must be placed or refused.
    pub fn deadline_s(&self, profile: &RequestProfile, arrived_s: f64) -> f64 {
        let budget_s = profile.slo.ttft_ms / 1e3 * self.budget;
        arrived_s + budget_s.min(self.max_wait_s).max(0.0)
    }
}

/// A node's count of requests deferred now (shared by its requests).
#[derive(Debug, Default)]
pub struct Deferrals(AtomicUsize);

impl Deferrals {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Requests deferred now.
    pub fn waiting(&self) -> usize {
        self.0.load(Relaxed)
    }
}

/// One request's place among the deferred; released on drop.
#[derive(Debug)]
struct DeferSlot(Arc<Deferrals>);

impl Drop for DeferSlot {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Relaxed);
    }
}

/// What to do with a request now.
#[derive(Debug)]
pub enum Admit {
    /// Dispatch to these targets in order (the first is the choice), labelled.
    Go {
        targets: Vec<RoutedTarget>,
        fallback: Option<&'static str>,
    },
    /// Decide again after this many seconds.
    Wait(f64),
    /// Refuse, saying why and when to retry.
    Reject(NoFit),
}

/// One request's admission: its deadline and its deferral slot, if it waited.
#[derive(Debug)]
pub struct Admission {
    arrived_s: f64,
    deadline_s: f64,
    limits: DeferLimits,
    deferrals: Arc<Deferrals>,
    slot: Option<DeferSlot>,
}

impl Admission {
    /// A request that arrived at `arrived_s` (the node's time axis).
    pub fn new(
        profile: &RequestProfile,
        arrived_s: f64,
        limits: DeferLimits,
        deferrals: Arc<Deferrals>,
    ) -> Self {
        Self {
            arrived_s,
            deadline_s: limits.deadline_s(profile, arrived_s),
            limits,
            deferrals,
            slot: None,
        }
    }

    /// The objectives a decision at `now_s` must meet: the `asked` TTFT less the time
    /// already spent since arrival (TPOT is untouched). Floored at [`MIN_TTFT_LEFT_MS`]:
    /// a request already past its TTFT objective cannot meet it, and is placed as one
    /// that nothing fits (its tenant's fallback).
    pub fn remaining(&self, asked: Slo, now_s: f64) -> Slo {
        let spent_ms = ((now_s - self.arrived_s) * 1e3).max(0.0);
        Slo {
            ttft_ms: (asked.ttft_ms - spent_ms).max(MIN_TTFT_LEFT_MS),
            tpot_ms: asked.tpot_ms,
        }
    }

    /// Whether the request has waited.
    pub fn deferred(&self) -> bool {
        self.slot.is_some()
    }

    /// Turns a decision made at `now_s` into what to do.
    pub fn admit(&mut self, routed: Routed, now_s: f64) -> Admit {
        let go = |targets, fallback| Admit::Go { targets, fallback };
        match routed.verdict {
            Verdict::Go => {
                let fallback = match routed.fallback {
                    None if self.slot.is_some() => Some(DEFERRED),
                    f => f,
                };
                go(routed.targets, fallback)
            }
            Verdict::Defer(after_s) => {
                let wait = if after_s.is_finite() {
                    after_s.clamp(MIN_WAIT_S, MAX_WAIT_S)
                } else {
                    MAX_WAIT_S
                };
                if self.slot.is_none() {
                    let before = self.deferrals.0.fetch_add(1, Relaxed);
                    self.slot = Some(DeferSlot(self.deferrals.clone()));
                    if before >= self.limits.max_deferred {
                        return go(routed.targets, Some(DEFER_FULL));
                    }
                }
                if now_s + wait > self.deadline_s {
                    return go(routed.targets, Some(DEFER_EXPIRED));
                }
                Admit::Wait(wait)
            }
            Verdict::Reject(no) => Admit::Reject(no),
        }
    }
}

/// Books a placement on `replica` (released when the booking drops). A warm TTFT
/// forecast in the target's prediction paces the ledger's estimate of prefill progress.
pub fn book(
    replica: &dyn ReplicaView,
    profile: &RequestProfile,
    target: &RoutedTarget,
    now_s: f64,
) -> Booking {
    // The ledger paces the engine's prefill: the engine-side forecast.
    let p = &crate::region::without_rtt(target.learn.prediction, target.learn.rtt_ms);
    replica.ledger().book(
        BookingSpec {
            prompt_tokens: profile.prompt_tokens,
            cached_tokens: target.cached_tokens,
            expected_output_tokens: profile.expected_output_tokens,
            tpot_slo_ms: Some(profile.slo.tpot_ms),
            expected_ttft_s: (p.ttft_state == ModelState::Warm).then_some(p.ttft_ms / 1e3),
            stream: profile.stream,
        },
        now_s,
    )
}

/// Records in the prefix index that `replica` accepted the request (it now holds the
/// prompt's blocks).
pub fn remember_prefix(
    prefix: &PrefixIndex,
    replica: &dyn ReplicaView,
    profile: &RequestProfile,
    target: &RoutedTarget,
    block_tokens: u32,
) {
    prefix.record(
        replica.prefix_cursor(),
        replica.id(),
        &profile.blocks,
        matched_blocks(target, block_tokens),
    );
}

/// Leading blocks of the prompt `target` was presumed to hold (cache hits): a record
/// touches them and inserts the rest.
pub fn matched_blocks(target: &RoutedTarget, block_tokens: u32) -> usize {
    (target.cached_tokens / block_tokens.max(1)) as usize
}

/// What the engine reported about a request's prompt (usage), where it did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reported {
    pub prompt_tokens: Option<u32>,
    pub cached_tokens: Option<u32>,
}

/// `l` with the request's own inputs as the engine reported them: its prompt tokens,
/// and cached tokens where given (else the router's estimate, within the prompt). The
/// model then learns what the engine did, not what the router guessed at dispatch.
pub fn as_reported(l: &Learn, r: Reported) -> Learn {
    let mut l = *l;
    if let Some(p) = r.prompt_tokens.filter(|p| *p > 0) {
        l.obs.prompt_tokens = f64::from(p);
    }
    if let Some(c) = r.cached_tokens {
        l.obs.cached_tokens = f64::from(c);
    }
    l.obs.cached_tokens = l.obs.cached_tokens.min(l.obs.prompt_tokens);
    l
}

/// The TTFT sample at the first token (learned at once, not at the end).
pub fn first_token_sample(l: &Learn, at_s: f64, ttft_ms: f64, r: Reported) -> Option<Sample> {
    sample(&as_reported(l, r), at_s, Some(ttft_ms), None, 0, false)
}

/// How a placed request ended, as the host measured it.
#[derive(Clone, Copy, Debug)]
pub struct Finished {
    /// Completed normally (no upstream failure or timeout).
    pub ok: bool,
    /// Dispatch → first token, if one came (ms).
    pub ttft_ms: Option<f64>,
    /// The TTFT label was learned at the first token already.
    pub ttft_learned: bool,
    /// Dispatch → end (ms): a lower bound on TTFT when no token came.
    pub upstream_ms: f64,
    /// The TPOT label (ms), if measured.
    pub tpot_ms: Option<f64>,
    pub output_tokens: u32,
    pub reported: Reported,
}

/// The labels a finished request gives: what is scored against the forecast and
/// learned.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Labels {
    /// TTFT still to learn (ms); a lower bound when `censored`.
    pub ttft_ms: Option<f64>,
    pub censored: bool,
    /// TPOT (ms), only from a request that completed.
    pub tpot_ms: Option<f64>,
}

impl Finished {
    /// The labels still to learn.
    pub fn labels(&self) -> Labels {
        let ttft_ms = if self.ttft_learned {
            None
        } else {
            match self.ttft_ms {
                Some(t) => Some(t),
                // No token ever came: the request waited at least this long.
                None if !self.ok => Some(self.upstream_ms),
                None => None,
            }
        };
        Labels {
            ttft_ms,
            censored: ttft_ms.is_some() && self.ttft_ms.is_none(),
            tpot_ms: self.tpot_ms.filter(|_| self.ok),
        }
    }

    /// The samples to learn at `at_s`: one carrying both labels when both are exact,
    /// else TTFT and TPOT apart (one may be censored while the other is not).
    pub fn samples(&self, l: &Learn, at_s: f64) -> Vec<Sample> {
        let lb = self.labels();
        let l = as_reported(l, self.reported);
        let out = self.output_tokens;
        if lb.ttft_ms.is_some() && lb.tpot_ms.is_some() && !lb.censored {
            return sample(&l, at_s, lb.ttft_ms, lb.tpot_ms, out, false)
                .into_iter()
                .collect();
        }
        [
            sample(&l, at_s, lb.ttft_ms, None, out, lb.censored),
            sample(&l, at_s, None, lb.tpot_ms, out, false),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The training sample for a placement (`None` when nothing was measured).
fn sample(
    learn: &Learn,
    at_s: f64,
    ttft_ms: Option<f64>,
    tpot_ms: Option<f64>,
    output_tokens: u32,
    censored: bool,
) -> Option<Sample> {
    if ttft_ms.is_none() && tpot_ms.is_none() {
        return None;
    }
    // Engine-side, whichever region measured it: the round trip is the network's.
    let rtt = learn.rtt_ms;
    Some(Sample {
        key: learn.key,
        obs: learn.obs,
        at_s,
        ttft_ms: ttft_ms.map(|t| (t - rtt).max(0.0)),
        tpot_ms,
        output_tokens,
        censored,
        predicted: Some(crate::region::without_rtt(learn.prediction, rtt)),
    })
}
