//! The watch caches (reflector stores) the controllers and the gateway read instead of the API
//! server, and whether each has had its first full list.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::Store;

use crate::plumbing::cached_pod::CachedPod;

use orchard_api::{RolloutGroup, RolloutQueue, Sandbox, SandboxPool, SandboxSnapshot};

/// Watch caches (reflector stores) the controllers and the gateway read instead of the API server.
#[derive(Clone)]
pub struct Caches {
    /// Every Sandbox in scope.
    pub sandboxes: Store<Sandbox>,
    /// Sandbox pods (label `orchard.dev/sandbox-pod=true`), as much of each as is read.
    pub pods: Store<CachedPod>,
    /// NetworkPolicies the operator manages.
    pub policies: Store<NetworkPolicy>,
    /// Every RolloutGroup in scope.
    pub rollout_groups: Store<RolloutGroup>,
    /// Every RolloutQueue in scope.
    pub rollout_queues: Store<RolloutQueue>,
    /// Every SandboxPool in scope.
    pub sandbox_pools: Store<SandboxPool>,
    /// Every SandboxSnapshot in scope.
    pub snapshots: Store<SandboxSnapshot>,
    /// Committer pods of SandboxSnapshots (the snapshot namespace, label
    /// `app.kubernetes.io/component=snapshot-committer`); empty when snapshots are off.
    pub committers: Store<Pod>,
}

/// Whether each watch cache has received its first full list.
///
/// Readiness is tracked with flags set on the watcher's `InitDone` event instead of
/// `Store::wait_until_ready`: in kube-runtime 5.0.0 that future keeps a single waker per store, and the
/// Controller itself waits on its main store, so a second waiter (a readiness probe) can leave one of
/// the two asleep forever.
#[derive(Clone, Default)]
pub struct CacheFill {
    /// Sandboxes cache.
    pub sandboxes: Arc<AtomicBool>,
    /// Pods cache.
    pub pods: Arc<AtomicBool>,
    /// NetworkPolicies cache.
    pub policies: Arc<AtomicBool>,
    /// RolloutGroups cache.
    pub rollout_groups: Arc<AtomicBool>,
    /// RolloutQueues cache.
    pub rollout_queues: Arc<AtomicBool>,
    /// SandboxPools cache.
    pub sandbox_pools: Arc<AtomicBool>,
    /// SandboxSnapshots cache.
    pub snapshots: Arc<AtomicBool>,
    /// Committer pods cache.
    pub committers: Arc<AtomicBool>,
}

impl CacheFill {
    /// Whether every cache is filled.
    pub fn all_filled(&self) -> bool {
        [
            &self.sandboxes,
            &self.pods,
            &self.policies,
            &self.rollout_groups,
            &self.rollout_queues,
            &self.sandbox_pools,
            &self.snapshots,
            &self.committers,
        ]
        .iter()
        .all(|flag| flag.load(Ordering::Relaxed))
    }

    /// Flags that say every cache is filled (tests whose caches are filled by hand).
    pub fn all_set() -> Self {
        let fill = Self::default();
        for flag in [
            &fill.sandboxes,
            &fill.pods,
            &fill.policies,
            &fill.rollout_groups,
            &fill.rollout_queues,
            &fill.sandbox_pools,
            &fill.snapshots,
            &fill.committers,
        ] {
            flag.store(true, Ordering::Relaxed);
        }
        fill
    }
}
