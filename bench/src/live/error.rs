//! Why a live run or benchmark could not be carried out.

use std::path::PathBuf;

/// Errors of the live runner, the orchestrator and the proxy-overhead benchmark.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// Options that cannot work together or are out of range.
    #[error("invalid options: {0}")]
    Options(String),
    #[error("workload: {0}")]
    Workload(#[from] crate::workload::WorkloadError),
    /// A child process could not be started.
    #[error("cannot start {what} ({}): {source}", path.display())]
    Spawn {
        what: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A binary this run needs is missing.
    #[error("{0}")]
    MissingBinary(String),
    /// A child process started but never became usable.
    #[error("{what} did not come up: {why}")]
    Startup { what: String, why: String },
    /// A target URL cannot be used.
    #[error("bad target URL `{url}`: {why}")]
    Target { url: String, why: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// A measurement could not be taken (no requests completed, a body was wrong…).
    #[error("measurement failed: {0}")]
    Measure(String),
}

impl LiveError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LiveError::Io {
            context: context.into(),
            source,
        }
    }
}
