//! RolloutGroup routes: create (returns at once), list and get (watch cache), delete, and wait until
//! the group is recorded (`Complete`) or `Failed`, driven by the watch.

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
    CreateRolloutGroupRequest, Deleted, RolloutGroupList, RolloutGroupSchema,
};
use crate::gateway::objects::spec::rollout_group_from_request;
use crate::gateway::state::{Call, ListQuery, NamespacePath, ObjectPath, WaitQuery, query};
use crate::plumbing::conditions::{is_true, why_unsettled};
use orchard_api::{RolloutGroup, RolloutPhase};

/// Creates a RolloutGroup and answers at once (201).
#[utoipa::path(
    post,
    path = "/v1/namespaces/{namespace}/rolloutgroups",
    tag = "rolloutgroups",
    params(NamespacePath),
    request_body = CreateRolloutGroupRequest,
    responses(
        (status = 201, description = "Created; `metadata.name` holds the (generated) name", body = RolloutGroupSchema),
        (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `create rolloutgroups`", body = ErrorBody),
        (status = 409, description = "`AlreadyExists`", body = ErrorBody),
        (status = 422, description = "Rejected by the CRD's rules (e.g. stride must divide maxTrajectories)", body = ErrorBody),
    )
)]
pub async fn create_group(
    Call(state, path, headers): Call<NamespacePath>,
    body: Body,
) -> Result<Response, ApiError> {
    let identity = state
        .authorize(&headers, Operation::CreateRolloutGroup, &path.namespace, "")
        .await?;
    let request = state.json_body(&identity, &headers, body).await?;
    let group = rollout_group_from_request(&path.namespace, request, &identity.username)?;
    objects::create(&state, &path.namespace, &group, &identity.username).await
}

/// Lists RolloutGroups of a namespace from the watch cache (`?labelSelector=`).
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/rolloutgroups",
    tag = "rolloutgroups",
    params(NamespacePath, ListQuery),
    responses(
        (status = 200, body = RolloutGroupList),
        (status = 400, body = ErrorBody),
        (status = 403, description = "RBAC denies `list rolloutgroups`", body = ErrorBody),
    )
)]
pub async fn list_groups(
    Call(state, path, headers): Call<NamespacePath>,
    list: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    state
        .authorize(&headers, Operation::ListRolloutGroups, &path.namespace, "")
        .await?;
    let text = query(list)?.label_selector.unwrap_or_default();
    let filled = state.filled.is_filled("RolloutGroup");
    let cache = &state.deps.reads.rollout_groups;
    objects::list(&state, cache, filled, &path.namespace, &text).await
}

/// Reads one RolloutGroup.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/rolloutgroups/{name}",
    tag = "rolloutgroups",
    params(ObjectPath),
    responses(
        (status = 200, body = RolloutGroupSchema),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn get_group(Call(state, path, headers): Call<ObjectPath>) -> Result<Response, ApiError> {
    state
        .authorize_object(&headers, Operation::GetRolloutGroup, &path)
        .await?;
    let group = state.group(&path).await?;
    Ok(json_response(StatusCode::OK, group.as_ref()))
}

/// Deletes a RolloutGroup (its trajectory Sandboxes are garbage-collected).
#[utoipa::path(
    delete,
    path = "/v1/namespaces/{namespace}/rolloutgroups/{name}",
    tag = "rolloutgroups",
    params(ObjectPath),
    responses(
        (status = 200, body = Deleted),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    )
)]
pub async fn delete_group(
    Call(state, path, headers): Call<ObjectPath>,
) -> Result<Response, ApiError> {
    let identity = state
        .authorize_object(&headers, Operation::DeleteRolloutGroup, &path)
        .await?;
    objects::delete::<RolloutGroup>(
        &state,
        &state.deps.reads.rollout_groups,
        &path.namespace,
        &path.name,
        &identity.username,
    )
    .await
}

/// Whether a group is done: `Complete=True`, phase Complete, or phase Failed.
pub fn group_settled(group: &RolloutGroup) -> bool {
    group.status.as_ref().is_some_and(|s| {
        is_true(&s.conditions, "Complete")
            || matches!(s.phase, Some(RolloutPhase::Complete | RolloutPhase::Failed))
    })
}

/// Where an unfinished group is: its phase and why it is not Complete.
fn group_progress(group: &RolloutGroup) -> Progress<'_> {
    let status = group.status.as_ref();
    (
        status.and_then(|s| s.phase).map(RolloutPhase::as_str),
        status.and_then(|s| why_unsettled(&s.conditions, "Complete")),
    )
}

/// Blocks until the group is recorded (`Complete`) or `Failed`, driven by the watch.
#[utoipa::path(
    get,
    path = "/v1/namespaces/{namespace}/rolloutgroups/{name}/wait",
    tag = "rolloutgroups",
    params(ObjectPath, WaitQuery),
    responses(
        (status = 200, description = "Settled: `status.group` holds the members when Complete", body = RolloutGroupSchema),
        (status = 403, description = "RBAC denies `get rolloutgroups`", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 504, description = "`WaitTimeout` (retryable): wait again", body = ErrorBody),
    )
)]
pub async fn wait_group(
    Call(state, path, headers): Call<ObjectPath>,
    wait: Result<Query<WaitQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let settling = Settling {
        operation: Operation::GetRolloutGroup,
        kind: "RolloutGroup",
        noun: "rolloutgroup",
        settled: group_settled,
        progress: group_progress,
    };
    wait_route(
        &state,
        &headers,
        &path,
        wait,
        &state.deps.reads.rollout_groups,
        settling,
    )
    .await
}
