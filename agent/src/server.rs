//! The HTTP server: configuration, shared state, the router, the `/v1` guard (bearer token, then the
//! in-flight cap answered with 429), and graceful shutdown (end every shell session, SIGTERM every
//! command's group, wait up to 5 s, SIGKILL the rest).

use crate::held_body::holding;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use orchard_api::agent::{AgentHealth, AgentIdentity};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::connections::{ConnectionLimits, serve_connections};
use crate::error::{AgentError, json_response};
use crate::exec::request::{CommandRequest, CommandSpec, IntoSpec, RequestKind};
use crate::processes::table::Started;
use crate::state::AppState;
use crate::{VERSION, exec, files, metrics, patch, ports, processes, sessions};

/// How long commands get to exit after SIGTERM at shutdown before they are SIGKILLed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long `/healthz` waits for a closed [`PolicyGate`] to open before answering 503: the kubelet
/// probes once a second with a one-second timeout, so a pod turns Ready within moments of its policy
/// being enforced rather than at the next probe.
pub const HEALTH_HOLD: Duration = Duration::from_millis(700);

/// `PUT /v1/identity`: from now on commands get `ORCHARD_SANDBOX=<sandbox>`.
async fn set_identity(
    State(state): State<AppState>,
    crate::json_body::JsonBody(identity): crate::json_body::JsonBody<AgentIdentity>,
) -> Result<Response, AgentError> {
    let name = identity.sandbox.trim();
    if name.is_empty() || name.len() > 253 || name.chars().any(char::is_control) {
        return Err(AgentError::BadRequest(
            "`sandbox` must be a Sandbox name of 1 to 253 characters".into(),
        ));
    }
    state.set_identity(name);
    tracing::info!(sandbox = name, "identity set");
    Ok(json_response(
        StatusCode::OK,
        &AgentIdentity {
            sandbox: name.to_string(),
        },
    ))
}

/// `GET /healthz` (no token): 200 once the policy gate is open; until then it waits up to
/// [`HEALTH_HOLD`] for it and answers 503.
async fn healthz(State(state): State<AppState>) -> Response {
    if !state.gate.wait_open(HEALTH_HOLD).await {
        return AgentError::Unavailable(POLICY_NOT_ENFORCED.into()).into_response();
    }
    json_response(
        StatusCode::OK,
        &AgentHealth {
            status: "ok".into(),
            version: VERSION.into(),
        },
    )
}

async fn not_found(request: Request) -> AgentError {
    AgentError::NotFound(format!(
        "no route `{} {}`; see docs/AGENT.md",
        request.method(),
        request.uri().path()
    ))
}

async fn method_not_allowed(request: Request) -> AgentError {
    AgentError::MethodNotAllowed(format!(
        "method {} is not allowed on `{}`",
        request.method(),
        request.uri().path()
    ))
}

/// Why a request is refused while the policy gate is closed.
const POLICY_NOT_ENFORCED: &str = "the sandbox's NetworkPolicies are not enforced yet (it still reaches an address they deny); \
     the agent serves once they are: retry shortly";

/// Authenticates, refuses everything while the policy gate is closed, then admits the request if
/// fewer than `max_concurrent` are in flight. The admission permit lives as long as the response body,
/// so streams and downloads count until they end.
async fn guard_v1(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.config.token
        && !token.authorizes(request.headers())
    {
        return AgentError::Unauthorized.into_response();
    }
    if !state.gate.is_open() {
        return AgentError::Unavailable(POLICY_NOT_ENFORCED.into()).into_response();
    }
    let Ok(permit) = Arc::clone(&state.admission).try_acquire_owned() else {
        return AgentError::TooManyRequests(format!(
            "{} requests are in flight (--max-concurrent); retry shortly",
            state.config.max_concurrent
        ))
        .into_response();
    };
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, holding(body, permit))
}

/// All routes.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/exec", post(exec::routes::exec))
        .route("/v1/exec/stream", post(exec::routes::exec_stream))
        .route(
            "/v1/processes",
            post(processes::routes::start).get(processes::routes::list),
        )
        .route(
            "/v1/processes/{id}",
            get(processes::routes::status).delete(processes::routes::remove),
        )
        .route("/v1/processes/{id}/signal", post(processes::routes::signal))
        .route("/v1/processes/{id}/stdin", post(processes::routes::stdin))
        .route("/v1/processes/{id}/resize", post(processes::routes::resize))
        .route(
            "/v1/sessions",
            post(sessions::routes::start).get(sessions::routes::list),
        )
        .route(
            "/v1/sessions/{id}",
            get(sessions::routes::status).delete(sessions::routes::remove),
        )
        .route("/v1/sessions/{id}/run", post(sessions::routes::run))
        .route("/v1/sessions/{id}/signal", post(sessions::routes::signal))
        .route("/v1/sessions/{id}/input", post(sessions::routes::input))
        .route("/v1/sessions/{id}/read", post(sessions::routes::read))
        .route(
            "/v1/files",
            get(files::routes::get)
                .put(files::routes::put)
                .delete(files::routes::delete),
        )
        .route("/v1/files/list", get(files::routes::list))
        .route("/v1/files/stat", get(files::stat::stat))
        .route("/v1/files/mkdir", post(files::mkdir::mkdir))
        .route("/v1/files/rename", post(files::rename::rename))
        .route(
            "/v1/files/tar",
            get(files::tar_download::download).put(files::tar_upload::upload),
        )
        .route("/v1/ports/{port}/tunnel", get(ports::tunnel::tunnel))
        .route("/v1/metrics", get(metrics::metrics))
        .route("/v1/patch", post(patch::apply))
        .route("/v1/identity", axum::routing::put(set_identity))
        .route_layer(middleware::from_fn_with_state(state.clone(), guard_v1));
    Router::new()
        .route("/healthz", get(healthz))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// Validates the JSON of `ORCHARD_AGENT_STARTUP` into the command to run (relative `cwd` against `root`).
pub fn startup_spec(root: &Path, json: &str) -> Result<CommandSpec, String> {
    let mut request: CommandRequest = crate::json_body::parse_json(json.as_bytes())
        .map_err(|error| format!("ORCHARD_AGENT_STARTUP: {error}"))?;
    if request.id.as_deref().is_some_and(|id| id != "startup") {
        return Err("ORCHARD_AGENT_STARTUP: `id` is always `startup`; leave it out".into());
    }
    request.id = None;
    request
        .into_spec(root, RequestKind::Process)
        .map_err(|error| format!("ORCHARD_AGENT_STARTUP: {error}"))
}

/// Starts the `ORCHARD_AGENT_STARTUP` command (checked by [`startup_spec`]) as background process
/// `startup`.
pub fn start_startup_command(state: &AppState, spec: CommandSpec) -> Result<(), String> {
    match state.processes.start(
        Some("startup".into()),
        spec,
        &state.config.scrubbed_env,
        &state.groups,
    ) {
        Ok(Started::New(process)) => {
            let status = process.status(false);
            tracing::info!(pid = ?status.pid, exit_code = ?status.exit_code, "startup command started");
            Ok(())
        }
        Ok(Started::Exists(_)) => Err("startup process already exists".into()),
        Err(error) => Err(format!("ORCHARD_AGENT_STARTUP: {error}")),
    }
}

/// Serves on `listener` (connections within `limits`) until `shutdown` resolves, then stops
/// accepting, SIGTERMs every command's process group, SIGKILLs what is left after `SHUTDOWN_GRACE`,
/// and returns.
pub async fn serve(
    state: AppState,
    listener: TcpListener,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let (stop, stopped) = watch::channel(false);
    let server = serve_connections(listener, app, limits, stopped);
    tokio::pin!(server);
    tokio::select! {
        result = &mut server => return result,
        () = shutdown => {}
    }
    tracing::info!(
        commands = state.groups.count(),
        "shutting down: stopping commands"
    );
    let _ = stop.send(true);
    // Sessions' shells wait for input forever: they are ended at once (their groups SIGKILLed).
    let sessions = state.sessions.end_all();
    if sessions > 0 {
        tracing::info!(sessions, "ended shell sessions");
    }
    state.groups.signal_all(libc::SIGTERM);
    if !state.groups.wait_until_empty(SHUTDOWN_GRACE).await {
        tracing::warn!(
            commands = state.groups.count(),
            "commands ignored SIGTERM; sending SIGKILL"
        );
        state.groups.signal_all(libc::SIGKILL);
        state.groups.wait_until_empty(Duration::from_secs(2)).await;
    }
    // Let in-flight responses (now completing) reach their clients, but never hang on a slow one.
    let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    Ok(())
}

/// Resolves when the process receives SIGTERM or SIGINT.
pub async fn termination_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; SIGTERM will not shut down gracefully");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
}
