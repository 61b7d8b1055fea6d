//! Why a chaos run could not be carried out (as opposed to an invariant failing,
//! which is a result, not an error).

/// Errors setting up or driving a scenario.
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    /// A binary the scenarios start is missing; the message names the build command.
    #[error("{0}")]
    MissingBinary(String),
    /// Options out of range or unknown names.
    #[error("invalid options: {0}")]
    Options(String),
    /// A process or server could not be started or never became ready.
    #[error("setup failed: {0}")]
    Setup(String),
    #[error(transparent)]
    Live(#[from] headroom_bench::live::LiveError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl ChaosError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ChaosError::Io {
            context: context.into(),
            source,
        }
    }
}
