//! The one error type of workload reading, writing, parsing and generation.

use std::path::PathBuf;

/// Everything that can go wrong turning a file or a spec into a [`super::Workload`].
/// Messages name the file and, for malformed rows, the 1-based line number.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{path}: unknown workload file extension (expected .jsonl, .json or .csv)")]
    UnknownFormat { path: PathBuf },
    #[error("{path}: no requests")]
    Empty { path: PathBuf },
    #[error("workload spec `{spec}`: {message}")]
    Spec { spec: String, message: String },
}

impl WorkloadError {
    pub(crate) fn spec(spec: &str, message: impl Into<String>) -> Self {
        WorkloadError::Spec {
            spec: spec.to_string(),
            message: message.into(),
        }
    }
}
