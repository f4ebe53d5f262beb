//! What a Sandbox reconcile and the trajectory runner use: the shared handles, the pods' settings,
//! this controller's lifecycle defaults, its reconcile slots, the agent client, the running
//! trajectory runs, the pools' state (a Sandbox of a pool claims a member), the cluster-wide
//! verdict on NetworkPolicy enforcement and the resources a sandbox that sets none runs with.

use std::sync::Arc;
use std::time::Duration;

use crate::plumbing::kube_ctx::KubeCtx;
use crate::plumbing::reconcile_slots::ReconcileSlots;
use crate::plumbing::task_set::KeyedTasks;
use crate::pod::agent_client::AgentClient;
use crate::pod::context::PodCtx;
use crate::pool::book::PoolBook;
use crate::retry::ResourceDefaults;
use crate::sandbox::enforcement::shared::SharedVerdict;

/// How many trajectory runs one replica drives at once; more wait in line for a slot. A run is
/// mostly an idle long poll, so the bound is generous; it keeps a burst of RolloutGroups from
/// turning into an unbounded number of tasks and agent connections.
pub const MAX_CONCURRENT_RUNS: usize = 4096;

/// The Sandbox controller's settings (from the command line).
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSettings {
    /// TTL of sandboxes whose spec sets none.
    pub default_ttl_seconds: i64,
    /// Longest TTL of any sandbox, whatever its spec says.
    pub max_ttl_seconds: i64,
    /// Heartbeat timeout of sandboxes whose spec sets none.
    pub default_heartbeat_timeout_seconds: i64,
    /// Seconds a sandbox may take to become Ready.
    pub startup_timeout_seconds: i64,
    /// Window after creation in which transient phases are not written.
    pub status_coalesce: Duration,
    /// Sandbox reconciles running at once.
    pub concurrency: u16,
    /// Answer the operator's own agent calls in process (`--simulated-agent`, KWOK test clusters).
    pub simulated_agent: bool,
}

impl SandboxSettings {
    /// The expiry that applies to a sandbox with `spec` (pure): its own values, else the defaults,
    /// with the TTL held to the maximum.
    pub fn lifecycle(&self, spec: &orchard_api::SandboxSpec) -> orchard_api::Lifecycle {
        let mut lifecycle = orchard_api::Lifecycle::of(
            spec,
            self.default_ttl_seconds,
            self.default_heartbeat_timeout_seconds,
        );
        lifecycle.ttl_seconds = lifecycle.ttl_seconds.min(self.max_ttl_seconds);
        lifecycle
    }
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
    /// Whether NetworkPolicies are enforced in the cluster, as the sandboxes tell.
    pub enforcement: Arc<SharedVerdict>,
    /// What a sandbox that sets no CPU or memory runs with (its `spec.retry` escalates from there).
    pub resource_defaults: ResourceDefaults,
}

impl SandboxCtx {
    /// A context with fresh slots, agent client, runners and an `Unknown` enforcement verdict.
    pub fn new(
        kube: Arc<KubeCtx>,
        pods: Arc<PodCtx>,
        settings: SandboxSettings,
        pools: Arc<PoolBook>,
    ) -> Self {
        let agent = if settings.simulated_agent {
            AgentClient::simulated()
        } else {
            AgentClient::new()
        };
        Self {
            enforcement: Arc::new(SharedVerdict::new(
                kube.metrics.network_policy_enforcement.clone(),
            )),
            slots: ReconcileSlots::new(settings.concurrency),
            resource_defaults: ResourceDefaults {
                cpu: pods.settings.pod.default_cpu.clone(),
                memory: pods.settings.pod.default_memory.clone(),
            },
            kube,
            pods,
            settings,
            agent,
            runners: KeyedTasks::new(MAX_CONCURRENT_RUNS),
            pools,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::{LifecycleSpec, SandboxSpec};

    fn settings() -> SandboxSettings {
        SandboxSettings {
            default_ttl_seconds: 7200,
            max_ttl_seconds: 86400,
            default_heartbeat_timeout_seconds: 0,
            startup_timeout_seconds: 600,
            status_coalesce: Duration::ZERO,
            concurrency: 1,
            simulated_agent: false,
        }
    }

    fn spec(ttl: Option<i64>) -> SandboxSpec {
        SandboxSpec {
            lifecycle: Some(LifecycleSpec {
                ttl_seconds: ttl,
                heartbeat_timeout_seconds: None,
            }),
            ..SandboxSpec::default()
        }
    }

    #[test]
    fn the_ttl_is_the_specs_or_the_default_held_to_the_maximum() {
        assert_eq!(settings().lifecycle(&spec(None)).ttl_seconds, 7200);
        assert_eq!(settings().lifecycle(&spec(Some(600))).ttl_seconds, 600);
        assert_eq!(settings().lifecycle(&spec(Some(90000))).ttl_seconds, 86400);
    }
}
