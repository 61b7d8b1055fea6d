//! A P/D placement through the request lifecycle's admission: when no (P, D) pair
//! meets both objectives the tenant's fallback decides, with the same defer budget,
//! node-wide limit on deferred requests, single-wait bounds and labels as a unified
//! placement ([`crate::lifecycle::Admission`]): least-bad goes at once, reject refuses
//! (503 with the pair's `Retry-After`), defer waits `slo.defer_poll_ms` and asks again
//! until a pair fits (`deferred`), the node is full of deferred requests
//! (`defer-full`) or the deadline comes (`defer-expired`), and then takes the pair
//! it has.
//!
//! Invariant: the verdict is the unified path's for the same evaluation — a plan in
//! tier 0, or one the cold-model threshold chose, always goes.

use crate::{
    decide::{Routed, Verdict},
    lifecycle::{Admission, Admit},
    policy::{
        Fallback, NoFit, RequestProfile,
        slo::{SloConfig, retry_after_s},
    },
};

use super::PdPlan;

/// What to do with a disaggregated placement now.
#[derive(Debug)]
pub enum PdAdmit {
    /// Run it: the plan, its fallback label set as the lifecycle decided.
    Go(Box<PdPlan>),
    /// Decide again (plan again) after this many seconds.
    Wait(f64),
    /// Refuse, saying why and when to retry.
    Reject(NoFit),
}

/// The refusal of a plan no pair fits: the best pair's bounds and the queue its
/// prefill replica must drain.
pub fn no_fit(plan: &PdPlan, profile: &RequestProfile) -> NoFit {
    NoFit::new(
        format!(
            "no prefill/decode pair can meet TTFT ≤ {:.0} ms and TPOT ≤ {:.0} ms; best bounds {:.0} / {:.0} ms",
            profile.slo.ttft_ms,
            profile.slo.tpot_ms,
            plan.prediction.ttft_upper_ms,
            plan.prediction.tpot_upper_ms
        ),
        retry_after_s(&plan.prediction, profile.slo.ttft_ms),
    )
}

/// The policy's verdict on a plan: go, or the tenant's fallback when no pair fits.
pub fn verdict(plan: &PdPlan, profile: &RequestProfile, slo: &SloConfig) -> Verdict {
    if plan.eval.tier == 0 || plan.fallback == Some("cold-model") {
        return Verdict::Go;
    }
    match profile.fallback {
        Fallback::LeastBad => Verdict::Go,
        // As `slo`: refused only when the plan would likely miss, not for its bound.
        Fallback::Reject if plan.eval.p_violate < slo.reject_above => Verdict::Go,
        Fallback::Reject => Verdict::Reject(no_fit(plan, profile)),
        Fallback::Defer => Verdict::Defer(slo.defer_poll_ms as f64 / 1e3),
    }
}

/// Admits `plan` decided at `now_s` for the request `admission` belongs to.
pub fn admit(
    admission: &mut Admission,
    mut plan: PdPlan,
    profile: &RequestProfile,
    slo: &SloConfig,
    now_s: f64,
) -> PdAdmit {
    let routed = Routed {
        verdict: verdict(&plan, profile, slo),
        // The lifecycle passes targets through untouched; the plan keeps both stages.
        targets: Vec::new(),
        fallback: plan.fallback,
        decision_ns: 0,
        explain: None,
    };
    match admission.admit(routed, now_s) {
        Admit::Go { fallback, .. } => {
            plan.fallback = fallback;
            PdAdmit::Go(Box::new(plan))
        }
        Admit::Wait(s) => PdAdmit::Wait(s),
        Admit::Reject(no) => PdAdmit::Reject(no),
    }
}
