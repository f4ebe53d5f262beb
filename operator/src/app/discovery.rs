//! What the process learns before anything runs: its identity in the Lease, the client
//! configuration, the cluster's own ranges; and the signal that stops it.

use kube::Client;
use tracing::{error, warn};

use crate::plumbing::error::{Error, Result};
use crate::pod::cluster_ranges::{self, Observations};
use crate::pod::context::RangeUse;

/// This replica's identity in the Lease: the host name (the pod name in a cluster) and the pid.
pub fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "orchard-operator".into());
    format!("{host}-{}", std::process::id())
}

/// The client configuration (`KUBECONFIG`, `~/.kube/config` or in-cluster), with a User-Agent that
/// names this replica, so the API server's audit log tells the replicas' requests apart.
pub async fn client_config(identity: &str) -> Result<kube::Config> {
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

/// A token cancelled on the first SIGTERM or SIGINT: the one shutdown signal of a process.
pub fn shutdown_on_signal() -> tokio_util::sync::CancellationToken {
    let shutdown = tokio_util::sync::CancellationToken::new();
    let cancel = shutdown.clone();
    tokio::spawn(async move {
        termination_signal().await;
        tracing::info!("termination signal received, shutting down");
        cancel.cancel();
    });
    shutdown
}

/// Resolves on SIGTERM or SIGINT.
pub async fn termination_signal() {
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

/// The egress proxy behind Service `service` in `namespace` (`--egress-proxy-service`), read once at
/// start; `None` when no Service is named.
pub async fn egress_proxy(
    client: &Client,
    namespace: &str,
    service: &str,
) -> Result<Option<crate::pod::egress_proxy::EgressProxy>> {
    if service.is_empty() {
        return Ok(None);
    }
    let services: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), namespace);
    let found = services.get(service).await.map_err(|err| {
        Error::Startup(format!(
            "cannot read the egress proxy's Service {namespace}/{service} (--egress-proxy-service, Helm egress.enabled): {err}; the operator needs `get` on services in its namespace"
        ))
    })?;
    let proxy = crate::pod::egress_proxy::egress_proxy(&found)
        .map_err(|why| Error::Startup(format!("--egress-proxy-service: {why}")))?;
    tracing::info!(url = %proxy.url, "sandboxes reach hosts through the egress proxy");
    Ok(Some(proxy))
}

/// Reads the cluster's own ranges once, before anything is reconciled (see `cluster_ranges`), with
/// a message naming the permission when they cannot be read.
pub async fn observe_ranges(client: &Client, use_: &RangeUse) -> Result<Observations> {
    let watched = use_.watched();
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
    if use_.await_enforcement && ranges.live_canaries.is_empty() {
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
