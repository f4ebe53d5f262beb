//! What a SandboxPool reconcile uses: the shared handles, the pods' settings and the pools' state.

use std::sync::Arc;

use crate::plumbing::kube_ctx::KubeCtx;
use crate::pod::context::PodCtx;
use crate::pool::book::PoolBook;

/// The SandboxPool controller's context.
pub struct PoolCtx {
    /// The controllers' shared handles.
    pub kube: Arc<KubeCtx>,
    /// How members are built now.
    pub pods: Arc<PodCtx>,
    /// The pools' in-memory state (reservations, claim counts, waiting Sandboxes) and signals.
    pub book: Arc<PoolBook>,
}
