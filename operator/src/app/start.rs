//! Process wiring: settings, client, the cluster's ranges, the watches and their caches, the
//! contexts, the five controllers, the gateway and the admin server, and one shutdown signal
//! (SIGTERM/SIGINT) that stops all of them.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, future};
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::{Recorder, Reporter};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::app::admin::{self, AdminState};
use crate::app::config::OperatorArgs;
use crate::app::discovery::{
    client_config, default_identity, egress_proxy, observe_ranges, shutdown_on_signal,
};
use crate::app::settings::Settings;
use crate::app::token_key;
use crate::app::watches;
use crate::gateway::deps::{GatewayDeps, ReadModel};
use crate::gateway::serve as gateway;
use crate::plumbing::api_client::{self, scoped_api};
use crate::plumbing::backoff::ReconcileBackoff;
use crate::plumbing::error::{Error, Result};
use crate::plumbing::kube_ctx::KubeCtx;
use crate::plumbing::leader::{self, Election, Leadership, Timing, WriteGate};
use crate::plumbing::metrics::Metrics;
use crate::plumbing::own_writes::OwnWrites;
use crate::plumbing::reconcile_slots::ReconcileSlots;
use crate::plumbing::watch::Memory;
use crate::pod::cluster_ranges;
use crate::pod::context::PodCtx;
use crate::pool::book::PoolBook;
use crate::pool::context::PoolCtx;
use crate::queue::book::QueueBook;
use crate::queue::context::QueueCtx;
use crate::retry::ResourceDefaults;
use crate::rollout::context::RolloutCtx;
use crate::sandbox::context::SandboxCtx;
use crate::snapshot::context::SnapshotCtx;
use crate::snapshot::source::sandboxes_of;
use crate::{pool, queue, rollout, sandbox, snapshot};
use orchard_api::Sandbox;

/// kube-runtime's own concurrency limit, off: the reconcilers bound themselves with FIFO slots
/// (`reconcile_slots`), because kube-runtime 5.0.0 starves some objects when its limit is reached.
const UNLIMITED: u16 = 0;

/// Runs the operator until a termination signal.
pub async fn run(args: OperatorArgs) -> Result<()> {
    let mut settings = Settings::from_args(&args)?;
    let identity = args
        .leader
        .identity
        .clone()
        .unwrap_or_else(default_identity);
    let config = client_config(&identity).await?;
    let client = api_client::client_builder(&config, api_client::POOL_IDLE_TIMEOUT)?.build();
    let observed_ranges = observe_ranges(&client, &settings.pod.ranges).await?;
    if let Some(proxy) = egress_proxy(
        &client,
        &args.sandbox.operator_namespace,
        &args.sandbox.egress_proxy_service,
    )
    .await?
    {
        settings.pod.pod.egress_proxy_url = Some(proxy.url);
        settings.pod.policy.egress_proxy = Some(proxy.peer);
    }
    let key = Arc::new(load_key(&client, &args.sandbox.operator_namespace).await?);
    let metrics = Metrics::new().map_err(|e| Error::Startup(format!("metrics registry: {e}")))?;
    let shutdown = shutdown_on_signal();
    let namespace = args.watch_namespace.clone();
    let sandboxes: Api<Sandbox> = scoped_api(&client, &namespace);
    if let Err(err) = sandboxes.list(&ListParams::default().limit(1)).await {
        return Err(Error::Startup(format!(
            "cannot list sandboxes.orchard.dev ({err}); are the CRDs installed (`kubectl apply --server-side -f crds/`) and does the operator's RBAC allow it?"
        )));
    }

    // The operator's memory of its own writes and its per-object backoff: every watch tells them
    // what it delivered, so entries end when the cache shows them or their object is deleted.
    let memory = Memory {
        own_writes: Arc::new(OwnWrites::default()),
        backoff: Arc::new(ReconcileBackoff::new(
            Duration::from_millis(args.controller.backoff_base_ms),
            Duration::from_secs(args.controller.backoff_max_seconds),
        )),
    };
    let queue_book = Arc::new(QueueBook::default());
    let pool_book = Arc::new(PoolBook::default());
    let snapshot_namespace = settings
        .snapshot
        .registry
        .as_ref()
        .map(|_| settings.snapshot.namespace.clone());
    let watches = watches::start(
        &client,
        &namespace,
        snapshot_namespace.as_deref(),
        &memory,
        &queue_book,
        &pool_book,
    );
    let gateway_deps = GatewayDeps {
        client: client.clone(),
        reads: ReadModel {
            sandboxes: watches.caches.sandboxes.clone(),
            pods: watches.caches.pods.clone(),
            rollout_groups: watches.caches.rollout_groups.clone(),
            snapshots: watches.caches.snapshots.clone(),
            changes: watches.changes.clone(),
        },
        metrics: metrics.clone(),
        settings: settings.gateway(),
        limits: args.gateway.clone(),
        key: key.clone(),
    };
    let (leadership, controller_client) =
        leadership(&args, &config, &client, &identity, &shutdown)?;
    export_leadership(&metrics, &leadership);

    // The cluster's own ranges: kept current by a watch; a change reconciles every sandbox, so each
    // open egress policy is rewritten with the new protected addresses.
    let (ranges_tx, ranges) = tokio::sync::watch::channel(observed_ranges.ranges());
    let (ranges_changed_tx, ranges_changed) = tokio::sync::mpsc::channel(1);
    tokio::spawn(cluster_ranges::keep_current(
        client.clone(),
        settings.pod.ranges.watched(),
        observed_ranges,
        ranges_tx,
        ranges_changed_tx,
        shutdown.clone(),
    ));

    let kube = Arc::new(KubeCtx {
        recorder: Recorder::new(
            controller_client.clone(),
            Reporter {
                controller: "orchard-operator".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
        client: controller_client,
        caches: watches.caches.clone(),
        filled: watches.filled.clone(),
        metrics: metrics.clone(),
        backoff: memory.backoff.clone(),
        own_writes: memory.own_writes.clone(),
        leadership: leadership.clone(),
        key,
        resync: settings.resync,
    });
    let pods = Arc::new(PodCtx::new(settings.pod.clone(), ranges));
    let sandbox_ctx = Arc::new(SandboxCtx::new(
        kube.clone(),
        pods.clone(),
        settings.sandbox.clone(),
        pool_book.clone(),
    ));
    // The cluster-wide verdict on NetworkPolicy enforcement, from the sandboxes there before we
    // started, then every resync (the reconciles tell it the rest).
    tokio::spawn(sandbox::enforcement::shared::keep_folding(
        sandbox_ctx.enforcement.clone(),
        watches.caches.clone(),
        watches.filled.clone(),
        kube.key.clone(),
        settings.resync,
        shutdown.clone(),
    ));
    let queue_ctx = Arc::new(QueueCtx {
        kube: kube.clone(),
        book: queue_book.clone(),
    });
    let rollout_ctx = Arc::new(RolloutCtx {
        kube: kube.clone(),
        slots: ReconcileSlots::new(settings.rollout_concurrency),
        queues: queue_ctx.clone(),
        defaults: ResourceDefaults {
            cpu: settings.pod.pod.default_cpu.clone(),
            memory: settings.pod.pod.default_memory.clone(),
        },
    });
    let snapshot_ctx = Arc::new(SnapshotCtx {
        kube: kube.clone(),
        settings: settings.snapshot.clone(),
        quota_locks: Default::default(),
    });
    let pool_ctx = Arc::new(PoolCtx {
        kube: kube.clone(),
        pods,
        book: pool_book.clone(),
    });
    let queue_signals = queue_book
        .take_receivers()
        .ok_or_else(|| Error::Startup("the queue signals were taken twice".into()))?;
    let pool_signals = pool_book
        .take_receivers()
        .ok_or_else(|| Error::Startup("the pool signals were taken twice".into()))?;

    let triggers = watches.triggers;
    let caches = watches.caches;
    let waiting_sandboxes = caches.sandboxes.clone();
    let sandbox_controller =
        Controller::for_shared_stream(triggers.sandboxes, caches.sandboxes.clone())
            .owns_stream(triggers.pods.map(|pod| Ok(Arc::unwrap_or_clone(pod))))
            .owns_stream(triggers.policies.map(|p| Ok(Arc::unwrap_or_clone(p))))
            .watches_shared_stream(triggers.snapshot_changes, move |snapshot| {
                sandboxes_of(&waiting_sandboxes, &snapshot)
            })
            .reconcile_on(pool_signals.sandboxes)
            .with_config(controller::Config::default().concurrency(UNLIMITED))
            .reconcile_all_on(leadership.gained_stream())
            .reconcile_all_on(futures::stream::unfold(
                ranges_changed,
                |mut changed| async move { changed.recv().await.map(|()| ((), changed)) },
            ))
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(
                sandbox::reconcile,
                sandbox::error_policy,
                sandbox_ctx.clone(),
            )
            .for_each(|_| future::ready(()));
    let rollout_controller =
        Controller::for_shared_stream(triggers.groups, caches.rollout_groups.clone())
            .owns_stream(
                triggers
                    .group_children
                    .map(|child| Ok(Arc::unwrap_or_clone(child))),
            )
            .reconcile_on(queue_signals.wake)
            .with_config(controller::Config::default().concurrency(UNLIMITED))
            .reconcile_all_on(leadership.gained_stream())
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(rollout::reconcile, rollout::error_policy, rollout_ctx)
            .for_each(|_| future::ready(()));
    let queue_loop = queue::controller::run(queue_ctx, queue_signals.dirty, shutdown.clone());
    let pool_controller =
        Controller::for_shared_stream(triggers.pools, caches.sandbox_pools.clone())
            .reconcile_on(pool_signals.pools)
            .with_config(controller::Config::default().concurrency(UNLIMITED))
            .reconcile_all_on(leadership.gained_stream())
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(
                pool::controller::reconcile,
                pool::controller::error_policy,
                pool_ctx,
            )
            .for_each(|_| future::ready(()));

    let snapshot_controller =
        Controller::for_shared_stream(triggers.snapshots, caches.snapshots.clone())
            .reconcile_on(triggers.snapshot_refs)
            .with_config(controller::Config::default().concurrency(UNLIMITED))
            .reconcile_all_on(leadership.gained_stream())
            .graceful_shutdown_on(shutdown.clone().cancelled_owned())
            .run(
                snapshot::controller::reconcile,
                snapshot::controller::error_policy,
                snapshot_ctx,
            )
            .for_each(|_| future::ready(()));

    let admin_server = admin::serve(
        args.metrics_listen,
        AdminState {
            metrics,
            caches,
            filled: watches.filled,
        },
        shutdown.clone(),
    );
    let gateway_server = gateway::serve(args.gateway_listen, gateway_deps, shutdown.clone());
    info!(
        namespace = if namespace.is_empty() {
            "*"
        } else {
            namespace.as_str()
        },
        "orchard-operator started"
    );
    let watch_until_shutdown = async {
        tokio::select! {
            _ = watches.running => {},
            _ = shutdown.cancelled() => {},
        }
    };
    let controllers = future::join5(
        sandbox_controller,
        rollout_controller,
        queue_loop,
        pool_controller,
        snapshot_controller,
    );
    let (_, _, admin_served, gateway_served) = tokio::join!(
        controllers,
        watch_until_shutdown,
        admin_server,
        gateway_server
    );
    // The trajectory runs stop with the process; whoever leads next adopts them through the agent.
    sandbox_ctx.runners.stop();
    admin_served
        .map_err(|err| Error::Startup(format!("admin server on {}: {err}", args.metrics_listen)))?;
    gateway_served
        .map_err(|err| Error::Startup(format!("gateway on {}: {err}", args.gateway_listen)))?;
    info!("orchard-operator stopped");
    Ok(())
}

/// The operator's key from its Secret (created on first start), with a message naming the
/// permission when it cannot be had.
async fn load_key(
    client: &Client,
    namespace: &str,
) -> Result<crate::plumbing::operator_key::OperatorKey> {
    let key = token_key::load_or_create(client, namespace)
        .await
        .map_err(|err| {
            Error::Startup(format!(
                "the agent-token key (Secret {namespace}/{}): {err}; the operator needs `get` and `create` on Secrets in its own namespace",
                token_key::TOKEN_KEY_SECRET
            ))
        })?;
    info!(key = key.id(), "agent tokens are derived from this key");
    Ok(key)
}

/// Leader election: the election's own Lease writes, the watches and the gateway use `client`; the
/// controllers (reconciles, the trajectory runner, events) use the returned client, whose writes
/// pass only during a term, are aborted when it ends, and time out within the lease margin
/// (`WriteGate`). Without election this replica always leads and the client is `client`.
fn leadership(
    args: &OperatorArgs,
    config: &kube::Config,
    client: &Client,
    identity: &str,
    shutdown: &CancellationToken,
) -> Result<(Leadership, Client)> {
    if !args.leader.leader_election {
        return Ok((Leadership::always(), client.clone()));
    }
    let leadership = Leadership::contended();
    let election = Election {
        namespace: args
            .leader
            .lease_namespace
            .clone()
            .unwrap_or_else(|| args.sandbox.operator_namespace.clone()),
        name: args.leader.lease_name.clone(),
        identity: identity.to_string(),
        duration: Duration::from_secs(args.leader.lease_duration_seconds.max(1)),
    };
    let timing = Timing::for_lease(election.duration);
    let controller_client = api_client::client_builder(config, api_client::POOL_IDLE_TIMEOUT)?
        .with_layer(&WriteGate::new(leadership.clone(), timing.call_timeout))
        .build();
    tokio::spawn(leader::run(
        client.clone(),
        election,
        leadership.clone(),
        shutdown.clone(),
    ));
    Ok((leadership, controller_client))
}

/// Keeps `orchard_leader` at 1 while this replica leads.
fn export_leadership(metrics: &Metrics, leadership: &Leadership) {
    let gauge = metrics.leader.clone();
    let leadership = leadership.clone();
    tokio::spawn(async move {
        loop {
            gauge.set(i64::from(leadership.is_leader()));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
}
