//! Federation slots: the per-node, mergeable part of a learner's state.
//!
//! G-counter semantics: every node owns exactly one slot (its own statistics, never a
//! running merged sum); a receiver keeps the newest slot per node and the merged model is
//! own + Σ slots. Re-merging a slot is therefore idempotent, and the merged statistics
//! equal those of one learner that saw all the data. Slots carry forward-decayed sums, so
//! a dead node's slot fades by itself and is dropped after `peer_max_age_s`. Calibration
//! quantiles are not in a slot: they stay local (their guarantee is per issuing router).

use serde::{Deserialize, Serialize};

use crate::decay_stats::DecayStats;
use crate::error::FederationError;
use crate::features::{TPOT_DIM, TTFT_DIM};

/// Target codes used in blocks.
pub const TARGET_TTFT: u8 = 0;
pub const TARGET_TPOT: u8 = 1;

/// One (class, target) block of decayed least-squares statistics, as plain numbers.
#[derive(
    Clone,
    Debug,
    PartialEq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct StatsBlock {
    /// The class id.
    pub group: u64,
    /// [`TARGET_TTFT`] or [`TARGET_TPOT`].
    pub target: u8,
    /// Feature dimension d (7 for TTFT, 6 for TPOT).
    pub dim: u8,
    /// Upper triangle of A = Σ g·w·x·xᵀ, row-major, d(d+1)/2 values.
    pub a_upper: Vec<f64>,
    /// b = Σ g·w·x·y, d values.
    pub b: Vec<f64>,
    /// Σ g: forward-decayed sample count.
    pub sum_w: f64,
    /// Σ g·w·y².
    pub sum_wyy: f64,
    /// Raw sample count.
    pub n: u64,
    /// Forward-decay landmark the sums are relative to (seconds).
    pub landmark_s: f64,
}

/// Newest label time behind one (class, target) block; lets a receiver judge staleness.
#[derive(
    Clone,
    Debug,
    PartialEq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct LabelTime {
    pub group: u64,
    pub target: u8,
    pub last_at_s: f64,
}

/// One replica's per-target correction as this node sees it.
#[derive(
    Clone,
    Debug,
    PartialEq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct CorrectionEntry {
    pub replica: u64,
    pub class: u64,
    pub target: u8,
    /// Median log-correction c (the replica is e^c × its class model).
    pub c: f64,
    /// Forward-decayed label count behind c, relative to `landmark_s`.
    pub weight: f64,
    pub landmark_s: f64,
    pub labels: u64,
    pub last_label_s: f64,
}

/// Everything one node contributes to the fleet model.
#[derive(
    Clone,
    Debug,
    PartialEq,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
pub struct FederationSlot {
    pub node_id: String,
    /// When the slot was exported (seconds); a newer slot from the same node replaces an older one.
    pub exported_at_s: f64,
    /// The exporter's forward-decay τ (seconds). Sums decayed with another τ do not add up
    /// to a pooled statistic, so a receiver with a different τ refuses the slot.
    pub tau_s: f64,
    pub blocks: Vec<StatsBlock>,
    /// One entry per block: when its newest label was seen.
    pub label_times: Vec<LabelTime>,
    pub corrections: Vec<CorrectionEntry>,
}

fn dim_of(target: u8) -> Option<usize> {
    match target {
        TARGET_TTFT => Some(TTFT_DIM),
        TARGET_TPOT => Some(TPOT_DIM),
        _ => None,
    }
}

impl StatsBlock {
    pub(crate) fn from_stats<const D: usize>(group: u64, target: u8, s: &DecayStats<D>) -> Self {
        Self {
            group,
            target,
            dim: D as u8,
            a_upper: s.a_upper(),
            b: s.b.to_vec(),
            sum_w: s.sum_g,
            sum_wyy: s.sum_wyy,
            n: s.n,
            landmark_s: s.landmark_s,
        }
    }

    /// Convert back to statistics, checking shape and that every value is usable.
    pub(crate) fn to_stats<const D: usize>(
        &self,
        node: &str,
    ) -> Result<DecayStats<D>, FederationError> {
        let bad = |reason: &str| FederationError::BadBlock {
            node: node.to_string(),
            group: self.group,
            target: self.target,
            reason: reason.to_string(),
        };
        if usize::from(self.dim) != D {
            return Err(bad(&format!("dim {} where {D} was expected", self.dim)));
        }
        let a = DecayStats::<D>::a_from_upper(&self.a_upper).ok_or_else(|| {
            bad(&format!(
                "a_upper has {} values, expected {}",
                self.a_upper.len(),
                D * (D + 1) / 2
            ))
        })?;
        if self.b.len() != D {
            return Err(bad(&format!("b has {} values, expected {D}", self.b.len())));
        }
        let finite = self.a_upper.iter().chain(&self.b).all(|v| v.is_finite())
            && self.sum_w.is_finite()
            && self.sum_wyy.is_finite()
            && self.landmark_s.is_finite();
        if !finite {
            return Err(bad("non-finite value"));
        }
        if self.sum_w < 0.0 || self.sum_wyy < 0.0 || (0..D).any(|i| a[i][i] < 0.0) {
            return Err(bad("negative weight or variance: not a sum of squares"));
        }
        let mut b = [0.0; D];
        b.copy_from_slice(&self.b);
        Ok(DecayStats {
            a,
            b,
            sum_g: self.sum_w,
            sum_wyy: self.sum_wyy,
            n: self.n,
            landmark_s: self.landmark_s,
            last_at_s: f64::NEG_INFINITY,
        })
    }
}

/// A validated peer slot, held by the receiving learner.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct PeerSlot {
    pub exported_at_s: f64,
    pub ttft: Vec<(u64, DecayStats<TTFT_DIM>)>,
    pub tpot: Vec<(u64, DecayStats<TPOT_DIM>)>,
    pub corrections: Vec<CorrectionEntry>,
}

impl PeerSlot {
    pub(crate) fn from_slot(slot: &FederationSlot, tau_s: f64) -> Result<Self, FederationError> {
        let node = slot.node_id.as_str();
        let bad_slot = |reason: &str| FederationError::BadSlot {
            node: node.to_string(),
            reason: reason.to_string(),
        };
        if (slot.tau_s - tau_s).abs() > 1e-9 * tau_s {
            return Err(bad_slot(&format!(
                "decayed with tau_s={} but this node uses {tau_s}",
                slot.tau_s
            )));
        }
        if !slot.exported_at_s.is_finite() {
            return Err(bad_slot("exported_at_s is not finite"));
        }
        let mut ttft = Vec::new();
        let mut tpot = Vec::new();
        let last_at = |group: u64, target: u8| {
            slot.label_times
                .iter()
                .find(|l| l.group == group && l.target == target && !l.last_at_s.is_nan())
                .map_or(f64::NEG_INFINITY, |l| l.last_at_s)
        };
        for blk in &slot.blocks {
            match blk.target {
                TARGET_TTFT => {
                    let mut st = blk.to_stats::<TTFT_DIM>(node)?;
                    st.last_at_s = last_at(blk.group, blk.target);
                    ttft.push((blk.group, st));
                }
                TARGET_TPOT => {
                    let mut st = blk.to_stats::<TPOT_DIM>(node)?;
                    st.last_at_s = last_at(blk.group, blk.target);
                    tpot.push((blk.group, st));
                }
                other => return Err(bad_slot(&format!("unknown target {other}"))),
            }
        }
        for list in [
            ttft.iter().map(|(g, _)| *g).collect::<Vec<_>>(),
            tpot.iter().map(|(g, _)| *g).collect(),
        ] {
            let mut l = list;
            l.sort_unstable();
            if l.windows(2).any(|w| w[0] == w[1]) {
                return Err(bad_slot("duplicate (group, target) block"));
            }
        }
        for c in &slot.corrections {
            let ok = dim_of(c.target).is_some()
                && c.c.is_finite()
                && c.weight.is_finite()
                && c.weight >= 0.0
                && c.landmark_s.is_finite()
                && !c.last_label_s.is_nan();
            if !ok {
                return Err(bad_slot(&format!(
                    "bad correction for replica {}",
                    c.replica
                )));
            }
        }
        Ok(Self {
            exported_at_s: slot.exported_at_s,
            ttft,
            tpot,
            corrections: slot.corrections.clone(),
        })
    }
}

/// What happened to a merged slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeOutcome {
    /// First slot from this node.
    Added,
    /// Replaced an older (or identical) slot from the same node.
    Replaced,
    /// Older than the slot already held; ignored.
    Outdated,
}
