//! One decision record: what the router knew about the request and every candidate
//! when it decided, what it did, and — once the response ended — what was measured.
//!
//! Written in three steps by three owners: the HTTP front opens it (the request and
//! its objectives), the proxy adds the decision ([`Decided::from_routed`], the last
//! one when the request was deferred), the response body closes it ([`Measured`]).
//! Why a candidate lost is derived when the record is read, not when it is written,
//! so the request path formats no text.

use serde::Serialize;

use headroom_core::{Routed, Verdict, explain::CandidateNote, policy::RequestProfile};
use headroom_predictor::features::{TTFT_DIM, TTFT_TERM_KEYS};

use crate::fleet::Replica;

/// The request as routing saw it.
#[derive(Clone, Debug, Serialize)]
pub struct Asked {
    pub tenant: String,
    pub model: String,
    pub prompt_tokens: u32,
    pub prefix_blocks: usize,
    pub max_tokens: Option<u32>,
    pub expected_output_tokens: u32,
    pub slo_ttft_ms: f64,
    pub slo_tpot_ms: f64,
    pub stream: bool,
    /// The prompt's prefix blocks, kept only for the request log.
    #[serde(skip)]
    pub blocks: Vec<u64>,
}

impl Asked {
    /// `keep_blocks`: hold the prefix blocks too (for the request log).
    pub fn new(tenant: &str, p: &RequestProfile, keep_blocks: bool) -> Self {
        Self {
            blocks: if keep_blocks {
                p.blocks.clone()
            } else {
                Vec::new()
            },
            tenant: tenant.to_string(),
            model: p.model.clone(),
            prompt_tokens: p.prompt_tokens,
            prefix_blocks: p.blocks.len(),
            max_tokens: p.max_tokens,
            expected_output_tokens: p.expected_output_tokens,
            slo_ttft_ms: p.slo.ttft_ms,
            slo_tpot_ms: p.slo.tpot_ms,
            stream: p.stream,
        }
    }
}

/// In-flight work on a replica, as the decision read it.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LoadNote {
    pub requests: f64,
    pub queued_requests: f64,
    pub queued_prefill_tokens: f64,
    pub decoding_requests: f64,
    pub decode_context_tokens: f64,
    /// How long this node's oldest waiting stream there had waited (s).
    pub queue_age_s: f64,
}

impl From<&headroom_core::ledger::Load> for LoadNote {
    fn from(l: &headroom_core::ledger::Load) -> Self {
        Self {
            requests: l.requests,
            queued_requests: l.queued_requests,
            queued_prefill_tokens: l.queued_prefill_tokens,
            decoding_requests: l.decoding_requests,
            decode_context_tokens: l.decode_context_tokens,
            queue_age_s: l.queue_age_s,
        }
    }
}

/// The forecast for one candidate (ms).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Forecast {
    pub ttft_ms: f64,
    pub ttft_upper_ms: f64,
    pub tpot_ms: f64,
    pub tpot_upper_ms: f64,
    pub ttft_state: headroom_predictor::ModelState,
    pub tpot_state: headroom_predictor::ModelState,
    /// The recent-error guard widened the bound (recent errors in this forecast's regime
    /// beyond what its calibrated band allows).
    pub ttft_guarded: bool,
    pub tpot_guarded: bool,
}

/// A TTFT forecast's terms (ms), serialised as an object keyed by term name.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TtftTerms(pub [f64; TTFT_DIM]);

impl Serialize for TtftTerms {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(TTFT_DIM))?;
        for (k, v) in TTFT_TERM_KEYS.iter().zip(&self.0) {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// The `slo` policy's judgement of one candidate.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Judged {
    /// 0 both objectives met, 1 one missed, 2 both missed.
    pub tier: u8,
    pub p_violate: f64,
    pub cost: f64,
    /// What ranks a tier that misses (`slo::Eval::lateness`).
    pub lateness: f64,
    pub ttft_ok: bool,
    pub tpot_ok: bool,
    pub ttft_headroom_ms: f64,
    pub tpot_headroom_ms: f64,
    /// How far past its KV capacity the placement would take the replica (share of the
    /// capacity; 0: it has room).
    pub kv_overflow: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct CandidateRecord {
    /// Shared with the replica (no copy per record).
    pub replica: std::sync::Arc<str>,
    pub class: std::sync::Arc<str>,
    /// Position in the ranking (0 = chosen); `None`: not ranked (rejected decision).
    pub rank: Option<usize>,
    pub cached_tokens: u32,
    pub load: LoadNote,
    pub peer_load: LoadNote,
    pub peer_load_age_s: f64,
    pub kv_usage: Option<f64>,
    /// The same scrape's running and waiting requests (waiting includes the preempted)
    /// and preemptions per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_running: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_waiting: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_preemptions_per_s: Option<f64>,
    pub scraped_age_s: Option<f64>,
    pub predicted: Forecast,
    /// The TTFT point forecast split into its terms (ms, engine-side), named as
    /// `headroom_predictor::features::TTFT_TERM_KEYS`; the choice and the runner-up only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_terms_ms: Option<TtftTerms>,
    pub eval: Option<Judged>,
    /// Why it won or lost; filled when the record is read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// What the policy decided (the last decision, for a deferred request).
#[derive(Clone, Debug, Serialize)]
pub struct Decided {
    pub policy: &'static str,
    /// `go`, `defer` or `reject`.
    pub verdict: &'static str,
    pub reject_reason: Option<String>,
    /// The fallback taken: the policy's (`cold-model`, `no-fit`, …) or admission's
    /// (`deferred`, `defer-full`, `defer-expired`).
    pub fallback: Option<&'static str>,
    /// How many times the request was deferred before this decision.
    pub deferrals: u32,
    pub decision_us: f64,
    /// Eligible replicas before the policy's shortlist; `candidates` lists the ones it
    /// evaluated (fewer on a fleet larger than `slo.shortlist`).
    pub eligible_candidates: usize,
    pub candidates: Vec<CandidateRecord>,
}

impl Decided {
    /// The record of `routed`, made over `replicas` (the slice its indices point into).
    pub fn from_routed(
        policy: &'static str,
        routed: &Routed,
        replicas: &[std::sync::Arc<Replica>],
    ) -> Self {
        let notes: &[CandidateNote] = routed.explain.as_deref().map_or(&[], |e| &e.candidates);
        let candidates = notes
            .iter()
            .filter_map(|n| {
                let r = replicas.get(n.index)?;
                let p = &n.prediction;
                Some(CandidateRecord {
                    replica: r.name.clone(),
                    class: r.class.clone(),
                    rank: n.rank,
                    cached_tokens: n.cached_tokens,
                    load: (&n.own).into(),
                    peer_load: (&n.peers).into(),
                    peer_load_age_s: n.peers_age_s,
                    kv_usage: n.kv_usage,
                    engine_running: n.engine_queue.map(|q| q.running),
                    engine_waiting: n.engine_queue.map(|q| q.waiting),
                    engine_preemptions_per_s: n.engine_queue.map(|q| q.preemption_rate),
                    scraped_age_s: n.scraped_age_s,
                    predicted: Forecast {
                        ttft_ms: p.ttft_ms,
                        ttft_upper_ms: p.ttft_upper_ms,
                        tpot_ms: p.tpot_ms,
                        tpot_upper_ms: p.tpot_upper_ms,
                        ttft_state: p.ttft_state,
                        tpot_state: p.tpot_state,
                        ttft_guarded: p.ttft_guarded,
                        tpot_guarded: p.tpot_guarded,
                    },
                    ttft_terms_ms: n.ttft_terms.map(TtftTerms),
                    eval: n.eval.map(|e| Judged {
                        tier: e.tier,
                        p_violate: e.p_violate,
                        cost: e.cost,
                        lateness: e.lateness,
                        ttft_ok: e.ttft_ok,
                        tpot_ok: e.tpot_ok,
                        ttft_headroom_ms: e.ttft_headroom_ms,
                        tpot_headroom_ms: e.tpot_headroom_ms,
                        kv_overflow: e.kv_overflow,
                    }),
                    why: None,
                })
            })
            .collect();
        let (verdict, reject_reason) = match &routed.verdict {
            Verdict::Go => ("go", None),
            Verdict::Defer(_) => ("defer", None),
            Verdict::Reject(no) => ("reject", Some(no.reason.clone())),
        };
        Self {
            policy,
            verdict,
            reject_reason,
            fallback: routed.fallback,
            deferrals: 0,
            decision_us: routed.decision_ns as f64 / 1e3,
            eligible_candidates: routed.explain.as_deref().map_or(0, |e| e.eligible),
            candidates,
        }
    }

    /// Says for each candidate why it won or lost, against the chosen one.
    pub fn explain(&mut self) {
        let chosen = self.candidates.iter().find(|c| c.rank == Some(0)).cloned();
        for c in &mut self.candidates {
            c.why = Some(why(c, chosen.as_ref(), self.fallback));
        }
    }
}

/// One candidate's verdict in words.
fn why(c: &CandidateRecord, chosen: Option<&CandidateRecord>, fallback: Option<&str>) -> String {
    let Some(w) = chosen else {
        return "no candidate was chosen".into();
    };
    if c.rank == Some(0) {
        return match (c.eval, fallback) {
            (_, Some(fb)) => format!("chosen by the `{fb}` fallback"),
            (Some(e), None) if e.tier == 0 => format!(
                "chosen: meets both objectives (TTFT headroom {:.0} ms, TPOT headroom {:.1} ms), violation probability {:.3}, cost {:.3}",
                e.ttft_headroom_ms, e.tpot_headroom_ms, e.p_violate, e.cost
            ),
            (Some(e), None) => format!(
                "chosen: least bad (tier {}, lateness {:.2}, violation probability {:.3})",
                e.tier, e.lateness, e.p_violate
            ),
            (None, None) => "chosen by the policy's ranking".into(),
        };
    }
    let place = c
        .rank
        .map_or("unranked".to_string(), |r| format!("rank {r}"));
    match (c.eval, w.eval) {
        (Some(e), Some(we)) if e.tier > we.tier => {
            let missed = match (e.ttft_ok, e.tpot_ok) {
                (false, false) => "both objectives",
                (false, true) => "the TTFT objective",
                _ => "the TPOT objective",
            };
            let kv = if e.kv_overflow > 0.0 {
                format!(
                    "; its KV cache would be {:.0}% over capacity",
                    e.kv_overflow * 100.0
                )
            } else {
                String::new()
            };
            format!(
                "{place}: predicted to miss {missed} (TTFT headroom {:.0} ms, TPOT headroom {:.1} ms{kv})",
                e.ttft_headroom_ms, e.tpot_headroom_ms
            )
        }
        (Some(e), Some(we))
            if e.tier == we.tier && e.tier > 0 && e.lateness > we.lateness + 1e-9 =>
        {
            format!(
                "{place}: later past the objectives (lateness {:.2} against {:.2})",
                e.lateness, we.lateness
            )
        }
        (Some(e), Some(we)) if e.p_violate > we.p_violate + 1e-9 && e.tier == we.tier => format!(
            "{place}: higher violation probability ({:.3} against {:.3})",
            e.p_violate, we.p_violate
        ),
        (Some(e), Some(we)) if e.cost > we.cost + 1e-9 => format!(
            "{place}: costlier ({:.3} against {:.3}: slower forecast or fewer cached tokens, {} against {})",
            e.cost, we.cost, c.cached_tokens, w.cached_tokens
        ),
        (Some(_), Some(_)) => format!("{place}: a near-equal, not drawn"),
        _ => format!(
            "{place}: ranked below {} by the policy (load {} against {} requests, {} against {} cached tokens)",
            w.replica,
            c.load.requests + c.peer_load.requests,
            w.load.requests + w.peer_load.requests,
            c.cached_tokens,
            w.cached_tokens
        ),
    }
}

/// What the router measured once the response ended.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    pub status: &'static str,
    /// The replica that served (after retries, if any).
    pub replica: std::sync::Arc<str>,
    /// Arrival → first token: what the client saw (the router's own wait included).
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: f64,
    /// Arrival → dispatch: the part of `ttft_ms` spent at the router.
    pub router_wait_ms: f64,
    pub output_tokens: Option<u32>,
    pub prompt_tokens: Option<u32>,
    pub cached_tokens: Option<u32>,
    /// Against the request's objectives; `None` where unmeasured.
    pub ttft_met: Option<bool>,
    pub tpot_met: Option<bool>,
}

impl Measured {
    /// Failed, or measured past an objective.
    pub fn missed(&self) -> bool {
        self.status != "ok" || self.ttft_met == Some(false) || self.tpot_met == Some(false)
    }
}

/// A whole record.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    pub id: u64,
    /// Wall-clock time the request arrived (ms since the Unix epoch).
    pub at_unix_ms: u64,
    pub request: Asked,
    pub decision: Option<Decided>,
    /// Attempts that failed before the first byte: (replica, why).
    pub retries: Vec<(std::sync::Arc<str>, &'static str)>,
    /// How it ended when no response body was streamed (refused, every attempt
    /// failed, the replica's 4xx passed through).
    pub ended: Option<String>,
    pub measured: Option<Measured>,
}

impl Record {
    /// The replica chosen first, if any.
    pub fn chosen(&self) -> Option<&str> {
        self.decision
            .as_ref()?
            .candidates
            .iter()
            .find(|c| c.rank == Some(0))
            .map(|c| &*c.replica)
    }

    /// Failed, refused, or measured past an objective.
    pub fn missed(&self) -> bool {
        match &self.measured {
            Some(m) => m.missed(),
            None => self.ended.is_some(),
        }
    }
}
