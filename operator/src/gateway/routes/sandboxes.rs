//! Sandbox lifecycle routes: create (returns at once), list and get (from the watch cache), delete,
//! wait (watch-driven), heartbeat (coalesced annotation write), timeout (the TTL from now), result
//! (write-once status field) and
//! the agent's address and token for direct calls.

use axum::Json;
use axum::body::Body;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::objects;
use super::waiting::{Progress, Settling, wait_route};
use crate::gateway::auth::access::Operation;
use crate::gateway::deps::GATEWAY_FIELD_MANAGER;
use crate::gateway::http::errors::{ApiError, ErrorBody, from_kube, json_response};
use crate::gateway::http::openapi::{
    AgentAccessResponse, CreateSandboxRequest, Deleted, HeartbeatResponse, ResultResponse,
    SandboxList, SandboxSchema, TimeoutRequestSchema, TimeoutResponse, TrajectoryResultSchema,
};
use crate::gateway::objects::spec::sandbox_from_request;
use crate::gateway::objects::timeout::{Refusal, ttl_for_timeout};
use crate::gateway::state::{Call, ListQuery, NamespacePath, ObjectPath, State, WaitQuery, query};
use crate::plumbing::conditions::{STALLED, is_true, why_unsettled};
use crate::plumbing::status_patch::status_member_patch;
use orchard_api::{Sandbox, SandboxPhase, TrajectoryResult, TrajectoryStatus};

fn api(state: &State, namespace: &str) -> Api<Sandbox> {
    Api::namespaced(state.deps.client.clone(), namespace)
}

/// Creates a Sandbox and answers at once (201) without waiting for it to start.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/sandboxes",
    tag = "sandboxes",
    params(NamespacePath),
    request_body = CreateSandboxRequest,
    responses(
        (status = 201, description = "Created; `metadata.name` holds the (generated) name. It starts in the background: wait with `.../wait`.", body = SandboxSchema),
        (status = 400, description = "Malformed request or unknown field", body = ErrorBody),
        (status = 401, description = "Missing or invalid token", body = ErrorBody),
        (status = 403, description = "RBAC denies `create sandboxes`", body = ErrorBody),
        (status = 409, description = "A sandbox with this name exists (`AlreadyExists`)", body = ErrorBody),
        (status = 422, description = "The API server rejected the spec (CEL rule message)", body = ErrorBody),
    )
)]
pub async fn create_sandbox(
    Call(state, path, headers): Call<NamespacePath>,
    body: Body,
) -> Result<Response, ApiError> {
    let identity = state
        .authorize(&headers, Operation::CreateSandbox, &path.namespace, "")
        .await?;
    let request = state.json_body(&identity, &headers, body).await?;
    let sandbox = sandbox_from_request(&path.namespace, request, &identity.username)?;
    let max = state.deps.settings.max_ttl_seconds;
    if let Some(ttl) = sandbox
        .spec
        .lifecycle
        .as_ref()
        .and_then(|l| l.ttl_seconds)
        .filter(|ttl| *ttl > max)
    {
        return Err(beyond_maximum(format!(
            "lifecycle.ttlSeconds {ttl} is beyond the operator's maximum of {max}s (--max-ttl-seconds, Helm value sandboxDefaults.maxTtlSeconds)"
        )));
    }
    objects::create(&state, &path.namespace, &sandbox, &identity.username).await
}

/// Lists the Sandboxes of a namespace from the watch cache (`?labelSelector=`).
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxes",
    tag = "sandboxes",
    params(NamespacePath, ListQuery),
    responses(
        (status = 200, description = "The sandboxes, sorted by name", body = SandboxList),
        (status = 400, description = "Invalid label selector", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `list sandboxes`", body = ErrorBody),
    )
)]
pub async fn list_sandboxes(
    Call(state, path, headers): Call<NamespacePath>,
    list: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    state
        .authorize(&headers, Operation::ListSandboxes, &path.namespace, "")
        .await?;
    let text = query(list)?.label_selector.unwrap_or_default();
    let filled = state.filled.is_filled("Sandbox");
    let cache = &state.deps.reads.sandboxes;
    objects::list(&state, cache, filled, &path.namespace, &text).await
}

/// Reads one Sandbox (watch cache; one API read if the cache does not have it yet).
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}",
    tag = "sandboxes",
    params(ObjectPath),
    responses(
        (status = 200, body = SandboxSchema),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, description = "No such sandbox", body = ErrorBody),
    )
)]
pub async fn get_sandbox(
    Call(state, path, headers): Call<ObjectPath>,
) -> Result<Response, ApiError> {
    state
        .authorize_object(&headers, Operation::GetSandbox, &path)
        .await?;
    let sandbox = state.sandbox(&path).await?;
    Ok(json_response(StatusCode::OK, sandbox.as_ref()))
}

/// Deletes a Sandbox (its Pod and policy are garbage-collected).
#[utoipa::path(
    delete,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}",
    tag = "sandboxes",
    params(ObjectPath),
    responses(
        (status = 200, body = Deleted),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn delete_sandbox(
    Call(state, path, headers): Call<ObjectPath>,
) -> Result<Response, ApiError> {
    let identity = state
        .authorize_object(&headers, Operation::DeleteSandbox, &path)
        .await?;
    objects::delete::<Sandbox>(
        &state,
        &state.deps.reads.sandboxes,
        &path.namespace,
        &path.name,
        &identity.username,
    )
    .await
}

/// Whether a sandbox has settled: Ready, a phase it will not leave on its own, or stalled (it cannot
/// go on without outside help: the `Stalled` condition says why).
pub fn sandbox_settled(sandbox: &Sandbox) -> bool {
    sandbox.status.as_ref().is_some_and(|s| {
        is_true(&s.conditions, "Ready")
            || is_true(&s.conditions, STALLED)
            || matches!(
                s.phase,
                Some(SandboxPhase::Failed | SandboxPhase::Succeeded | SandboxPhase::Expired)
            )
    })
}

/// Where an unsettled sandbox is: its phase and why it is not Ready.
fn sandbox_progress(sandbox: &Sandbox) -> Progress<'_> {
    let status = sandbox.status.as_ref();
    (
        status.and_then(|s| s.phase).map(SandboxPhase::as_str),
        status.and_then(|s| why_unsettled(&s.conditions, "Ready")),
    )
}

/// Blocks until the sandbox is Ready, has Failed (or Succeeded/Expired), or is stalled, driven by the
/// watch.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/wait",
    tag = "sandboxes",
    params(ObjectPath, WaitQuery),
    responses(
        (status = 200, description = "Settled: check `status.phase` (Ready, or Failed with `status.reason`) and the `Stalled` condition (it cannot go on without outside help, e.g. a missing pool or image)", body = SandboxSchema),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `get sandboxes`", body = ErrorBody),
        (status = 404, description = "No such sandbox, or deleted while waiting", body = ErrorBody),
        (status = 504, description = "`WaitTimeout`: not settled within timeoutSeconds (retryable; `phase` says where it is, `reason` and `conditionMessage` why)", body = ErrorBody),
    )
)]
pub async fn wait_sandbox(
    Call(state, path, headers): Call<ObjectPath>,
    wait: Result<Query<WaitQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let settling = Settling {
        operation: Operation::GetSandbox,
        kind: "Sandbox",
        noun: "sandbox",
        settled: sandbox_settled,
        progress: sandbox_progress,
    };
    wait_route(
        &state,
        &headers,
        &path,
        wait,
        &state.deps.reads.sandboxes,
        settling,
    )
    .await
}

/// Refreshes the sandbox's expiry (coalesced: at most one API write per third of its heartbeat
/// timeout). Calls through the gateway's agent routes count as heartbeats too.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/heartbeat",
    tag = "sandboxes",
    params(ObjectPath),
    responses(
        (status = 200, body = HeartbeatResponse),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `create sandboxes/heartbeat`", body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn heartbeat(Call(state, path, headers): Call<ObjectPath>) -> Result<Response, ApiError> {
    state
        .authorize_object(&headers, Operation::Heartbeat, &path)
        .await?;
    let sandbox = state.sandbox(&path).await?;
    let beat = state.heartbeats.beat(&sandbox).await?;
    let expires_at = sandbox
        .status
        .as_ref()
        .and_then(|s| s.expires_at.as_ref())
        .map(|t| t.0.to_string());
    Ok(Json(json!({
        "heartbeatTimeoutSeconds": beat.timeout_seconds,
        "written": beat.written,
        "expiresAt": expires_at,
    }))
    .into_response())
}

/// Body of `POST .../timeout`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TimeoutRequest {
    /// Seconds from now until the sandbox ends.
    timeout_seconds: i64,
}

/// 422 `TtlBeyondMaximum`: a TTL the operator's maximum does not allow.
fn beyond_maximum(message: String) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "TtlBeyondMaximum",
        message,
    )
}

/// Sets a Ready sandbox's TTL so that it ends `timeoutSeconds` from now, to extend or shorten its
/// life (`spec.lifecycle.ttlSeconds` becomes the time since Ready plus the timeout). The heartbeat
/// deadline still applies. Authorised like a heartbeat.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/timeout",
    tag = "sandboxes",
    params(ObjectPath),
    request_body = TimeoutRequestSchema,
    responses(
        (status = 200, body = TimeoutResponse),
        (status = 400, description = "Malformed body, or `timeoutSeconds` not between 1 and 31622400", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `create sandboxes/heartbeat`", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "`NotReady`: the TTL counts from Ready; wait for it first", body = ErrorBody),
        (status = 422, description = "`TtlBeyondMaximum`: past the operator's `--max-ttl-seconds`; the message names the most still allowed", body = ErrorBody),
    )
)]
pub async fn set_timeout(
    Call(state, path, headers): Call<ObjectPath>,
    body: Body,
) -> Result<Response, ApiError> {
    let identity = state
        .authorize_object(&headers, Operation::Heartbeat, &path)
        .await?;
    let value = state.json_body(&identity, &headers, body).await?;
    let request: TimeoutRequest = serde_json::from_value(value)
        .map_err(|err| ApiError::bad_request(format!("invalid body: {err}")))?;
    let sandbox = state.sandbox(&path).await?;
    let status = sandbox.status.clone().unwrap_or_default();
    let ready = match (status.phase, status.ready_time) {
        (Some(SandboxPhase::Ready), Some(ready))
            if sandbox.metadata.deletion_timestamp.is_none() =>
        {
            ready.0
        }
        (phase, _) => {
            return Err(ApiError::not_ready(
                &path.namespace,
                &path.name,
                phase.map(|p| p.as_str()),
            ));
        }
    };
    let max = state.deps.settings.max_ttl_seconds;
    let now = k8s_openapi::jiff::Timestamp::now();
    let ttl =
        ttl_for_timeout(ready, now, request.timeout_seconds, max).map_err(
            |refusal| match refusal {
                Refusal::OutOfRange(_) => ApiError::bad_request(refusal.message()),
                Refusal::BeyondMaximum { .. } => beyond_maximum(refusal.message()),
            },
        )?;
    let patch = json!({"spec": {"lifecycle": {"ttlSeconds": ttl.ttl_seconds}}});
    api(&state, &path.namespace)
        .patch(
            &path.name,
            &PatchParams {
                field_manager: Some(GATEWAY_FIELD_MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|err| from_kube(&err, &format!("sandbox {}/{}", path.namespace, path.name)))?;
    Ok(Json(json!({
        "ttlSeconds": ttl.ttl_seconds,
        "ttlEndsAt": ttl.ends_at.to_string(),
        "maxTtlSeconds": max,
    }))
    .into_response())
}

/// The agent address and token of a Ready sandbox, for clients that call its agent directly
/// (`direct` mode of the SDK): the address of the sandbox's own pod and the token bound to that pod.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/token",
    tag = "sandboxes",
    params(ObjectPath),
    responses(
        (status = 200, body = AgentAccessResponse),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `get sandboxes/token`", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Not Ready (`NotReady`), or a pod whose token cannot be derived (`Conflict`)", body = ErrorBody),
    )
)]
pub async fn agent_token(
    Call(state, path, headers): Call<ObjectPath>,
) -> Result<Response, ApiError> {
    state
        .authorize_object(&headers, Operation::AgentToken, &path)
        .await?;
    let sandbox = state.sandbox(&path).await?;
    let agent = state.agent_access(&sandbox).await?;
    let mut response =
        Json(json!({"endpoint": agent.endpoint, "token": agent.token})).into_response();
    response.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    Ok(response)
}

/// Checks a result the way the CRD's CEL rules will, so the caller gets a 400 naming the field.
fn validate_result(body: &Value) -> Result<TrajectoryResult, ApiError> {
    let result: TrajectoryResult = serde_json::from_value(body.clone())
        .map_err(|err| ApiError::bad_request(format!("invalid JSON body: {err}")))?;
    let known = [
        "reward", "status", "length", "exitCode", "artifact", "reason", "message",
    ];
    if let Some(object) = body.as_object()
        && let Some(unknown) = object.keys().find(|k| !known.contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "unknown field `{unknown}` in the result; allowed: {}",
            known.join(", ")
        )));
    }
    if result.status != TrajectoryStatus::Aborted && result.reward.is_none() {
        return Err(ApiError::bad_request(
            "`reward` is required unless `status` is `aborted`",
        ));
    }
    Ok(result)
}

/// Records the trajectory result of an externally driven sandbox in `status.result` (write-once).
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/result",
    tag = "sandboxes",
    params(ObjectPath),
    request_body = TrajectoryResultSchema,
    responses(
        (status = 200, description = "Recorded (or the same result was already recorded)", body = ResultResponse),
        (status = 400, description = "Invalid result", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `create sandboxes/result`", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "`ResultAlreadyRecorded`: a different result is recorded (write-once); `RunDriven`: the sandbox has `spec.run`, whose result only the operator's runner records", body = ErrorBody),
    )
)]
pub async fn record_result(
    Call(state, path, headers): Call<ObjectPath>,
    body: Body,
) -> Result<Response, ApiError> {
    let identity = state
        .authorize_object(&headers, Operation::RecordResult, &path)
        .await?;
    let value = state.json_body(&identity, &headers, body).await?;
    let result = validate_result(&value)?;
    let sandbox = state.sandbox(&path).await?;
    if sandbox.spec.run.is_some() {
        return Err(run_driven(&path));
    }
    let already = |recorded: &TrajectoryResult| {
        ApiError::new(
            StatusCode::CONFLICT,
            "ResultAlreadyRecorded",
            format!(
                "sandbox {}/{} already has a different result recorded (status.result is write-once): {}",
                path.namespace,
                path.name,
                serde_json::to_string(recorded).unwrap_or_default()
            ),
        )
    };
    if let Some(recorded) = sandbox.status.as_ref().and_then(|s| s.result.as_ref()) {
        if *recorded == result {
            return Ok(Json(json!({"recorded": false, "result": recorded})).into_response());
        }
        return Err(already(recorded));
    }
    let value = serde_json::to_value(&result)
        .map_err(|e| ApiError::internal(format!("cannot serialise the result: {e}")))?;
    // Guarded by the sandbox's UID: a sandbox deleted and recreated under the name meanwhile is not
    // the one the caller means.
    let patch = status_member_patch(&sandbox.uid().unwrap_or_default(), "result", value);
    let patch_params = PatchParams {
        field_manager: Some(GATEWAY_FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    match api(&state, &path.namespace)
        .patch_status(&path.name, &patch_params, &Patch::Json::<()>(patch))
        .await
    {
        Ok(patched) => {
            state.deps.metrics.api_write("sandboxes", "patch");
            let recorded = patched.status.and_then(|s| s.result).unwrap_or(result);
            Ok(Json(json!({"recorded": true, "result": recorded})).into_response())
        }
        Err(kube::Error::Api(status))
            if status.code == 422 && status.message.contains("write-once") =>
        {
            // The cache had not seen the first result yet; the CEL rule kept it.
            Err(ApiError::new(
                StatusCode::CONFLICT,
                "ResultAlreadyRecorded",
                format!(
                    "sandbox {}/{} already has a different result recorded (status.result is write-once)",
                    path.namespace, path.name
                ),
            ))
        }
        Err(kube::Error::Api(status)) if status.code == 422 => {
            // The UID test failed: the sandbox was deleted (and recreated under its name) meanwhile.
            Err(ApiError::not_found("sandbox", &path.namespace, &path.name))
        }
        Err(err) => Err(from_kube(
            &err,
            &format!(
                "recording the result of sandbox {}/{}",
                path.namespace, path.name
            ),
        )),
    }
}

/// 409 `RunDriven`: the result of a sandbox with `spec.run` is the operator's runner's to record.
fn run_driven(path: &ObjectPath) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "RunDriven",
        format!(
            "sandbox {}/{} runs `spec.run`: its result is recorded by the operator's trajectory runner from the run's own output, and nobody else may record one; leave `run` out of the spec (or of the RolloutGroup's template) to record results yourself",
            path.namespace, path.name
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_validated_before_the_api_server_sees_them() {
        assert!(validate_result(&json!({"reward": 1.0, "status": "completed"})).is_ok());
        assert!(validate_result(&json!({"status": "aborted", "reason": "Crashed"})).is_ok());
        let err = validate_result(&json!({"status": "completed"})).unwrap_err();
        assert!(err.body.message.contains("`reward` is required"));
        let err = validate_result(&json!({"reward": 1, "status": "done"})).unwrap_err();
        assert_eq!(err.status, 400);
        let err =
            validate_result(&json!({"rewrad": 1, "reward": 1, "status": "completed"})).unwrap_err();
        assert!(err.body.message.contains("rewrad"));
    }

    #[test]
    fn settled_means_ready_or_terminal() {
        use orchard_api::{SandboxSpec, SandboxStatus};
        let mut s = Sandbox::new("s", SandboxSpec::default());
        assert!(!sandbox_settled(&s));
        s.status = Some(SandboxStatus {
            phase: Some(SandboxPhase::Starting),
            ..SandboxStatus::default()
        });
        assert!(!sandbox_settled(&s));
        s.status = Some(SandboxStatus {
            phase: Some(SandboxPhase::Failed),
            ..SandboxStatus::default()
        });
        assert!(sandbox_settled(&s));
        let timeout = super::super::waiting::wait_timeout(
            "sandbox",
            "ns",
            "s",
            Some("Starting"),
            Some(("PolicyEnforcementMissing", "no enforcer")),
        );
        assert_eq!(
            timeout.body.reason.as_deref(),
            Some("PolicyEnforcementMissing")
        );
        assert_eq!(
            timeout.body.condition_message.as_deref(),
            Some("no enforcer")
        );
        assert!(
            timeout
                .body
                .message
                .contains("PolicyEnforcementMissing: no enforcer"),
            "{}",
            timeout.body.message
        );
        assert_eq!(timeout.status, 504);
        assert!(timeout.body.retryable);
        assert_eq!(timeout.body.phase.as_deref(), Some("Starting"));
    }
}
