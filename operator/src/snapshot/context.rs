//! What a SandboxSnapshot reconcile uses: the shared handles and how snapshots are committed.

use std::sync::Arc;

use crate::plumbing::keyed_locks::KeyedLocks;
use crate::plumbing::kube_ctx::KubeCtx;
use crate::snapshot::committer::CommitterSettings;

/// The SandboxSnapshot controller's context.
pub struct SnapshotCtx {
    /// The controllers' shared handles.
    pub kube: Arc<KubeCtx>,
    /// The committer Pods' settings (`--snapshot-*`).
    pub settings: CommitterSettings,
    /// One lock per namespace, held from reading its size quota's budget until the decision is
    /// written: two snapshots finishing together cannot both take the last room.
    pub quota_locks: KeyedLocks,
}
