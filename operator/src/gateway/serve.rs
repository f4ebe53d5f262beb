//! The gateway assembled and served: its router and OpenAPI document from one list of routes, its
//! shared state, and the limits its flags set.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::header;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::future::Either;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::gateway::auth::AuthSettings;
use crate::gateway::auth::review_budget::BudgetLimits;
use crate::gateway::config::GatewayLimits;
use crate::gateway::deps::GatewayDeps;
use crate::gateway::http::body::BodyLimits;
use crate::gateway::http::errors::ApiError;
use crate::gateway::http::in_flight::{InFlight, PoolLimits};
use crate::gateway::http::metrics::GatewayMetrics;
use crate::gateway::http::pipeline::Pipeline;
use crate::gateway::http::server::ConnectionLimits;
use crate::gateway::routes::{network, rollout_groups, sandboxes, snapshots, system};
use crate::gateway::state::{CachesFilled, GatewayState, State};
use crate::gateway::{agent, auth, http, objects};

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

/// Marks the Sandbox, RolloutGroup and SandboxSnapshot caches filled when their watches report
/// `InitDone`.
fn watch_cache_fill(state: &State, shutdown: CancellationToken) {
    let mut sandboxes = state.deps.reads.changes.relists("Sandbox");
    let mut groups = state.deps.reads.changes.relists("RolloutGroup");
    let mut snapshots = state.deps.reads.changes.relists("SandboxSnapshot");
    let state = state.clone();
    tokio::spawn(async move {
        let filled = &state.filled;
        while !(filled.sandboxes.load(Ordering::Relaxed)
            && filled.rollout_groups.load(Ordering::Relaxed)
            && filled.snapshots.load(Ordering::Relaxed))
        {
            tokio::select! {
                _ = sandboxes.next() => filled.sandboxes.store(true, Ordering::Relaxed),
                _ = groups.next() => filled.rollout_groups.store(true, Ordering::Relaxed),
                _ = snapshots.next() => filled.snapshots.store(true, Ordering::Relaxed),
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
        .routes(routes!(sandboxes::set_timeout))
        .routes(routes!(network::set_network))
        .routes(routes!(sandboxes::agent_token))
        .routes(routes!(sandboxes::record_result))
        .merge(agent::table::router())
        .routes(routes!(agent::tunnel::tunnel))
        .routes(routes!(
            rollout_groups::create_group,
            rollout_groups::list_groups
        ))
        .routes(routes!(
            rollout_groups::get_group,
            rollout_groups::delete_group
        ))
        .routes(routes!(rollout_groups::wait_group))
        .routes(routes!(
            snapshots::create_snapshot,
            snapshots::list_snapshots
        ))
        .routes(routes!(snapshots::get_snapshot, snapshots::delete_snapshot))
        .routes(routes!(snapshots::wait_snapshot))
        .routes(routes!(system::healthz))
}

/// The request pipeline of the gateway with `state` (its request pools sized by its limits).
pub fn pipeline(state: &State) -> Arc<Pipeline> {
    let in_flight = InFlight::new(pool_limits(&state.deps.limits), &state.metrics);
    Arc::new(Pipeline::new(state.metrics.clone(), in_flight))
}

/// The gateway's router, every route behind `pipeline`, and its OpenAPI document.
pub fn router(state: State, pipeline: Arc<Pipeline>) -> (Router, serde_json::Value) {
    let (router, openapi) = api_routes().split_for_parts();
    let document = http::openapi::document(openapi);
    let served = Arc::new(serde_json::to_vec_pretty(&document).unwrap_or_default());
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
        .layer(middleware::from_fn_with_state(
            pipeline,
            http::pipeline::layer,
        ))
        .with_state(state);
    (router, document)
}

/// How the gateway handles a request: an agent call ([`agent::table::recognise`]) goes straight to
/// its proxy, through the same pipeline as the router's routes; any other request to the router.
#[derive(Clone)]
pub struct Handler {
    state: State,
    pipeline: Arc<Pipeline>,
    router: Router,
}

impl Handler {
    /// The handler of the gateway with `state`.
    pub fn new(state: State) -> Self {
        let pipeline = pipeline(&state);
        let (router, _) = router(state.clone(), pipeline.clone());
        Self {
            state,
            pipeline,
            router,
        }
    }

    /// The answer to `request`.
    pub fn handle(&self, request: Request) -> impl Future<Output = Response> + Send + use<> {
        match agent::table::recognise(request.method(), request.uri().path()) {
            // Boxed like the router's futures: moving the whole call's state costs more.
            Some((route, _)) => Either::Left(Box::pin(agent::routes::serve_recognised(
                self.state.clone(),
                self.pipeline.clone(),
                route,
                request,
            ))),
            None => {
                let answer = self.router.clone().oneshot(request);
                Either::Right(async move {
                    match answer.await {
                        Ok(response) => response,
                        Err(never) => match never {},
                    }
                })
            }
        }
    }
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
        heartbeats: objects::heartbeat::Heartbeats::new(
            deps.client.clone(),
            deps.settings.default_heartbeat_timeout_seconds,
            deps.settings.default_ttl_seconds,
            metrics.clone(),
            deps.metrics.clone(),
        ),
        proxy: agent::proxy::AgentProxy::new(metrics.clone()),
        bodies: http::body::BodyReader::new(body_limits(&deps.limits), metrics.throttled.clone()),
        tunnels: Arc::new(tokio::sync::Semaphore::new(deps.limits.gateway_max_tunnels)),
        metrics,
        filled: CachesFilled::default(),
        access_memo: agent::access_memo::AccessMemo::default(),
        recent_deletes: objects::recent_deletes::RecentDeletes::default(),
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
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "gateway listening");
    let handler = Handler::new(state);
    http::server::serve_requests(
        listener,
        move |request| handler.handle(request),
        connection_limits,
        metrics,
        shutdown,
    )
    .await
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
        let document = http::openapi::document(openapi);
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
                "/v1/namespaces/{namespace}/sandboxes/{name}/processes/{id}/stdin",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/processes/{id}/resize",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/sessions",
                &["get", "post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/sessions/{id}",
                &["get", "delete"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/sessions/{id}/run",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/sessions/{id}/signal",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/sessions/{id}/input",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/sessions/{id}/read",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/files/stat",
                &["get"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/files/mkdir",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/files/rename",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/files/tar",
                &["get", "put"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/metrics",
                &["get"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/patch",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/ports/{port}/tunnel",
                &["get"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/heartbeat",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/timeout",
                &["post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxes/{name}/network",
                &["put"],
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
            (
                "/v1/namespaces/{namespace}/sandboxsnapshots",
                &["get", "post"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxsnapshots/{name}",
                &["get", "delete"],
            ),
            (
                "/v1/namespaces/{namespace}/sandboxsnapshots/{name}/wait",
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
