//! One watch per kind, each kept in a cache and telling its subscribers (`plumbing::watch`): who
//! listens to which kind is the whole of this file.
//!
//! The controllers are triggered through their own channels (`plumbing::triggers`), fed after the
//! cache was updated, not through the shared store's subscribers (see `triggers.rs` for why).

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::runtime::watcher;

use crate::plumbing::api_client::scoped_api;
use crate::plumbing::cached_pod::CachedPod;
use crate::plumbing::caches::{CacheFill, Caches};
use crate::plumbing::change_feed::ChangeFeed;
use crate::plumbing::triggers::{Forward, MappedTrigger, mapped_channel, trigger};
use crate::plumbing::watch::{Memory, Publish, Subscribers, cached_watch};
use crate::pool::book::PoolBook;
use crate::queue::book::QueueBook;
use crate::snapshot::committer::COMPONENT as COMMITTER_COMPONENT;
use crate::snapshot::source::{
    snapshot_of_committer, snapshot_of_group, snapshot_of_pool, snapshot_of_sandbox,
};
use kube::runtime::reflector::ObjectRef;
use orchard_api::{
    MANAGED_BY, MANAGED_BY_LABEL, RolloutGroup, RolloutQueue, SANDBOX_POD_LABEL, Sandbox,
    SandboxPool, SandboxSnapshot,
};

/// What the controllers are woken by.
pub struct Triggers {
    /// Sandboxes applied (the Sandbox controller's own objects).
    pub sandboxes: BoxStream<'static, Arc<Sandbox>>,
    /// Sandboxes applied or deleted (a RolloutGroup's children).
    pub group_children: BoxStream<'static, Arc<Sandbox>>,
    /// RolloutGroups applied.
    pub groups: BoxStream<'static, Arc<RolloutGroup>>,
    /// SandboxPools applied.
    pub pools: BoxStream<'static, Arc<SandboxPool>>,
    /// Sandbox pods applied or deleted (a deleted child wakes its owner: a Sandbox waiting for a
    /// previous incarnation's Pod to go, or one whose Pod was deleted from outside).
    pub pods: BoxStream<'static, Arc<CachedPod>>,
    /// Managed NetworkPolicies applied or deleted.
    pub policies: BoxStream<'static, Arc<NetworkPolicy>>,
    /// SandboxSnapshots applied (the snapshot controller's own objects).
    pub snapshots: BoxStream<'static, Arc<SandboxSnapshot>>,
    /// SandboxSnapshots applied or deleted (Sandboxes waiting for one start once it is Ready).
    pub snapshot_changes: BoxStream<'static, Arc<SandboxSnapshot>>,
    /// Snapshots concerned by a change elsewhere: a committer Pod's, or a Sandbox's, SandboxPool's
    /// or RolloutGroup's that names one in `fromSnapshot`.
    pub snapshot_refs: BoxStream<'static, ObjectRef<SandboxSnapshot>>,
}

/// The running watches.
pub struct Watches {
    /// Their caches.
    pub caches: Caches,
    /// Whether each cache has had its first full list.
    pub filled: CacheFill,
    /// Notes of changed Sandboxes and RolloutGroups for the gateway's waiters.
    pub changes: ChangeFeed,
    /// What wakes the controllers.
    pub triggers: Triggers,
    /// Drives every watch until its stream ends.
    pub running: BoxFuture<'static, ()>,
}

/// Starts a watch of every kind the operator reads, in `namespace` (all when empty); committer Pods
/// in `snapshot_namespace` when snapshots are on.
pub fn start(
    client: &Client,
    namespace: &str,
    snapshot_namespace: Option<&str>,
    memory: &Memory,
    queues: &Arc<QueueBook>,
    pools: &Arc<PoolBook>,
) -> Watches {
    let filled = CacheFill::default();
    let changes = ChangeFeed::default();
    let all = watcher::Config::default;
    let (snapshot_refs_tx, snapshot_refs) = mapped_channel::<SandboxSnapshot>();

    let (sandbox_trigger, sandboxes_triggered) = trigger::<Sandbox>(Forward::Applied);
    let (children_trigger, group_children) = trigger::<Sandbox>(Forward::AppliedAndDeleted);
    let subscribers: Subscribers<Sandbox> = vec![
        Box::new(memory.clone()),
        Box::new(sandbox_trigger),
        Box::new(children_trigger),
        Box::new(Publish {
            feed: changes.clone(),
            kind: "Sandbox",
        }),
        Box::new(queues.clone()),
        Box::new(pools.clone()),
        Box::new(MappedTrigger::with(&snapshot_refs_tx, snapshot_of_sandbox)),
    ];
    let (sandboxes, sandbox_watch) = cached_watch(
        scoped_api(client, namespace),
        all(),
        filled.sandboxes.clone(),
        subscribers,
    );

    let (group_trigger, groups_triggered) = trigger::<RolloutGroup>(Forward::Applied);
    let subscribers: Subscribers<RolloutGroup> = vec![
        Box::new(memory.clone()),
        Box::new(group_trigger),
        Box::new(Publish {
            feed: changes.clone(),
            kind: "RolloutGroup",
        }),
        Box::new(queues.clone()),
        Box::new(MappedTrigger::with(&snapshot_refs_tx, snapshot_of_group)),
    ];
    let (rollout_groups, group_watch) = cached_watch(
        scoped_api(client, namespace),
        all(),
        filled.rollout_groups.clone(),
        subscribers,
    );

    let subscribers: Subscribers<RolloutQueue> =
        vec![Box::new(memory.clone()), Box::new(queues.clone())];
    let (rollout_queues, queue_watch) = cached_watch(
        scoped_api(client, namespace),
        all(),
        filled.rollout_queues.clone(),
        subscribers,
    );

    let (pool_trigger, pools_triggered) = trigger::<SandboxPool>(Forward::Applied);
    let subscribers: Subscribers<SandboxPool> = vec![
        Box::new(memory.clone()),
        Box::new(pool_trigger),
        Box::new(pools.clone()),
        Box::new(MappedTrigger::with(&snapshot_refs_tx, snapshot_of_pool)),
    ];
    let (sandbox_pools, pool_watch) = cached_watch(
        scoped_api(client, namespace),
        all(),
        filled.sandbox_pools.clone(),
        subscribers,
    );

    let (pod_trigger, pods_triggered) = trigger::<CachedPod>(Forward::AppliedAndDeleted);
    let subscribers: Subscribers<CachedPod> = vec![
        Box::new(memory.clone()),
        Box::new(queues.clone()),
        Box::new(pools.clone()),
        Box::new(pod_trigger),
    ];
    let (pods, pod_watch) = cached_watch(
        scoped_api(client, namespace),
        all().labels(&format!("{SANDBOX_POD_LABEL}=true")),
        filled.pods.clone(),
        subscribers,
    );

    let (policy_trigger, policies_triggered) = trigger::<NetworkPolicy>(Forward::AppliedAndDeleted);
    let subscribers: Subscribers<NetworkPolicy> =
        vec![Box::new(memory.clone()), Box::new(policy_trigger)];
    let (policies, policy_watch) = cached_watch(
        scoped_api(client, namespace),
        all().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")),
        filled.policies.clone(),
        subscribers,
    );

    let (snapshot_trigger, snapshots_triggered) = trigger::<SandboxSnapshot>(Forward::Applied);
    let (changes_trigger, snapshot_changes) =
        trigger::<SandboxSnapshot>(Forward::AppliedAndDeleted);
    let subscribers: Subscribers<SandboxSnapshot> = vec![
        Box::new(memory.clone()),
        Box::new(snapshot_trigger),
        Box::new(changes_trigger),
        Box::new(Publish {
            feed: changes.clone(),
            kind: "SandboxSnapshot",
        }),
    ];
    let (snapshots, snapshot_watch) = cached_watch(
        scoped_api(client, namespace),
        all(),
        filled.snapshots.clone(),
        subscribers,
    );

    // Committer pods live in the snapshot namespace; without snapshots nothing is watched there (the
    // operator may have no permission in it) and the empty cache counts as filled.
    let (committers, committer_watch) = match snapshot_namespace {
        Some(snapshot_namespace) => {
            let subscribers: Subscribers<Pod> = vec![
                Box::new(memory.clone()),
                Box::new(MappedTrigger::with(
                    &snapshot_refs_tx,
                    snapshot_of_committer,
                )),
            ];
            cached_watch(
                kube::Api::namespaced(client.clone(), snapshot_namespace),
                all().labels(&format!(
                    "app.kubernetes.io/component={COMMITTER_COMPONENT},{MANAGED_BY_LABEL}={MANAGED_BY}"
                )),
                filled.committers.clone(),
                subscribers,
                    )
        }
        None => {
            filled
                .committers
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let (store, _writer) = kube::runtime::reflector::store::<Pod>();
            let idle: BoxFuture<'static, ()> = futures::future::pending().boxed();
            (store, idle)
        }
    };

    let running = futures::future::join_all([
        sandbox_watch,
        group_watch,
        queue_watch,
        pool_watch,
        pod_watch,
        policy_watch,
        snapshot_watch,
        committer_watch,
    ])
    .map(|_| ())
    .boxed();
    Watches {
        caches: Caches {
            sandboxes,
            pods,
            policies,
            rollout_groups,
            rollout_queues,
            sandbox_pools,
            snapshots,
            committers,
        },
        filled,
        changes,
        triggers: Triggers {
            sandboxes: sandboxes_triggered.boxed(),
            group_children: group_children.boxed(),
            groups: groups_triggered.boxed(),
            pools: pools_triggered.boxed(),
            pods: pods_triggered.boxed(),
            policies: policies_triggered.boxed(),
            snapshots: snapshots_triggered.boxed(),
            snapshot_changes: snapshot_changes.boxed(),
            snapshot_refs: snapshot_refs.boxed(),
        },
        running,
    }
}
