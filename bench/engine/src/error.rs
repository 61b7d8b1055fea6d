//! Errors of the engine model: bad profiles, knobs and requests.

/// Why the engine refused a profile, a knob value or a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// `--profile` named nothing in the table.
    #[error("unknown profile `{name}`; valid profiles: {valid}")]
    UnknownProfile { name: String, valid: String },
    /// A profile or override that cannot run.
    #[error("invalid engine configuration: {0}")]
    InvalidConfig(String),
    /// A request that can never run here (too long, empty, malformed hashes).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request id is already queued or running.
    #[error("request id {0} is already in the engine")]
    DuplicateId(u64),
    /// An engine profile file that cannot be read or parsed.
    #[error("engine profile file {path}: {msg}")]
    ProfileFile { path: String, msg: String },
    /// A fault/noise knob outside its domain.
    #[error("invalid knob value: {0}")]
    InvalidKnob(String),
}
