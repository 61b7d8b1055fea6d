//! Decision records: a bounded ring of the router's recent decisions, each readable
//! by the id every response carries (`x-headroom-decision-id`) at
//! `GET /debug/decisions/{id}` and filtered at `GET /debug/decisions`.
//!
//! Invariants: at most `decision_records` records are held (slot = id mod capacity;
//! a newer id overwrites the oldest); a write for an id whose slot has moved on is
//! dropped, so a slow stream never corrupts a newer record. Each slot has its own
//! lock, held only to copy a record in or out, so requests on different slots never
//! contend. `decision_records = 0` turns records off: no id, no header, no work.
//!
//! Memory: ≈ 0.5 KB + 0.4 KB per candidate per record; the default 4096 records over
//! 8 replicas ≈ 15 MB at most.

pub mod api;
pub mod record;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use serde_json::{Value, json};

pub use record::{Asked, Decided, Measured, Record};

/// The ring.
pub struct DecisionRing {
    slots: Box<[Mutex<Option<Record>>]>,
    /// The last id handed out (ids start at 1).
    last: AtomicU64,
}

/// What `GET /debug/decisions` filters by.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Query {
    /// Chosen or serving replica name.
    pub replica: Option<String>,
    pub tenant: Option<String>,
    /// Only records that failed, were refused, or missed an objective (`true`), or only
    /// those that did not (`false`).
    pub missed: Option<bool>,
    /// Only records whose decision took a fallback.
    pub fallback: Option<bool>,
    /// Most records returned, newest first (default 50).
    pub limit: Option<usize>,
}

impl DecisionRing {
    pub fn new(capacity: usize) -> Self {
        Self {
            slots: (0..capacity).map(|_| Mutex::new(None)).collect(),
            last: AtomicU64::new(0),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.slots.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn slot(&self, id: u64) -> Option<&Mutex<Option<Record>>> {
        if id == 0 || self.slots.is_empty() {
            return None;
        }
        self.slots.get((id % self.slots.len() as u64) as usize)
    }

    /// Opens a record for a request about to be routed; `None` when records are off.
    pub fn open(&self, request: Asked) -> Option<u64> {
        if !self.enabled() {
            return None;
        }
        let id = self.last.fetch_add(1, Relaxed) + 1;
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        *self.slot(id)?.lock() = Some(Record {
            id,
            at_unix_ms,
            request,
            decision: None,
            retries: Vec::new(),
            ended: None,
            measured: None,
        });
        Some(id)
    }

    /// Changes record `id` if it is still held.
    pub fn update(&self, id: Option<u64>, f: impl FnOnce(&mut Record)) {
        let Some(slot) = id.and_then(|id| self.slot(id).map(|s| (id, s))) else {
            return;
        };
        let mut g = slot.1.lock();
        if let Some(r) = g.as_mut().filter(|r| r.id == slot.0) {
            f(r);
        }
    }

    /// Record `id` with every candidate's verdict in words.
    pub fn get(&self, id: u64) -> Option<Record> {
        let mut r = self.slot(id)?.lock().clone().filter(|r| r.id == id)?;
        if let Some(d) = r.decision.as_mut() {
            d.explain();
        }
        Some(r)
    }

    /// Records matching `q`, newest first. Scans at most the ring.
    pub fn query(&self, q: &Query) -> Vec<Record> {
        let limit = q.limit.unwrap_or(50).min(self.capacity());
        let last = self.last.load(Relaxed);
        let oldest = last.saturating_sub(self.capacity() as u64) + 1;
        let mut out = Vec::new();
        for id in (oldest..=last).rev() {
            if out.len() >= limit {
                break;
            }
            let Some(r) = self.get(id) else { continue };
            let keep = q.replica.as_deref().is_none_or(|want| {
                r.chosen() == Some(want) || r.measured.as_ref().is_some_and(|m| &*m.replica == want)
            }) && q.tenant.as_deref().is_none_or(|t| r.request.tenant == t)
                && q.missed.is_none_or(|m| r.missed() == m)
                && q.fallback
                    .is_none_or(|f| r.decision.as_ref().is_some_and(|d| d.fallback.is_some()) == f);
            if keep {
                out.push(r);
            }
        }
        out
    }

    /// Per tenant over the records held: requests finished, objectives met (both,
    /// where measured), fallback share; and per replica predicted against measured
    /// TTFT/TPOT of the latest finished requests (for the dashboard).
    pub fn summary(&self, points: usize) -> Value {
        #[derive(Default)]
        struct T {
            finished: u64,
            met: u64,
            fallback: u64,
            decided: u64,
        }
        let mut tenants: std::collections::BTreeMap<String, T> = Default::default();
        let mut series = Vec::new();
        let last = self.last.load(Relaxed);
        let oldest = last.saturating_sub(self.capacity() as u64) + 1;
        for id in (oldest..=last).rev() {
            let Some(slot) = self.slot(id) else { continue };
            let g = slot.lock();
            let Some(r) = g.as_ref().filter(|r| r.id == id) else {
                continue;
            };
            let t = tenants.entry(r.request.tenant.clone()).or_default();
            if let Some(d) = &r.decision {
                t.decided += 1;
                t.fallback += u64::from(d.fallback.is_some());
            }
            if let Some(m) = &r.measured {
                t.finished += 1;
                t.met += u64::from(!m.missed());
                if series.len() < points {
                    let predicted = r.decision.as_ref().and_then(|d| {
                        d.candidates
                            .iter()
                            .find(|c| c.replica == m.replica)
                            .map(|c| c.predicted)
                    });
                    series.push(json!({
                        "id": r.id, "at_unix_ms": r.at_unix_ms, "tenant": r.request.tenant,
                        "replica": m.replica, "status": m.status,
                        "ttft_ms": m.ttft_ms, "tpot_ms": m.tpot_ms,
                        "predicted_ttft_ms": predicted.map(|p| p.ttft_ms),
                        "predicted_tpot_ms": predicted.map(|p| p.tpot_ms),
                    }));
                }
            }
        }
        series.reverse();
        let tenants: Vec<Value> = tenants
            .into_iter()
            .map(|(name, t)| {
                json!({
                    "tenant": name, "finished": t.finished, "decided": t.decided,
                    "attainment": (t.finished > 0).then(|| t.met as f64 / t.finished as f64),
                    "fallback_share": (t.decided > 0).then(|| t.fallback as f64 / t.decided as f64),
                })
            })
            .collect();
        json!({ "records": self.capacity(), "last_id": last, "tenants": tenants, "recent": series })
    }
}

impl DecisionRing {
    /// The proxy's decision by `policy`, into record `id` (deferrals counted).
    pub fn note_decision(
        &self,
        id: Option<u64>,
        policy: &'static str,
        routed: &headroom_core::Routed,
        replicas: &[std::sync::Arc<crate::fleet::Replica>],
    ) {
        if id.is_none() {
            return;
        }
        let mut d = Decided::from_routed(policy, routed, replicas);
        self.update(id, |r| {
            d.deferrals = r
                .decision
                .as_ref()
                .map_or(0, |p| p.deferrals + u32::from(p.verdict == "defer"));
            r.decision = Some(d);
        });
    }

    /// Admission's verdict: its fallback label (deferred, defer-full, defer-expired)
    /// replaces the policy's when it sent the request on.
    pub fn note_admit(&self, id: Option<u64>, admit: &headroom_core::Admit) {
        if let headroom_core::Admit::Go {
            fallback: Some(kind),
            ..
        } = admit
        {
            self.update(id, |r| {
                if let Some(d) = r.decision.as_mut() {
                    d.fallback = Some(kind);
                }
            });
        }
    }

    /// How a request ended without a streamed response; the first reason stands.
    pub fn note_end(&self, id: Option<u64>, why: String) {
        self.update(id, |r| {
            if r.ended.is_none() && r.measured.is_none() {
                r.ended = Some(why);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked(tenant: &str) -> Asked {
        Asked {
            tenant: tenant.into(),
            model: "m".into(),
            prompt_tokens: 10,
            prefix_blocks: 1,
            max_tokens: None,
            expected_output_tokens: 5,
            slo_ttft_ms: 100.0,
            slo_tpot_ms: 10.0,
            stream: true,
            blocks: Vec::new(),
        }
    }

    #[test]
    fn the_ring_keeps_the_newest_and_drops_writes_to_overwritten_slots() {
        let ring = DecisionRing::new(4);
        let ids: Vec<u64> = (0..6)
            .map(|i| ring.open(asked(&format!("t{i}"))).unwrap())
            .collect();
        assert_eq!(ids, vec![1, 2, 3, 4, 5, 6]);
        assert!(
            ring.get(1).is_none() && ring.get(2).is_none(),
            "overwritten"
        );
        assert_eq!(ring.get(3).unwrap().request.tenant, "t2");
        // A late write for id 2 (slot now holds 6) must not touch record 6.
        ring.update(Some(2), |r| r.ended = Some("late".into()));
        assert!(ring.get(6).unwrap().ended.is_none());
        ring.update(Some(6), |r| r.ended = Some("refused".into()));
        let missed = ring.query(&Query {
            missed: Some(true),
            ..Default::default()
        });
        assert_eq!(missed.iter().map(|r| r.id).collect::<Vec<_>>(), vec![6]);
        let all = ring.query(&Query {
            limit: Some(10),
            ..Default::default()
        });
        assert_eq!(
            all.iter().map(|r| r.id).collect::<Vec<_>>(),
            vec![6, 5, 4, 3]
        );
        let t4 = ring.query(&Query {
            tenant: Some("t4".into()),
            ..Default::default()
        });
        assert_eq!(t4.len(), 1);
        assert_eq!(t4[0].id, 5);
    }

    #[test]
    fn off_means_no_ids() {
        let ring = DecisionRing::new(0);
        assert_eq!(ring.open(asked("t")), None);
        assert!(ring.query(&Query::default()).is_empty());
        ring.update(None, |_| unreachable!("nothing to update"));
    }
}
