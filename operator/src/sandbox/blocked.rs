//! Why a sandbox cannot have a child it needs (the create path and the pool claim say it; the status
//! shows it).

/// Why the sandbox cannot have one of its children under the name it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// A deleted sandbox of the same name still has children the garbage collector is removing; the
    /// Pod is created once they are gone.
    PreviousIncarnation(String),
    /// Somebody else's object holds the name: the sandbox fails, nothing is touched.
    NameConflict(String),
    /// The API server refused the Pod for good (Pod Security admission, an invalid field): the
    /// sandbox fails with the server's words.
    PodRejected(String),
    /// The operator's placement policy refuses the spec (`placement`): the sandbox fails before any
    /// child is created.
    PlacementRefused(String),
    /// The spec's `retry` cannot run under the operator's defaults (`sandbox::retry::policy_of`): the
    /// sandbox fails before any child is created.
    InvalidSpec(String),
    /// A ResourceQuota refused the Pod: the sandbox stays Pending and the creation is retried (a
    /// trajectory of a RolloutGroup waits for as long as its group allows; see [`startup_clock`]).
    QuotaExceeded(String),
    /// A trajectory of a RolloutGroup whose stride's starts are spread (`launchJitterSeconds`): its
    /// Pod is created at this time (`orchard.dev/launch-after`).
    LaunchJitter(k8s_openapi::jiff::Timestamp),
    /// A sandbox of a pool has no member to claim and does not start cold: it waits (`stalled`: until
    /// someone changes something, e.g. creates the pool or aligns its spec with the template).
    Pool {
        /// Machine-readable reason: `WaitingForPoolMember`, `PoolNotFound`, `PoolTemplateMismatch`.
        reason: &'static str,
        /// Detail.
        message: String,
        /// Nothing the operator does will end the wait.
        stalled: bool,
    },
    /// The sandbox starts from a SandboxSnapshot (`fromSnapshot`) that is not Ready (it waits,
    /// reason `SnapshotNotReady`) or never will be (`failed`: it fails, reason `SnapshotFailed`).
    Snapshot {
        /// The snapshot failed or is being deleted: the sandbox fails.
        failed: bool,
        /// Detail.
        message: String,
    },
}
