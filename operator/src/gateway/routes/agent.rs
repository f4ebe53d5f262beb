//! Routes proxied to the sandbox's agent (`exec`, `exec/stream`, `processes...`, `files...`, `patch`):
//! authorise, find the sandbox's endpoint and token in the caches, count the call as a heartbeat, and
//! stream the request to `status.agentEndpoint` and the answer back unchanged.

use std::time::Duration;

use axum::extract::{Path, Request, State as AxumState};
use axum::response::Response;

use super::{ObjectPath, State};
use crate::gateway::access::Operation;
use crate::gateway::errors::{ApiError, ErrorBody};
use crate::gateway::lookup::{agent_endpoint, agent_token, find_sandbox};
use crate::gateway::openapi::{
    ExecRequest, ExecResponse, FileList, PatchRequest, PatchResult, ProcessStatus, SignalRequest,
};
use crate::gateway::proxy::{Target, answer_timeout};

/// How long an exec may run by default before the gateway gives up waiting (the agent's default
/// command timeout is 600 s); clients with longer commands set `X-Orchard-Timeout`.
const EXEC_ANSWER_TIMEOUT: Duration = Duration::from_secs(660);

/// Default wait for the agent's answer on every other route.
const QUICK_ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The agent's path for a gateway path (pure): `/v1/namespaces/ns/sandboxes/s/exec/stream?x=1` ->
/// `/v1/exec/stream?x=1`. The raw (still percent-encoded) path and query are kept.
pub fn agent_path(gateway_path: &str, query: Option<&str>) -> Option<String> {
    let segments: Vec<&str> = gateway_path.split('/').collect();
    // ["", "v1", "namespaces", ns, "sandboxes", name, rest...]
    if segments.len() < 7
        || segments[1] != "v1"
        || segments[2] != "namespaces"
        || segments[4] != "sandboxes"
    {
        return None;
    }
    let mut path = format!("/v1/{}", segments[6..].join("/"));
    if let Some(query) = query.filter(|q| !q.is_empty()) {
        path.push('?');
        path.push_str(query);
    }
    Some(path)
}

/// The answer timeout of a process status read: its long-poll `wait` plus a margin.
fn process_answer_timeout(query: Option<&str>) -> Duration {
    let wait = query
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| *key == "wait")
        .and_then(|(_, value)| value.parse::<f64>().ok())
        .filter(|w| w.is_finite() && *w > 0.0)
        .unwrap_or(0.0)
        .min(300.0);
    QUICK_ANSWER_TIMEOUT + Duration::from_secs_f64(wait)
}

/// Sends `request` to the agent of `namespace/name` after authorising `operation`.
async fn proxy(
    state: &State,
    namespace: &str,
    name: &str,
    operation: Operation,
    default_timeout: Duration,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    state
        .authorize(&parts.headers, operation, namespace, name)
        .await?;
    let timeout = answer_timeout(&parts.headers, default_timeout)?;
    let sandbox = find_sandbox(
        &state.deps.client,
        &state.deps.caches.sandboxes,
        namespace,
        name,
    )
    .await?;
    let endpoint = agent_endpoint(&sandbox)?;
    let token = agent_token(&state.deps.client, &state.deps.caches.secrets, &sandbox).await?;
    let path = agent_path(parts.uri.path(), parts.uri.query())
        .ok_or_else(|| ApiError::internal(format!("unroutable path {}", parts.uri.path())))?;
    state.heartbeats.activity(&sandbox);
    let target = Target {
        sandbox: format!("{namespace}/{name}"),
        endpoint,
        token,
    };
    state
        .proxy
        .forward(&target, parts.method, &path, &parts.headers, body, timeout)
        .await
}

/// Runs one command in the sandbox and answers when it ends (agent `POST /v1/exec`).
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/exec",
    tag = "agent",
    params(ObjectPath, ("x-orchard-timeout" = Option<f64>, Header, description = "Seconds to wait for the answer (default 660; set it above the command's timeoutSeconds)")),
    request_body = ExecRequest,
    responses(
        (status = 200, description = "The command ran (any exit code)", body = ExecResponse),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `create sandboxes/exec`", body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
        (status = 409, description = "`NotReady` with the sandbox's phase", body = ErrorBody),
        (status = 502, description = "`AgentUnreachable` / `AgentConnectionLost` (retryable when marked)", body = ErrorBody),
        (status = 503, description = "`AgentUnavailable` (retryable)", body = ErrorBody),
        (status = 504, description = "`AgentTimeout`: no answer within X-Orchard-Timeout", body = ErrorBody),
    )
)]
pub async fn exec(
    AxumState(state): AxumState<State>,
    Path(path): Path<ObjectPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::Exec,
        EXEC_ANSWER_TIMEOUT,
        request,
    )
    .await
}

/// Runs one command and streams its output as NDJSON events (`started`, `stdout`, `stderr`, `exit`).
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/exec/stream",
    tag = "agent",
    params(ObjectPath),
    request_body = ExecRequest,
    responses(
        (status = 200, description = "One JSON event per line as output arrives", content_type = "application/x-ndjson", body = String),
        (status = 403, description = "RBAC denies `create sandboxes/exec`", body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 502, body = ErrorBody),
    )
)]
pub async fn exec_stream(
    AxumState(state): AxumState<State>,
    Path(path): Path<ObjectPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::Exec,
        QUICK_ANSWER_TIMEOUT,
        request,
    )
    .await
}

/// Starts a background process (agent `POST /v1/processes`).
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/processes",
    tag = "agent",
    params(ObjectPath),
    request_body = ExecRequest,
    responses(
        (status = 201, description = "Started", body = ProcessStatus),
        (status = 409, description = "The id is taken (`process` holds its status), or the sandbox is not ready", body = ErrorBody),
    )
)]
pub async fn start_process(
    AxumState(state): AxumState<State>,
    Path(path): Path<ObjectPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::Exec,
        QUICK_ANSWER_TIMEOUT,
        request,
    )
    .await
}

/// Lists background processes (`?output=false` leaves out their output).
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/processes",
    tag = "agent",
    params(ObjectPath),
    responses((status = 200, description = "`{\"processes\": [status, ...]}`", body = Object))
)]
pub async fn list_processes(
    AxumState(state): AxumState<State>,
    Path(path): Path<ObjectPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::Exec,
        QUICK_ANSWER_TIMEOUT,
        request,
    )
    .await
}

/// Path parameters of one process.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ProcessPath {
    /// Namespace.
    pub namespace: String,
    /// Sandbox name.
    pub name: String,
    /// Process id.
    pub id: String,
}

/// Reads a process's status; `?wait=SECONDS` long-polls until it exits (at most 300).
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/processes/{id}",
    tag = "agent",
    params(ProcessPath),
    responses(
        (status = 200, body = ProcessStatus),
        (status = 404, description = "Unknown process id", body = ErrorBody),
    )
)]
pub async fn get_process(
    AxumState(state): AxumState<State>,
    Path(path): Path<ProcessPath>,
    request: Request,
) -> Result<Response, ApiError> {
    let timeout = process_answer_timeout(request.uri().query());
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::Exec,
        timeout,
        request,
    )
    .await
}

/// Kills a process's group if it runs and forgets it (agent `DELETE /v1/processes/{id}`).
#[utoipa::path(
    delete,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/processes/{id}",
    tag = "agent",
    params(ProcessPath),
    responses((status = 200, description = "The final status", body = ProcessStatus))
)]
pub async fn delete_process(
    AxumState(state): AxumState<State>,
    Path(path): Path<ProcessPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::Exec,
        QUICK_ANSWER_TIMEOUT,
        request,
    )
    .await
}

/// Signals a process's whole group.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/processes/{id}/signal",
    tag = "agent",
    params(ProcessPath),
    request_body = SignalRequest,
    responses(
        (status = 200, body = ProcessStatus),
        (status = 409, description = "The process already exited", body = ErrorBody),
    )
)]
pub async fn signal_process(
    AxumState(state): AxumState<State>,
    Path(path): Path<ProcessPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::Exec,
        QUICK_ANSWER_TIMEOUT,
        request,
    )
    .await
}

/// Downloads a file as raw bytes (`?path=`), streamed.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/files",
    tag = "agent",
    params(ObjectPath, ("path" = String, Query, description = "File path (absolute or relative to the agent's root)")),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 403, description = "RBAC denies `get sandboxes/files`", body = ErrorBody),
        (status = 404, description = "No such file (agent) or sandbox", body = ErrorBody),
    )
)]
pub async fn download(
    AxumState(state): AxumState<State>,
    Path(path): Path<ObjectPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::ReadFiles,
        QUICK_ANSWER_TIMEOUT,
        request,
    )
    .await
}

/// Uploads a file from the raw request body (`?path=&mode=`), streamed; atomic on the agent.
#[utoipa::path(
    put,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/files",
    tag = "agent",
    params(ObjectPath, ("path" = String, Query, description = "Destination path"), ("mode" = Option<String>, Query, description = "Octal mode, e.g. 0755")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 201, description = "`{\"path\": \"/abs/P\", \"size\": N}`", body = Object),
        (status = 403, description = "RBAC denies `create sandboxes/files`", body = ErrorBody),
    )
)]
pub async fn upload(
    AxumState(state): AxumState<State>,
    Path(path): Path<ObjectPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::WriteFiles,
        QUICK_ANSWER_TIMEOUT,
        request,
    )
    .await
}

/// Deletes a file or directory (`?path=&recursive=true`).
#[utoipa::path(
    delete,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/files",
    tag = "agent",
    params(ObjectPath, ("path" = String, Query, description = "Path to delete"), ("recursive" = Option<bool>, Query, description = "Delete a non-empty directory")),
    responses(
        (status = 200, description = "`{\"path\": \"/abs/P\", \"deleted\": true}`", body = Object),
        (status = 403, description = "RBAC denies `create sandboxes/files`", body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn delete_file(
    AxumState(state): AxumState<State>,
    Path(path): Path<ObjectPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::WriteFiles,
        QUICK_ANSWER_TIMEOUT,
        request,
    )
    .await
}

/// Lists a directory (`?path=`).
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/files/list",
    tag = "agent",
    params(ObjectPath, ("path" = String, Query, description = "Directory to list")),
    responses(
        (status = 200, body = FileList),
        (status = 403, description = "RBAC denies `get sandboxes/files`", body = ErrorBody),
    )
)]
pub async fn list_files(
    AxumState(state): AxumState<State>,
    Path(path): Path<ObjectPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::ReadFiles,
        QUICK_ANSWER_TIMEOUT,
        request,
    )
    .await
}

/// Applies a unified diff natively (all hunks or nothing).
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/patch",
    tag = "agent",
    params(ObjectPath),
    request_body = PatchRequest,
    responses(
        (status = 200, body = PatchResult),
        (status = 403, description = "RBAC denies `create sandboxes/exec`", body = ErrorBody),
        (status = 409, description = "`PatchConflict` with `failedHunks` (nothing written), or the sandbox is not ready", body = ErrorBody),
    )
)]
pub async fn apply_patch(
    AxumState(state): AxumState<State>,
    Path(path): Path<ObjectPath>,
    request: Request,
) -> Result<Response, ApiError> {
    proxy(
        &state,
        &path.namespace,
        &path.name,
        Operation::Exec,
        QUICK_ANSWER_TIMEOUT,
        request,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_paths_map_to_agent_paths() {
        let cases = [
            ("/v1/namespaces/ns/sandboxes/s/exec", None, "/v1/exec"),
            (
                "/v1/namespaces/ns/sandboxes/s/exec/stream",
                Some(""),
                "/v1/exec/stream",
            ),
            (
                "/v1/namespaces/ns/sandboxes/s/processes/p-1/signal",
                None,
                "/v1/processes/p-1/signal",
            ),
            (
                "/v1/namespaces/ns/sandboxes/s/files",
                Some("path=a%20b.txt&mode=0644"),
                "/v1/files?path=a%20b.txt&mode=0644",
            ),
            (
                "/v1/namespaces/ns/sandboxes/s/files/list",
                Some("path=/"),
                "/v1/files/list?path=/",
            ),
        ];
        for (gateway, query, agent) in cases {
            assert_eq!(
                agent_path(gateway, query).as_deref(),
                Some(agent),
                "{gateway}"
            );
        }
        assert_eq!(agent_path("/v1/namespaces/ns/sandboxes/s", None), None);
        assert_eq!(agent_path("/healthz", None), None);
    }

    #[test]
    fn long_polls_get_their_wait_added_to_the_answer_timeout() {
        assert_eq!(process_answer_timeout(None), QUICK_ANSWER_TIMEOUT);
        assert_eq!(
            process_answer_timeout(Some("output=false&wait=30")),
            QUICK_ANSWER_TIMEOUT + Duration::from_secs(30)
        );
        assert_eq!(
            process_answer_timeout(Some("wait=9999")),
            QUICK_ANSWER_TIMEOUT + Duration::from_secs(300)
        );
        assert_eq!(process_answer_timeout(Some("wait=x")), QUICK_ANSWER_TIMEOUT);
    }
}
