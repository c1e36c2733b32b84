//! Why a server could not be started.

/// Why a server could not be started.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The server's program is not installed.
    #[error("{0}")]
    Missing(String),
    /// It started but failed, exited or did not become ready in time.
    #[error("{0}")]
    Failed(String),
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl LaunchError {
    pub(crate) fn io(what: &'static str, source: std::io::Error) -> Self {
        LaunchError::Io { what, source }
    }
}
