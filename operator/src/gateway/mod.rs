//! The gateway (default :8080): the REST API trainers use. Sandbox and RolloutGroup lifecycle from the
//! watch caches, exec/file/process/patch calls proxied straight to each sandbox's agent at its pod IP
//! with the sandbox's own token, callers authenticated with TokenReview and authorised with
//! SubjectAccessReview, heartbeats coalesced into few API writes. `docs/API.md` is the reference.
//!
//! Modules: [`routes`] (handlers), [`access`] (route -> RBAC attributes), [`auth`], [`proxy`],
//! [`heartbeat`], [`wait`], [`lookup`], [`spec`] (create requests -> objects), [`selector`],
//! [`errors`], [`metrics`], [`openapi`].

pub mod access;
pub mod auth;
pub mod errors;
pub mod heartbeat;
pub mod lookup;
pub mod metrics;
pub mod openapi;
pub mod proxy;
pub mod routes;
pub mod selector;
pub mod spec;
pub mod wait;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State as AxumState};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use kube::Client;
use kube::runtime::reflector::Store;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::runtime::change_feed::ChangeFeed;
use crate::runtime::context::{Caches, Settings};
use crate::runtime::metrics::Metrics;
use errors::ApiError;
use metrics::GatewayMetrics;
use orchard_api::RolloutGroup;
use routes::{CachesFilled, GatewayState, State, agent, rollout_groups, sandboxes, system};

/// Field manager of the gateway's writes (heartbeat annotations, results, creates), distinct from the
/// controllers' so server-side apply never takes their fields away.
pub const GATEWAY_FIELD_MANAGER: &str = "orchard-gateway";

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

/// Counts requests and their latency by route template and status code.
async fn track(
    AxumState(metrics): AxumState<GatewayMetrics>,
    request: Request,
    next: Next,
) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    metrics
        .duration
        .with_label_values(&[&route])
        .observe(started.elapsed().as_secs_f64());
    metrics
        .requests
        .with_label_values(&[&route, response.status().as_str()])
        .inc();
    response
}

/// Marks the Sandbox and RolloutGroup caches filled when their watches report `InitDone`.
fn watch_cache_fill(state: &State, shutdown: CancellationToken) {
    let mut notes = state.deps.changes.subscribe();
    let state = state.clone();
    tokio::spawn(async move {
        loop {
            let note = tokio::select! {
                note = notes.recv() => note,
                () = shutdown.cancelled() => return,
            };
            match note {
                Ok(note) if note.namespace.is_empty() && note.name.is_empty() => match note.kind {
                    "Sandbox" => state.filled.sandboxes.store(true, Ordering::Relaxed),
                    "RolloutGroup" => state.filled.rollout_groups.store(true, Ordering::Relaxed),
                    _ => {}
                },
                Ok(_) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            }
            if state.filled.sandboxes.load(Ordering::Relaxed)
                && state.filled.rollout_groups.load(Ordering::Relaxed)
            {
                return;
            }
        }
    });
}

/// Every documented route: the router and the OpenAPI paths come from this one list (the agent routes
/// from their table, `routes::agent::ROUTES`).
fn api_routes() -> OpenApiRouter<State> {
    OpenApiRouter::<State>::new()
        .routes(routes!(
            sandboxes::create_sandbox,
            sandboxes::list_sandboxes
        ))
        .routes(routes!(sandboxes::get_sandbox, sandboxes::delete_sandbox))
        .routes(routes!(sandboxes::wait_sandbox))
        .routes(routes!(sandboxes::heartbeat))
        .routes(routes!(sandboxes::record_result))
        .merge(agent::router())
        .routes(routes!(
            rollout_groups::create_group,
            rollout_groups::list_groups
        ))
        .routes(routes!(
            rollout_groups::get_group,
            rollout_groups::delete_group
        ))
        .routes(routes!(rollout_groups::wait_group))
        .routes(routes!(system::healthz))
}

/// The gateway's router and its OpenAPI document.
pub fn router(state: State) -> (Router, serde_json::Value) {
    let (router, openapi) = api_routes().split_for_parts();
    let document = openapi::document(openapi);
    let served = Arc::new(serde_json::to_vec_pretty(&document).unwrap_or_default());
    let metrics = state.metrics.clone();
    let router = router
        .route(
            "/openapi.json",
            get(move || {
                let served = served.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "application/json")],
                        served.as_ref().clone(),
                    )
                }
            }),
        )
        .fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "NotFound",
                "no such route; see /openapi.json",
            )
            .into_response()
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                "this route does not take that method; see /openapi.json",
            )
            .into_response()
        })
        .layer(middleware::from_fn_with_state(metrics, track))
        .with_state(state);
    (router, document)
}

/// Builds the gateway's shared state (registers its metrics).
pub fn state(deps: GatewayDeps) -> std::io::Result<State> {
    let metrics = GatewayMetrics::register(deps.metrics.registry())
        .map_err(|e| std::io::Error::other(format!("gateway metrics: {e}")))?;
    Ok(Arc::new(GatewayState {
        auth: auth::Authorizer::new(deps.client.clone(), metrics.clone()),
        heartbeats: heartbeat::Heartbeats::new(
            deps.client.clone(),
            deps.settings.default_heartbeat_timeout_seconds,
            deps.settings.default_ttl_seconds,
            metrics.clone(),
            deps.metrics.clone(),
        ),
        proxy: proxy::AgentProxy::new(metrics.clone()),
        metrics,
        filled: CachesFilled::default(),
        deps,
    }))
}

/// Serves the gateway on `addr` until `shutdown` is cancelled.
pub async fn serve(
    addr: SocketAddr,
    deps: GatewayDeps,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let state = state(deps)?;
    // Subscribe before the first await, so the watches' first InitDone notes are not missed.
    watch_cache_fill(&state, shutdown.clone());
    let (router, _) = router(state);
    // TCP_NODELAY: without it a response written in two parts waits for the client's delayed ACK
    // (about 40 ms per call on Linux).
    let listener = tokio::net::TcpListener::bind(addr).await?.tap_io(|stream| {
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(%err, "cannot set TCP_NODELAY on a gateway connection");
        }
    });
    tracing::info!(%addr, "gateway listening");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_documented_with_its_methods() {
        let (_, openapi) = api_routes().split_for_parts();
        let document = openapi::document(openapi);
        let paths = document["paths"].as_object().expect("paths");
        let expected: &[(&str, &[&str])] = &[
            ("/v1/namespaces/{namespace}/sandboxes", &["get", "post"]),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}",
                &["get", "delete"],
            ),
            ("/v1/namespaces/{namespace}/sandboxes/{name}/wait", &["get"]),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/exec",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/exec/stream",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/processes",
                &["get", "post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/processes/{id}",
                &["get", "delete"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/processes/{id}/signal",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/files",
                &["get", "put", "delete"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/files/list",
                &["get"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/patch",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/heartbeat",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/result",
                &["post"],
            ),
            ("/v1/namespaces/{namespace}/rolloutgroups", &["get", "post"]),
            (
                "/v1/namespaces/{namespace}/rolloutgroups/{name}",
                &["get", "delete"],
            ),
            (
                "/v1/namespaces/{namespace}/rolloutgroups/{name}/wait",
                &["get"],
            ),
            ("/healthz", &["get"]),
        ];
        for (path, methods) in expected {
            let item = paths
                .get(*path)
                .unwrap_or_else(|| panic!("{path} undocumented"));
            for method in *methods {
                assert!(item.get(*method).is_some(), "{method} {path} undocumented");
            }
        }
        assert_eq!(paths.len(), expected.len(), "{:?}", paths.keys());
        // Referenced schemas resolve.
        let text = document.to_string();
        for name in [
            "Sandbox",
            "ErrorBody",
            "ExecRequest",
            "CreateSandboxRequest",
        ] {
            assert!(
                document["components"]["schemas"][name].is_object(),
                "schema {name} missing"
            );
            assert!(
                text.contains(&format!("#/components/schemas/{name}")),
                "{name} unreferenced"
            );
        }
    }
}
