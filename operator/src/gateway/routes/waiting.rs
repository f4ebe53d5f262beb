//! The wait route of every kind (sandboxes, rolloutgroups, sandboxsnapshots), one implementation:
//! authorise, wait on the watch until the kind's settled state while the caller stays authorised (a
//! revoked RoleBinding ends the wait), and answer the object, a `WaitTimeout` saying where it is and
//! why, or `NotFound` when it was deleted meanwhile.

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use kube::runtime::reflector::Store;
use serde::Serialize;

use crate::gateway::auth::access::{Access, Operation};
use crate::gateway::auth::revalidate::Guard;
use crate::gateway::http::errors::{ApiError, json_response};
use crate::gateway::objects::wait::{WaitFor, WaitOutcome, wait_duration};
use crate::gateway::state::{ObjectPath, State, WaitQuery, query};
use crate::plumbing::writes::Child;

/// Where an unsettled object is: its phase, and from its conditions why (reason and message).
pub type Progress<'a> = (Option<&'a str>, Option<(&'a str, &'a str)>);

/// What the wait route of one kind needs to know of it.
pub struct Settling<K> {
    /// The operation authorised (the kind's `get`).
    pub operation: Operation,
    /// The change feed's kind (`Sandbox`, `RolloutGroup`, `SandboxSnapshot`).
    pub kind: &'static str,
    /// Lower-case kind for messages (`sandbox`, `rolloutgroup`, `sandboxsnapshot`).
    pub noun: &'static str,
    /// Whether an object of the kind has settled.
    pub settled: fn(&K) -> bool,
    /// Where an unsettled object is.
    pub progress: fn(&K) -> Progress<'_>,
}

/// Waits (`timeoutSeconds` of `wait`) until the object `path` names, of the kind `store` caches, has
/// settled as `settling` says.
pub async fn wait_route<K>(
    state: &State,
    headers: &HeaderMap,
    path: &ObjectPath,
    wait: Result<Query<WaitQuery>, QueryRejection>,
    store: &Store<K>,
    settling: Settling<K>,
) -> Result<Response, ApiError>
where
    K: Child + Serialize,
{
    state
        .authorize_object(headers, settling.operation, path)
        .await?;
    let timeout = wait_duration(query(wait)?.timeout_seconds);
    let waiter = WaitFor {
        client: &state.deps.client,
        store,
        deletes: &state.recent_deletes,
        changes: &state.deps.reads.changes,
        kind: settling.kind,
        noun: settling.noun,
        namespace: &path.namespace,
        name: &path.name,
    };
    // The caller is checked again while waiting (a revoked RoleBinding ends the wait).
    let access = Access::of(settling.operation, &path.namespace, &path.name);
    let guard = Guard::new(state, headers, &access);
    match guard.run(waiter.until(timeout, settling.settled)).await? {
        WaitOutcome::Done(object) => Ok(json_response(StatusCode::OK, object.as_ref())),
        WaitOutcome::TimedOut(object) => {
            let (phase, why) = (settling.progress)(object.as_ref());
            Err(wait_timeout(
                settling.noun,
                &path.namespace,
                &path.name,
                phase,
                why,
            ))
        }
        WaitOutcome::Deleted => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "{} {}/{} was deleted while waiting",
                settling.noun, path.namespace, path.name
            ),
        )),
    }
}

/// The 504 of a wait that ran out of time, saying where the object is (`phase`) and, from its
/// conditions, why (`why`: reason and message).
pub fn wait_timeout(
    kind: &str,
    namespace: &str,
    name: &str,
    phase: Option<&str>,
    why: Option<(&str, &str)>,
) -> ApiError {
    let phase = phase.unwrap_or("Pending");
    let because = match why {
        Some((reason, message)) if !message.is_empty() => format!(": {reason}: {message}"),
        Some((reason, _)) => format!(": {reason}"),
        None => String::new(),
    };
    let mut error = ApiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "WaitTimeout",
        format!(
            "{kind} {namespace}/{name} did not settle in time (phase {phase}{because}); wait again"
        ),
    )
    .retryable(true);
    error.body.phase = Some(phase.to_string());
    if let Some((reason, message)) = why {
        error.body.reason = Some(reason.to_string());
        error.body.condition_message = Some(message.to_string()).filter(|m| !m.is_empty());
    }
    error
}
