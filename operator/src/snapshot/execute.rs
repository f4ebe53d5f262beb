//! The I/O half of a SandboxSnapshot reconcile: carry out a [`Plan`] (see `decide`): the
//! finalizer, the committer Pod, the status, the Events, the deletion after the TTL.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::info;

use super::committer::{committer_name, committer_pod};
use super::context::SnapshotCtx;
use super::decide::{CommitterStep, Plan};
use crate::plumbing::error::Result;
use crate::plumbing::events::publish;
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::own_writes::{child_key, namespace_scope};
use crate::plumbing::writes::{self, StatusWrite};
use orchard_api::{SNAPSHOT_FINALIZER, SandboxSnapshot};

/// Carries out `plan` for `snapshot`; returns when to reconcile again.
pub async fn execute(
    ctx: &SnapshotCtx,
    snapshot: &SandboxSnapshot,
    plan: Plan,
) -> Result<Option<Duration>> {
    if plan.add_finalizer {
        add_finalizer(ctx, snapshot).await?;
    }
    match &plan.committer {
        CommitterStep::Keep => {}
        CommitterStep::Create(target) => {
            let pod = committer_pod(snapshot, target, &ctx.settings);
            create_committer(ctx, &pod).await?;
            info!(snapshot = %object_key(snapshot), node = %target.node_name, sandbox_pod = %target.pod_uid, "committer started");
        }
        CommitterStep::Delete => delete_committer(ctx, snapshot).await?,
    }
    if plan.write {
        let written = writes::write_status(
            &ctx.kube,
            &ctx.kube.caches.snapshots,
            snapshot,
            snapshot.status.as_ref(),
            &plan.status,
        )
        .await?;
        if written == StatusWrite::Gone {
            return Ok(None);
        }
        for note in &plan.notes {
            let type_ = if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            };
            publish(
                &ctx.kube,
                snapshot,
                type_,
                &note.reason,
                note.message.clone(),
            )
            .await;
        }
    }
    if plan.remove_finalizer {
        remove_finalizer(ctx, snapshot).await?;
        return Ok(None);
    }
    if plan.delete {
        info!(snapshot = %object_key(snapshot), "ttlSecondsAfterUnused ran out: deleting the snapshot");
        delete_snapshot(ctx, snapshot).await?;
        return Ok(None);
    }
    Ok(plan.requeue)
}

fn api(ctx: &SnapshotCtx, snapshot: &SandboxSnapshot) -> Api<SandboxSnapshot> {
    Api::namespaced(
        ctx.kube.client.clone(),
        &snapshot.namespace().unwrap_or_default(),
    )
}

/// Adds the finalizer with a JSON Patch that tests the UID (a recreated snapshot is not touched).
async fn add_finalizer(ctx: &SnapshotCtx, snapshot: &SandboxSnapshot) -> Result<()> {
    let uid = snapshot.uid().unwrap_or_default();
    let add = if snapshot.metadata.finalizers.is_some() {
        json!({"op": "add", "path": "/metadata/finalizers/-", "value": SNAPSHOT_FINALIZER})
    } else {
        json!({"op": "add", "path": "/metadata/finalizers", "value": [SNAPSHOT_FINALIZER]})
    };
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        add
    ]))
    .map_err(|source| crate::plumbing::error::Error::Serialize {
        what: "finalizer patch",
        source,
    })?;
    patch_metadata(ctx, snapshot, patch).await
}

/// Removes the finalizer (by index, testing the UID and the entry).
async fn remove_finalizer(ctx: &SnapshotCtx, snapshot: &SandboxSnapshot) -> Result<()> {
    let uid = snapshot.uid().unwrap_or_default();
    let Some(index) = snapshot
        .metadata
        .finalizers
        .iter()
        .flatten()
        .position(|f| f == SNAPSHOT_FINALIZER)
    else {
        return Ok(());
    };
    let path = format!("/metadata/finalizers/{index}");
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": path, "value": SNAPSHOT_FINALIZER},
        {"op": "remove", "path": path},
    ]))
    .map_err(|source| crate::plumbing::error::Error::Serialize {
        what: "finalizer patch",
        source,
    })?;
    patch_metadata(ctx, snapshot, patch).await
}

async fn patch_metadata(
    ctx: &SnapshotCtx,
    snapshot: &SandboxSnapshot,
    patch: json_patch::Patch,
) -> Result<()> {
    match api(ctx, snapshot)
        .patch(
            &snapshot.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
    {
        Ok(_) => {
            ctx.kube.metrics.api_write("sandboxsnapshots", "patch");
            Ok(())
        }
        // Gone, or another incarnation (the UID test failed): its own reconcile takes over.
        Err(kube::Error::Api(status)) if status.is_not_found() || status.code == 422 => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// Creates the committer Pod; one that exists already (same name: the same snapshot incarnation)
/// is the one. Remembered until the committer watch shows it.
async fn create_committer(ctx: &SnapshotCtx, pod: &Pod) -> Result<()> {
    let namespace = &ctx.settings.namespace;
    let pods: Api<Pod> = Api::namespaced(ctx.kube.client.clone(), namespace);
    let created = match pods.create(&PostParams::default(), pod).await {
        Ok(created) => {
            ctx.kube.metrics.api_write("pods", "create");
            created
        }
        Err(kube::Error::Api(status)) if status.is_already_exists() => return Ok(()),
        Err(err) => return Err(err.into()),
    };
    let name = created.name_any();
    let uid = created.uid();
    let cache = ctx.kube.caches.committers.clone();
    let shown = {
        let name = name.clone();
        let namespace = namespace.clone();
        move || {
            cache
                .get(&ObjectRef::new(&name).within(&namespace))
                .is_some_and(|c| c.uid() == uid)
        }
    };
    ctx.kube.own_writes.record_object(
        &namespace_scope(namespace),
        &child_key("Pod", &name),
        "create",
        created,
        shown,
    );
    Ok(())
}

/// Deletes the committer Pod of `snapshot` (gone counts as done); the script's TERM trap resumes a
/// sandbox it paused.
async fn delete_committer(ctx: &SnapshotCtx, snapshot: &SandboxSnapshot) -> Result<()> {
    let name = committer_name(&snapshot.uid().unwrap_or_default());
    let scope = namespace_scope(&ctx.settings.namespace);
    let key = child_key("Pod", &name);
    if ctx.kube.own_writes.recorded(&scope, &key, "delete") {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(ctx.kube.client.clone(), &ctx.settings.namespace);
    match pods.delete(&name, &DeleteParams::background()).await {
        Ok(_) => ctx.kube.metrics.api_write("pods", "delete"),
        Err(kube::Error::Api(status)) if status.is_not_found() => {}
        Err(err) => return Err(err.into()),
    }
    let cache = ctx.kube.caches.committers.clone();
    let namespace = ctx.settings.namespace.clone();
    ctx.kube.own_writes.record(&scope, &key, "delete", move || {
        cache
            .get(&ObjectRef::new(&name).within(&namespace))
            .is_none_or(|c| c.meta().deletion_timestamp.is_some())
    });
    Ok(())
}

/// Deletes the snapshot itself (its TTL ran out), if it is still the one we mean.
async fn delete_snapshot(ctx: &SnapshotCtx, snapshot: &SandboxSnapshot) -> Result<()> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: snapshot.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api(ctx, snapshot)
        .delete(&snapshot.name_any(), &params)
        .await
    {
        Ok(_) => {
            ctx.kube.metrics.api_write("sandboxsnapshots", "delete");
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.is_not_found() || status.code == 409 => Ok(()),
        Err(err) => Err(err.into()),
    }
}
