//! SandboxSnapshot routes: create (returns at once), list and get (watch cache), delete, and wait until
//! the snapshot is `Ready` or `Failed`, driven by the watch. Authorised by RBAC on
//! `orchard.dev/sandboxsnapshots` like the other kinds (docs/API.md); creating a snapshot also needs
//! `get` on the Sandbox it names (a snapshot reads the sandbox's whole filesystem).

use axum::body::Body;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::response::Response;

use super::objects;
use super::waiting::{Progress, Settling, wait_route};
use crate::gateway::auth::access::Operation;
use crate::gateway::http::errors::{ApiError, ErrorBody, json_response};
use crate::gateway::http::openapi::{
    CreateSnapshotRequest, Deleted, SandboxSnapshotList, SandboxSnapshotSchema,
};
use crate::gateway::objects::spec::snapshot_from_request;
use crate::gateway::state::{Call, ListQuery, NamespacePath, ObjectPath, WaitQuery, query};
use crate::plumbing::conditions::why_unsettled;
use orchard_api::{SandboxSnapshot, SnapshotPhase};

/// Creates a SandboxSnapshot of a Ready Sandbox and answers at once (201); wait on `.../wait`.
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/sandboxsnapshots",
    tag = "sandboxsnapshots",
    params(NamespacePath),
    request_body = CreateSnapshotRequest,
    responses(
        (status = 201, description = "Created; `metadata.name` holds the (generated) name", body = SandboxSnapshotSchema),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `create sandboxsnapshots`, or `get sandboxes` on the sandbox it names", body = ErrorBody),
        (status = 409, description = "`AlreadyExists`", body = ErrorBody),
        (status = 422, description = "Rejected by the CRD's rules (e.g. a relative path)", body = ErrorBody),
    )
)]
pub async fn create_snapshot(
    Call(state, path, headers): Call<NamespacePath>,
    body: Body,
) -> Result<Response, ApiError> {
    let identity = state
        .authorize(&headers, Operation::CreateSnapshot, &path.namespace, "")
        .await?;
    let request = state.json_body(&identity, &headers, body).await?;
    let snapshot = snapshot_from_request(&path.namespace, request, &identity.username)?;
    // The snapshot holds the sandbox's whole filesystem: its creator must be allowed to read the
    // sandbox (the operator commits it with its own rights).
    state
        .authorize(
            &headers,
            Operation::GetSandbox,
            &path.namespace,
            &snapshot.spec.sandbox,
        )
        .await?;
    objects::create(&state, &path.namespace, &snapshot, &identity.username).await
}

/// Lists SandboxSnapshots of a namespace from the watch cache (`?labelSelector=`).
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxsnapshots",
    tag = "sandboxsnapshots",
    params(NamespacePath, ListQuery),
    responses(
        (status = 200, body = SandboxSnapshotList),
        (status = 400, body = ErrorBody),
        (status = 403, description = "RBAC denies `list sandboxsnapshots`", body = ErrorBody),
    )
)]
pub async fn list_snapshots(
    Call(state, path, headers): Call<NamespacePath>,
    list: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    state
        .authorize(&headers, Operation::ListSnapshots, &path.namespace, "")
        .await?;
    let text = query(list)?.label_selector.unwrap_or_default();
    let filled = state.filled.is_filled("SandboxSnapshot");
    let cache = &state.deps.reads.snapshots;
    objects::list(&state, cache, filled, &path.namespace, &text).await
}

/// Reads one SandboxSnapshot.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxsnapshots/{name}",
    tag = "sandboxsnapshots",
    params(ObjectPath),
    responses(
        (status = 200, body = SandboxSnapshotSchema),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn get_snapshot(
    Call(state, path, headers): Call<ObjectPath>,
) -> Result<Response, ApiError> {
    state
        .authorize_object(&headers, Operation::GetSnapshot, &path)
        .await?;
    let snapshot = state.snapshot(&path).await?;
    Ok(json_response(StatusCode::OK, snapshot.as_ref()))
}

/// Deletes a SandboxSnapshot. The deletion completes once no Sandbox, SandboxPool or RolloutGroup
/// names it (its `InUse` condition says who does); the image stays in the registry.
#[utoipa::path(
    delete,
    path = "/v1/namespaces/{namespace}/sandboxsnapshots/{name}",
    tag = "sandboxsnapshots",
    params(ObjectPath),
    responses(
        (status = 200, body = Deleted),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn delete_snapshot(
    Call(state, path, headers): Call<ObjectPath>,
) -> Result<Response, ApiError> {
    let identity = state
        .authorize_object(&headers, Operation::DeleteSnapshot, &path)
        .await?;
    objects::delete::<SandboxSnapshot>(
        &state,
        &state.deps.reads.snapshots,
        &path.namespace,
        &path.name,
        &identity.username,
    )
    .await
}

/// Whether a snapshot is done: phase Ready or Failed.
pub fn snapshot_settled(snapshot: &SandboxSnapshot) -> bool {
    snapshot
        .status
        .as_ref()
        .is_some_and(|s| matches!(s.phase, Some(SnapshotPhase::Ready | SnapshotPhase::Failed)))
}

/// Where an unsettled snapshot is: its phase and why it is not Ready.
fn snapshot_progress(snapshot: &SandboxSnapshot) -> Progress<'_> {
    let status = snapshot.status.as_ref();
    (
        status.and_then(|s| s.phase).map(SnapshotPhase::as_str),
        status.and_then(|s| why_unsettled(&s.conditions, "Ready")),
    )
}

/// Blocks until the snapshot is `Ready` (its image pushed) or `Failed`, driven by the watch.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/sandboxsnapshots/{name}/wait",
    tag = "sandboxsnapshots",
    params(ObjectPath, WaitQuery),
    responses(
        (status = 200, description = "Settled: `status.phase` is Ready (`status.image` set) or Failed (the `Ready` condition says why)", body = SandboxSnapshotSchema),
        (status = 403, description = "RBAC denies `get sandboxsnapshots`", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 504, description = "`WaitTimeout` (retryable): wait again", body = ErrorBody),
    )
)]
pub async fn wait_snapshot(
    Call(state, path, headers): Call<ObjectPath>,
    wait: Result<Query<WaitQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let settling = Settling {
        operation: Operation::GetSnapshot,
        kind: "SandboxSnapshot",
        noun: "sandboxsnapshot",
        settled: snapshot_settled,
        progress: snapshot_progress,
    };
    wait_route(
        &state,
        &headers,
        &path,
        wait,
        &state.deps.reads.snapshots,
        settling,
    )
    .await
}
