//! The egress proxy process (`orchard-operator egress-proxy`): a watch of Sandboxes rebuilt into the
//! proxy's table of pod IP -> rules on every change, `status.egress` reports, the protected ranges
//! kept current, the proxy listener, and an admin server (`/metrics`, `/healthz`, `/readyz`). Until
//! the first list of Sandboxes arrives the table is empty: every connection is refused (fail closed).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use futures::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::discovery::{client_config, shutdown_on_signal};
use super::egress_args::EgressArgs;
use super::settings::cidr_list;
use crate::egress::metrics::EgressMetrics;
use crate::egress::proxy::{self, ProxyDeps};
use crate::egress::resolve::{DnsResolver, Protected};
use crate::egress::sandboxes::TableBuilder;
use crate::egress::sink::{Sink, publish_notes};
use crate::egress::table::PolicyTable;
use crate::plumbing::api_client::scoped_api;
use crate::plumbing::error::{Error, Result};
use crate::plumbing::status_patch::status_member_patch;
use crate::pod::cidr::Cidr;
use crate::pod::cluster_ranges::{self, ClusterRanges, Watched};
use orchard_api::{EgressStatus, Sandbox};

/// How often the service ranges (ServiceCIDR objects) are read again.
const SERVICE_RANGES_EVERY: Duration = Duration::from_secs(60);

/// Most `status.egress` writes in flight at once.
const REPORT_CONCURRENCY: usize = 16;

/// The ranges the proxy never connects to, from its flags and what the cluster says now (pure).
fn protected(static_ranges: &[Cidr], ranges: &ClusterRanges, services: &[Cidr]) -> Protected {
    let mut extra: Vec<Cidr> = static_ranges.to_vec();
    extra.extend(ranges.api_server.iter().cloned());
    extra.extend(ranges.pod_cidrs.iter().cloned());
    extra.extend(services.iter().cloned());
    let mut protected = Protected::defaults();
    protected.extend(extra);
    protected
}

/// The cluster's service ranges (ServiceCIDR objects, Kubernetes 1.33+); empty where there are none
/// or they cannot be read (then `--egress-deny-cidrs` should name them).
async fn service_ranges(client: &Client) -> Vec<Cidr> {
    let api: Api<k8s_openapi::api::networking::v1::ServiceCIDR> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .filter_map(|s| s.spec.as_ref()?.cidrs.clone())
            .flatten()
            .filter_map(|c| Cidr::parse(&c).ok())
            .collect(),
        Err(error) => {
            warn!(%error, "cannot list ServiceCIDRs: name the service range in --egress-deny-cidrs (Helm egress.denyCidrs) so the proxy never connects to cluster services");
            Vec::new()
        }
    }
}

/// Admin server state.
#[derive(Clone)]
struct Admin {
    metrics: Arc<EgressMetrics>,
    ready: Arc<AtomicBool>,
}

async fn render_metrics(State(admin): State<Admin>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        admin.metrics.render(),
    )
}

async fn readyz(State(admin): State<Admin>) -> impl IntoResponse {
    if admin.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "the Sandbox cache is filling\n",
        )
    }
}

/// Writes `report` into `status.egress` of the sandbox with `uid`.
async fn write_report(
    client: Client,
    metrics: Arc<EgressMetrics>,
    namespace: String,
    name: String,
    uid: String,
    report: EgressStatus,
) {
    let api: Api<Sandbox> = Api::namespaced(client, &namespace);
    let value = match serde_json::to_value(&report) {
        Ok(value) => value,
        Err(error) => {
            warn!(%error, "cannot encode status.egress");
            return;
        }
    };
    let patch = status_member_patch(&uid, "egress", value);
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => metrics.status_writes.with_label_values(&["ok"]).inc(),
        Err(error) => {
            metrics.status_writes.with_label_values(&["error"]).inc();
            warn!(sandbox = %format!("{namespace}/{name}"), %error, "cannot write status.egress");
        }
    }
}

/// Rebuilds the table whenever `changed` fires, publishes it, and writes the reports it owes.
async fn keep_table(
    client: Client,
    store: Store<Sandbox>,
    changed: Arc<Notify>,
    tables: watch::Sender<Arc<PolicyTable>>,
    metrics: Arc<EgressMetrics>,
    shutdown: CancellationToken,
) {
    let mut builder = TableBuilder::default();
    let writes = Arc::new(tokio::sync::Semaphore::new(REPORT_CONCURRENCY));
    let mut resync = tokio::time::interval(Duration::from_secs(30));
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = changed.notified() => {},
            _ = resync.tick() => {},
        }
        let sandboxes = store.state();
        let rebuilt = builder.rebuild(sandboxes.iter().map(|s| s.as_ref()));
        metrics.sandboxes.set(rebuilt.table.len() as i64);
        metrics
            .conflicts
            .set(rebuilt.table.conflicts().len() as i64);
        let present: HashSet<(String, String)> = sandboxes
            .iter()
            .map(|s| (s.namespace().unwrap_or_default(), s.name_any()))
            .collect();
        metrics.forget_except(&present);
        tables.send_replace(Arc::new(rebuilt.table));
        for (namespace, name, uid, report) in rebuilt.reports {
            let Ok(permit) = writes.clone().acquire_owned().await else {
                return;
            };
            let (client, metrics) = (client.clone(), metrics.clone());
            tokio::spawn(async move {
                write_report(client, metrics, namespace, name, uid, report).await;
                drop(permit);
            });
        }
    }
}

/// Runs the egress proxy until a termination signal.
pub async fn run(args: EgressArgs) -> Result<()> {
    let mut static_ranges = cidr_list(&args.egress_except_cidrs, "--egress-except-cidrs")?;
    static_ranges.extend(cidr_list(&args.cluster_pod_cidrs, "--cluster-pod-cidrs")?);
    static_ranges.extend(cidr_list(&args.deny_cidrs, "--egress-deny-cidrs")?);
    let identity = std::env::var("POD_NAME").unwrap_or_else(|_| "orchard-egress".into());
    let config = client_config(&identity).await?;
    let client =
        Client::try_from(config).map_err(|e| Error::Startup(format!("Kubernetes client: {e}")))?;
    let metrics = Arc::new(
        EgressMetrics::new().map_err(|e| Error::Startup(format!("metrics registry: {e}")))?,
    );
    let shutdown = shutdown_on_signal();

    // The protected ranges: flags, the API server, the nodes' pod ranges, the service ranges.
    let watched = Watched {
        api_server: !args.egress_allow_api_server,
        nodes: args.discover_pod_cidrs,
    };
    let observed = cluster_ranges::observe_once(&client, watched)
        .await
        .map_err(|err| {
            Error::Startup(format!(
                "cannot read the cluster's own ranges ({err}): the egress proxy needs `get`, `list` and `watch` on the EndpointSlice default/kubernetes and `list` and `watch` on nodes (or --egress-allow-api-server and --discover-pod-cidrs=false)"
            ))
        })?;
    let (ranges_tx, mut ranges) = watch::channel(observed.ranges());
    let (ranges_changed_tx, _ranges_changed) = tokio::sync::mpsc::channel(1);
    tokio::spawn(cluster_ranges::keep_current(
        client.clone(),
        watched,
        observed,
        ranges_tx,
        ranges_changed_tx,
        shutdown.clone(),
    ));
    let mut services = service_ranges(&client).await;
    let (protected_tx, protected_rx) = watch::channel(Arc::new(protected(
        &static_ranges,
        &ranges.borrow(),
        &services,
    )));
    {
        let (client, shutdown) = (client.clone(), shutdown.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(SERVICE_RANGES_EVERY);
            every.tick().await;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = every.tick() => services = service_ranges(&client).await,
                    changed = ranges.changed() => if changed.is_err() { return },
                }
                let next = protected(&static_ranges, &ranges.borrow(), &services);
                protected_tx.send_replace(Arc::new(next));
            }
        });
    }

    // The Sandbox watch and the table.
    let sandboxes: Api<Sandbox> = scoped_api(&client, &args.watch_namespace);
    let (store, writer) = reflector::store();
    let (tables_tx, tables) = watch::channel(Arc::new(PolicyTable::default()));
    let changed = Arc::new(Notify::new());
    let ready = Arc::new(AtomicBool::new(false));
    {
        let (changed, ready, shutdown) = (changed.clone(), ready.clone(), shutdown.clone());
        let stream = reflector::reflector(
            writer,
            watcher::watcher(sandboxes, watcher::Config::default()),
        );
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                let event = tokio::select! {
                    () = shutdown.cancelled() => return,
                    event = stream.next() => event,
                };
                match event {
                    None => return,
                    Some(Ok(Event::InitDone)) => {
                        ready.store(true, Ordering::Release);
                        changed.notify_one();
                    }
                    Some(Ok(Event::Apply(_) | Event::Delete(_))) => {
                        if ready.load(Ordering::Acquire) {
                            changed.notify_one();
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(error)) => warn!(%error, "Sandbox watch error (retrying)"),
                }
            }
        });
    }
    tokio::spawn(keep_table(
        client.clone(),
        store,
        changed,
        tables_tx,
        metrics.clone(),
        shutdown.clone(),
    ));

    // Denials and cuts become events.
    let (sink, notes) = Sink::new(metrics.clone());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "orchard-egress".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    tokio::spawn(publish_notes(recorder, notes));

    let admin = Admin {
        metrics: metrics.clone(),
        ready: ready.clone(),
    };
    let admin_listener = bind(args.admin_listen, "admin").await?;
    let admin_router = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(admin);
    tokio::spawn(
        axum::serve(admin_listener, admin_router)
            .with_graceful_shutdown(shutdown.clone().cancelled_owned())
            .into_future(),
    );

    let listener = bind(args.listen, "egress proxy").await?;
    info!(addr = %args.listen, "egress proxy listening");
    let deps = ProxyDeps {
        table: tables,
        resolver: Arc::new(DnsResolver::from_system().map_err(Error::Startup)?),
        protected: protected_rx,
        audit: Arc::new(sink),
        connect_timeout: Duration::from_secs(args.connect_timeout_seconds.max(1)),
        header_read_timeout: Duration::from_secs(args.header_read_timeout_seconds.max(1)),
    };
    proxy::serve(listener, deps, shutdown)
        .await
        .map_err(|e| Error::Startup(format!("egress proxy: {e}")))
}

async fn bind(addr: SocketAddr, what: &str) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Startup(format!("cannot listen on {addr} ({what}): {e}")))
}
