//! Warm start from bytes: snapshots and learner state, framed as
//! `magic(4) | version u16 | reserved u16 | payload_len u64 | fnv1a64(payload) u64 | rkyv payload`.
//!
//! Invariant: loading never panics and never yields non-finite parameters: the frame,
//! checksum, rkyv's structural validation (bytecheck) and a semantic check must all pass,
//! else a [`PersistError`] says which failed.

use std::sync::Arc;

use rkyv::rancor;
use rkyv::util::AlignedVec;

use crate::calibration::Band;
use crate::class_model::{ClassModel, ClassTrack};
use crate::config::PredictorConfig;
use crate::counters::Counters;
use crate::decay_stats::DecayStats;
use crate::error::PersistError;
use crate::federation::PeerSlot;
use crate::learner::{Learner, LearnerState};
use crate::prediction::TargetParams;
use crate::replica::{ReplicaTrack, TargetTrack};
use crate::snapshot::{Snapshot, SnapshotData};

const SNAPSHOT_MAGIC: [u8; 4] = *b"HRPS";
const LEARNER_MAGIC: [u8; 4] = *b"HRPL";
/// Bump whenever a persisted struct changes shape (8 was used once and retired: skip it).
pub const FORMAT_VERSION: u16 = 9;
const HEADER_LEN: usize = 24;

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn frame(magic: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&magic);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a64(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Check the frame and return the payload copied into aligned memory.
fn unframe(
    magic: [u8; 4],
    what: &'static str,
    bytes: &[u8],
) -> Result<AlignedVec<16>, PersistError> {
    if bytes.len() < HEADER_LEN {
        return Err(PersistError::Truncated {
            len: bytes.len(),
            need: HEADER_LEN,
        });
    }
    let mut found = [0u8; 4];
    found.copy_from_slice(&bytes[0..4]);
    if found != magic {
        return Err(PersistError::BadMagic {
            expected: what,
            found,
        });
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != FORMAT_VERSION {
        return Err(PersistError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&bytes[8..16]);
    let declared = u64::from_le_bytes(len8);
    let payload = &bytes[HEADER_LEN..];
    if declared != payload.len() as u64 {
        return Err(PersistError::LengthMismatch {
            declared,
            actual: payload.len() as u64,
        });
    }
    let mut sum8 = [0u8; 8];
    sum8.copy_from_slice(&bytes[16..24]);
    if u64::from_le_bytes(sum8) != fnv1a64(payload) {
        return Err(PersistError::Checksum);
    }
    let mut aligned = AlignedVec::<16>::with_capacity(payload.len());
    aligned.extend_from_slice(payload);
    Ok(aligned)
}

fn finite(vals: &[f64]) -> bool {
    vals.iter().all(|v| v.is_finite())
}

fn check(ok: bool, what: &str) -> Result<(), PersistError> {
    if ok {
        Ok(())
    } else {
        Err(PersistError::Invalid(what.to_string()))
    }
}

fn check_params<const D: usize>(p: &TargetParams<D>) -> Result<(), PersistError> {
    check(
        finite(&p.theta)
            && p.mult.is_finite()
            && p.bands.iter().all(|b| {
                finite(&[b.upper_mult, b.median_mult, b.log_sigma, b.guard_log])
                    && b.upper_mult > 0.0
                    && b.median_mult > 0.0
                    && b.log_sigma > 0.0
                    && b.abs_err_ms >= 0.0
                    && b.recent_log_err >= 0.0
            })
            && p.mult > 0.0,
        "non-finite or non-positive prediction parameters",
    )
}

impl Snapshot {
    /// Serialise for a warm start (see [`Snapshot::from_bytes`]).
    pub fn to_bytes(&self) -> Result<Vec<u8>, PersistError> {
        let payload = rkyv::to_bytes::<rancor::Error>(&self.d)
            .map_err(|e| PersistError::Serialize(e.to_string()))?;
        Ok(frame(SNAPSHOT_MAGIC, &payload))
    }

    /// Load a snapshot written by [`Snapshot::to_bytes`]; corrupt input is an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<Snapshot, PersistError> {
        let payload = unframe(SNAPSHOT_MAGIC, "snapshot", bytes)?;
        let d = rkyv::from_bytes::<SnapshotData, rancor::Error>(&payload)
            .map_err(|e| PersistError::Invalid(e.to_string()))?;
        check(
            d.replicas.len() == d.replica_diag.len(),
            "replica diagnostics do not match entries",
        )?;
        check(
            d.classes.len() == d.class_diag.len(),
            "class diagnostics do not match entries",
        )?;
        check(
            finite(&[d.z_hi, d.floor_ms, d.guard_factor, d.upper_quantile])
                && d.z_hi > 0.0
                && d.floor_ms > 0.0
                && d.fp.default_max_batched_tokens > 0.0
                && d.fp.default_max_batched_tokens.is_finite(),
            "invalid snapshot settings",
        )?;
        for e in d
            .replicas
            .iter()
            .chain(&d.classes)
            .chain(std::iter::once(&d.fallback))
        {
            check_params(&e.ttft)?;
            check_params(&e.tpot)?;
        }
        Ok(Snapshot::from_data(d, Arc::new(Counters::default())))
    }
}

/// Persisted form of a learner (maps flattened to sorted vectors).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct PersistedLearner {
    tau_s: f64,
    landmark_interval_s: f64,
    classes: Vec<(u64, ClassTrack)>,
    replicas: Vec<(u64, ReplicaTrack)>,
    global_ttft_q: Band,
    global_tpot_q: Band,
    peers: Vec<(String, PeerSlot)>,
    node_id: Option<String>,
}

fn stats_ok<const D: usize>(s: &DecayStats<D>) -> bool {
    s.a.iter().all(|r| finite(r))
        && finite(&s.b)
        && finite(&[s.sum_g, s.sum_wyy])
        && !s.landmark_s.is_nan()
        && !s.last_at_s.is_nan()
        && s.sum_g >= 0.0
}

fn model_ok<const D: usize>(m: &ClassModel<D>) -> bool {
    stats_ok(&m.own)
        && stats_ok(&m.peers)
        && finite(&m.theta)
        && finite(&m.shape)
        && m.resid_var.is_finite()
}

fn gate_ok(g: &crate::class_model::Gate) -> bool {
    finite(&[
        g.model_err,
        g.base_err,
        g.model_conc,
        g.base_conc,
        g.base_log,
        g.cover,
    ]) && finite(&g.prev)
}

fn quant_ok(b: &Band) -> bool {
    b.by_regime.iter().chain([&b.pooled]).all(|q| {
        finite(&[q.hi, q.mid]) && !q.blk_max.is_nan() && !q.prev_max.is_nan() && q.blk_n < 1024
    })
}

fn track_ok(t: &TargetTrack) -> bool {
    finite(&[
        t.corr,
        t.fast,
        t.run_sum,
        t.corr_w,
        t.coverage,
        t.err.abs_ms,
        t.err.log,
        t.err.recent_over,
    ]) && quant_ok(&t.q)
        && !t.boost_until_s.is_nan()
        && !t.corr_landmark.is_nan()
}

impl Learner {
    /// Serialise all learned state (not the configuration) for a warm start.
    pub fn save_state(&self) -> Result<Vec<u8>, PersistError> {
        let mut classes: Vec<_> = self
            .st
            .classes
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        classes.sort_unstable_by_key(|(k, _)| *k);
        let mut replicas: Vec<_> = self
            .st
            .replicas
            .iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        replicas.sort_unstable_by_key(|(k, _)| *k);
        let p = PersistedLearner {
            tau_s: self.cfg.tau_s,
            landmark_interval_s: self.cfg.landmark_interval_s,
            classes,
            replicas,
            global_ttft_q: self.global_ttft_q,
            global_tpot_q: self.global_tpot_q,
            peers: self
                .st
                .peers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            node_id: self.st.node_id.clone(),
        };
        let payload = rkyv::to_bytes::<rancor::Error>(&p)
            .map_err(|e| PersistError::Serialize(e.to_string()))?;
        Ok(frame(LEARNER_MAGIC, &payload))
    }

    /// Rebuild a learner from [`Learner::save_state`] bytes under `cfg`. The decay time
    /// constant must match the one the state was learned with.
    pub fn load_state(cfg: PredictorConfig, bytes: &[u8]) -> Result<Learner, PersistError> {
        let payload = unframe(LEARNER_MAGIC, "learner state", bytes)?;
        let p = rkyv::from_bytes::<PersistedLearner, rancor::Error>(&payload)
            .map_err(|e| PersistError::Invalid(e.to_string()))?;
        let mut l = Learner::new(cfg);
        check(
            p.tau_s == l.cfg.tau_s,
            &format!(
                "state was learned with tau_s={} but the config says {}",
                p.tau_s, l.cfg.tau_s
            ),
        )?;
        check(
            quant_ok(&p.global_ttft_q) && quant_ok(&p.global_tpot_q),
            "bad global quantiles",
        )?;
        for (_, c) in &p.classes {
            check(
                model_ok(&c.ttft)
                    && model_ok(&c.tpot)
                    && quant_ok(&c.ttft_q)
                    && quant_ok(&c.tpot_q)
                    && gate_ok(&c.ttft_gate)
                    && gate_ok(&c.tpot_gate)
                    && c.step_ms.is_finite(),
                "bad class state",
            )?;
        }
        for (_, r) in &p.replicas {
            check(
                track_ok(&r.ttft)
                    && track_ok(&r.tpot)
                    && finite(&[
                        r.step_ms,
                        r.tpot_step_ms,
                        r.peak_running,
                        r.at_peak,
                        r.stable_base,
                    ])
                    && !r.step_at_s.is_nan()
                    && !r.peak_grew_at_s.is_nan(),
                "bad replica state",
            )?;
        }
        for (_, s) in &p.peers {
            check(
                s.exported_at_s.is_finite()
                    && s.ttft.iter().all(|(_, x)| stats_ok(x))
                    && s.tpot.iter().all(|(_, x)| stats_ok(x)),
                "bad peer slot",
            )?;
        }
        let mut st = LearnerState::default();
        for (id, mut c) in p.classes {
            // Priors come from the (possibly updated) configuration.
            let fresh = Learner::class_prior(&l.cfg, id);
            // A shape that was the old prior (not borrowed from a warm class) follows it.
            if c.ttft.shape == c.ttft.prior {
                c.ttft.shape = fresh.0;
            }
            if c.tpot.shape == c.tpot.prior {
                c.tpot.shape = fresh.1;
            }
            c.ttft.prior = fresh.0;
            c.tpot.prior = fresh.1;
            c.ttft.kappa = fresh.2;
            c.tpot.kappa = fresh.2;
            st.classes.insert(id, c);
        }
        for (id, r) in p.replicas {
            st.replicas.insert(id, r);
        }
        st.peers = p.peers.into_iter().collect();
        st.node_id = p.node_id;
        l.st = st;
        l.global_ttft_q = p.global_ttft_q;
        l.global_tpot_q = p.global_tpot_q;
        l.rebuild_peer_aggregates();
        Ok(l)
    }
}
