//! Which endings of an attempt a retry may fix (pure): an out-of-memory kill, an eviction, a pod
//! deleted under its sandbox or lost with its node. The reasons are the sandbox failure reasons of
//! `pod::oom` and `pod::disruption`.

pub use crate::pod::disruption::{EVICTED, NODE_LOST, POD_DELETED};
pub use crate::pod::oom::OOM_KILLED;

/// What the kubelet's eviction message says when the node ran short of memory.
pub const LOW_ON_MEMORY: &str = "low on resource: memory";

/// How much of an attempt's message its record keeps (the start of it: a RolloutGroup's status of
/// many trajectories must stay far below the API server's object size limit).
pub const MESSAGE_KEPT: usize = 512;

/// Why an attempt may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// It was OOM-killed: retried with more memory (`onOOM`).
    OutOfMemory,
    /// Its pod was evicted because the node was low on memory: retried with more memory (`onOOM`),
    /// or, without `onOOM` or at `maxMemory`, as it was (`onEviction`).
    MemoryEviction,
    /// Its pod was evicted or deleted under it: retried as it was (`onEviction`).
    Eviction,
}

/// The cause an attempt that ended with `reason` and `message` has, if a retry may fix it (pure).
pub fn cause_of(reason: &str, message: &str) -> Option<Cause> {
    match reason {
        OOM_KILLED => Some(Cause::OutOfMemory),
        EVICTED if message.contains(LOW_ON_MEMORY) => Some(Cause::MemoryEviction),
        EVICTED | POD_DELETED | NODE_LOST => Some(Cause::Eviction),
        _ => None,
    }
}

/// How an attempt ended, when a retry may fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptEnd {
    /// Out of memory or evicted.
    pub cause: Cause,
    /// `OOMKilled`, `Evicted`, `PodDeleted` or `NodeLost`.
    pub reason: String,
    /// What the run or the sandbox said.
    pub message: String,
}

impl AttemptEnd {
    /// The ending `reason` and `message` are, if a retry may fix it (pure).
    pub fn of(reason: &str, message: &str) -> Option<Self> {
        Some(Self {
            cause: cause_of(reason, message)?,
            reason: reason.to_string(),
            message: message.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endings_are_classified_by_reason_and_the_evictions_message() {
        let memory =
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 10Mi.";
        let disk = "The node was low on resource: ephemeral-storage.";
        let cases = [
            ("OOMKilled", "", Some(Cause::OutOfMemory)),
            ("Evicted", memory, Some(Cause::MemoryEviction)),
            ("Evicted", disk, Some(Cause::Eviction)),
            ("PodDeleted", "gone", Some(Cause::Eviction)),
            ("NodeLost", "node n1 is gone", Some(Cause::Eviction)),
            ("Preempted", "higher priority", None),
            ("ImagePullBackOff", "not found", None),
            ("StartupTimeout", "not Ready", None),
            ("AgentExited", "exit code 1", None),
        ];
        for (reason, message, expected) in cases {
            assert_eq!(cause_of(reason, message), expected, "{reason}: {message}");
            assert_eq!(
                AttemptEnd::of(reason, message).map(|e| e.cause),
                expected,
                "{reason}"
            );
        }
    }
}
