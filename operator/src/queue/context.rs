//! What the queue loop uses: the shared handles and the queues' admission state.

use std::sync::Arc;

use crate::plumbing::kube_ctx::KubeCtx;
use crate::queue::book::QueueBook;

/// The queue loop's context.
pub struct QueueCtx {
    /// The controllers' shared handles.
    pub kube: Arc<KubeCtx>,
    /// Admission state of the RolloutQueues (waiting groups, reservations) and the loop's signals.
    pub book: Arc<QueueBook>,
}
