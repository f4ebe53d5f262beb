//! HTTP routes of shell sessions: `POST/GET /v1/sessions`, `GET/DELETE /v1/sessions/{id}`,
//! `POST /v1/sessions/{id}/run`, `/signal`, `/input` and `/read`.

use crate::held_body::holding;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use orchard_api::agent::{
    SessionInputRequest, SessionList, SessionReadRequest, SessionReadResponse, SessionRequest,
    SessionRunRequest, SessionRunResponse, SessionSignalRequest, SessionSignalResponse,
};

use super::process::ShellLaunch;
use super::session::{Session, SessionContext};
use super::shell::choose_shell;
use crate::error::{AgentError, json_response};
use crate::exec::output::CapturedOutput;
use crate::exec::request::{DEFAULT_EXEC_TIMEOUT, output_cap, resolve_cwd, validate_env};
use crate::json_body::JsonBody;
use crate::processes::signals::SignalNumber;
use crate::state::AppState;
use crate::users::{add_account_env, resolve_user};

/// Default wait of `read` for its `until`.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait of `read`.
pub const MAX_READ_TIMEOUT: Duration = Duration::from_secs(300);
/// How long `DELETE` waits for the SIGKILLed shell to be reaped.
const END_WAIT: Duration = Duration::from_secs(5);

pub async fn start(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<SessionRequest>,
) -> Result<Response, AgentError> {
    let cwd = resolve_cwd(&state.config.root, request.cwd.as_deref())?;
    let mut env: Vec<(String, String)> = request.env.unwrap_or_default().into_iter().collect();
    validate_env(&env)?;
    let user = request
        .user
        .as_deref()
        .map(resolve_user)
        .transpose()?
        .flatten();
    if let Some(account) = &user {
        add_account_env(&mut env, account);
    }
    state.apply_identity_env(&mut env);
    let max_output_bytes = output_cap(request.max_output_bytes)?;
    if let Some(shell) = &request.shell
        && (shell.is_empty() || shell.contains('\0'))
    {
        return Err(AgentError::BadRequest(
            "`shell` must be a non-empty path or name without NUL bytes".into(),
        ));
    }
    let path_var = env
        .iter()
        .find(|(key, _)| key == "PATH")
        .map(|(_, value)| value.clone())
        .or_else(|| std::env::var("PATH").ok());
    let shell = choose_shell(request.shell.as_deref(), path_var.as_deref(), |path| {
        path.is_file()
    })
    .ok_or_else(|| match &request.shell {
        Some(shell) => AgentError::BadRequest(format!(
            "shell `{shell}` does not exist (not a file, nor found on PATH)"
        )),
        None => AgentError::BadRequest(
            "the image has no shell: neither bash nor sh is at /bin or on PATH; pass `shell`"
                .into(),
        ),
    })?;
    let launch = ShellLaunch {
        shell,
        cwd,
        env,
        scrubbed_env: state.config.scrubbed_env.clone(),
        max_output_bytes,
        user,
    };
    let context = SessionContext {
        groups: Arc::clone(&state.groups),
        budget: Some(Arc::clone(&state.output_budget)),
    };
    let session = state.sessions.start(launch, context).await?;
    tracing::debug!(id = session.id(), "session started");
    Ok(json_response(StatusCode::CREATED, &session.status()))
}

pub async fn list(State(state): State<AppState>) -> Response {
    let sessions = state
        .sessions
        .list()
        .iter()
        .map(|session| session.status())
        .collect();
    json_response(StatusCode::OK, &SessionList { sessions })
}

pub async fn status(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, AgentError> {
    let session = find(&state, id)?;
    Ok(json_response(StatusCode::OK, &session.status()))
}

pub async fn remove(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, AgentError> {
    let session = find(&state, id)?;
    state.sessions.remove(session.id());
    session.end(END_WAIT).await;
    tracing::debug!(id = session.id(), "session ended");
    Ok(json_response(StatusCode::OK, &session.status()))
}

pub async fn run(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<SessionRunRequest>,
) -> Result<Response, AgentError> {
    let session = find(&state, id)?;
    if request.command.contains('\0') {
        return Err(AgentError::BadRequest(
            "`command` must not contain NUL bytes".into(),
        ));
    }
    let timeout = match request.timeout_ms {
        Some(0) => {
            return Err(AgentError::BadRequest(
                "`timeoutMs` must be a positive number of milliseconds".into(),
            ));
        }
        Some(millis) => Duration::from_millis(millis),
        None => DEFAULT_EXEC_TIMEOUT,
    };
    let encoding = request.output_encoding.unwrap_or_default();
    let mut outcome = session.run(&request.command, timeout).await?;
    // The output stays charged to the agent-wide budget until the response carrying it is sent.
    let charge = outcome.output.take_charge();
    let output = outcome.output.into_encoded(encoding);
    let response = SessionRunResponse {
        output: output.data,
        exit_code: outcome.exit_code,
        timed_out: outcome.timed_out,
        output_truncated: output.truncated,
        output_lossy: output.lossy,
        output_encoding: encoding,
        duration_ms: outcome.duration.as_millis() as u64,
        shell_exited: outcome.shell_exited,
        shell_restarted: outcome.shell_restarted,
    };
    let (parts, body) = json_response(StatusCode::OK, &response).into_parts();
    Ok(Response::from_parts(parts, holding(body, charge)))
}

/// `POST /v1/sessions/{id}/signal`: signals the command of the run in progress (SIGINT by default)
/// without waiting for the run, which answers on its own once the command has ended.
pub async fn signal(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<SessionSignalRequest>,
) -> Result<Response, AgentError> {
    let session = find(&state, id)?;
    let number = match &request.signal {
        Some(signal) => signal.number().map_err(AgentError::BadRequest)?,
        None => libc::SIGINT,
    };
    let running = session.signal(number)?;
    Ok(json_response(
        StatusCode::OK,
        &SessionSignalResponse {
            running,
            session: session.status(),
        },
    ))
}

pub async fn input(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<SessionInputRequest>,
) -> Result<Response, AgentError> {
    let session = find(&state, id)?;
    session.input(request.text.as_bytes()).await?;
    Ok(json_response(StatusCode::OK, &session.status()))
}

pub async fn read(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<SessionReadRequest>,
) -> Result<Response, AgentError> {
    let session = find(&state, id)?;
    if request.until.as_deref() == Some("") {
        return Err(AgentError::BadRequest(
            "`until` must not be empty; leave it out to read what is there".into(),
        ));
    }
    let timeout = request
        .timeout_ms
        .map_or(DEFAULT_READ_TIMEOUT, Duration::from_millis)
        .min(MAX_READ_TIMEOUT);
    let encoding = request.output_encoding.unwrap_or_default();
    let (read, shell_exited) = session
        .read(request.until.as_deref().map(str::as_bytes), timeout)
        .await;
    let mut bytes = CapturedOutput::new(read.bytes.len());
    bytes.push(&read.bytes);
    let output = bytes.into_encoded(encoding);
    Ok(json_response(
        StatusCode::OK,
        &SessionReadResponse {
            output: output.data,
            matched: read.matched,
            output_truncated: read.truncated,
            output_lossy: output.lossy,
            output_encoding: encoding,
            shell_exited,
        },
    ))
}

fn find(
    state: &AppState,
    id: Result<Path<String>, PathRejection>,
) -> Result<Arc<Session>, AgentError> {
    let Path(id) =
        id.map_err(|rejection| AgentError::BadRequest(format!("invalid session id: {rejection}")))?;
    state.sessions.get(&id).ok_or_else(|| {
        AgentError::NotFound(format!(
            "no session with id `{id}` (GET /v1/sessions lists them; POST /v1/sessions starts one)"
        ))
    })
}
