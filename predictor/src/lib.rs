//! Headroom's latency predictor: a pure library (no I/O, no clocks).
//!
//! For a request and a candidate replica the router builds an [`Observation`] of what it
//! can see, and a [`Snapshot`] returns TTFT and TPOT forecasts with calibrated upper
//! bounds ([`Prediction`]). A [`Learner`] — owned by one trainer thread — learns from
//! labelled [`Sample`]s and publishes snapshots through a [`SharedPredictor`].
//!
//! The model (see README.md): per class, a linear model on physically shaped features fitted
//! by forward-decayed relative least squares with non-negative physics coefficients; per
//! replica, a multiplicative correction tracked as an online median of the log residual;
//! per replica, online quantile tracking (ACI) of the log score for calibrated bounds, per
//! regime (nothing queued ahead, or a queue) and pooled,
//! with back-off replica → class → global; Page–Hinkley drift detection; Cold/Warm/Stale
//! states. Class statistics federate exactly through per-node slots ([`FederationSlot`]).
//!
//! Time is always passed in as seconds on a shared axis (`now_s`, `at_s`).

mod calibration;
mod class_model;
pub mod config;
mod counters;
mod decay_stats;
mod drift;
pub mod error;
mod fastmap;
pub mod features;
pub mod federation;
pub mod journal;
mod learner;
mod linalg;
pub mod memo;
mod normal;
pub mod observation;
mod persist;
pub mod prediction;
mod replica;
pub mod report;
mod shared;
mod slot_codec;
mod snapshot;

pub use class_model::GateView;
pub use config::{ClassPrior, CorrectionMode, DriftConfig, PredictorConfig};
pub use counters::CounterValues;
pub use error::{ConfigError, FederationError, PersistError};
pub use federation::{
    CorrectionEntry, FederationSlot, MergeOutcome, StatsBlock, TARGET_TPOT, TARGET_TTFT,
};
pub use journal::{Issued, JournalEntry, read_journal};
pub use learner::{Learner, Sample};
pub use normal::{normal_quantile, normal_sf};
pub use observation::{Observation, ReplicaKey, kv_footprint_tokens};
pub use persist::FORMAT_VERSION;
pub use prediction::{ModelState, Prediction, TAIL_SATURATES, lognormal_tail};
pub use report::{BoundSource, Coefficient, ReplicaReport, TargetDiag};
pub use shared::SharedPredictor;
pub use slot_codec::{TABLE_DIM, TARGET_CORRECTIONS, TARGET_LABEL_TIMES, TARGET_META};
pub use snapshot::Snapshot;
