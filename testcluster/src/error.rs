//! Errors of the test harness, with enough context to debug a failed run from CI output.

/// What went wrong while setting up or driving the local cluster.
#[derive(thiserror::Error, Debug)]
pub enum E2eError {
    /// A binary or directory is missing, or a process would not start.
    #[error("setup: {0}")]
    Setup(String),
    /// A component did not become ready in time.
    #[error("{component} not ready after {seconds}s: {detail}")]
    NotReady {
        /// Which component.
        component: String,
        /// How long we waited.
        seconds: u64,
        /// Last error seen, or where to look.
        detail: String,
    },
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Local I/O failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// Result of the harness.
pub type Result<T, E = E2eError> = std::result::Result<T, E>;
