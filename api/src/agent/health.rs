//! The agent itself: its health, identity, error body and resource usage.

use serde::{Deserialize, Serialize};

use super::exec::ProcessStatus;
use super::patch::FailedHunk;

/// Body of every agent error: `{"code", "message"}`, plus `process` on a `Conflict` about a process
/// and `failedHunks` on a `PatchConflict`. The agent writes its keys sorted by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentErrorBody {
    /// Machine-readable code (`BadRequest`, `InvalidRequest`, `NotFound`, `Conflict`, ...).
    pub code: String,
    /// What went wrong and what to change.
    pub message: String,
    /// The hunks that did not apply (`PatchConflict`; nothing was written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_hunks: Option<Vec<FailedHunk>>,
    /// The process the conflict is about (a taken id, or one that already exited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<Box<ProcessStatus>>,
}

/// Answer of `GET /v1/metrics`: what the sandbox's container uses, from its cgroup, and its disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentMetrics {
    /// `v2` or `v1`: the cgroup version read; null when the agent found no cgroup of its own.
    pub cgroup: Option<String>,
    /// CPU time used by the container, in seconds (user and system).
    pub cpu_seconds: Option<f64>,
    /// Memory the container uses now, in bytes (page cache included, as the limit counts it).
    pub memory_bytes: Option<u64>,
    /// Most memory the container has used, in bytes (cgroup v2 needs Linux 5.19 for it).
    pub memory_peak_bytes: Option<u64>,
    /// The container's memory limit in bytes; null when it has none.
    pub memory_limit_bytes: Option<u64>,
    /// Processes (tasks) in the container.
    pub pids: Option<u64>,
    /// Processes the out-of-memory killer has killed in the container so far.
    pub oom_kills: Option<u64>,
    /// The agent's root directory, whose file system the disk figures are about.
    pub disk_path: String,
    /// Bytes used on that file system (`statvfs`: size less free blocks; the whole file system, not
    /// only what the sandbox wrote).
    pub disk_used_bytes: Option<u64>,
    /// Size of that file system in bytes.
    pub disk_total_bytes: Option<u64>,
    /// Bytes still available to unprivileged users on it.
    pub disk_available_bytes: Option<u64>,
}

/// Body and answer of `PUT /v1/identity`: the Sandbox this agent serves. Every later command gets
/// `ORCHARD_SANDBOX=<sandbox>` unless its own `env` sets it (the operator sets it when a Sandbox
/// claims a warm pool member, whose Pod was started under the member's name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentIdentity {
    /// Name of the Sandbox (1 to 253 characters).
    pub sandbox: String,
}

/// Answer of `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentHealth {
    /// Always `ok` when the agent answers.
    pub status: String,
    /// The agent's version.
    pub version: String,
}
