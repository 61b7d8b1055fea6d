//! Error types of the predictor. Every input path returns one of these instead of panicking.

use thiserror::Error;

/// A configuration that cannot be used as given.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ConfigError {
    #[error("invalid predictor config: {0}")]
    Invalid(String),
}

/// Why a serialised snapshot or learner state could not be loaded.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PersistError {
    #[error("input is {len} bytes, shorter than the {need}-byte header")]
    Truncated { len: usize, need: usize },
    #[error("bad magic {found:?}: not a headroom {expected} file")]
    BadMagic {
        expected: &'static str,
        found: [u8; 4],
    },
    #[error("unsupported format version {found} (this build reads version {supported})")]
    UnsupportedVersion { found: u16, supported: u16 },
    #[error("payload length {declared} does not match the {actual} bytes present")]
    LengthMismatch { declared: u64, actual: u64 },
    #[error("checksum mismatch: the file is corrupt")]
    Checksum,
    #[error("payload failed validation: {0}")]
    Invalid(String),
    #[error("serialisation failed: {0}")]
    Serialize(String),
}

/// Why a peer's federation slot was not merged.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum FederationError {
    #[error("slot from {node}: block for group {group} target {target}: {reason}")]
    BadBlock {
        node: String,
        group: u64,
        target: u8,
        reason: String,
    },
    #[error("slot from {node}: {reason}")]
    BadSlot { node: String, reason: String },
    #[error("slot carries this node's own id {0:?}")]
    OwnSlot(String),
}
