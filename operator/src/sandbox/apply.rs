//! The thin I/O layer of the Sandbox controller: the baseline and egress policies and the Pod. Each function writes only when neither the watch caches nor the operator's memory of its
//! own writes (scoped by the Sandbox's UID) show what the pure builders want, and uses an existing
//! object only when it is sealed for the Sandbox's UID (`plumbing::ownership`).

use crate::plumbing::cached_pod::CachedPod;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::plumbing::error::{Error, Result};
use crate::plumbing::events::publish;
use crate::plumbing::own_writes::child_key;
use crate::plumbing::ownership::{Owner, sealed_for};
use crate::plumbing::writes::{
    ChildState, apply_owned, create_owned, delete_if_same, ensure_deleted, existing_state,
    force_delete_if_same,
};
use crate::pod::lookup::{cached_pod, own_pod_name, previous_attempt_pods};
use crate::pod::naming::{egress_policy_name, own_pod_name_of};
use crate::pod::policy::{desired_egress_policy, refused_allow_rules};
use crate::sandbox::context::SandboxCtx;
use orchard_api::Sandbox;

/// The Sandbox as the owner of its children.
pub fn owner_of(sandbox: &Sandbox) -> Owner<'_> {
    Owner {
        kind: "Sandbox",
        name: sandbox.meta().name.as_deref().unwrap_or_default(),
        uid: sandbox.meta().uid.as_deref().unwrap_or_default(),
    }
}

/// Ensures the sandbox's own egress policy matches its spec (applied, or deleted for `Deny`). A
/// policy under its name that is not its own is never changed: a previous incarnation's is waited
/// for (it selects pods by the sandbox's name, so the new Pod must not start under it).
pub async fn ensure_egress_policy(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    owner: &OwnerReference,
) -> Result<ChildState<()>> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let name = egress_policy_name(&sandbox.name_any());
    let scope = owner.uid.as_str();
    let cached = ctx
        .kube
        .caches
        .policies
        .get(&ObjectRef::new(&name).within(&namespace));
    let desired = desired_egress_policy(sandbox, owner, &ctx.pods.policy_shape(), &ctx.kube.key);
    if let Some(cached) = &cached {
        match existing_state((**cached).clone(), owner_of(sandbox), &ctx.kube.key) {
            ChildState::Ours(_) => {}
            // Somebody else's policy under a name we do not need is none of our business.
            ChildState::Conflict(_) if desired.is_none() => return Ok(ChildState::Ours(())),
            other => return Ok(other.unit()),
        }
    }
    match desired {
        Some(desired) => {
            let tag = format!("apply@{}", sandbox.meta().generation.unwrap_or(0));
            if cached.as_ref().is_some_and(|p| p.spec == desired.spec)
                || ctx
                    .kube
                    .own_writes
                    .recorded(scope, &child_key("NetworkPolicy", &name), &tag)
            {
                return Ok(ChildState::Ours(()));
            }
            let refused = refused_allow_rules(sandbox, &ctx.pods.policy_shape());
            if !refused.is_empty() {
                let note = format!(
                    "egress to {} is not allowed: it lies within a range sandboxes never reach (the metadata address, the API server, the cluster's pods; operator flags --egress-except-cidrs, --egress-allow-api-server, --cluster-pod-cidrs)",
                    refused.join(", ")
                );
                publish(
                    &ctx.kube,
                    sandbox,
                    EventType::Warning,
                    "EgressRuleRefused",
                    note,
                )
                .await;
            }
            if cached.is_none() {
                // Created, not applied: an object that appeared under the name meanwhile is classified,
                // never taken over (a later reconcile applies the spec to our own).
                let state = create_owned(
                    &ctx.kube,
                    &ctx.kube.caches.policies,
                    &desired,
                    owner_of(sandbox),
                    &tag,
                    false,
                )
                .await?;
                return Ok(state.unit());
            }
            let current = |p: &NetworkPolicy| p.spec == desired.spec;
            apply_owned(
                &ctx.kube,
                &ctx.kube.caches.policies,
                scope,
                &desired,
                &tag,
                current,
            )
            .await?;
        }
        None => {
            if let Some(cached) = cached {
                let uid = cached.uid().unwrap_or_default();
                ensure_deleted::<NetworkPolicy, _>(
                    &ctx.kube,
                    &ctx.kube.caches.policies,
                    scope,
                    &namespace,
                    &name,
                    &uid,
                )
                .await?;
            }
        }
    }
    Ok(ChildState::Ours(()))
}

/// The sandbox's Pod as far as the operator knows without asking: the cache (classified by owner and
/// seal), else the Pod this incarnation created or claimed moments ago.
pub fn known_pod(ctx: &SandboxCtx, sandbox: &Sandbox) -> Option<ChildState<CachedPod>> {
    let uid = sandbox.uid().unwrap_or_default();
    let name = own_pod_name_of(sandbox);
    let key = &ctx.kube.key;
    let written = ctx
        .kube
        .own_writes
        .object::<Pod>(&uid, &child_key("Pod", &name))
        .map(|pod| CachedPod::from(&pod));
    if let Some(cached) = cached_pod(&ctx.kube.caches.pods, sandbox, key) {
        // A pool member this sandbox claimed moments ago: the cache may still show it as the
        // pool's, the claim's answer is newer.
        if let Some(claimed) = written
            .as_ref()
            .filter(|w| w.uid() == cached.uid() && !sealed_for(cached.as_ref(), &uid, key))
        {
            return Some(ChildState::Ours(claimed.clone()));
        }
        return Some(existing_state((*cached).clone(), owner_of(sandbox), key));
    }
    written.map(ChildState::Ours)
}

/// Creates the sandbox's Pod. A plain create, not server-side apply: a Pod's spec is immutable, so
/// field ownership buys nothing and costs the API server a managed-fields computation on a large
/// object. A Pod already under the name is classified, never adopted.
pub async fn create_pod(ctx: &SandboxCtx, sandbox: &Sandbox, pod: &Pod) -> Result<ChildState<Pod>> {
    if pod.namespace().is_none() {
        return Err(Error::MissingField {
            kind: "Pod",
            field: "metadata.namespace",
        });
    }
    create_owned(
        &ctx.kube,
        &ctx.kube.caches.pods,
        pod,
        owner_of(sandbox),
        "create",
        true,
    )
    .await
}

/// Reads the sandbox's Pod from the API server (used only when the cache lacks a pod the status
/// names); a Pod under the name that is not this sandbox's (not sealed for it) counts as none.
pub async fn fetch_own_pod(ctx: &SandboxCtx, sandbox: &Sandbox) -> Result<Option<Pod>> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(ctx.kube.client.clone(), &namespace);
    let uid = sandbox.uid().unwrap_or_default();
    Ok(api
        .get_opt(&own_pod_name(sandbox))
        .await?
        .filter(|pod| sealed_for(pod, &uid, &ctx.kube.key)))
}

/// Deletes the sandbox's Pod if the cache shows one of its own (sealed for its UID; never another
/// object under the name).
pub async fn delete_own_pod(ctx: &SandboxCtx, sandbox: &Sandbox) -> Result<()> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let uid = sandbox.uid().unwrap_or_default();
    let cached = cached_pod(&ctx.kube.caches.pods, sandbox, &ctx.kube.key)
        .filter(|pod| sealed_for(pod.as_ref(), &uid, &ctx.kube.key));
    let pod = match cached {
        Some(pod) if pod.meta().deletion_timestamp.is_none() => Some((*pod).clone()),
        Some(_) => return Ok(()),
        None => ctx
            .kube
            .own_writes
            .object::<Pod>(&uid, &child_key("Pod", &own_pod_name_of(sandbox)))
            .map(|pod| CachedPod::from(&pod)),
    };
    if let Some(pod) = pod
        && let Some(pod_uid) = pod.uid()
    {
        let name = pod.name_any();
        ensure_deleted::<Pod, _>(
            &ctx.kube,
            &ctx.kube.caches.pods,
            &uid,
            &namespace,
            &name,
            &pod_uid,
        )
        .await?;
    }
    Ok(())
}

/// Removes the Pods of a retried sandbox's earlier attempts (`spec.retry`) before its new attempt's
/// Pod is created: each one the cache shows sealed for the sandbox under another name; one stuck
/// terminating on a lost node with grace period 0 (`pod::disruption::stuck_on_lost_node`).
pub async fn delete_previous_attempts(ctx: &SandboxCtx, sandbox: &Sandbox) -> Result<()> {
    let uid = sandbox.uid().unwrap_or_default();
    let key = &ctx.kube.key;
    for pod in previous_attempt_pods(&ctx.kube.caches.pods, sandbox, key) {
        let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
        let pod_uid = pod.uid().unwrap_or_default();
        if pod.meta().deletion_timestamp.is_none() {
            ensure_deleted::<Pod, _>(
                &ctx.kube,
                &ctx.kube.caches.pods,
                &uid,
                &namespace,
                &name,
                &pod_uid,
            )
            .await?;
        } else if crate::pod::disruption::stuck_on_lost_node(&pod) {
            force_delete_if_same::<Pod>(&ctx.kube, &namespace, &name, &pod_uid).await?;
        }
    }
    Ok(())
}

/// Deletes a Sandbox (its children follow by garbage collection).
pub async fn delete_sandbox(ctx: &SandboxCtx, sandbox: &Sandbox) -> Result<()> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let uid = sandbox.uid().unwrap_or_default();
    delete_if_same::<Sandbox>(&ctx.kube, &namespace, &sandbox.name_any(), &uid).await
}

/// Removes the Pod under the sandbox's pod name with grace period 0 when it is being deleted because
/// its node was lost, which that node will never confirm (`pod::disruption::stuck_on_lost_node`).
/// Only a Pod the operator sealed for the Sandbox that controls it: this sandbox's own, or a previous
/// incarnation's that holds the name; never a Pod someone else put there.
pub async fn remove_if_stuck_on_lost_node(ctx: &SandboxCtx, sandbox: &Sandbox) -> Result<()> {
    let key = &ctx.kube.key;
    let operators = |pod: &CachedPod| {
        crate::plumbing::ownership::sealed(pod, key).is_some_and(|uid| {
            crate::plumbing::ownership::controller_uid(&pod.metadata) == Some(uid)
        })
    };
    let Some(pod) = cached_pod(&ctx.kube.caches.pods, sandbox, key)
        .filter(|pod| operators(pod) && crate::pod::disruption::stuck_on_lost_node(pod))
    else {
        return Ok(());
    };
    let (namespace, name) = (pod.namespace().unwrap_or_default(), pod.name_any());
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    force_delete_if_same::<Pod>(&ctx.kube, &namespace, &name, &pod.uid().unwrap_or_default())
        .await?;
    tracing::info!(sandbox = %crate::plumbing::kube_ctx::object_key(sandbox), pod = %name, %node, "pod of a lost node removed (grace period 0)");
    let note =
        format!("pod {name} was still bound to lost node {node}; removed with grace period 0");
    publish(
        &ctx.kube,
        sandbox,
        EventType::Warning,
        "LostNodePodRemoved",
        note,
    )
    .await;
    Ok(())
}

/// The failure of a sandbox whose Pod is gone: `NodeLost` when the node its status names is gone or
/// not Ready, else `PodDeleted`. The node is read with `list` by name (the chart grants `list` on
/// Nodes for `--discover-pod-cidrs`); an operator that may not read Nodes reports `PodDeleted`.
pub async fn gone_failure(ctx: &SandboxCtx, sandbox: &Sandbox) -> crate::pod::failure::Failure {
    let node = sandbox.status.as_ref().and_then(|s| s.node_name.as_deref());
    let state = match node {
        Some(name) => {
            let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.kube.client.clone());
            let by_name = kube::api::ListParams::default().fields(&format!("metadata.name={name}"));
            match nodes.list(&by_name).await {
                Ok(list) => Some(list.items.into_iter().next()),
                Err(err) => {
                    tracing::debug!(node = name, %err, "node unreadable; the pod's loss reads as PodDeleted");
                    None
                }
            }
        }
        None => None,
    };
    crate::pod::disruption::gone_failure(node, state.as_ref().map(Option::as_ref))
}
