//! The thin I/O layer of the Sandbox controller: server-side apply of built objects, creates, deletes
//! and status patches. Each function writes only when the watch caches say the cluster differs from
//! what the pure builders want, and counts every write in `orchard_api_writes_total`.

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::build::{
    BASELINE_POLICY, baseline_policy, desired_egress_policy, desired_token_secret,
    egress_policy_name, token_secret_name,
};
use crate::api::{Sandbox, SandboxStatus};
use crate::context::{Context, FIELD_MANAGER};
use crate::error::{Error, Result};
use crate::merge_patch;

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

fn is_status(err: &kube::Error, check: fn(&kube::core::Status) -> bool) -> bool {
    matches!(err, kube::Error::Api(status) if check(status))
}

/// Ensures the namespace baseline policy (default-deny egress, agent ingress only from the operator).
pub async fn ensure_baseline(ctx: &Context, namespace: &str) -> Result<()> {
    let desired = baseline_policy(namespace, &ctx.settings.policy);
    let key = format!("networkpolicies/{namespace}/{BASELINE_POLICY}");
    let cached = ctx
        .caches
        .policies
        .get(&ObjectRef::new(BASELINE_POLICY).within(namespace));
    if cached.is_some_and(|p| p.spec == desired.spec) || ctx.recent.contains(&key) {
        return Ok(());
    }
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), namespace);
    api.patch(BASELINE_POLICY, &apply_params(), &Patch::Apply(&desired))
        .await?;
    ctx.metrics.api_write("networkpolicies", "apply");
    ctx.recent.record(key);
    Ok(())
}

/// Ensures the sandbox's agent-token Secret exists. The token is generated here, once; an existing
/// Secret is never replaced (the running agent read its token at start).
pub async fn ensure_token_secret(
    ctx: &Context,
    sandbox: &Sandbox,
    owner: &OwnerReference,
) -> Result<()> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let name = token_secret_name(&sandbox.name_any());
    let key = format!("secrets/{namespace}/{name}");
    if ctx
        .caches
        .secrets
        .get(&ObjectRef::new(&name).within(&namespace))
        .is_some()
        || ctx.recent.contains(&key)
    {
        return Ok(());
    }
    let secret = desired_token_secret(sandbox, owner, &new_token());
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => ctx.metrics.api_write("secrets", "create"),
        Err(err) if is_status(&err, kube::core::Status::is_already_exists) => {}
        Err(err) => return Err(err.into()),
    }
    ctx.recent.record(key);
    Ok(())
}

/// 32 random bytes, hex-encoded: the per-sandbox agent token.
pub fn new_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Ensures the sandbox's own egress policy matches its spec (applied, or deleted for `Deny`).
pub async fn ensure_egress_policy(
    ctx: &Context,
    sandbox: &Sandbox,
    owner: &OwnerReference,
) -> Result<()> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let name = egress_policy_name(&sandbox.name_any());
    let cached = ctx
        .caches
        .policies
        .get(&ObjectRef::new(&name).within(&namespace));
    let api: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), &namespace);
    match desired_egress_policy(sandbox, owner, &ctx.settings.policy) {
        Some(desired) => {
            let key = format!(
                "networkpolicies/{namespace}/{name}/{}",
                sandbox.meta().generation.unwrap_or(0)
            );
            if cached.is_some_and(|p| p.spec == desired.spec) || ctx.recent.contains(&key) {
                return Ok(());
            }
            api.patch(&name, &apply_params(), &Patch::Apply(&desired))
                .await?;
            ctx.metrics.api_write("networkpolicies", "apply");
            ctx.recent.record(key);
        }
        None if cached.is_some() => match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => ctx.metrics.api_write("networkpolicies", "delete"),
            Err(err) if is_status(&err, kube::core::Status::is_not_found) => {}
            Err(err) => return Err(err.into()),
        },
        None => {}
    }
    Ok(())
}

/// Creates the sandbox's Pod and returns it. A plain create, not server-side apply: a Pod's spec is
/// immutable, so field ownership buys nothing and costs the API server a managed-fields computation on a
/// large object. Repeating it is harmless (AlreadyExists reads the existing Pod).
pub async fn create_pod(ctx: &Context, pod: &Pod) -> Result<Pod> {
    let namespace = pod.namespace().ok_or(Error::MissingField {
        kind: "Pod",
        field: "metadata.namespace",
    })?;
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let created = match api.create(&PostParams::default(), pod).await {
        Ok(created) => {
            ctx.metrics.api_write("pods", "create");
            created
        }
        Err(err) if is_status(&err, kube::core::Status::is_already_exists) => {
            api.get(&name).await?
        }
        Err(err) => return Err(err.into()),
    };
    ctx.recent.record(format!("pods/{namespace}/{name}"));
    ctx.created_pods
        .record(format!("{namespace}/{name}"), created.clone());
    Ok(created)
}

/// Reads a Pod from the API server (used only when the cache lacks a pod the status names).
pub async fn fetch_pod(ctx: &Context, namespace: &str, name: &str) -> Result<Option<Pod>> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    Ok(api.get_opt(name).await?)
}

/// Deletes a Pod if it exists.
pub async fn delete_pod(ctx: &Context, namespace: &str, name: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => ctx.metrics.api_write("pods", "delete"),
        Err(err) if is_status(&err, kube::core::Status::is_not_found) => {}
        Err(err) => return Err(err.into()),
    }
    Ok(())
}

/// Writes the status as the smallest merge patch from the status we last saw (nothing when equal).
/// Returns the updated Sandbox, or `None` when nothing had to be written.
pub async fn patch_status(
    ctx: &Context,
    sandbox: &Sandbox,
    status: &SandboxStatus,
) -> Result<Option<Sandbox>> {
    let from =
        serde_json::to_value(sandbox.status.clone().unwrap_or_default()).map_err(|source| {
            Error::Serialize {
                what: "sandbox status",
                source,
            }
        })?;
    let to = serde_json::to_value(status).map_err(|source| Error::Serialize {
        what: "sandbox status",
        source,
    })?;
    let Some(change) = merge_patch::diff(&from, &to) else {
        return Ok(None);
    };
    let namespace = sandbox.namespace().unwrap_or_default();
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    let updated = api
        .patch_status(
            &sandbox.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": change})),
        )
        .await?;
    ctx.metrics.api_write("sandboxes/status", "patch");
    Ok(Some(updated))
}

/// Deletes a Sandbox (its children follow by garbage collection).
pub async fn delete_sandbox(ctx: &Context, sandbox: &Sandbox) -> Result<()> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: sandbox.uid().map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&sandbox.name_any(), &params).await {
        Ok(_) => ctx.metrics.api_write("sandboxes", "delete"),
        Err(err) if is_status(&err, kube::core::Status::is_not_found) => {}
        Err(err) => return Err(err.into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_hex() {
        let a = new_token();
        let b = new_token();
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
