//! The thin I/O layer of the RolloutGroup controller: the group's children as the caches show them,
//! a live check of children the cache does not show yet, trajectory creation and the clean-up after
//! completion, all through the generic write layer (`plumbing::writes`), scoped by the group's UID.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::info;

use super::build::desired_trajectory;
use super::observe::{ChildView, DEADLINE_EXCEEDED, Observation};
use crate::plumbing::error::Result;
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::own_writes::child_key;
use crate::plumbing::ownership::{Owner, sealed_for};
use crate::plumbing::writes::{ChildState, create_owned, ensure_deleted, existing_state};
use crate::rollout::context::RolloutCtx;
use orchard_api::{
    CleanupPolicy, EarlyStop, RolloutGroup, RolloutGroupStatus, STRIDE_LABEL, Sandbox,
    TrajectoryRecord,
};

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
        .map(|s| ChildView {
            name: s.name_any(),
            stride: s
                .labels()
                .get(STRIDE_LABEL)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            result: s.status.as_ref().and_then(|st| st.result.clone()),
            deleting: s.meta().deletion_timestamp.is_some(),
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

/// Creates trajectory `index` and records it as running. A name held by a previous group's trajectory
/// comes back as a wait (the stride is finished once it is gone), one held by anything else as a
/// conflict; neither object is touched.
pub async fn create_trajectory(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    owner: &OwnerReference,
    index: u32,
    stride: u32,
    observation: &mut Observation,
) -> Result<Option<ChildState<()>>> {
    let sandbox = desired_trajectory(group, owner, index, stride, &ctx.kube.key);
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
        Some(existing) => existing_state((*existing).clone(), as_owner, &ctx.kube.key).unit(),
        None if ctx.kube.own_writes.recorded(&uid, &key, "create") => ChildState::Ours(()),
        None => create_owned(
            &ctx.kube,
            &ctx.kube.caches.sandboxes,
            &sandbox,
            as_owner,
            "create",
            false,
        )
        .await?
        .unit(),
    };
    if state != ChildState::Ours(()) {
        info!(group = %object_key(group), trajectory = %name, ?state, "trajectory name not available yet");
        return Ok(Some(state));
    }
    observation
        .records
        .entry(index)
        .or_insert(TrajectoryRecord {
            name,
            stride: i32::try_from(stride).unwrap_or(i32::MAX),
            status: None,
            reward: None,
            length: None,
            artifact: None,
            reason: None,
        });
    Ok(None)
}

/// After completion: `Eager` deletes the trajectories still running, the group's deadline those it
/// aborted; `cleanup: Delete` deletes them all.
pub async fn cleanup(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    status: &RolloutGroupStatus,
) -> Result<()> {
    let eager = group.spec.early_stop == EarlyStop::Eager;
    let stopped: BTreeSet<&str> = status
        .trajectories
        .iter()
        .filter(|r| match r.reason.as_deref() {
            Some("Cancelled") => eager,
            Some(reason) => reason == DEADLINE_EXCEEDED,
            None => false,
        })
        .map(|r| r.name.as_str())
        .collect();
    let delete_all = group.spec.cleanup == CleanupPolicy::Delete;
    delete_children(ctx, group, |name| delete_all || stopped.contains(name)).await
}

/// Before completion, on a queue: deletes the trajectories whose outcome `status` records (the group
/// keeps what a trainer needs), so their slots are freed.
pub async fn release_finished(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    status: &RolloutGroupStatus,
) -> Result<()> {
    let finished: BTreeSet<&str> = status
        .trajectories
        .iter()
        .filter(|r| r.status.is_some())
        .map(|r| r.name.as_str())
        .collect();
    delete_children(ctx, group, |name| finished.contains(name)).await
}

/// Deletes the group's children (not already being deleted) whose name `chosen` picks.
async fn delete_children(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    chosen: impl Fn(&str) -> bool,
) -> Result<()> {
    let namespace = group.namespace().unwrap_or_default();
    let uid = group.uid().unwrap_or_default();
    for child in owned_children(ctx, group) {
        let name = child.name_any();
        if child.meta().deletion_timestamp.is_some() || !chosen(name.as_str()) {
            continue;
        }
        let child_uid = child.uid().unwrap_or_default();
        ensure_deleted(
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
