//! The gateway (default :8080): the REST API trainers use. Placeholder until the gateway lands: it
//! answers `/healthz` so the process shape (controllers + gateway + admin server) is in place.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use kube::Client;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;

use crate::api::RolloutGroup;
use crate::change_feed::ChangeFeed;
use crate::context::{Caches, Settings};
use crate::metrics::Metrics;

/// What the gateway needs from the rest of the operator.
#[derive(Clone)]
pub struct GatewayDeps {
    /// Kubernetes client (the operator's own identity).
    pub client: Client,
    /// Watch caches of sandboxes, pods, secrets and policies.
    pub caches: Caches,
    /// Watch cache of RolloutGroups.
    pub rollout_groups: Store<RolloutGroup>,
    /// Notes of changed Sandboxes and RolloutGroups, published after the caches applied them.
    pub changes: ChangeFeed,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Operator settings (agent port, defaults).
    pub settings: Settings,
}

/// Serves the gateway on `addr` until `shutdown` is cancelled.
pub async fn serve(
    addr: SocketAddr,
    deps: GatewayDeps,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let _ = deps;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "gateway listening");
    let router = Router::new().route("/healthz", get(|| async { "ok\n" }));
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}
