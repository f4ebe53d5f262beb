//! The gateway (default :8080): the REST API trainers use. Sandbox and RolloutGroup lifecycle from the
//! watch caches, exec/file/process/patch calls proxied straight to each sandbox's agent at its pod IP
//! with the sandbox's own token, callers authenticated with TokenReview and authorised with
//! SubjectAccessReview, heartbeats coalesced into few API writes. `docs/API.md` is the reference.
//!
//! Modules: [`routes`] (handlers), [`access`] (route -> RBAC attributes), [`auth`] (with
//! [`verdict_cache`] and [`review_budget`]), [`revalidate`] (long calls re-check their caller),
//! [`proxy`], [`heartbeat`], [`wait`], [`lookup`], [`spec`] (create requests -> objects),
//! [`selector`], [`errors`], [`metrics`], [`openapi`], and the server with its limits: [`server`]
//! (header-read timeout, connection limit) and [`in_flight`] (request limit).

pub mod access;
pub mod auth;
pub mod body;
pub mod config;
pub mod errors;
pub mod heartbeat;
pub mod in_flight;
pub mod lookup;
pub mod metrics;
pub mod names;
pub mod openapi;
pub mod proxy;
pub mod recent_deletes;
pub mod revalidate;
pub mod review_budget;
pub mod routes;
pub mod selector;
pub mod server;
pub mod spec;
pub mod unread_body;
pub mod verdict_cache;
pub mod wait;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{MatchedPath, Request, State as AxumState};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kube::Client;
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::plumbing::change_feed::ChangeFeed;
use crate::plumbing::metrics::Metrics;
use auth::AuthSettings;
use body::BodyLimits;
use config::GatewayLimits;
use errors::ApiError;
use in_flight::{InFlight, PoolLimits};
use k8s_openapi::api::core::v1::Pod;
use metrics::GatewayMetrics;
use orchard_api::{RolloutGroup, Sandbox};
use review_budget::BudgetLimits;
use routes::{CachesFilled, GatewayState, State, agent, rollout_groups, sandboxes, system};
use server::ConnectionLimits;

/// Field manager of the gateway's writes (heartbeat annotations, results, creates), distinct from the
/// controllers' so server-side apply never takes their fields away.
pub const GATEWAY_FIELD_MANAGER: &str = "orchard-gateway";

/// What the gateway reads of the cluster: the watch caches the controllers fill (read only; the
/// gateway never writes a cache) and the feed of their changes. It reads nothing else of the
/// controllers.
#[derive(Clone)]
pub struct ReadModel {
    /// Every Sandbox in scope.
    pub sandboxes: Store<Sandbox>,
    /// Sandbox pods.
    pub pods: Store<Pod>,
    /// Every RolloutGroup in scope.
    pub rollout_groups: Store<RolloutGroup>,
    /// Notes of changed Sandboxes and RolloutGroups, published after the caches applied them.
    pub changes: ChangeFeed,
}

/// The sandbox settings the gateway answers with (from the operator's command line).
#[derive(Debug, Clone, PartialEq)]
pub struct GatewaySettings {
    /// Port of the agents.
    pub agent_port: u16,
    /// TTL of sandboxes whose spec sets none.
    pub default_ttl_seconds: i64,
    /// Heartbeat timeout of sandboxes whose spec sets none.
    pub default_heartbeat_timeout_seconds: i64,
}

/// What the gateway needs from the rest of the operator.
#[derive(Clone)]
pub struct GatewayDeps {
    /// Kubernetes client (the operator's own identity).
    pub client: Client,
    /// What it reads.
    pub reads: ReadModel,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Sandbox defaults.
    pub settings: GatewaySettings,
    /// Connection, request and authentication limits.
    pub limits: GatewayLimits,
    /// The key the agents' tokens are derived from.
    pub key: std::sync::Arc<crate::plumbing::operator_key::OperatorKey>,
}

/// How the gateway authenticates, from its limits (pure).
pub fn auth_settings(limits: &GatewayLimits) -> AuthSettings {
    AuthSettings {
        ttl: Duration::from_secs(limits.gateway_auth_cache_ttl_seconds),
        audiences: limits.audiences(),
        budget: BudgetLimits {
            rate: f64::from(limits.gateway_token_review_rate),
            burst: f64::from(limits.gateway_token_review_burst),
            per_client_rate: f64::from(limits.gateway_token_review_rate_per_client),
            per_client_burst: f64::from(limits.gateway_token_review_burst_per_client),
        },
        access_review_rate: f64::from(limits.gateway_access_review_rate_per_caller),
        access_review_burst: f64::from(limits.gateway_access_review_burst_per_caller),
    }
}

/// Counts requests and their latency by route template and status code.
async fn track(
    AxumState(metrics): AxumState<Arc<GatewayMetrics>>,
    request: Request,
    next: Next,
) -> Response {
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    let started = Instant::now();
    let response = next.run(request).await;
    metrics
        .duration
        .with_label_values(&[route])
        .observe(started.elapsed().as_secs_f64());
    metrics
        .requests
        .with_label_values(&[route, response.status().as_str()])
        .inc();
    response
}

/// Marks the Sandbox and RolloutGroup caches filled when their watches report `InitDone`.
fn watch_cache_fill(state: &State, shutdown: CancellationToken) {
    let mut sandboxes = state.deps.reads.changes.relists("Sandbox");
    let mut groups = state.deps.reads.changes.relists("RolloutGroup");
    let state = state.clone();
    tokio::spawn(async move {
        let filled = &state.filled;
        while !(filled.sandboxes.load(Ordering::Relaxed)
            && filled.rollout_groups.load(Ordering::Relaxed))
        {
            tokio::select! {
                _ = sandboxes.next() => filled.sandboxes.store(true, Ordering::Relaxed),
                _ = groups.next() => filled.rollout_groups.store(true, Ordering::Relaxed),
                () = shutdown.cancelled() => return,
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
        .routes(routes!(sandboxes::agent_token))
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
    let in_flight = InFlight::new(pool_limits(&state.deps.limits), &metrics);
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
        .layer(middleware::from_fn_with_state(in_flight, in_flight::limit))
        .layer(middleware::from_fn(unread_body::close_if_unread))
        .layer(middleware::from_fn_with_state(Arc::new(metrics), track))
        .with_state(state);
    (router, document)
}

/// Builds the gateway's shared state (registers its metrics).
pub fn state(deps: GatewayDeps) -> std::io::Result<State> {
    let metrics = GatewayMetrics::register(deps.metrics.registry())
        .map_err(|e| std::io::Error::other(format!("gateway metrics: {e}")))?;
    Ok(Arc::new(GatewayState {
        auth: auth::Authorizer::new(
            deps.client.clone(),
            metrics.clone(),
            auth_settings(&deps.limits),
        ),
        heartbeats: heartbeat::Heartbeats::new(
            deps.client.clone(),
            deps.settings.default_heartbeat_timeout_seconds,
            deps.settings.default_ttl_seconds,
            metrics.clone(),
            deps.metrics.clone(),
        ),
        proxy: proxy::AgentProxy::new(metrics.clone()),
        bodies: body::BodyReader::new(body_limits(&deps.limits), metrics.throttled.clone()),
        metrics,
        filled: CachesFilled::default(),
        recent_deletes: recent_deletes::RecentDeletes::default(),
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
    let connection_limits = connection_limits(&state.deps.limits);
    let metrics = state.metrics.clone();
    let (router, _) = router(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "gateway listening");
    server::serve_router(listener, router, connection_limits, metrics, shutdown).await
}

/// The sizes of the request pools, from the gateway's limits (pure).
pub fn pool_limits(limits: &GatewayLimits) -> PoolLimits {
    PoolLimits {
        calls: limits.gateway_max_in_flight_requests,
        waits: limits.gateway_max_waits,
        per_caller: limits.gateway_max_in_flight_per_caller,
    }
}

/// How authorised bodies are read, from the gateway's limits (pure). The deadline is at least one
/// second.
pub fn body_limits(limits: &GatewayLimits) -> BodyLimits {
    BodyLimits {
        max_bytes: limits.gateway_max_body_bytes,
        read_timeout: Duration::from_secs(limits.gateway_body_read_timeout_seconds.max(1)),
        per_caller_bytes: limits.gateway_body_bytes_per_caller,
    }
}

/// The server's connection limits, from the gateway's limits (pure). The header-read timeout is at
/// least one second: zero would disconnect every client at once.
pub fn connection_limits(limits: &GatewayLimits) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_secs(limits.gateway_header_read_timeout_seconds.max(1)),
        max_connections: limits.gateway_max_connections,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_map_to_server_and_auth_settings() {
        let limits = GatewayLimits {
            gateway_header_read_timeout_seconds: 0,
            gateway_token_audiences: " a, ,b ".into(),
            ..GatewayLimits::default()
        };
        let server = connection_limits(&limits);
        assert_eq!(server.header_read_timeout, Duration::from_secs(1));
        assert_eq!(server.max_connections, 4096);
        let auth = auth_settings(&limits);
        assert_eq!(auth.audiences, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(auth.ttl, Duration::from_secs(10));
        assert_eq!(auth.budget.rate, 20.0);
        assert_eq!(auth.budget.per_client_burst, 10.0);
        let defaults = GatewayLimits::default();
        assert!(defaults.audiences().is_empty(), "no audience by default");
        assert_eq!(defaults.gateway_max_in_flight_requests, 1024);
    }

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
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/token",
                &["get"],
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
