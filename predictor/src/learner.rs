//! The learner: single-threaded owner of all statistics. It takes labelled samples, keeps
//! class models, per-replica corrections and calibration, and publishes immutable
//! [`Snapshot`]s. The router runs it on a trainer thread; the simulator calls it inline.
//!
//! Besides labels it takes two router-side measurements of a replica, both optional:
//! [`Learner::observe_step_time`] (the decode step read from streamed tokens) and
//! [`Learner::observe_running`] (how many requests decode there now). They price and
//! detect the admission wait of a capacity-bound replica (`features::admission_wait_steps`)
//! before any label from that regime can arrive: labels come one TTFT late, and on the
//! measured vLLM runs that is tens of seconds.
//!
//! Invariants: no clock is read (every time comes from a sample or an argument); bad input
//! is counted and skipped, never a panic; peer aggregates always equal the sum of the
//! currently held peer slots; the statistics of a replica with neither a measured step
//! nor a seen slot cap are a function of its samples alone (so federated sums equal
//! pooled ones); what was measured about a replica stays local, like calibration.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::calibration::{Band, REGIMES, ScoreQuantiles, regime};
use crate::class_model::{ClassModel, ClassTrack, ErrTrack, Gate, GateView, SolveParams};
use crate::config::{CorrectionMode, DriftConfig, PredictorConfig};
use crate::counters::{CounterValues, Counters};
use crate::error::FederationError;
use crate::fastmap::FastMap;
use crate::features::{
    FeatureParams, GENERIC_TPOT_THETA, GENERIC_TTFT_THETA, ReplicaCtx, TPOT_ANCHOR, TPOT_DIM,
    TPOT_SPEED_SCALED, TTFT_ANCHOR, TTFT_DIM, TTFT_SPEED_SCALED, derive, dot, tpot_features_on,
    ttft_features_on,
};
use crate::federation::{
    CorrectionEntry, FederationSlot, LabelTime, MergeOutcome, PeerSlot, StatsBlock, TARGET_TPOT,
    TARGET_TTFT,
};
use crate::normal::normal_quantile;
use crate::observation::{Observation, ReplicaKey};
use crate::prediction::{ModelState, Prediction, RegimeBand, TargetParams};
use crate::replica::{CORR_LIMIT, ReplicaTrack, TargetTrack, step_ewma};
use crate::report::BoundSource;
use crate::snapshot::Snapshot;

/// Labels a replica needs before its recent absolute error feeds the guard.
const GUARD_MIN_LABELS: u64 = 5;
/// Coverage samples before a collapse can mark a replica Stale.
const COVERAGE_MIN_LABELS: u64 = 20;
/// A replica is broken apart from its class when its recent |log error| is this multiple
/// of the class's (and past the absolute backstop).
const REPLICA_APART: f64 = 1.5;
/// `OnDrift` TPOT correction: latches on at a drift alarm or once the replica's median
/// offset |c| is material (≥ LATCH_SET, log units), releases below LATCH_RELEASE.
const LATCH_SET: f64 = 0.15;
const LATCH_RELEASE: f64 = 0.1;
/// Rate of the per-replica fast residual EWMA (≈ the last 3 labels).
const FAST_RATE: f64 = 0.3;
/// A residual this many spreads (and at least `JUMP_MIN_LOG`) from the correction is "far";
/// `JUMP_RUN` far ones in a row on one side move the correction to their mean.
const JUMP_SIGMAS: f64 = 3.0;
const JUMP_MIN_LOG: f64 = 0.5;
const JUMP_RUN: u32 = 3;
/// A run back toward the class model (a replica that recovered) needs only this many:
/// an avoided replica sees few placements, so each of its labels is slow to come.
const JUMP_RUN_BACK: u32 = 2;

/// One observed outcome of a placement, with the observation made at dispatch.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub key: ReplicaKey,
    /// What the router observed when it placed the request.
    pub obs: Observation,
    /// When the label became known (seconds, shared axis). Drives forward decay.
    pub at_s: f64,
    /// Measured TTFT (ms), dispatch → first streamed chunk.
    pub ttft_ms: Option<f64>,
    /// Measured TPOT (ms): (t_last − t_first)/(output_tokens − 1).
    pub tpot_ms: Option<f64>,
    /// Output tokens streamed; TPOT labels need at least 2.
    pub output_tokens: u32,
    /// The request ended early (client cancel, timeout): every given label is only a lower
    /// bound ("≥ value"). Such samples update calibration only.
    pub censored: bool,
    /// The prediction issued at dispatch, if the router kept it: scores and coverage are
    /// then measured against what was actually issued (prequential).
    pub predicted: Option<Prediction>,
}

/// Derived constants, computed once from the configuration.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Knobs {
    pub alpha: f64,
    pub upper_quantile: f64,
    pub z_hi: f64,
    pub cold_hi: f64,
    pub eta_hi: f64,
    pub eta_mid: f64,
    pub eta_c: f64,
    pub floor_ms: f64,
    pub huber_log: f64,
    pub ewma_rate: f64,
    pub backoff_min: u64,
    pub warm_min: u64,
    pub warm_max_log_err: f64,
    pub stale_after_s: f64,
    pub coverage_collapse: f64,
    pub guard_factor: f64,
    pub guard_rate: f64,
    pub ttft_correction: bool,
    pub tpot_correction: CorrectionMode,
    pub drift: DriftConfig,
    pub solve: SolveParams,
}

impl Knobs {
    fn new(c: &PredictorConfig) -> Self {
        Self {
            alpha: 1.0 - c.upper_quantile,
            upper_quantile: c.upper_quantile,
            z_hi: normal_quantile(c.upper_quantile),
            cold_hi: c.cold_upper_factor.ln(),
            eta_hi: c.quantile_step,
            eta_mid: c.median_step,
            eta_c: c.correction_step,
            floor_ms: c.min_target_ms,
            huber_log: c.huber_log,
            ewma_rate: c.ewma_rate,
            backoff_min: c.backoff_min_labels,
            warm_min: c.warm_min_labels,
            warm_max_log_err: c.warm_max_log_err,
            stale_after_s: c.stale_after_s,
            coverage_collapse: c.coverage_collapse,
            guard_factor: c.guard_factor,
            guard_rate: c.guard_rate,
            ttft_correction: c.ttft_correction,
            tpot_correction: c.tpot_correction,
            drift: c.drift,
            solve: SolveParams {
                ridge: c.ridge,
                tau_s: c.tau_s,
                interval_s: c.landmark_interval_s,
                solve_every: c.solve_every,
            },
        }
    }

    /// The quantiles a bound in `regime` uses: the first with enough labels of the
    /// replica's, its class's and the global ones in that regime (`REGIME_MIN_FACTOR`
    /// times the pooled minimum), then the same three over all regimes, else a cold
    /// default.
    pub fn backoff(
        &self,
        replica: Option<&Band>,
        class: &Band,
        global: &Band,
        regime: usize,
    ) -> (ScoreQuantiles, BoundSource) {
        let levels = [
            (replica, BoundSource::Replica),
            (Some(class), BoundSource::Class),
            (Some(global), BoundSource::Global),
        ];
        let pick = |q: fn(&Band, usize) -> &ScoreQuantiles, min: u64| {
            levels.iter().find_map(|(b, src)| {
                let q = q((*b)?, regime);
                (q.n >= min).then_some((*q, *src))
            })
        };
        let cold = (ScoreQuantiles::new(self.cold_hi, 0.0), BoundSource::Cold);
        let pooled = || pick(|b, _| &b.pooled, self.backoff_min);
        if regime >= REGIMES {
            return pooled().unwrap_or(cold);
        }
        pick(|b, r| b.get(r), REGIME_MIN_FACTOR * self.backoff_min)
            .or_else(pooled)
            .unwrap_or(cold)
    }

    /// [`Self::backoff`] in every regime, and over all of them (`pooled`); the source
    /// reported is the free regime's.
    pub fn backoff_band(
        &self,
        replica: Option<&Band>,
        class: &Band,
        global: &Band,
    ) -> (Band, BoundSource) {
        let mut out = Band::uniform(ScoreQuantiles::new(self.cold_hi, 0.0));
        let mut src = BoundSource::Cold;
        for r in (0..REGIMES).rev() {
            let (q, s) = self.backoff(replica, class, global, r);
            out.by_regime[r] = q;
            src = s;
        }
        out.pooled = self.backoff(replica, class, global, REGIMES).0;
        (out, src)
    }

    fn correction_applies(&self, target: u8, rt: &TargetTrack) -> bool {
        if target == TARGET_TTFT {
            return self.ttft_correction;
        }
        match self.tpot_correction {
            CorrectionMode::Off => false,
            CorrectionMode::Always => true,
            CorrectionMode::OnDrift => rt.latched,
        }
    }

    /// Cold until the class has `warm_min_labels` (fleet-wide) and a fit; Stale after
    /// silence; then the gate decides ([`Gate`]: better than the load baseline and
    /// covering). A class this node has scored no label of trusts the fleet's statistics
    /// (a fresh node that merged a warm peer's slot).
    pub fn class_state<const D: usize>(
        &self,
        m: &ClassModel<D>,
        gate: &Gate,
        now_s: f64,
    ) -> ModelState {
        let (n, last) = m.labels();
        if n < self.warm_min || !m.solved {
            ModelState::Cold
        } else if now_s - last > self.stale_after_s {
            ModelState::Stale
        } else if gate.local == 0 || gate.warm {
            ModelState::Warm
        } else {
            ModelState::Cold
        }
    }

    /// A replica's state: its class's, unless it is silent or its bound collapsed
    /// (Stale), or its forecasts are broken where its class's are not (Cold).
    pub fn replica_state(
        &self,
        class_state: ModelState,
        rt: &TargetTrack,
        class_err: &ErrTrack,
        now_s: f64,
    ) -> ModelState {
        if class_state != ModelState::Warm {
            return class_state;
        }
        let (n, last) = rt.all_labels();
        if n == 0 {
            // A new replica of a known class inherits the class model (fleet prior).
            return ModelState::Warm;
        }
        let silent = now_s - last > self.stale_after_s;
        let collapsed = rt.coverage_n >= COVERAGE_MIN_LABELS
            && rt.coverage < self.upper_quantile - self.coverage_collapse;
        if silent || collapsed {
            ModelState::Stale
        } else if rt.err.n >= self.warm_min
            && rt.err.log > crate::class_model::BACKSTOP_LEAVE * self.warm_max_log_err
            && rt.err.log > REPLICA_APART * class_err.log
        {
            // The class gate decides warmth; a replica is cold on its own only when its
            // forecasts are broken outright and the class's are not. Alone in its class
            // (the real-vLLM pair), its errors are the class's, which the gate has
            // already judged against the load baseline.
            ModelState::Cold
        } else {
            ModelState::Warm
        }
    }

    /// Parameters a snapshot uses for one target of one class (`rt` None) or replica.
    #[allow(clippy::too_many_arguments)]
    pub fn target_params<const D: usize>(
        &self,
        target: u8,
        model: &ClassModel<D>,
        class_q: &Band,
        class_err: &ErrTrack,
        gate: &Gate,
        global_q: &Band,
        rt: Option<&TargetTrack>,
        now_s: f64,
    ) -> (TargetParams<D>, BoundSource) {
        let cs = self.class_state(model, gate, now_s);
        let (band, src) = self.backoff_band(rt.map(|r| &r.q), class_q, global_q);
        let (mult, state) = match rt {
            Some(r) => {
                let mult = if self.correction_applies(target, r) {
                    r.merged_correction(self.solve.tau_s).exp()
                } else {
                    1.0
                };
                (mult, self.replica_state(cs, r, class_err, now_s))
            }
            None => (1.0, cs),
        };
        let solved_floor = |hi: f64| {
            if model.solved {
                hi
            } else {
                hi.max(self.cold_hi)
            }
        };
        // The guard of a regime with enough recent labels of its own compares them with
        // its own band; otherwise the recent errors of all regimes with the band over all
        // of them (a model gone wrong shows in both; the spread between regimes must not).
        let pooled = (
            rt.map_or(class_err, |r| &r.err),
            solved_floor(band.pooled.hi).max(0.0),
        );
        let mut bands = [Default::default(); REGIMES];
        for (r, (b, q)) in bands.iter_mut().zip(band.by_regime).enumerate() {
            // Physics prior only: never tighter than the cold bound.
            let hi = solved_floor(q.hi);
            let qq = ScoreQuantiles { hi, ..q };
            let (e, guard_log) = match rt.map(|t| &t.err_by_regime[r]) {
                Some(e) if e.n >= GUARD_MIN_LABELS => (e, hi.max(0.0)),
                _ => pooled,
            };
            let (abs_err_ms, recent_log_err) = if e.n >= GUARD_MIN_LABELS {
                (e.abs_ms, e.recent_over)
            } else {
                (0.0, 0.0)
            };
            *b = RegimeBand {
                upper_mult: hi.exp(),
                median_mult: q.mid.exp(),
                log_sigma: qq.sigma(self.z_hi),
                guard_log,
                abs_err_ms,
                recent_log_err,
            };
        }
        (
            TargetParams {
                theta: model.theta,
                mult,
                bands,
                state,
            },
            src,
        )
    }
}

/// A regime's own quantiles issue bounds only after this many times the labels a pooled
/// tracker needs. The regime splits the evidence, and on the RTX 4090 replay, a queue
/// that built over the first 50 labels, a queued band issuing from 30 of its own labels
/// (learned on plain scores while the pooled band issued) lagged the ramp: coverage fell
/// to 0.61 and the replica went stale, where the pooled band kept it at 0.82. Tried for
/// the free regime alone (real vLLM, 2026-12-04): its tracker's first 30 labels still
/// hold the cold start's wide steps (the recent cap needs a closed block of 32), and the
/// free bounds issued from it were 3–7× the point, wider than the pooled band's.
pub(crate) const REGIME_MIN_FACTOR: u64 = 2;

/// All learned state (what `save_state` persists).
#[derive(Clone, Debug, Default)]
pub(crate) struct LearnerState {
    pub classes: FastMap<u64, ClassTrack>,
    pub replicas: FastMap<u64, ReplicaTrack>,
    pub peers: BTreeMap<String, PeerSlot>,
    pub node_id: Option<String>,
}

/// Single-threaded owner of the predictor's statistics.
pub struct Learner {
    pub(crate) cfg: PredictorConfig,
    pub(crate) fp: FeatureParams,
    pub(crate) k: Knobs,
    pub(crate) st: LearnerState,
    pub(crate) global_ttft_q: Band,
    pub(crate) global_tpot_q: Band,
    pub(crate) counters: Arc<Counters>,
}

fn valid_label(v: Option<f64>) -> Option<Option<f64>> {
    match v {
        None => Some(None),
        Some(y) if y.is_finite() && y > 0.0 => Some(Some(y)),
        Some(_) => None,
    }
}

impl Learner {
    /// A learner with the given configuration; invalid fields fall back to their defaults
    /// (use [`PredictorConfig::validate`] to surface them).
    pub fn new(cfg: PredictorConfig) -> Self {
        let cfg = cfg.sanitized();
        let k = Knobs::new(&cfg);
        let cold = Band::uniform(ScoreQuantiles::new(k.cold_hi, 0.0));
        let mut st = LearnerState::default();
        // Classes with a configured prior are known (and predicted from it) before any label.
        for p in &cfg.priors {
            st.classes
                .insert(p.class, Self::new_class(&cfg, &k, p.class, &cold, &cold));
        }
        Self {
            fp: cfg.feature_params(),
            k,
            cfg,
            st,
            global_ttft_q: cold,
            global_tpot_q: cold,
            counters: Arc::new(Counters::default()),
        }
    }

    pub fn config(&self) -> &PredictorConfig {
        &self.cfg
    }

    /// This node's id; slots carrying it are refused by [`Self::merge_peer_slot`].
    pub fn set_node_id(&mut self, node_id: &str) {
        self.st.node_id = Some(node_id.to_string());
    }

    pub fn counters(&self) -> CounterValues {
        self.counters.values()
    }

    /// The prior (θ₀ for TTFT, θ₀ for TPOT, κ) a class starts from under `cfg`.
    pub(crate) fn class_prior(
        cfg: &PredictorConfig,
        class: u64,
    ) -> ([f64; TTFT_DIM], [f64; TPOT_DIM], f64) {
        match cfg.priors.iter().find(|p| p.class == class) {
            Some(p)
                if crate::config::ttft_prior_len_ok(p.ttft_theta.len())
                    && p.tpot_theta.len() == TPOT_DIM =>
            {
                // A prior without `kv_deficit`'s coefficient leaves it at 0.
                let mut a = [0.0; TTFT_DIM];
                a[..p.ttft_theta.len()].copy_from_slice(&p.ttft_theta);
                let mut b = [0.0; TPOT_DIM];
                b.copy_from_slice(&p.tpot_theta);
                (a, b, p.kappa)
            }
            _ => (
                GENERIC_TTFT_THETA,
                GENERIC_TPOT_THETA,
                cfg.generic_prior_kappa,
            ),
        }
    }

    fn new_class(cfg: &PredictorConfig, k: &Knobs, class: u64, gt: &Band, gp: &Band) -> ClassTrack {
        let (tt, tp, kappa) = Self::class_prior(cfg, class);
        let cold = ScoreQuantiles::new(k.cold_hi, 0.0);
        let init = |g: &Band| {
            let own = |q: ScoreQuantiles| {
                let q = if q.n >= k.backoff_min { q } else { cold };
                ScoreQuantiles { n: 0, ..q }
            };
            Band {
                by_regime: g.by_regime.map(own),
                pooled: own(g.pooled),
            }
        };
        ClassTrack {
            ttft: ClassModel::new(tt, kappa, TTFT_SPEED_SCALED, TTFT_ANCHOR),
            tpot: ClassModel::new(tp, kappa, TPOT_SPEED_SCALED, TPOT_ANCHOR),
            ttft_q: init(gt),
            tpot_q: init(gp),
            ttft_err: ErrTrack::default(),
            tpot_err: ErrTrack::default(),
            ttft_gate: Gate::default(),
            tpot_gate: Gate::default(),
            step_ms: 0.0,
            step_n: 0,
        }
    }

    fn new_replica(k: &Knobs, class: u64, ct: &ClassTrack, gt: &Band, gp: &Band) -> ReplicaTrack {
        ReplicaTrack::new(
            class,
            TargetTrack::new(k.backoff_band(None, &ct.ttft_q, gt).0),
            TargetTrack::new(k.backoff_band(None, &ct.tpot_q, gp).0),
        )
    }

    /// Make sure the class and replica exist (a replica that moved class starts afresh).
    fn ensure(&mut self, key: ReplicaKey) {
        let (gt, gp) = (self.global_ttft_q, self.global_tpot_q);
        if !self.st.classes.contains_key(&key.class) {
            let mut ct = Self::new_class(&self.cfg, &self.k, key.class, &gt, &gp);
            // Speed-ratio prior: borrow the shape of the best-known warm class (most
            // labels), unless this class has a configured prior of its own.
            let configured = self.cfg.priors.iter().any(|p| p.class == key.class);
            let donor = self
                .st
                .classes
                .values()
                .filter(|c| c.ttft.solved && c.ttft_gate.warm)
                .max_by_key(|c| c.ttft.labels().0);
            if let (false, Some(d)) = (configured, donor) {
                ct.ttft.borrow_shape(d.ttft.theta);
                if d.tpot.solved && d.tpot_gate.warm {
                    ct.tpot.borrow_shape(d.tpot.theta);
                }
            }
            self.st.classes.insert(key.class, ct);
        }
        let (cfg, k) = (&self.cfg, &self.k);
        let ct = self
            .st
            .classes
            .entry(key.class)
            .or_insert_with(|| Self::new_class(cfg, k, key.class, &gt, &gp));
        let fresh = match self.st.replicas.get(&key.replica) {
            Some(r) => r.class != key.class,
            None => true,
        };
        if fresh {
            self.st
                .replicas
                .insert(key.replica, Self::new_replica(k, key.class, ct, &gt, &gp));
        }
    }

    /// Learn from one labelled sample. Invalid labels are counted and skipped.
    pub fn observe(&mut self, s: &Sample) {
        let (ttft, tpot) = match (valid_label(s.ttft_ms), valid_label(s.tpot_ms)) {
            (Some(a), Some(b)) if s.at_s.is_finite() => (a, b),
            _ => {
                Counters::bump(&self.counters.rejected_labels);
                return;
            }
        };
        let tpot = match tpot {
            Some(_) if s.output_tokens < 2 => {
                Counters::bump(&self.counters.rejected_labels);
                None
            }
            t => t,
        };
        if ttft.is_none() && tpot.is_none() {
            return;
        }
        let (obs, bad) = s.obs.sanitized();
        if bad {
            Counters::bump(&self.counters.sanitized_samples);
        }
        self.ensure(s.key);
        let k = self.k;
        let Some(ct) = self.st.classes.get_mut(&s.key.class) else {
            return;
        };
        let Some(rt) = self.st.replicas.get_mut(&s.key.replica) else {
            return;
        };
        // The replica's slot cap shows as the most requests ever seen decoding on it.
        let n_dec = derive(&obs, &self.fp).n_dec;
        rt.see_running(n_dec, s.at_s);
        // What is known about the replica now, for the features that depend on it. Only a
        // replica with a measured step or a seen slot cap differs from the default, so
        // the statistics of replicas without either stay a function of the samples alone
        // (federated sums equal pooled ones).
        let class_step = if ct.step_n > 0 {
            ct.step_ms
        } else {
            crate::features::DEFAULT_STEP_MS
        };
        let rctx_now = ReplicaCtx {
            step_ms: if rt.step_n > 0 {
                rt.step_for(s.at_s, class_step)
            } else {
                crate::features::DEFAULT_STEP_MS
            },
            peak_running: rt.slot_cap(s.at_s),
        };
        if let (Some(z), false) = (tpot, s.censored) {
            // A TPOT label is the mean decode step over that request's decode.
            rt.tpot_step_ms = step_ewma(rt.tpot_step_ms, z, rt.tpot_step_n);
            rt.tpot_step_n += 1;
            ct.step_ms = step_ewma(ct.step_ms, z, ct.step_n);
            ct.step_n += 1;
        }
        if let Some(y) = ttft {
            // The admission wait is learned as issued (what was known at dispatch). Without
            // the issued prediction it is recomputed from the sample alone, with nothing
            // measured about the replica, so the statistics stay a function of the samples
            // and federated sums equal pooled ones.
            let mut x = ttft_features_on(&obs, &self.fp, &ReplicaCtx::default());
            if let Some(w) = s.predicted.map(|p| p.ttft_wait_ms)
                && w.is_finite()
                && w >= 0.0
            {
                x[6] = w.min(crate::observation::FIELD_MAX);
            }
            // A slot cap found since dispatch was the replica's all along: the first labels
            // from a slot-bound queue were issued before the cap showed (the count must
            // hold for a while), and learned without it they teach the class that its
            // queue costs nothing and the replica that it is many times slower.
            if rctx_now.peak_running > 0.0 {
                let now = ReplicaCtx {
                    step_ms: rt.step_for(s.at_s, class_step),
                    ..rctx_now
                };
                x[6] = x[6].max(ttft_features_on(&obs, &self.fp, &now)[6]);
            }
            let load = (obs.queued_prefill_tokens
                + (obs.prompt_tokens - obs.cached_tokens).max(0.0))
                + 1.0;
            let issued = s.predicted.map(|p| (p.ttft_ms, p.ttft_upper_ms));
            learn_target(
                &k,
                TARGET_TTFT,
                Parts {
                    model: &mut ct.ttft,
                    class_q: &mut ct.ttft_q,
                    class_err: &mut ct.ttft_err,
                    gate: &mut ct.ttft_gate,
                    load,
                    global_q: &mut self.global_ttft_q,
                    regime: regime(&obs),
                    rt: &mut rt.ttft,
                    // TTFT labels of one replica share no window worth excluding.
                    span_start_s: f64::INFINITY,
                },
                &x,
                y,
                s.at_s,
                s.censored,
                issued,
            );
        }
        if let Some(y) = tpot {
            // TPOT residuals of requests decoding together share one burst of prefill
            // interference, so runs of slow ones are common without any change (in the
            // mixed simulator workload jumps on such runs latched noisy corrections:
            // TPOT MAPE 19.3% vs 13.4%). A run is evidence of a change only once a label
            // measured a decode that began after the run's first label ended.
            let decode_s = y * f64::from(s.output_tokens.saturating_sub(1)) / 1e3;
            let span_start_s = s.at_s - decode_s;
            // Learned with the slot cap known now (as for TTFT's wait): the batch a
            // request decoded with never exceeded it.
            let x = tpot_features_on(&obs, &self.fp, &rctx_now);
            let load = n_dec + obs.queued_requests + 1.0;
            let issued = s.predicted.map(|p| (p.tpot_ms, p.tpot_upper_ms));
            learn_target(
                &k,
                TARGET_TPOT,
                Parts {
                    model: &mut ct.tpot,
                    class_q: &mut ct.tpot_q,
                    class_err: &mut ct.tpot_err,
                    gate: &mut ct.tpot_gate,
                    load,
                    global_q: &mut self.global_tpot_q,
                    regime: regime(&obs),
                    rt: &mut rt.tpot,
                    span_start_s,
                },
                &x,
                y,
                s.at_s,
                s.censored,
                issued,
            );
        }
    }

    /// Re-solve every class with unsolved labels and drop peer slots older than
    /// `peer_max_age_s`. Call periodically (e.g. before publishing a snapshot).
    pub fn tick(&mut self, now_s: f64) {
        if now_s.is_finite() {
            let max_age = self.cfg.peer_max_age_s;
            let before = self.st.peers.len();
            self.st
                .peers
                .retain(|_, p| now_s - p.exported_at_s <= max_age);
            if self.st.peers.len() != before {
                self.rebuild_peer_aggregates();
            }
        }
        let sp = self.k.solve;
        for ct in self.st.classes.values_mut() {
            if ct.ttft.since_solve > 0 {
                ct.ttft.solve(&sp);
            }
            if ct.tpot.since_solve > 0 {
                ct.tpot.solve(&sp);
            }
        }
    }

    /// An immutable snapshot of everything predict() needs, as of `now_s`.
    pub fn snapshot(&self, now_s: f64) -> Snapshot {
        Snapshot::build(self, now_s)
    }

    /// The pooled (own + peers) statistics of one class and target, as a plain block.
    pub fn merged_stats(&self, class: u64, target: u8) -> Option<StatsBlock> {
        let ct = self.st.classes.get(&class)?;
        let tau = self.k.solve.tau_s;
        match target {
            TARGET_TTFT => Some(StatsBlock::from_stats(class, target, &ct.ttft.merged(tau))),
            TARGET_TPOT => Some(StatsBlock::from_stats(class, target, &ct.tpot.merged(tau))),
            _ => None,
        }
    }

    /// The warm/cold gate of one class and target, as it stands (see [`GateView`]).
    pub fn gate(&self, class: u64, target: u8) -> Option<GateView> {
        let ct = self.st.classes.get(&class)?;
        let g = match target {
            TARGET_TTFT => &ct.ttft_gate,
            TARGET_TPOT => &ct.tpot_gate,
            _ => return None,
        };
        Some(GateView {
            warm: g.warm,
            labels: g.n,
            model_log_err: g.model_err,
            load_log_err: g.base_err,
            model_concordance: g.model_conc,
            load_concordance: g.base_conc,
            coverage: g.cover,
        })
    }

    /// Current coefficients of a class model (θ, in the units of the feature names).
    pub fn coefficients(&self, class: u64, target: u8) -> Option<Vec<f64>> {
        let ct = self.st.classes.get(&class)?;
        match target {
            TARGET_TTFT => Some(ct.ttft.theta.to_vec()),
            TARGET_TPOT => Some(ct.tpot.theta.to_vec()),
            _ => None,
        }
    }

    /// This node's own contribution, for gossip. Only own statistics are exported, never
    /// merged ones, so receivers can sum slots without double counting.
    pub fn export_slot(&self, node_id: &str, now_s: f64) -> FederationSlot {
        let mut classes: Vec<_> = self.st.classes.iter().collect();
        classes.sort_unstable_by_key(|(id, _)| **id);
        let mut blocks = Vec::new();
        let mut label_times = Vec::new();
        for (id, ct) in classes {
            if !ct.ttft.own.is_empty() {
                blocks.push(StatsBlock::from_stats(*id, TARGET_TTFT, &ct.ttft.own));
                label_times.push(LabelTime {
                    group: *id,
                    target: TARGET_TTFT,
                    last_at_s: ct.ttft.own.last_at_s,
                });
            }
            if !ct.tpot.own.is_empty() {
                blocks.push(StatsBlock::from_stats(*id, TARGET_TPOT, &ct.tpot.own));
                label_times.push(LabelTime {
                    group: *id,
                    target: TARGET_TPOT,
                    last_at_s: ct.tpot.own.last_at_s,
                });
            }
        }
        let mut replicas: Vec<_> = self.st.replicas.iter().collect();
        replicas.sort_unstable_by_key(|(id, _)| **id);
        let mut corrections = Vec::new();
        for (id, rt) in replicas {
            for (target, t) in [(TARGET_TTFT, &rt.ttft), (TARGET_TPOT, &rt.tpot)] {
                if t.labels > 0 {
                    corrections.push(CorrectionEntry {
                        replica: *id,
                        class: rt.class,
                        target,
                        c: t.corr,
                        weight: t.corr_w,
                        landmark_s: t.corr_landmark,
                        labels: t.labels,
                        last_label_s: t.last_label_s,
                    });
                }
            }
        }
        FederationSlot {
            node_id: node_id.to_string(),
            exported_at_s: if now_s.is_finite() { now_s } else { 0.0 },
            tau_s: self.k.solve.tau_s,
            blocks,
            label_times,
            corrections,
        }
    }

    /// Merge (or replace) a peer's slot. Idempotent: merging the same slot twice changes
    /// nothing; an older slot from the same node is ignored.
    pub fn merge_peer_slot(
        &mut self,
        slot: FederationSlot,
    ) -> Result<MergeOutcome, FederationError> {
        if self.st.node_id.as_deref() == Some(slot.node_id.as_str()) {
            Counters::bump(&self.counters.rejected_slots);
            return Err(FederationError::OwnSlot(slot.node_id));
        }
        let peer = match PeerSlot::from_slot(&slot, self.k.solve.tau_s) {
            Ok(p) => p,
            Err(e) => {
                Counters::bump(&self.counters.rejected_slots);
                return Err(e);
            }
        };
        let outcome = match self.st.peers.get(&slot.node_id) {
            Some(old) if old.exported_at_s > peer.exported_at_s => {
                return Ok(MergeOutcome::Outdated);
            }
            Some(_) => MergeOutcome::Replaced,
            None => MergeOutcome::Added,
        };
        self.st.peers.insert(slot.node_id, peer);
        self.rebuild_peer_aggregates();
        Ok(outcome)
    }

    /// Drop a peer's slot (it left the mesh). Returns whether one was held.
    pub fn forget_peer(&mut self, node_id: &str) -> bool {
        let had = self.st.peers.remove(node_id).is_some();
        if had {
            self.rebuild_peer_aggregates();
        }
        had
    }

    /// Node ids of the peer slots currently held.
    pub fn peers(&self) -> Vec<String> {
        self.st.peers.keys().cloned().collect()
    }

    /// Recompute every class's and replica's peer sums from the held slots, then re-solve.
    pub(crate) fn rebuild_peer_aggregates(&mut self) {
        let tau = self.k.solve.tau_s;
        let (gt, gp) = (self.global_ttft_q, self.global_tpot_q);
        let (cfg, k) = (&self.cfg, &self.k);
        let st = &mut self.st;
        for ct in st.classes.values_mut() {
            ct.ttft.peers = Default::default();
            ct.tpot.peers = Default::default();
        }
        for rt in st.replicas.values_mut() {
            for t in [&mut rt.ttft, &mut rt.tpot] {
                t.peer_wc = 0.0;
                t.peer_w = 0.0;
                t.peer_landmark = f64::NEG_INFINITY;
                t.peer_labels = 0;
                t.peer_last_label_s = f64::NEG_INFINITY;
            }
        }
        for slot in st.peers.values() {
            for (g, s) in &slot.ttft {
                let ct = st
                    .classes
                    .entry(*g)
                    .or_insert_with(|| Self::new_class(cfg, k, *g, &gt, &gp));
                ct.ttft.peers.merge_from(s, tau);
            }
            for (g, s) in &slot.tpot {
                let ct = st
                    .classes
                    .entry(*g)
                    .or_insert_with(|| Self::new_class(cfg, k, *g, &gt, &gp));
                ct.tpot.peers.merge_from(s, tau);
            }
            for c in &slot.corrections {
                let ct = st
                    .classes
                    .entry(c.class)
                    .or_insert_with(|| Self::new_class(cfg, k, c.class, &gt, &gp));
                let rt = st
                    .replicas
                    .entry(c.replica)
                    .or_insert_with(|| Self::new_replica(k, c.class, ct, &gt, &gp));
                if rt.class != c.class {
                    continue;
                }
                let t = if c.target == TARGET_TTFT {
                    &mut rt.ttft
                } else {
                    &mut rt.tpot
                };
                let lm = t.peer_landmark.max(c.landmark_s);
                if t.peer_landmark.is_finite() && lm > t.peer_landmark {
                    let f = (-(lm - t.peer_landmark) / tau).exp();
                    t.peer_wc *= f;
                    t.peer_w *= f;
                }
                let f = (-(lm - c.landmark_s) / tau).exp();
                t.peer_landmark = lm;
                t.peer_wc += c.weight * f * c.c;
                t.peer_w += c.weight * f;
                t.peer_labels += c.labels;
                t.peer_last_label_s = t.peer_last_label_s.max(c.last_label_s);
            }
        }
        let sp = k.solve;
        for ct in st.classes.values_mut() {
            ct.ttft.solve(&sp);
            ct.tpot.solve(&sp);
        }
    }
}

/// Mutable pieces one target's update touches.
struct Parts<'a, const D: usize> {
    model: &'a mut ClassModel<D>,
    class_q: &'a mut Band,
    class_err: &'a mut ErrTrack,
    gate: &'a mut Gate,
    /// The load baseline's L for this label (see [`Gate`]).
    load: f64,
    global_q: &'a mut Band,
    /// The label's regime ([`regime`] of its observation).
    regime: usize,
    rt: &'a mut TargetTrack,
    /// Start of the interval the label measured (TPOT: its first token); a run of far
    /// residuals jumps only once a label measured an interval after the run's first.
    span_start_s: f64,
}

/// One label for one target: calibration, coverage, errors, drift, correction, regression.
#[allow(clippy::too_many_arguments)]
fn learn_target<const D: usize>(
    k: &Knobs,
    target: u8,
    p: Parts<'_, D>,
    x: &[f64; D],
    y: f64,
    at_s: f64,
    censored: bool,
    issued: Option<(f64, f64)>,
) {
    let Parts {
        model,
        class_q,
        class_err,
        gate,
        load,
        global_q,
        regime,
        rt,
        span_start_s,
    } = p;
    let tau = k.solve.tau_s;
    let mu_class = dot(&model.theta, x).max(k.floor_ms);
    let c_merged = rt.merged_correction(tau);
    let (mu, upper) = match issued {
        Some((m, u)) if m.is_finite() && m > 0.0 && u.is_finite() => (m, u),
        _ => {
            // Recompute what a snapshot would have issued (including the guard).
            let mu = if k.correction_applies(target, rt) {
                mu_class * c_merged.exp()
            } else {
                mu_class
            };
            let (q, _) = k.backoff(Some(&rt.q), class_q, global_q, regime);
            let mut u = mu * q.hi.exp().max(1.0);
            let e = &rt.err_by_regime[regime.min(REGIMES - 1)];
            if e.n >= GUARD_MIN_LABELS && e.recent_over > q.hi.max(0.0) {
                u = u.max(mu * (k.guard_factor * e.recent_over).exp());
            }
            (mu, u)
        }
    };
    let s = (y / mu).ln();
    // The replica's upper quantile moves on misses of the bound it actually issued
    // (guard included), so the issued bounds cover 1−α in the long run (ACI); class and
    // global quantiles track the plain score, the clean fallback for new replicas.
    if censored {
        for b in [&mut rt.q, class_q, global_q] {
            b.update_censored(regime, s, k.alpha, k.eta_hi, k.eta_mid);
        }
        if y > upper {
            rt.record_coverage(false, k.ewma_rate);
        }
        return;
    }
    gate.update(
        y,
        mu,
        upper,
        load,
        std::mem::take(&mut model.moved),
        k.ewma_rate,
        k.upper_quantile,
        k.warm_max_log_err,
    );
    let upd = |b: &mut Band, issued: Option<bool>| {
        let min = REGIME_MIN_FACTOR * k.backoff_min;
        b.update(regime, s, issued, min, k.alpha, k.eta_hi, k.eta_mid);
    };
    upd(&mut rt.q, Some(y > upper));
    upd(class_q, None);
    upd(global_q, None);
    rt.record_coverage(y <= upper, k.ewma_rate);
    // The noise level a jump is judged against, from before this label: the lesser of
    // the replica's and its class's mean |log error| (≈ 0.8 σ for a normal). Updated
    // first, a change would raise its own bar and never count as far.
    let spread = (1.25 * rt.err.log.min(class_err.log)).max(k.drift.min_sigma);
    rt.err.update(y, mu, k.ewma_rate, k.guard_rate);
    rt.err_by_regime[regime.min(REGIMES - 1)].update(y, mu, k.ewma_rate, k.guard_rate);
    class_err.update(y, mu, k.ewma_rate, k.guard_rate);

    // Drift: residual against the corrected class model, whether or not it is applied.
    let r_class = (y / mu_class).ln();
    rt.fast = if rt.labels == 0 {
        r_class
    } else {
        rt.fast + FAST_RATE * (r_class - rt.fast)
    };
    // No refractory period after an alarm: the jump re-centres the residuals at once,
    // so the next alarm means the next change (a slowed replica recovering).
    let armed = rt.labels >= k.drift.min_labels;
    let sigma = rt.q.pooled.sigma(k.z_hi).max(k.drift.min_sigma);
    // A run of residuals far on one side of the correction (winsorised PH needs ~5).
    let dev = r_class - rt.corr;
    let far = dev.abs() > (JUMP_SIGMAS * spread).max(JUMP_MIN_LOG);
    let side = if dev > 0.0 { 1 } else { -1 };
    if far && rt.run_n.signum() == side {
        rt.run_n += side;
        rt.run_sum += r_class;
    } else if far {
        rt.run_n = side;
        rt.run_sum = r_class;
        rt.run_first_end_s = at_s;
    } else {
        rt.run_n = 0;
        rt.run_sum = 0.0;
    }
    let run_mean = rt.run_sum / f64::from(rt.run_n.unsigned_abs().max(1));
    // Back toward the class model is always allowed, and sooner: a replica that recovered.
    let back = run_mean.abs() < rt.corr.abs();
    let need = if back { JUMP_RUN_BACK } else { JUMP_RUN };
    let run_jump =
        armed && rt.run_n.unsigned_abs() >= need && (span_start_s > rt.run_first_end_s || back);
    if rt.ph.update(r_class - c_merged, sigma, armed, &k.drift) || run_jump {
        rt.boost_until_s = at_s + k.drift.boost_s;
        rt.alarms += 1;
        rt.latched = true;
        // A change point: the labels since it say where the replica is now.
        let to = if run_jump { run_mean } else { rt.fast };
        rt.corr = to.clamp(-CORR_LIMIT, CORR_LIMIT);
        rt.fast = rt.corr;
        rt.run_n = 0;
        rt.run_sum = 0.0;
    }
    let boosted = at_s < rt.boost_until_s;
    let eta = if boosted {
        k.eta_c * k.drift.boost
    } else {
        k.eta_c
    };
    rt.step_correction(r_class, eta, at_s, tau, k.solve.interval_s);
    let c_now = rt.merged_correction(tau).abs();
    if rt.labels >= k.backoff_min && c_now >= LATCH_SET {
        rt.latched = true;
    } else if rt.latched && !boosted && c_now < LATCH_RELEASE {
        rt.latched = false;
    }
    rt.labels += 1;
    rt.last_label_s = rt.last_label_s.max(at_s);

    // The label's weight: the inverse square of its scale, so a long TTFT does not
    // outweigh many short ones, taken as `1/(y·f)` with `f` the current fit (before the
    // per-replica correction) once the class has `warm_min` labels, and `1/y²` before
    // (a fit from a handful of labels, or a borrowed prior, is no scale). Why not `1/y²`
    // throughout: with multiplicative noise, `y = f·e^ε`, ε ~ N(0, σ²), weights
    // `∝ y^(−a)` put the weighted least-squares level at `E[y^(1−a)]/E[y^(−a)] =
    // median·e^(σ²(1−2a)/2)`. `1/y²` (`a = 2`) sits at `median·e^(−1.5σ²)`, half the median
    // where σ ≈ 0.7, which is TTFT behind a queue just formed on a KV-bound real vLLM: it
    // held those forecasts 2-3× low (bench/results/real-vllm/2026-12-06 §5-§9). `a = 1`
    // sits at `median·e^(−σ²/2)`, 0.78 of it there; `a = ½`, unbiased, let over-forecasts
    // of short labels grow (the RTX 4090 replay's TTFT MdAPE 14% → 20%).
    //
    // Huber weight against the current fit (θ now, with the correction that would apply
    // now), not the forecast issued one label-delay ago: under delay the issued forecast
    // can be from a fit that has since moved, and weighing a label by its distance from a
    // forecast nobody would make any more down-weights exactly the labels that moved it.
    // While the class is young (< warm_min labels) every label is information about the
    // fit, not an outlier, so none is down-weighted.
    // With `huber_log` = 0 the weight is `1/y²`, a function of the sample alone, so
    // federated statistics equal pooled ones exactly.
    let yf = y.max(k.floor_ms);
    let trusted = k.huber_log > 0.0 && model.solved && model.labels().0 >= k.warm_min;
    let mut w = 1.0 / (yf * if trusted { mu_class } else { yf });
    if trusted {
        let c_now = if k.correction_applies(target, rt) {
            rt.merged_correction(tau)
        } else {
            0.0
        };
        let fit = mu_class * c_now.exp();
        let r = (y / fit).ln().abs();
        if r > k.huber_log {
            w *= k.huber_log / r;
        }
    }
    model.add(x, y, w, at_s, &k.solve);
}

impl Learner {
    /// A measured decode step on `key`'s replica (ms): the mean gap between one stream's
    /// tokens, as the router's step clock reads it (or `vllm:generation_tokens_total`'s
    /// rate over `num_requests_running`). It prices the admission wait of a
    /// capacity-bound replica (`features::admission_wait_steps`) before any TTFT label
    /// from that regime can arrive. Invalid values are counted and ignored.
    pub fn observe_step_time(&mut self, key: ReplicaKey, at_s: f64, step_ms: f64) {
        if !(step_ms.is_finite() && step_ms > 0.0 && at_s.is_finite()) {
            Counters::bump(&self.counters.rejected_labels);
            return;
        }
        self.ensure(key);
        let (Some(ct), Some(rt)) = (
            self.st.classes.get_mut(&key.class),
            self.st.replicas.get_mut(&key.replica),
        ) else {
            return;
        };
        rt.step_ms = step_ewma(rt.step_ms, step_ms, rt.step_n);
        rt.step_at_s = rt.step_at_s.max(at_s);
        rt.step_n += 1;
        ct.step_ms = step_ewma(ct.step_ms, step_ms, ct.step_n);
        ct.step_n += 1;
    }

    /// The number of requests decoding on `key`'s replica now (the router's ledger, or
    /// fresh scraped `running` minus its queued ones). The learner also reads it from
    /// every labelled sample, but labels arrive one TTFT late; a replica that hit its
    /// `max_num_seqs` is seen pinned there at once through this call. Invalid values are
    /// counted and ignored.
    pub fn observe_running(&mut self, key: ReplicaKey, at_s: f64, decoding_requests: f64) {
        if !(decoding_requests.is_finite() && decoding_requests >= 0.0 && at_s.is_finite()) {
            Counters::bump(&self.counters.rejected_labels);
            return;
        }
        self.ensure(key);
        if let Some(rt) = self.st.replicas.get_mut(&key.replica) {
            rt.see_running(decoding_requests, at_s);
        }
    }

    /// Coverage EWMA of a replica's TTFT and TPOT bounds (None for an unknown replica).
    pub fn coverage(&self, replica: u64) -> Option<(f64, f64)> {
        let rt = self.st.replicas.get(&replica)?;
        Some((rt.ttft.coverage, rt.tpot.coverage))
    }
}
