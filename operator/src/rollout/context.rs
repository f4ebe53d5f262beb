//! What a RolloutGroup reconcile uses: the shared handles, its reconcile slots and the queues'
//! admission state (a group's stride may wait for its queue).

use std::sync::Arc;

use crate::plumbing::kube_ctx::KubeCtx;
use crate::plumbing::reconcile_slots::ReconcileSlots;
use crate::queue::context::QueueCtx;
use crate::retry::ResourceDefaults;

/// The RolloutGroup controller's context.
pub struct RolloutCtx {
    /// The controllers' shared handles.
    pub kube: Arc<KubeCtx>,
    /// RolloutGroup reconciles running at once.
    pub slots: ReconcileSlots,
    /// The RolloutQueues' admission (a group's stride may wait for its queue).
    pub queues: Arc<QueueCtx>,
    /// The operator's default sandbox resources (what a retry of a template without them starts
    /// from).
    pub defaults: ResourceDefaults,
}
