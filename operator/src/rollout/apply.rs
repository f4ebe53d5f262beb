//! The thin I/O layer of the RolloutGroup controller: the group's children as the caches show them,
//! a live check of children the cache does not show yet (together, [`observe`]), trajectory creation
//! and the deletion of the children `decide` picks, all through the generic write layer
//! (`plumbing::writes`), scoped by the group's UID.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::info;

use super::build::{attempt_of, desired_trajectory};
use super::decide::{Launch, Targets};
use super::observe::{
    ChildView, Observation, Superseded, observe as observe_children, scheduling_wait,
};
use crate::plumbing::error::Result;
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::own_writes::child_key;
use crate::plumbing::ownership::{Owner, sealed_for};
use crate::plumbing::writes::{ChildState, create_owned, ensure_deleted, existing_state};
use crate::retry::RetryParams;
use crate::rollout::context::RolloutCtx;
use orchard_api::{RolloutGroup, STRIDE_LABEL, Sandbox, SandboxPhase};

/// The group's children as the Sandbox cache shows them: same namespace, sealed for this group's UID
/// (a Sandbox somebody made with a controller reference to the group is not one), in name order (the
/// cache's order is arbitrary; clean-up deletes in a stable order).
pub fn owned_children(ctx: &RolloutCtx, group: &RolloutGroup) -> Vec<Arc<Sandbox>> {
    let namespace = group.namespace().unwrap_or_default();
    let uid = group.uid().unwrap_or_default();
    let mut children: Vec<Arc<Sandbox>> = ctx
        .kube
        .caches
        .sandboxes
        .state()
        .into_iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|s| sealed_for(s.as_ref(), &uid, &ctx.kube.key))
        .collect();
    children.sort_by_key(|s| s.name_any());
    children
}

/// What the pure observation needs of the group's children.
pub fn children_of(ctx: &RolloutCtx, group: &RolloutGroup) -> Vec<ChildView> {
    owned_children(ctx, group)
        .into_iter()
        .map(|s| {
            let status = s.status.as_ref();
            ChildView {
                name: s.name_any(),
                uid: s.uid().unwrap_or_default(),
                stride: s
                    .labels()
                    .get(STRIDE_LABEL)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                attempt: attempt_of(&s),
                result: status.and_then(|st| st.result.clone()),
                failure: status
                    .filter(|st| st.phase == Some(SandboxPhase::Failed))
                    .map(|st| {
                        (
                            st.reason.clone().unwrap_or_default(),
                            st.message.clone().unwrap_or_default(),
                        )
                    }),
                resources: s.spec.resources.clone(),
                deleting: s.meta().deletion_timestamp.is_some(),
                waiting: status.and_then(scheduling_wait),
            }
        })
        .collect()
}

/// Which of `names` are really gone (the cache may lag behind our own creates). A Sandbox under the
/// name that is not this group's (not sealed for it) counts as gone.
pub async fn confirm_gone(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    names: &[String],
) -> Result<BTreeSet<String>> {
    let namespace = group.namespace().unwrap_or_default();
    let uid = group.uid().unwrap_or_default();
    let api: Api<Sandbox> = Api::namespaced(ctx.kube.client.clone(), &namespace);
    let mut gone = BTreeSet::new();
    for name in names {
        if ctx
            .kube
            .own_writes
            .recorded(&uid, &child_key("Sandbox", name), "create")
        {
            continue;
        }
        let ours = api
            .get_opt(name)
            .await?
            .is_some_and(|s| sealed_for(&s, &uid, &ctx.kube.key));
        if !ours {
            gone.insert(name.clone());
        }
    }
    Ok(gone)
}

/// The group's progress as its status and children show it, under its retry policy `retry`: the
/// children the cache shows and, for trajectories the status lists that the cache does not show, a
/// live read of whether they are gone.
pub async fn observe(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    retry: Option<&RetryParams>,
) -> Result<Observation> {
    let name = group.name_any();
    let previous = group.status.clone().unwrap_or_default();
    let children = children_of(ctx, group);
    let mut observation = observe_children(&name, &previous, &children, &BTreeSet::new(), retry);
    if !observation.unseen.is_empty() {
        let gone = confirm_gone(ctx, group, &observation.unseen).await?;
        if !gone.is_empty() {
            observation = observe_children(&name, &previous, &children, &gone, retry);
        }
    }
    Ok(observation)
}

/// Creates `launch` (an attempt of a trajectory). A name held by a previous group's trajectory, or
/// by an earlier attempt of this one that is still being removed, comes back as a wait (it is
/// created once that is gone), one held by anything else as a conflict; neither object is touched.
pub async fn create_trajectory(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    owner: &OwnerReference,
    launch: &Launch,
) -> Result<ChildState<()>> {
    let sandbox = desired_trajectory(group, owner, launch, &ctx.kube.key);
    let namespace = group.namespace().unwrap_or_default();
    let name = sandbox.name_any();
    let uid = group.uid().unwrap_or_default();
    let key = child_key("Sandbox", &name);
    let as_owner = Owner {
        kind: "RolloutGroup",
        name: group.meta().name.as_deref().unwrap_or_default(),
        uid: &uid,
    };
    let cached = ctx
        .kube
        .caches
        .sandboxes
        .get(&ObjectRef::new(&name).within(&namespace));
    let state = match cached {
        Some(existing) => existing_state((*existing).clone(), as_owner, &ctx.kube.key),
        None if ctx.kube.own_writes.recorded(&uid, &key, "create") => {
            ChildState::Ours(sandbox.clone())
        }
        None => {
            create_owned(
                &ctx.kube,
                &ctx.kube.caches.sandboxes,
                &sandbox,
                as_owner,
                "create",
                false,
            )
            .await?
        }
    };
    // Ours under the name, but another attempt (one still being removed): not the one asked for.
    let state = match state {
        ChildState::Ours(found) if attempt_of(&found) != launch.attempt.max(1) => {
            ChildState::Waiting(format!(
                "attempt {} of Sandbox {name} is still being removed",
                attempt_of(&found)
            ))
        }
        other => other.unit(),
    };
    if state != ChildState::Ours(()) {
        info!(group = %object_key(group), trajectory = %name, ?state, "trajectory name not available yet");
    }
    Ok(state)
}

/// Deletes the children of ended attempts, each only by its UID (never a new attempt under the same
/// name).
pub async fn delete_superseded(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    superseded: &[Superseded],
) -> Result<()> {
    let namespace = group.namespace().unwrap_or_default();
    let uid = group.uid().unwrap_or_default();
    for child in superseded {
        ensure_deleted::<Sandbox, _>(
            &ctx.kube,
            &ctx.kube.caches.sandboxes,
            &uid,
            &namespace,
            &child.name,
            &child.uid,
        )
        .await?;
    }
    Ok(())
}

/// Deletes the group's children (not already being deleted) that `targets` picks.
pub async fn delete_children(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    targets: &Targets,
) -> Result<()> {
    let namespace = group.namespace().unwrap_or_default();
    let uid = group.uid().unwrap_or_default();
    for child in owned_children(ctx, group) {
        let name = child.name_any();
        if child.meta().deletion_timestamp.is_some() || !targets.picks(name.as_str()) {
            continue;
        }
        let child_uid = child.uid().unwrap_or_default();
        ensure_deleted::<Sandbox, _>(
            &ctx.kube,
            &ctx.kube.caches.sandboxes,
            &uid,
            &namespace,
            &name,
            &child_uid,
        )
        .await?;
    }
    Ok(())
}
