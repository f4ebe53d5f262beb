//! Why a sandbox failed, as the pod says it ([`health`](super::health) and [`oom`](super::oom) find
//! the failures; the sandbox's status reports them).

/// Why a sandbox failed: a machine-readable reason and a message a user can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// CamelCase reason, e.g. `ImagePullBackOff`.
    pub reason: String,
    /// What happened and what to do.
    pub message: String,
}

impl Failure {
    /// A failure with `reason` and `message`.
    pub fn new(reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            message: message.into(),
        }
    }
}
