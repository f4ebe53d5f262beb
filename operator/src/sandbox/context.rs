//! What a Sandbox reconcile and the trajectory runner use: the shared handles, the pods' settings,
//! this controller's lifecycle defaults, its reconcile slots, the agent client, the running
//! trajectory runs and the pools' state (a Sandbox of a pool claims a member).

use std::sync::Arc;
use std::time::Duration;

use crate::plumbing::kube_ctx::KubeCtx;
use crate::plumbing::reconcile_slots::ReconcileSlots;
use crate::plumbing::task_set::KeyedTasks;
use crate::pod::agent_client::AgentClient;
use crate::pod::context::PodCtx;
use crate::pool::book::PoolBook;

/// How many trajectory runs one replica drives at once; more wait in line for a slot. A run is
/// mostly an idle long poll, so the bound is generous; it keeps a burst of RolloutGroups from
/// turning into an unbounded number of tasks and agent connections.
pub const MAX_CONCURRENT_RUNS: usize = 4096;

/// The Sandbox controller's settings (from the command line).
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSettings {
    /// TTL of sandboxes whose spec sets none.
    pub default_ttl_seconds: i64,
    /// Heartbeat timeout of sandboxes whose spec sets none.
    pub default_heartbeat_timeout_seconds: i64,
    /// Seconds a sandbox may take to become Ready.
    pub startup_timeout_seconds: i64,
    /// Window after creation in which transient phases are not written.
    pub status_coalesce: Duration,
    /// Sandbox reconciles running at once.
    pub concurrency: u16,
}

/// The Sandbox controller's context.
pub struct SandboxCtx {
    /// The controllers' shared handles.
    pub kube: Arc<KubeCtx>,
    /// How sandbox Pods are built now.
    pub pods: Arc<PodCtx>,
    /// This controller's settings.
    pub settings: SandboxSettings,
    /// Sandbox reconciles running at once (FIFO; see `reconcile_slots`).
    pub slots: ReconcileSlots,
    /// Client for the operator's own agent calls (trajectory runs, claimed members' identity).
    pub agent: AgentClient,
    /// The trajectory runs this replica drives, one per sandbox UID (bounded, stopped at shutdown).
    pub runners: KeyedTasks,
    /// The pools' in-memory state (member reservations, claim counts, waiting Sandboxes).
    pub pools: Arc<PoolBook>,
}

impl SandboxCtx {
    /// A context with fresh slots, agent client and runners.
    pub fn new(
        kube: Arc<KubeCtx>,
        pods: Arc<PodCtx>,
        settings: SandboxSettings,
        pools: Arc<PoolBook>,
    ) -> Self {
        Self {
            slots: ReconcileSlots::new(settings.concurrency),
            kube,
            pods,
            settings,
            agent: AgentClient::new(),
            runners: KeyedTasks::new(MAX_CONCURRENT_RUNS),
            pools,
        }
    }
}
