//! The operator's error type: one enum at the crate boundary, with messages a user can act on and a
//! short label for metrics.

/// Everything that can go wrong inside the operator.
#[derive(thiserror::Error, Debug)]
pub enum Error {
    /// A request to the Kubernetes API failed.
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),

    /// The API server returned an object without a field it always sets.
    #[error("{kind} is missing {field} (the API server always sets it; the object is malformed)")]
    MissingField {
        /// Kind of the object.
        kind: &'static str,
        /// Missing field.
        field: &'static str,
    },

    /// The operator's own configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// Something the operator needs at start is missing or failed (a permission, the CRDs, a port).
    #[error("cannot start: {0}")]
    Startup(String),

    /// Talking to a sandbox's agent failed.
    #[error("agent of sandbox {sandbox}: {message}")]
    Agent {
        /// `namespace/name` of the sandbox.
        sandbox: String,
        /// What went wrong.
        message: String,
    },

    /// Serialising an object failed (a bug, reported instead of panicking).
    #[error("cannot serialise {what}: {source}")]
    Serialize {
        /// What was being serialised.
        what: &'static str,
        /// The serde error.
        source: serde_json::Error,
    },
}

impl Error {
    /// A short, bounded label for the `error` label of metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube(kube::Error::Api(status)) if status.is_conflict() => "conflict",
            Self::Kube(kube::Error::Api(status)) if status.is_forbidden() => "forbidden",
            Self::Kube(kube::Error::Api(status)) if status.is_not_found() => "not_found",
            Self::Kube(kube::Error::Api(_)) => "api",
            Self::Kube(_) => "transport",
            Self::MissingField { .. } => "missing_field",
            Self::Config(_) => "config",
            Self::Startup(_) => "startup",
            Self::Agent { .. } => "agent",
            Self::Serialize { .. } => "serialize",
        }
    }
}

/// Result with the operator's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
