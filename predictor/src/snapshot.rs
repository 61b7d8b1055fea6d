//! Immutable, cheap-to-read predictor state. `predict()` is a hash lookup, two feature
//! maps, two dot products and a few multiplications; it allocates nothing.
//!
//! Invariants: `replica_index[r]` points at the entry of replica r; `class_index[c]` at the
//! class entry of c; every entry's parameters are finite. A replica whose recorded class
//! differs from the key's class is predicted with the key's class (it moved), and an
//! unknown class gets the generic physics prior with a cold bound.

use std::sync::Arc;

use crate::calibration::{REGIMES, regime};
use crate::counters::{CounterValues, Counters};
use crate::fastmap::FastMap;
use crate::features::{
    DEFAULT_STEP_MS, FeatureParams, GENERIC_TPOT_THETA, GENERIC_TTFT_THETA, ReplicaCtx, TPOT_DIM,
    TPOT_FEATURE_NAMES, TTFT_DIM, TTFT_FEATURE_NAMES, all_features_and_cached_on, all_features_on,
    ttft_features_on,
};
use crate::federation::{TARGET_TPOT, TARGET_TTFT};
use crate::learner::{Knobs, Learner};
use crate::observation::{Observation, ReplicaKey};
use crate::prediction::{ModelState, Prediction, RegimeBand, TargetParams};
use crate::replica::{STEP_FRESH_S, TargetTrack};
use crate::report::{BoundSource, Coefficient, ReplicaReport, TargetDiag};

/// Parameters for one replica (or one class, or the generic fallback).
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Entry {
    pub replica: u64,
    pub class: u64,
    /// Measured step time and running peak the admission-wait feature uses.
    pub ctx: ReplicaCtx,
    pub ttft: TargetParams<TTFT_DIM>,
    pub tpot: TargetParams<TPOT_DIM>,
}

#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Diag {
    pub ttft: TargetDiag,
    pub tpot: TargetDiag,
}

/// The serialisable part of a snapshot.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct SnapshotData {
    pub created_at_s: f64,
    pub fp: FeatureParams,
    pub z_hi: f64,
    pub floor_ms: f64,
    pub guard_factor: f64,
    pub upper_quantile: f64,
    pub replicas: Vec<Entry>,
    pub replica_diag: Vec<Diag>,
    pub classes: Vec<Entry>,
    pub class_diag: Vec<Diag>,
    pub fallback: Entry,
}

/// A frozen predictor: share it behind [`crate::SharedPredictor`] and call
/// [`Snapshot::predict`] per candidate.
#[derive(Debug)]
pub struct Snapshot {
    pub(crate) d: SnapshotData,
    replica_index: FastMap<u64, u32>,
    class_index: FastMap<u64, u32>,
    counters: Arc<Counters>,
}

#[allow(clippy::too_many_arguments)]
fn diag(
    k: &Knobs,
    p_state: ModelState,
    rt: Option<&TargetTrack>,
    class_labels: u64,
    bands: &[RegimeBand; REGIMES],
    src: BoundSource,
    applied: bool,
    resid_var: f64,
    effective: f64,
    now_s: f64,
) -> TargetDiag {
    let tau = k.solve.tau_s;
    TargetDiag {
        state: p_state,
        labels: rt.map_or(class_labels, |r| r.labels),
        peer_labels: rt.map_or(0, |r| r.peer_labels),
        coverage: rt.filter(|r| r.coverage_n > 0).map(|r| r.coverage),
        recent_abs_err_ms: rt.filter(|r| r.err.n > 0).map(|r| r.err.abs_ms),
        recent_log_err: rt.filter(|r| r.err.n > 0).map(|r| r.err.log),
        correction_log: rt.map_or(0.0, |r| r.merged_correction(tau)),
        correction_applied: applied,
        upper_log_quantile: bands[0].upper_mult.ln(),
        median_log_quantile: bands[0].median_mult.ln(),
        queued_upper_log_quantile: bands[REGIMES - 1].upper_mult.ln(),
        queued_median_log_quantile: bands[REGIMES - 1].median_mult.ln(),
        bound_source: src,
        drift_alarms: rt.map_or(0, |r| r.alarms),
        drift_active: rt.is_some_and(|r| r.boost_until_s > now_s),
        last_label_s: rt
            .map(|r| r.last_label_s.max(r.peer_last_label_s))
            .filter(|t| t.is_finite()),
        class_fit_rel_sd: resid_var.sqrt(),
        class_effective_labels: effective,
    }
}

/// TPOT coefficients that forecast the measured decode step for every placement.
fn step_theta(step_ms: f64) -> [f64; TPOT_DIM] {
    let mut t = [0.0; TPOT_DIM];
    t[0] = step_ms;
    t
}

impl Snapshot {
    pub(crate) fn build(l: &Learner, now_s: f64) -> Snapshot {
        let k = &l.k;
        let (gt, gp) = (&l.global_ttft_q, &l.global_tpot_q);
        let mut class_ids: Vec<u64> = l.st.classes.keys().copied().collect();
        class_ids.sort_unstable();
        let mut classes = Vec::with_capacity(class_ids.len());
        let mut class_diag = Vec::with_capacity(class_ids.len());
        let mut effective: FastMap<u64, (f64, f64)> = FastMap::default();
        for id in &class_ids {
            let ct = &l.st.classes[id];
            let (t, ts) = k.target_params(
                TARGET_TTFT,
                &ct.ttft,
                &ct.ttft_q,
                &ct.ttft_err,
                &ct.ttft_gate,
                gt,
                None,
                now_s,
            );
            let (p, ps) = k.target_params(
                TARGET_TPOT,
                &ct.tpot,
                &ct.tpot_q,
                &ct.tpot_err,
                &ct.tpot_gate,
                gp,
                None,
                now_s,
            );
            let mut p = p;
            if !ct.tpot.solved && ct.step_n > 0 {
                p.theta = step_theta(ct.step_ms);
            }
            let tau = k.solve.tau_s;
            let eff_t = ct.ttft.merged(tau).decayed_count(now_s, tau);
            let eff_p = ct.tpot.merged(tau).decayed_count(now_s, tau);
            effective.insert(*id, (eff_t, eff_p));
            let (tn, _) = ct.ttft.labels();
            let (pn, _) = ct.tpot.labels();
            class_diag.push(Diag {
                ttft: diag(
                    k,
                    t.state,
                    None,
                    tn,
                    &t.bands,
                    ts,
                    false,
                    ct.ttft.resid_var,
                    eff_t,
                    now_s,
                ),
                tpot: diag(
                    k,
                    p.state,
                    None,
                    pn,
                    &p.bands,
                    ps,
                    false,
                    ct.tpot.resid_var,
                    eff_p,
                    now_s,
                ),
            });
            let class_step = if ct.step_n > 0 {
                ct.step_ms
            } else {
                DEFAULT_STEP_MS
            };
            classes.push(Entry {
                replica: u64::MAX,
                class: *id,
                ctx: ReplicaCtx {
                    step_ms: class_step,
                    peak_running: 0.0,
                },
                ttft: t,
                tpot: p,
            });
        }
        let mut replica_ids: Vec<u64> = l.st.replicas.keys().copied().collect();
        replica_ids.sort_unstable();
        let mut replicas = Vec::with_capacity(replica_ids.len());
        let mut replica_diag = Vec::with_capacity(replica_ids.len());
        for id in &replica_ids {
            let rt = &l.st.replicas[id];
            let Some(ct) = l.st.classes.get(&rt.class) else {
                continue;
            };
            let (eff_t, eff_p) = effective.get(&rt.class).copied().unwrap_or((0.0, 0.0));
            let (t, ts) = k.target_params(
                TARGET_TTFT,
                &ct.ttft,
                &ct.ttft_q,
                &ct.ttft_err,
                &ct.ttft_gate,
                gt,
                Some(&rt.ttft),
                now_s,
            );
            let (p, ps) = k.target_params(
                TARGET_TPOT,
                &ct.tpot,
                &ct.tpot_q,
                &ct.tpot_err,
                &ct.tpot_gate,
                gp,
                Some(&rt.tpot),
                now_s,
            );
            let mut p = p;
            if !ct.tpot.solved && rt.step_n > 0 && now_s - rt.step_at_s <= STEP_FRESH_S {
                // No TPOT label yet (they come at a request's end): the decode step the
                // router measures on the replica now is the per-token time a request
                // placed there will see, a better prior than the generic physics (on the
                // RTX 4090 replay 30 ms measured against 15 ms from the generic θ).
                p.theta = step_theta(rt.step_ms);
            }
            replica_diag.push(Diag {
                ttft: diag(
                    k,
                    t.state,
                    Some(&rt.ttft),
                    0,
                    &t.bands,
                    ts,
                    t.mult != 1.0,
                    ct.ttft.resid_var,
                    eff_t,
                    now_s,
                ),
                tpot: diag(
                    k,
                    p.state,
                    Some(&rt.tpot),
                    0,
                    &p.bands,
                    ps,
                    p.mult != 1.0,
                    ct.tpot.resid_var,
                    eff_p,
                    now_s,
                ),
            });
            let class_step = if ct.step_n > 0 {
                ct.step_ms
            } else {
                DEFAULT_STEP_MS
            };
            replicas.push(Entry {
                replica: *id,
                class: rt.class,
                ctx: ReplicaCtx {
                    step_ms: rt.step_for(now_s, class_step),
                    peak_running: rt.slot_cap(now_s),
                },
                ttft: t,
                tpot: p,
            });
        }
        let cold = |theta_t, theta_p| {
            let mk = |hi: f64| {
                (
                    hi.exp(),
                    ((hi) / k.z_hi).max(crate::calibration::SIGMA_FLOOR),
                )
            };
            let (u, s) = mk(k.cold_hi);
            Entry {
                replica: u64::MAX,
                class: u64::MAX,
                ctx: ReplicaCtx::default(),
                ttft: TargetParams {
                    theta: theta_t,
                    mult: 1.0,
                    bands: [RegimeBand {
                        upper_mult: u,
                        median_mult: 1.0,
                        log_sigma: s,
                        guard_log: k.cold_hi,
                        abs_err_ms: 0.0,
                        recent_log_err: 0.0,
                    }; REGIMES],
                    state: ModelState::Cold,
                },
                tpot: TargetParams {
                    theta: theta_p,
                    mult: 1.0,
                    bands: [RegimeBand {
                        upper_mult: u,
                        median_mult: 1.0,
                        log_sigma: s,
                        guard_log: k.cold_hi,
                        abs_err_ms: 0.0,
                        recent_log_err: 0.0,
                    }; REGIMES],
                    state: ModelState::Cold,
                },
            }
        };
        let d = SnapshotData {
            created_at_s: now_s,
            fp: l.fp,
            z_hi: k.z_hi,
            floor_ms: k.floor_ms,
            guard_factor: k.guard_factor,
            upper_quantile: k.upper_quantile,
            replicas,
            replica_diag,
            classes,
            class_diag,
            fallback: cold(GENERIC_TTFT_THETA, GENERIC_TPOT_THETA),
        };
        Snapshot::from_data(d, l.counters.clone())
    }

    pub(crate) fn from_data(d: SnapshotData, counters: Arc<Counters>) -> Snapshot {
        let mut replica_index = FastMap::default();
        replica_index.reserve(d.replicas.len());
        for (i, e) in d.replicas.iter().enumerate() {
            replica_index.insert(e.replica, i as u32);
        }
        let mut class_index = FastMap::default();
        for (i, e) in d.classes.iter().enumerate() {
            class_index.insert(e.class, i as u32);
        }
        Snapshot {
            d,
            replica_index,
            class_index,
            counters,
        }
    }

    /// An empty snapshot: every prediction comes from the generic prior, Cold.
    pub fn empty() -> Snapshot {
        Learner::new(Default::default()).snapshot(0.0)
    }

    #[inline(always)]
    fn entry(&self, key: ReplicaKey) -> &Entry {
        if let Some(&i) = self.replica_index.get(&key.replica) {
            let e = &self.d.replicas[i as usize];
            if e.class == key.class {
                return e;
            }
        }
        match self.class_index.get(&key.class) {
            Some(&i) => &self.d.classes[i as usize],
            None => &self.d.fallback,
        }
    }

    /// Runs `f` on `obs`, or on its sanitised copy (counted) when it has bad values.
    #[inline(always)]
    fn with_clean<R>(&self, obs: &Observation, f: impl FnOnce(&Observation) -> R) -> R {
        if obs.is_clean() {
            f(obs)
        } else {
            Counters::bump(&self.counters.sanitized_predictions);
            f(&obs.sanitized().0)
        }
    }

    /// Forecast TTFT and TPOT for placing a request with `obs` on `key`. Never panics,
    /// never NaN: bad inputs are sanitised (and counted).
    #[inline]
    pub fn predict(&self, key: ReplicaKey, obs: &Observation) -> Prediction {
        let e = self.entry(key);
        let d = &self.d;
        let ((xt, xp), r) =
            self.with_clean(obs, |o| (all_features_on(o, &d.fp, &e.ctx), regime(o)));
        Self::prediction(e, d, &xt, &xp, r)
    }

    /// The forecast of entry `e` from its TTFT and TPOT features in regime `r`.
    #[inline(always)]
    fn prediction(
        e: &Entry,
        d: &SnapshotData,
        xt: &[f64; TTFT_DIM],
        xp: &[f64; TPOT_DIM],
        r: usize,
    ) -> Prediction {
        let t = e.ttft.eval(xt, r, d.floor_ms, d.guard_factor, d.z_hi);
        let p = e.tpot.eval(xp, r, d.floor_ms, d.guard_factor, d.z_hi);
        Prediction {
            ttft_ms: t.mu,
            ttft_upper_ms: t.upper,
            tpot_ms: p.mu,
            tpot_upper_ms: p.upper,
            state: e.ttft.state.worst(e.tpot.state),
            ttft_state: e.ttft.state,
            tpot_state: e.tpot.state,
            ttft_recent_abs_err_ms: t.abs_err_ms,
            tpot_recent_abs_err_ms: p.abs_err_ms,
            ttft_median_ms: t.median,
            ttft_log_sigma: t.sigma,
            tpot_median_ms: p.median,
            tpot_log_sigma: p.sigma,
            ttft_guarded: t.guarded,
            tpot_guarded: p.guarded,
            ttft_wait_ms: xt[6],
        }
    }

    /// [`Self::predict`], and the TTFT point forecast had `cached` of the prompt's tokens
    /// been cached instead: what [`Self::predict_ttft_ms`] says of `obs` with
    /// `cached_tokens = cached`, bit for bit, sharing the lookup, the sanitising test and
    /// every term the cache does not move (the admission wait). For pricing a prefix
    /// miss: the forecast with the best-cached prefix held here.
    #[inline]
    pub fn predict_with_cached(
        &self,
        key: ReplicaKey,
        obs: &Observation,
        cached: f64,
    ) -> (Prediction, f64) {
        // Either observation needing the sanitiser would be sanitised on its own.
        #[allow(clippy::manual_range_contains)]
        let clean = obs.is_clean() && cached >= 0.0 && cached <= obs.prompt_tokens;
        if !clean {
            let mut held = *obs;
            held.cached_tokens = cached;
            return (self.predict(key, obs), self.predict_ttft_ms(key, &held));
        }
        let e = self.entry(key);
        let d = &self.d;
        let (xt, xp, xh) = all_features_and_cached_on(obs, &d.fp, &e.ctx, cached);
        let p = Self::prediction(e, d, &xt, &xp, regime(obs));
        (p, e.ttft.mean(&xh, d.floor_ms))
    }

    /// The TTFT point forecast alone (what `predict(..).ttft_ms` gives, at half the cost):
    /// for what-if questions such as "how long would this prefill take on an idle queue".
    #[inline]
    pub fn predict_ttft_ms(&self, key: ReplicaKey, obs: &Observation) -> f64 {
        let e = self.entry(key);
        let d = &self.d;
        let x = self.with_clean(obs, |o| ttft_features_on(o, &d.fp, &e.ctx));
        e.ttft.mean(&x, d.floor_ms)
    }

    /// The TTFT point forecast split into its terms (ms): each feature times its
    /// coefficient and the replica's correction, in [`crate::features::TTFT_TERM_KEYS`] order. They sum to
    /// [`Self::predict_ttft_ms`] unless the floor lifted it. For operators and offline
    /// reading: which part of a forecast was too low or too high.
    pub fn ttft_terms(&self, key: ReplicaKey, obs: &Observation) -> [f64; TTFT_DIM] {
        let e = self.entry(key);
        let x = self.with_clean(obs, |o| ttft_features_on(o, &self.d.fp, &e.ctx));
        std::array::from_fn(|i| e.ttft.theta[i] * x[i] * e.ttft.mult)
    }

    /// Predict for many candidates into `out` (cleared first; reuse it to avoid allocation).
    pub fn predict_many(&self, obs: &[(ReplicaKey, Observation)], out: &mut Vec<Prediction>) {
        out.clear();
        out.extend(obs.iter().map(|(k, o)| self.predict(*k, o)));
    }

    /// When the snapshot was taken (seconds).
    pub fn created_at_s(&self) -> f64 {
        self.d.created_at_s
    }

    /// The coverage target of the bounds.
    pub fn upper_quantile(&self) -> f64 {
        self.d.upper_quantile
    }

    /// Sanitisation and rejection counters of the learner this snapshot came from.
    pub fn counters(&self) -> CounterValues {
        self.counters.values()
    }

    fn report(e: &Entry, dg: &Diag, replica: Option<u64>) -> ReplicaReport {
        ReplicaReport {
            replica,
            class: e.class,
            state: e.ttft.state.worst(e.tpot.state),
            ttft: dg.ttft.clone(),
            tpot: dg.tpot.clone(),
            ttft_coefficients: TTFT_FEATURE_NAMES
                .iter()
                .zip(e.ttft.theta)
                .map(|(n, v)| Coefficient { name: n, value: v })
                .collect(),
            tpot_coefficients: TPOT_FEATURE_NAMES
                .iter()
                .zip(e.tpot.theta)
                .map(|(n, v)| Coefficient { name: n, value: v })
                .collect(),
        }
    }

    /// Per-replica error, coverage, state and coefficients (for `/debug/predictor`).
    pub fn replica_report(&self, replica: u64) -> Option<ReplicaReport> {
        let &i = self.replica_index.get(&replica)?;
        let i = i as usize;
        Some(Self::report(
            &self.d.replicas[i],
            &self.d.replica_diag[i],
            Some(replica),
        ))
    }

    /// Reports for every known replica, ordered by replica id.
    pub fn replica_reports(&self) -> Vec<ReplicaReport> {
        self.d
            .replicas
            .iter()
            .zip(&self.d.replica_diag)
            .map(|(e, dg)| Self::report(e, dg, Some(e.replica)))
            .collect()
    }

    /// Class-level reports (merged class model, class-level calibration).
    pub fn class_reports(&self) -> Vec<ReplicaReport> {
        self.d
            .classes
            .iter()
            .zip(&self.d.class_diag)
            .map(|(e, dg)| Self::report(e, dg, None))
            .collect()
    }
}
