//! `PUT .../network`: replace `spec.network` of a sandbox (Harbor's `apply_network_policy` between an
//! agent phase and a verifier phase), then wait, briefly, until the egress proxy enforces the new
//! generation. The API server validates the rules (its CEL messages come back as 422).

use axum::Json;
use axum::body::Body;
use axum::extract::Query;
use axum::extract::rejection::QueryRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::gateway::auth::access::{Access, Operation};
use crate::gateway::auth::revalidate::Guard;
use crate::gateway::deps::GATEWAY_FIELD_MANAGER;
use crate::gateway::http::errors::{ApiError, ErrorBody, from_kube};
use crate::gateway::http::openapi::{NetworkResponse, NetworkSpecSchema};
use crate::gateway::objects::wait::{WaitFor, WaitOutcome};
use crate::gateway::state::{Call, ObjectPath, WaitQuery, query};
use orchard_api::{NetworkSpec, Sandbox, SandboxPhase};

/// Default wait for the new rules to be in force (the proxy applies them within milliseconds of the
/// watch event; two seconds is the bound the docs promise).
const DEFAULT_NETWORK_WAIT_SECONDS: f64 = 5.0;

/// Longest accepted wait.
const MAX_NETWORK_WAIT_SECONDS: f64 = 60.0;

/// Members `spec.network` has: anything else is a typo the API server would silently prune.
const NETWORK_MEMBERS: &[&str] = &["egress", "allow", "deny"];

/// The `spec.network` a request body asks for (pure): an object with only the known members, each
/// of the right shape.
pub fn network_from_body(body: &Value) -> Result<NetworkSpec, String> {
    let object = body
        .as_object()
        .ok_or("the body must be a JSON object: the new spec.network, e.g. {\"egress\": \"AllowList\", \"allow\": [{\"host\": \"pypi.org\"}]}")?;
    if let Some(unknown) = object
        .keys()
        .find(|k| !NETWORK_MEMBERS.contains(&k.as_str()))
    {
        return Err(format!(
            "unknown member `{unknown}` of spec.network (it has egress, allow and deny)"
        ));
    }
    serde_json::from_value(body.clone()).map_err(|err| format!("invalid spec.network: {err}"))
}

/// Whether `sandbox` has the rules of `generation` in force at the proxy, or the proxy said it
/// cannot enforce them (pure).
fn proxy_answered(sandbox: &Sandbox, generation: i64) -> bool {
    sandbox
        .status
        .as_ref()
        .and_then(|s| s.egress.as_ref())
        .is_some_and(|e| e.observed_generation >= generation || e.message.is_some())
}

/// Replaces the sandbox's `spec.network`. Rules naming hosts are enforced by the egress proxy: the
/// call waits up to `timeoutSeconds` (default 5, at most 60) for it to report the new generation in
/// force, and connections to hosts no longer allowed are cut. Address ranges (`cidr`) and the
/// `egress` mode are NetworkPolicies, which the operator rewrites within a reconcile.
#[utoipa::path(
    put,
    path = "/v1/namespaces/{namespace}/sandboxes/{name}/network",
    tag = "sandboxes",
    params(ObjectPath, WaitQuery),
    request_body = NetworkSpecSchema,
    responses(
        (status = 200, description = "Stored; `hostRulesInForce` says whether the egress proxy enforces it yet (false after the wait: it still applies, the previous rules stay in force until then)", body = NetworkResponse),
        (status = 400, description = "Malformed body or unknown member", body = ErrorBody),
        (status = 401, body = ErrorBody),
        (status = 403, description = "RBAC denies `update sandboxes/network`", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 422, description = "The API server rejected the rules (CEL rule message, e.g. a host with a scheme)", body = ErrorBody),
    )
)]
pub async fn set_network(
    Call(state, path, headers): Call<ObjectPath>,
    wait: Result<Query<WaitQuery>, QueryRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let identity = state
        .authorize_object(&headers, Operation::SetNetwork, &path)
        .await?;
    let timeout = query(wait)?
        .timeout_seconds
        .filter(|s| s.is_finite())
        .unwrap_or(DEFAULT_NETWORK_WAIT_SECONDS)
        .clamp(0.0, MAX_NETWORK_WAIT_SECONDS);
    let value = state.json_body(&identity, &headers, body).await?;
    let network = network_from_body(&value).map_err(ApiError::bad_request)?;
    // `add` replaces the whole member: no merge with the previous lists.
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/spec/network", "value": network}
    ]))
    .map_err(|err| ApiError::bad_request(format!("invalid spec.network: {err}")))?;
    let api: Api<Sandbox> = Api::namespaced(state.deps.client.clone(), &path.namespace);
    let stored = api
        .patch(
            &path.name,
            &PatchParams {
                field_manager: Some(GATEWAY_FIELD_MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::<()>::Json(patch),
        )
        .await
        .map_err(|err| from_kube(&err, &format!("sandbox {}/{}", path.namespace, path.name)))?;
    let generation = stored.metadata.generation.unwrap_or_default();
    let reported = stored.status.as_ref().and_then(|s| s.egress.as_ref());
    if !network.names_hosts() && reported.is_none() {
        return Ok(answer(generation, None, None));
    }
    let ready = stored.status.as_ref().and_then(|s| s.phase) == Some(SandboxPhase::Ready);
    let mut last = stored;
    if ready && !proxy_answered(&last, generation) && timeout > 0.0 {
        let waiter = WaitFor {
            client: &state.deps.client,
            store: &state.deps.reads.sandboxes,
            deletes: &state.recent_deletes,
            changes: &state.deps.reads.changes,
            kind: "Sandbox",
            noun: "sandbox",
            namespace: &path.namespace,
            name: &path.name,
        };
        let access = Access::of(Operation::SetNetwork, &path.namespace, &path.name);
        let guard = Guard::new(&state, &headers, &access);
        let until = waiter.until(std::time::Duration::from_secs_f64(timeout), |s| {
            proxy_answered(s, generation)
        });
        last = match guard.run(until).await? {
            WaitOutcome::Done(sandbox) | WaitOutcome::TimedOut(sandbox) => (*sandbox).clone(),
            WaitOutcome::Deleted => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!(
                        "sandbox {}/{} was deleted while waiting",
                        path.namespace, path.name
                    ),
                ));
            }
        };
    }
    let egress = last.status.as_ref().and_then(|s| s.egress.as_ref());
    let in_force =
        egress.is_some_and(|e| e.observed_generation >= generation && e.message.is_none());
    let message = egress.and_then(|e| e.message.clone());
    Ok(answer(generation, Some(in_force), message))
}

fn answer(generation: i64, in_force: Option<bool>, message: Option<String>) -> Response {
    Json(json!({
        "generation": generation,
        "hostRulesInForce": in_force,
        "message": message,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_is_a_network_spec_and_nothing_else() {
        let ok = network_from_body(&json!({"egress": "AllowList", "allow": [{"host": "pypi.org", "ports": [{"port": 443}]}], "deny": []}))
            .expect("valid");
        assert!(ok.names_hosts());
        for (body, says) in [
            (json!("pypi.org"), "must be a JSON object"),
            (
                json!({"egress": "AllowList", "hosts": ["pypi.org"]}),
                "unknown member `hosts`",
            ),
            (json!({"egress": "Sometimes"}), "invalid spec.network"),
            (
                json!({"egress": "AllowList", "allow": [{"host": 7}]}),
                "invalid spec.network",
            ),
        ] {
            let err = network_from_body(&body).expect_err("refused");
            assert!(err.contains(says), "{err}");
        }
    }
}
