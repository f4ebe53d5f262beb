//! Process wiring: one watch per resource kind feeding the reflector caches and the controllers, the
//! Sandbox controller, the admin server, and one shutdown signal (SIGTERM/SIGINT) that stops all of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{StreamExt, future};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::gateway::{self, GatewayDeps};
use crate::pool::book::{PoolBook, PoolKey};
use crate::queue::book::{QueueBook, QueueKey};
use crate::app::admin::{self, AdminState};
use crate::plumbing::api_client;
use crate::plumbing::backoff::ReconcileBackoff;
use crate::plumbing::change_feed::ChangeFeed;
use crate::app::config::OperatorArgs;
use crate::app::context::{Caches, Context, Settings};
use crate::plumbing::error::{Error, Result};
use crate::plumbing::leader::{self, Election, Leadership, Timing, WriteGate};
use crate::plumbing::metrics::Metrics;
use crate::plumbing::own_writes::{OwnWrites, child_key, namespace_scope};
use crate::plumbing::ownership::controller_uid;
use crate::plumbing::triggers::{Forward, forwarded, trigger};
use crate::pod::cluster_ranges::{self, Observations};
use crate::{rollout, sandbox};
use orchard_api::{
    CLAIMED_FROM_LABEL, MANAGED_BY, MANAGED_BY_LABEL, POOL_LABEL, ROLLOUT_QUEUE_LABEL,
    RolloutGroup, RolloutQueue, SANDBOX_POD_LABEL, Sandbox, SandboxPool,
};

/// kube-runtime's own concurrency limit, off: the reconcilers bound themselves with FIFO slots
/// (`reconcile_slots`), because kube-runtime 5.0.0 starves some objects when its limit is reached.
const UNLIMITED: u16 = 0;

/// An `Api` over every namespace, or over the one the operator is told to watch.
pub fn scoped_api<K>(client: &Client, namespace: &str) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    if namespace.is_empty() {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), namespace)
    }
}

/// This replica's identity in the Lease: the host name (the pod name in a cluster) and the pid.
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "orchard-operator".into());
    format!("{host}-{}", std::process::id())
}

/// The client configuration (`KUBECONFIG`, `~/.kube/config` or in-cluster), with a User-Agent that
/// names this replica, so the API server's audit log tells the replicas' requests apart.
async fn client_config(identity: &str) -> Result<kube::Config> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| Error::Config(format!("no Kubernetes client configuration: {e}")))?;
    let agent = format!(
        "orchard-operator/{} ({identity})",
        env!("CARGO_PKG_VERSION")
    );
    if let Ok(value) = hyper::header::HeaderValue::from_str(&agent) {
        config.headers.push((hyper::header::USER_AGENT, value));
    }
    Ok(config)
}

/// Resolves on SIGTERM or SIGINT.
async fn termination_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(err) => {
                error!(%err, "cannot listen for SIGTERM; only SIGINT stops the operator");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Reads the cluster's own ranges once, before anything is reconciled (see `cluster_ranges`), with
/// a message naming the permission when they cannot be read.
async fn observe_ranges(client: &Client, settings: &Settings) -> Result<Observations> {
    let watched = settings.ranges.watched();
    let observed = cluster_ranges::observe_once(client, watched)
        .await
        .map_err(|err| {
            Error::Startup(format!(
                "cannot read the cluster's own ranges ({err}): the operator needs `get`, `list` and `watch` on the EndpointSlice default/kubernetes to keep sandboxes away from the API server and to see their NetworkPolicies enforced (or --egress-allow-api-server and --await-policy-enforcement=false), and `list` and `watch` on nodes to read their pod ranges (or --discover-pod-cidrs=false)"
            ))
        })?;
    let ranges = observed.ranges();
    cluster_ranges::log_ranges(&ranges);
    if watched.api_server && ranges.api_server.is_empty() {
        warn!(
            "no ready endpoint in the EndpointSlice default/kubernetes: the API server's addresses cannot be excepted from sandbox egress until one appears; add them to --egress-except-cidrs"
        );
    }
    if settings.ranges.await_enforcement && ranges.live_canaries.is_empty() {
        warn!(
            "no endpoint of the EndpointSlice default/kubernetes answers the operator: sandboxes cannot check that their NetworkPolicies are enforced and become Ready without waiting for it until one does"
        );
    }
    if watched.nodes && ranges.pod_cidrs.is_empty() {
        warn!(
            "no node carries spec.podCIDRs (an IPAM that does not set them): set --cluster-pod-cidrs (Helm sandboxEgress.clusterPodCidrs) so that AllowAll sandboxes cannot reach the operator's pods through their IP blocks"
        );
    }
    Ok(observed)
}

/// Runs the operator until a termination signal.
pub async fn run(args: OperatorArgs) -> Result<()> {
    let settings = Settings::from_args(&args)?;
    let identity = args
        .leader
        .identity
        .clone()
        .unwrap_or_else(default_identity);
    let config = client_config(&identity).await?;
    let client = api_client::client_builder(&config, api_client::POOL_IDLE_TIMEOUT)?.build();
    let observed_ranges = observe_ranges(&client, &settings).await?;
    let token_key = super::token_key::load_or_create(&client, &args.sandbox.operator_namespace)
        .await
        .map_err(|err| {
            Error::Startup(format!(
                "the agent-token key (Secret {}/{}): {err}; the operator needs `get` and `create` on Secrets in its own namespace",
                args.sandbox.operator_namespace,
                super::token_key::TOKEN_KEY_SECRET
            ))
        })?;
    info!(
        key = token_key.id(),
        "agent tokens are derived from this key"
    );
    let token_key = Arc::new(token_key);
    let metrics = Metrics::new().map_err(|e| Error::Startup(format!("metrics registry: {e}")))?;
    let shutdown = CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            termination_signal().await;
            info!("termination signal received, shutting down");
            shutdown.cancel();
        });
    }

    let namespace = args.watch_namespace.clone();
    let sandboxes: Api<Sandbox> = scoped_api(&client, &namespace);
    if let Err(err) = sandboxes.list(&ListParams::default().limit(1)).await {
        return Err(Error::Startup(format!(
            "cannot list sandboxes.orchard.dev ({err}); are the CRDs installed (`kubectl apply --server-side -f crds/`) and does the operator's RBAC allow it?"
        )));
    }

    // Sandboxes: one watch and cache shared by the Sandbox controller, the RolloutGroup controller and
    // the gateway. The controllers are triggered through our own channels, fed after the cache was
    // updated, not through the shared store's subscribers (see `triggers.rs` for why).
    // The operator's memory of its own writes and its per-object backoff: every watch below tells them
    // what it delivered, so entries end when the cache shows them or their object is deleted.
    let own_writes = Arc::new(OwnWrites::default());
    let backoff = Arc::new(ReconcileBackoff::new(
        Duration::from_millis(args.controller.backoff_base_ms),
        Duration::from_secs(args.controller.backoff_max_seconds),
    ));
    // The queues' admission state; the watches below tell it when a queue's accounting may change.
    let queue_book = Arc::new(QueueBook::default());
    // The pools' state; pod and pool events wake pools and the Sandboxes waiting for a member.
    let pool_book = Arc::new(PoolBook::default());
    let (sandbox_store, sandbox_writer) = reflector::store::<Sandbox>();
    let (sandbox_trigger_tx, sandbox_trigger) = trigger::<Sandbox>(Forward::Applied);
    let (group_children_tx, group_children) = trigger::<Sandbox>(Forward::AppliedAndDeleted);
    let filled = CacheFill::default();
    let changes = ChangeFeed::default();
    let sandbox_watch = watcher(sandboxes, watcher::Config::default())
        .default_backoff()
        .modify(|s: &mut Sandbox| s.meta_mut().managed_fields = None)
        .inspect(flag_on_init_done(filled.sandboxes.clone()))
        .reflect(sandbox_writer)
        .inspect(tell_memory(own_writes.clone(), backoff.clone()))
        .inspect(move |event| {
            sandbox_trigger_tx.forward(event);
            group_children_tx.forward(event);
        })
        .inspect(publish_changes(changes.clone(), "Sandbox"))
        .inspect(mark_queue_dirty(queue_book.clone()))
        .inspect({
            let book = pool_book.clone();
            move |event| {
                // A deleted Sandbox no longer waits for a pool member.
                if let Ok(watcher::Event::Delete(sandbox)) = event
                    && let Some(pool) = sandbox.spec.pool.as_ref()
                {
                    let key = PoolKey {
                        namespace: sandbox.meta().namespace.clone().unwrap_or_default(),
                        name: pool.clone(),
                    };
                    book.stop_waiting(&key, sandbox.meta().name.as_deref().unwrap_or_default());
                }
            }
        })
        .for_each(|event| async move {
            if let Err(err) = event {
                warn!(%err, "sandbox watch error (retrying)");
            }
        });

    // RolloutGroups: one watch shared by the RolloutGroup controller and the gateway.
    let (rollout_store, rollout_writer) = reflector::store::<RolloutGroup>();
    let (rollout_trigger_tx, rollout_trigger) = trigger::<RolloutGroup>(Forward::Applied);
    let rollout_watch = watcher(
        scoped_api::<RolloutGroup>(&client, &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|g: &mut RolloutGroup| g.meta_mut().managed_fields = None)
    .inspect(flag_on_init_done(filled.rollout_groups.clone()))
    .reflect(rollout_writer)
    .inspect(tell_memory(own_writes.clone(), backoff.clone()))
    .inspect(move |event| {
        rollout_trigger_tx.forward(event);
    })
    .inspect(publish_changes(changes.clone(), "RolloutGroup"))
    .inspect({
        let book = queue_book.clone();
        move |event| {
            // A deleted group leaves its queue's waiting list.
            if let Ok(watcher::Event::Delete(group)) = event
                && let Some(key) = crate::queue::admission::queue_of(group)
            {
                book.mark_dirty(key);
            }
        }
    })
    .for_each(|event| async move {
        if let Err(err) = event {
            tracing::warn!(%err, "rolloutgroup watch error (retrying)");
        }
    });

    // RolloutQueues: their spec (limits) and status; any change is a reason to look at the queue.
    let (queue_store, queue_writer) = reflector::store::<RolloutQueue>();
    let queue_watch = watcher(
        scoped_api::<RolloutQueue>(&client, &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|q: &mut RolloutQueue| q.meta_mut().managed_fields = None)
    .inspect(flag_on_init_done(filled.rollout_queues.clone()))
    .reflect(queue_writer)
    .inspect(tell_memory(own_writes.clone(), backoff.clone()))
    .inspect({
        let book = queue_book.clone();
        move |event| {
            if let Some(queue) = forwarded(event, Forward::AppliedAndDeleted) {
                book.mark_dirty(QueueKey {
                    namespace: queue.meta().namespace.clone().unwrap_or_default(),
                    name: queue.meta().name.clone().unwrap_or_default(),
                });
            }
        }
    })
    .for_each(|event| async move {
        if let Err(err) = event {
            tracing::warn!(%err, "rolloutqueue watch error (retrying)");
        }
    });

    // SandboxPools: the pool controller's objects; a pool that appears or changes may end the wait of
    // the Sandboxes naming it.
    let (pool_store, pool_writer) = reflector::store::<SandboxPool>();
    let (pool_trigger_tx, pool_trigger) = trigger::<SandboxPool>(Forward::Applied);
    let pool_watch = watcher(
        scoped_api::<SandboxPool>(&client, &namespace),
        watcher::Config::default(),
    )
    .default_backoff()
    .modify(|p: &mut SandboxPool| p.meta_mut().managed_fields = None)
    .inspect(flag_on_init_done(filled.sandbox_pools.clone()))
    .reflect(pool_writer)
    .inspect(tell_memory(own_writes.clone(), backoff.clone()))
    .inspect(move |event| {
        pool_trigger_tx.forward(event);
    })
    .inspect({
        let book = pool_book.clone();
        move |event| {
            if let Some(pool) = forwarded(event, Forward::AppliedAndDeleted) {
                book.wake_waiting(&PoolKey {
                    namespace: pool.meta().namespace.clone().unwrap_or_default(),
                    name: pool.meta().name.clone().unwrap_or_default(),
                });
            }
        }
    })
    .for_each(|event| async move {
        if let Err(err) = event {
            tracing::warn!(%err, "sandboxpool watch error (retrying)");
        }
    });

    let pod_labels = format!("{SANDBOX_POD_LABEL}=true");
    let managed_labels = format!("{MANAGED_BY_LABEL}={MANAGED_BY}");
    let (pods, pod_events) = cached_watch::<Pod>(
        scoped_api(&client, &namespace),
        &pod_labels,
        filled.pods.clone(),
        {
            let mut remember = tell_memory(own_writes.clone(), backoff.clone());
            let mut mark = mark_queue_dirty(queue_book.clone());
            let mut pools = tell_pools(pool_book.clone());
            move |event| {
                remember(event);
                mark(event);
                pools(event);
            }
        },
    );
    let (policies, policy_events) = cached_watch::<NetworkPolicy>(
        scoped_api(&client, &namespace),
        &managed_labels,
        filled.policies.clone(),
        tell_memory(own_writes.clone(), backoff.clone()),
    );

    let caches = Caches {
        sandboxes: sandbox_store.clone(),
        pods,
        policies,
        rollout_groups: rollout_store.clone(),
        rollout_queues: queue_store,
        sandbox_pools: pool_store.clone(),
    };
    let gateway_deps = GatewayDeps {
        client: client.clone(),
        caches: caches.clone(),
        rollout_groups: rollout_store.clone(),
        changes: changes.clone(),
        metrics: metrics.clone(),
        settings: settings.clone(),
        limits: args.gateway.clone(),
        token_key: token_key.clone(),
    };
    // Leader election: the election's own Lease writes, the watches and the gateway use `client`;
    // the controllers (reconciles, the trajectory runner, events) use `controller_client`, whose
    // writes pass only during a term, are aborted when it ends, and time out within the lease margin
    // (`WriteGate`).
    let (leadership, controller_client) = if args.leader.leader_election {
        let leadership = Leadership::contended();
        let election = Election {
            namespace: args
                .leader
                .lease_namespace
                .clone()
                .unwrap_or_else(|| args.sandbox.operator_namespace.clone()),
            name: args.leader.lease_name.clone(),
            identity: identity.clone(),
            duration: Duration::from_secs(args.leader.lease_duration_seconds.max(1)),
        };
        let timing = Timing::for_lease(election.duration);
        let controller_client = api_client::client_builder(&config, api_client::POOL_IDLE_TIMEOUT)?
            .with_layer(&WriteGate::new(leadership.clone(), timing.call_timeout))
            .build();
        tokio::spawn(leader::run(
            client.clone(),
            election,
            leadership.clone(),
            shutdown.clone(),
        ));
        (leadership, controller_client)
    } else {
        (Leadership::always(), client.clone())
    };
    {
        let gauge = metrics.leader.clone();
        let leadership = leadership.clone();
        tokio::spawn(async move {
            loop {
                gauge.set(i64::from(leadership.is_leader()));
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }
    let mut context = Context::new(
        controller_client,
        settings,
        metrics.clone(),
        backoff,
        caches.clone(),
        own_writes,
        leadership.clone(),
        token_key,
    );
    context.queues = queue_book.clone();
    context.pools = pool_book.clone();
    // The cluster's own ranges: kept current by a watch; a change reconciles every sandbox, so each
    // open egress policy is rewritten with the new protected addresses.
    let (ranges_tx, ranges) = tokio::sync::watch::channel(observed_ranges.ranges());
    let (ranges_changed_tx, ranges_changed) = tokio::sync::mpsc::channel(1);
    context.ranges = ranges;
    tokio::spawn(cluster_ranges::keep_current(
        client.clone(),
        context.settings.ranges.watched(),
        observed_ranges,
        ranges_tx,
        ranges_changed_tx,
        shutdown.clone(),
    ));
    let ctx = Arc::new(context);
    let queue_signals = queue_book
        .take_receivers()
        .ok_or_else(|| Error::Startup("the queue signals were taken twice".into()))?;
    let pool_signals = pool_book
        .take_receivers()
        .ok_or_else(|| Error::Startup("the pool signals were taken twice".into()))?;

    let sandbox_controller = Controller::for_shared_stream(sandbox_trigger, sandbox_store)
        .owns_stream(pod_events)
        .owns_stream(policy_events)
        .reconcile_on(pool_signals.sandboxes)
        .with_config(controller::Config::default().concurrency(UNLIMITED))
        .reconcile_all_on(leadership.gained_stream())
        .reconcile_all_on(futures::stream::unfold(
            ranges_changed,
            |mut changed| async move { changed.recv().await.map(|()| ((), changed)) },
        ))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(sandbox::reconcile, sandbox::error_policy, ctx.clone())
        .for_each(|_| future::ready(()));

    let admin_state = AdminState {
        metrics,
        caches,
        filled,
    };
    let admin_server = admin::serve(args.metrics_listen, admin_state, shutdown.clone());

    info!(
        namespace = if namespace.is_empty() {
            "*"
        } else {
            namespace.as_str()
        },
        "orchard-operator started"
    );
    let rollout_controller = Controller::for_shared_stream(rollout_trigger, rollout_store.clone())
        .owns_stream(group_children.map(|child| Ok(Sandbox::clone(&child))))
        .reconcile_on(queue_signals.wake)
        .with_config(controller::Config::default().concurrency(UNLIMITED))
        .reconcile_all_on(leadership.gained_stream())
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(rollout::reconcile, rollout::error_policy, ctx.clone())
        .for_each(|_| future::ready(()));
    let queue_loop =
        crate::queue::controller::run(ctx.clone(), queue_signals.dirty, shutdown.clone());
    let pool_controller = Controller::for_shared_stream(pool_trigger, pool_store)
        .reconcile_on(pool_signals.pools)
        .with_config(controller::Config::default().concurrency(UNLIMITED))
        .reconcile_all_on(leadership.gained_stream())
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(
            crate::pool::controller::reconcile,
            crate::pool::controller::error_policy,
            ctx.clone(),
        )
        .for_each(|_| future::ready(()));
    let gateway_server = gateway::serve(args.gateway_listen, gateway_deps, shutdown.clone());
    let watch_until_shutdown = async {
        tokio::select! {
            _ = futures::future::join4(sandbox_watch, rollout_watch, queue_watch, pool_watch) => {},
            _ = shutdown.cancelled() => {},
        }
    };
    let controllers = future::join4(
        sandbox_controller,
        rollout_controller,
        queue_loop,
        pool_controller,
    );
    let (_, _, admin_served, gateway_served) = tokio::join!(
        controllers,
        watch_until_shutdown,
        admin_server,
        gateway_server
    );
    // The trajectory runs stop with the process; whoever leads next adopts them through the agent.
    ctx.runners.stop();
    if let Err(err) = admin_served {
        return Err(Error::Startup(format!(
            "admin server on {}: {err}",
            args.metrics_listen
        )));
    }
    if let Err(err) = gateway_served {
        return Err(Error::Startup(format!(
            "gateway on {}: {err}",
            args.gateway_listen
        )));
    }
    info!("orchard-operator stopped");
    Ok(())
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
        ]
        .iter()
        .all(|flag| flag.load(Ordering::Relaxed))
    }
}

/// An `inspect` callback that sets `flag` when the watcher finishes its initial list.
fn flag_on_init_done<K>(
    flag: Arc<AtomicBool>,
) -> impl FnMut(&std::result::Result<watcher::Event<K>, watcher::Error>) {
    move |event| {
        if let Ok(watcher::Event::InitDone) = event
            && !flag.swap(true, Ordering::Relaxed)
        {
            tracing::debug!(kind = std::any::type_name::<K>(), "watch cache filled");
        }
    }
}

/// An `inspect` callback that publishes every applied or deleted object to `feed` (after the
/// reflector put it in the cache, so a notified waiter reads the new state).
fn publish_changes<K>(
    feed: ChangeFeed,
    kind: &'static str,
) -> impl FnMut(&std::result::Result<watcher::Event<K>, watcher::Error>)
where
    K: Resource,
{
    move |event| match event {
        Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) => feed.publish(
            kind,
            obj.meta().namespace.as_deref(),
            obj.meta().name.as_deref(),
        ),
        Ok(watcher::Event::InitDone) => feed.publish(kind, None, None),
        _ => {}
    }
}

/// An `inspect` callback, placed after a reflector, that tells the operator's memory what the watch
/// delivered: a version of an object (its remembered status may end), a child shown or deleted (the
/// owner's entry for it ends), an object deleted (everything remembered about its UID ends, backoff
/// included).
fn tell_memory<K>(
    own_writes: Arc<OwnWrites>,
    backoff: Arc<ReconcileBackoff>,
) -> impl FnMut(&std::result::Result<watcher::Event<K>, watcher::Error>)
where
    K: Resource<DynamicType = ()>,
{
    move |event| {
        let (object, deleted) = match event {
            Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (o, false),
            Ok(watcher::Event::Delete(o)) => (o, true),
            _ => return,
        };
        let meta = object.meta();
        let uid = meta.uid.as_deref().unwrap_or_default();
        let parent = controller_uid(meta)
            .map(str::to_string)
            .unwrap_or_else(|| namespace_scope(meta.namespace.as_deref().unwrap_or_default()));
        let key = child_key(&K::kind(&()), meta.name.as_deref().unwrap_or_default());
        own_writes.child_observed(&parent, &key);
        if deleted {
            own_writes.forget(uid);
            backoff.reset(uid);
        } else {
            own_writes.observed(uid, meta.resource_version.as_deref());
        }
    }
}

/// An `inspect` callback that tells the queue loop about a changed or deleted Sandbox or Pod of a
/// queued trajectory (label `orchard.dev/rollout-queue`): its queue's slots may have changed.
fn mark_queue_dirty<K>(
    book: Arc<QueueBook>,
) -> impl FnMut(&std::result::Result<watcher::Event<K>, watcher::Error>)
where
    K: Resource,
{
    move |event| {
        if let Some(object) = forwarded(event, Forward::AppliedAndDeleted)
            && let Some(queue) = object
                .meta()
                .labels
                .as_ref()
                .and_then(|l| l.get(ROLLOUT_QUEUE_LABEL))
        {
            book.mark_dirty(QueueKey {
                namespace: object.meta().namespace.clone().unwrap_or_default(),
                name: queue.clone(),
            });
        }
    }
}

/// An `inspect` callback that tells the pools about a changed or deleted member Pod (label
/// `orchard.dev/pool`) or a claimed one (`orchard.dev/claimed-from`): its pool reconciles (it refills
/// after a claim), and a member that is Ready wakes the Sandboxes waiting for one.
fn tell_pools(
    book: Arc<PoolBook>,
) -> impl FnMut(&std::result::Result<watcher::Event<Pod>, watcher::Error>) {
    move |event| {
        let Some(pod) = forwarded(event, Forward::AppliedAndDeleted) else {
            return;
        };
        let labels = pod.metadata.labels.as_ref();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let key = |name: &String| PoolKey {
            namespace: namespace.clone(),
            name: name.clone(),
        };
        if let Some(pool) = labels.and_then(|l| l.get(POOL_LABEL)) {
            book.wake_pool(&key(pool));
            if crate::sandbox::status::pod_ready(pod) && pod.metadata.deletion_timestamp.is_none() {
                book.wake_waiting(&key(pool));
            }
        } else if let Some(pool) = labels.and_then(|l| l.get(CLAIMED_FROM_LABEL)) {
            book.wake_pool(&key(pool));
        }
    }
}

/// A watch of `K` selected by `labels`, kept in a cache, yielding changed and deleted objects for
/// `owns_stream` (a deleted child wakes its owner: a Sandbox waiting for a previous incarnation's Pod
/// to go, or one whose Pod was deleted from outside).
fn cached_watch<K>(
    api: Api<K>,
    labels: &str,
    filled: Arc<AtomicBool>,
    after_cache: impl FnMut(&std::result::Result<watcher::Event<K>, watcher::Error>) + Send + 'static,
) -> (
    Store<K>,
    impl futures::Stream<Item = std::result::Result<K, watcher::Error>> + Send + 'static,
)
where
    K: crate::plumbing::writes::Child,
{
    let (store, writer) = reflector::store::<K>();
    let events = watcher(api, watcher::Config::default().labels(labels))
        .default_backoff()
        .modify(|o: &mut K| o.meta_mut().managed_fields = None)
        .inspect(flag_on_init_done(filled))
        .reflect(writer)
        .inspect(after_cache)
        .filter_map(|event| {
            future::ready(match event {
                Err(err) => Some(Err(err)),
                ok => forwarded(&ok, Forward::AppliedAndDeleted).cloned().map(Ok),
            })
        });
    (store, events)
}
