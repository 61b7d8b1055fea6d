//! Human- and JSON-facing diagnostics of a snapshot (for `/debug/predictor`).

use serde::Serialize;

use crate::prediction::ModelState;

/// Which calibration group a bound came from (replica → class → global → cold back-off).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum BoundSource {
    Replica,
    Class,
    Global,
    Cold,
}

/// Diagnostics of one target (TTFT or TPOT) of one replica or class.
#[derive(Clone, Debug, PartialEq, Serialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct TargetDiag {
    pub state: ModelState,
    /// Labels this node learned from for this replica (class: merged class labels).
    pub labels: u64,
    /// Labels behind peers' corrections for this replica.
    pub peer_labels: u64,
    /// EWMA of 1{y ≤ issued upper bound}; None until labelled (and for classes).
    pub coverage: Option<f64>,
    /// EWMA of |y − ŷ| (ms); None for classes.
    pub recent_abs_err_ms: Option<f64>,
    /// EWMA of |log(y/ŷ)|; None for classes.
    pub recent_log_err: Option<f64>,
    /// Per-replica log-correction c (merged over peers), and whether predictions use it.
    pub correction_log: f64,
    pub correction_applied: bool,
    /// Tracked log quantiles of the score actually used for bounds, for a request that
    /// starts at once (nothing queued ahead) and for one behind queued work.
    pub upper_log_quantile: f64,
    pub median_log_quantile: f64,
    pub queued_upper_log_quantile: f64,
    pub queued_median_log_quantile: f64,
    pub bound_source: BoundSource,
    pub drift_alarms: u64,
    pub drift_active: bool,
    /// Newest label time (seconds); None if none.
    pub last_label_s: Option<f64>,
    /// Weighted relative residual s.d. of the class fit.
    pub class_fit_rel_sd: f64,
    /// Forward-decayed label count behind the class fit, as of the snapshot.
    pub class_effective_labels: f64,
}

/// One named coefficient of a class model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Coefficient {
    pub name: &'static str,
    pub value: f64,
}

/// Everything `/debug/predictor` shows for one replica (or, with `replica` None, a class).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplicaReport {
    pub replica: Option<u64>,
    pub class: u64,
    pub state: ModelState,
    pub ttft: TargetDiag,
    pub tpot: TargetDiag,
    pub ttft_coefficients: Vec<Coefficient>,
    pub tpot_coefficients: Vec<Coefficient>,
}
