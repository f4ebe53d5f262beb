//! HTTP routes of background processes: `POST/GET /v1/processes`, `GET/DELETE /v1/processes/{id}`,
//! `POST /v1/processes/{id}/signal`, `/stdin` and `/resize`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine;
use orchard_api::agent::{ProcessList, ProcessStdinRequest, SignalRequest, TerminalSize};
use serde::Deserialize;

use super::signals::SignalNumber;
use super::table::{ManagedProcess, Started};
use crate::error::{AgentError, json_response};
use crate::exec::request::{CommandRequest, IntoSpec, RequestKind};
use crate::json_body::JsonBody;
use crate::state::AppState;

/// Longest accepted `wait` of a status long-poll.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// How long `DELETE` waits for a SIGKILLed group's leader to be reaped.
const DELETE_WAIT: Duration = Duration::from_secs(10);

pub async fn start(
    State(state): State<AppState>,
    JsonBody(mut request): JsonBody<CommandRequest>,
) -> Result<Response, AgentError> {
    let id = request.id.take();
    let mut spec = request.into_spec(&state.config.root, RequestKind::Process)?;
    state.apply_identity(&mut spec);
    match state
        .processes
        .start(id, spec, &state.config.scrubbed_env, &state.groups)?
    {
        Started::New(process) => {
            tracing::debug!(id = process.id(), "background process started");
            Ok(json_response(StatusCode::CREATED, &process.status(true)))
        }
        Started::Exists(existing) => Err(AgentError::Conflict {
            message: format!(
                "a process with id `{}` already exists (see `process`); adopt it, or DELETE it first",
                existing.id()
            ),
            process: Some(Box::new(existing.status(true))),
        }),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// `false` leaves out `stdout`/`stderr` (default true).
    output: Option<bool>,
}

pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, AgentError> {
    let Query(query) = query.map_err(query_error)?;
    let with_output = query.output.unwrap_or(true);
    let processes = state
        .processes
        .list()
        .iter()
        .map(|process| process.status(with_output))
        .collect();
    Ok(json_response(StatusCode::OK, &ProcessList { processes }))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusQuery {
    /// Long-poll: wait up to this many seconds for the process to exit.
    wait: Option<f64>,
    output: Option<bool>,
}

pub async fn status(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Response, AgentError> {
    let process = find(&state, id)?;
    let Query(query) = query.map_err(query_error)?;
    if let Some(wait) = query.wait {
        if !wait.is_finite() || wait < 0.0 {
            return Err(AgentError::BadRequest(format!(
                "`wait` must be a number of seconds >= 0, got {wait}"
            )));
        }
        let wait = Duration::from_secs_f64(wait.min(MAX_WAIT.as_secs_f64()));
        if process.is_running() {
            process.wait_exit(wait).await;
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &process.status(query.output.unwrap_or(true)),
    ))
}

pub async fn signal(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<SignalRequest>,
) -> Result<Response, AgentError> {
    let process = find(&state, id)?;
    let number = request.signal.number().map_err(AgentError::BadRequest)?;
    if process.signal(number)? {
        Ok(json_response(StatusCode::OK, &process.status(false)))
    } else {
        Err(AgentError::Conflict {
            message: format!(
                "process `{}` has already exited; nothing to signal",
                process.id()
            ),
            process: Some(Box::new(process.status(false))),
        })
    }
}

pub async fn stdin(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(request): JsonBody<ProcessStdinRequest>,
) -> Result<Response, AgentError> {
    let process = find(&state, id)?;
    let data = match (request.data, request.data_base64) {
        (Some(_), Some(_)) => {
            return Err(AgentError::InvalidRequest(
                "give at most one of `data` and `dataBase64`".into(),
            ));
        }
        (Some(text), None) => text.into_bytes(),
        (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
            .decode(encoded.as_bytes())
            .map_err(|error| {
                AgentError::BadRequest(format!("`dataBase64` is not valid base64: {error}"))
            })?,
        (None, None) => Vec::new(),
    };
    process
        .write_stdin(&data, request.close.unwrap_or(false))
        .await?;
    Ok(json_response(StatusCode::OK, &process.status(false)))
}

pub async fn resize(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    JsonBody(size): JsonBody<TerminalSize>,
) -> Result<Response, AgentError> {
    let process = find(&state, id)?;
    if !(1..=1000).contains(&size.rows) || !(1..=1000).contains(&size.cols) {
        return Err(AgentError::BadRequest(format!(
            "rows and cols must be 1 to 1000, got {}x{}",
            size.rows, size.cols
        )));
    }
    process.resize(size)?;
    Ok(json_response(StatusCode::OK, &process.status(false)))
}

pub async fn remove(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
) -> Result<Response, AgentError> {
    let process = find(&state, id)?;
    if process.is_running() {
        process.signal(libc::SIGKILL)?;
        process.wait_exit(DELETE_WAIT).await;
    }
    state.processes.remove(process.id());
    Ok(json_response(StatusCode::OK, &process.status(true)))
}

fn find(
    state: &AppState,
    id: Result<Path<String>, PathRejection>,
) -> Result<Arc<ManagedProcess>, AgentError> {
    let Path(id) =
        id.map_err(|rejection| AgentError::BadRequest(format!("invalid process id: {rejection}")))?;
    state.processes.get(&id).ok_or_else(|| {
        AgentError::NotFound(format!(
            "no process with id `{id}` (GET /v1/processes lists them)"
        ))
    })
}

/// Turns axum's query rejection into a JSON error.
pub fn query_error(rejection: QueryRejection) -> AgentError {
    AgentError::BadRequest(format!("invalid query string: {}", rejection.body_text()))
}
