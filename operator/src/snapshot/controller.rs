//! The SandboxSnapshot reconcile: observe (the snapshot, its Sandbox and that Sandbox's Pod, its
//! committer Pod, who names it), decide (`decide::decide`, pure: a `Plan`) and execute
//! (`execute::execute`). Woken by its own changes, its committer Pod's, and those of the
//! Sandboxes, SandboxPools and RolloutGroups that name it.

use crate::plumbing::cached_pod::CachedPod;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use tracing::instrument;

use super::committer::committer_name;
use super::context::SnapshotCtx;
use super::decide::{Observed, decide, touches_quota};
use super::execute::execute;
use super::quota::{self, Budget};
use super::source::referrers;
use crate::plumbing::error::{Error, Result};
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::own_writes::{child_key, namespace_scope};
use crate::plumbing::reconcile::Reconcile;
use crate::pod::lookup::cached_pod;
use orchard_api::{SANDBOX_LABEL, SNAPSHOT_UID_LABEL, Sandbox, SandboxSnapshot};

/// Controller name used in metrics and logs.
pub const CONTROLLER: &str = "sandboxsnapshot";

fn reconciler(ctx: &SnapshotCtx) -> Reconcile<'_, SandboxSnapshot> {
    Reconcile {
        kube: &ctx.kube,
        controller: CONTROLLER,
        store: &ctx.kube.caches.snapshots,
        slots: None,
    }
}

/// Reconciles one SandboxSnapshot.
#[instrument(skip_all, fields(snapshot = %object_key(snapshot.as_ref())))]
pub async fn reconcile(snapshot: Arc<SandboxSnapshot>, ctx: Arc<SnapshotCtx>) -> Result<Action> {
    reconciler(&ctx)
        .run(&snapshot, reconcile_inner(&snapshot, &ctx))
        .await
}

/// Retries a failed reconcile with per-object exponential backoff.
pub fn error_policy(
    snapshot: Arc<SandboxSnapshot>,
    error: &Error,
    ctx: Arc<SnapshotCtx>,
) -> Action {
    reconciler(&ctx).retry(&snapshot, error)
}

/// The committer Pod of `snapshot`: the cache's, or the one created moments ago that the cache does
/// not show yet; one that carries another snapshot's UID is not it.
fn committer_of(ctx: &SnapshotCtx, snapshot: &SandboxSnapshot) -> Option<Pod> {
    let uid = snapshot.uid().unwrap_or_default();
    let name = committer_name(&uid);
    let namespace = &ctx.settings.namespace;
    let ours = |pod: &Pod| {
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SNAPSHOT_UID_LABEL))
            .is_some_and(|v| *v == uid)
    };
    ctx.kube
        .caches
        .committers
        .get(&ObjectRef::new(&name).within(namespace))
        .map(|p| (*p).clone())
        .or_else(|| {
            ctx.kube
                .own_writes
                .object::<Pod>(&namespace_scope(namespace), &child_key("Pod", &name))
        })
        .filter(ours)
}

/// The Sandbox's Pod as the cache shows it, if it carries the Sandbox's label.
fn sandbox_pod(ctx: &SnapshotCtx, sandbox: &Sandbox) -> Option<Arc<CachedPod>> {
    cached_pod(&ctx.kube.caches.pods, sandbox, &ctx.kube.key).filter(|pod| {
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SANDBOX_LABEL))
            .is_some_and(|v| *v == sandbox.name_any())
    })
}

async fn reconcile_inner(
    queued: &SandboxSnapshot,
    ctx: &Arc<SnapshotCtx>,
) -> Result<Option<std::time::Duration>> {
    if !ctx.kube.leadership.is_leader() {
        return Ok(None);
    }
    // Not `fresh`: a snapshot being deleted is still reconciled (its finalizer).
    let Some(snapshot) = crate::plumbing::writes::freshest(
        &ctx.kube,
        &ctx.kube.caches.snapshots,
        queued,
        |s: &mut SandboxSnapshot, status| {
            s.status = Some(status);
        },
    ) else {
        return Ok(None);
    };
    let namespace = snapshot.namespace().ok_or(Error::MissingField {
        kind: "SandboxSnapshot",
        field: "metadata.namespace",
    })?;
    let caches = &ctx.kube.caches;
    let sandbox = caches
        .sandboxes
        .get(&ObjectRef::new(&snapshot.spec.sandbox).within(&namespace));
    let pod = sandbox.as_deref().and_then(|s| sandbox_pod(ctx, s));
    let committer = committer_of(ctx, &snapshot);
    let sandboxes = caches.sandboxes.state();
    let pools = caches.sandbox_pools.state();
    let groups = caches.rollout_groups.state();
    let referrers = referrers(
        &namespace,
        &snapshot.name_any(),
        sandboxes.iter().map(|s| s.as_ref()),
        pools.iter().map(|p| p.as_ref()),
        groups.iter().map(|g| g.as_ref()),
    );
    let observed = Observed {
        sandbox: sandbox.as_deref(),
        sandbox_pod: pod.as_deref(),
        committer: committer.as_ref(),
        referrers: &referrers,
        settings: &ctx.settings,
        budget: None,
        now: Timestamp::now(),
    };
    let plan = decide(&snapshot, &observed);
    if !touches_quota(&snapshot, &plan) {
        return execute(ctx, &snapshot, plan).await;
    }
    // Starting a commit or becoming Ready: decide again knowing the namespace's size quota, read
    // from the API server (not the cache) and written under the namespace's lock.
    ctx.quota_locks
        .with(&namespace, async {
            let budget = budget(ctx, &namespace, &snapshot.uid().unwrap_or_default()).await?;
            let observed = Observed {
                budget: budget.as_ref(),
                now: Timestamp::now(),
                ..observed
            };
            execute(ctx, &snapshot, decide(&snapshot, &observed)).await
        })
        .await
}

/// The namespace's snapshot size quota and what its snapshots other than `uid` hold of it, read
/// from the API server; `None` when no ResourceQuota names `orchard.dev/snapshot-bytes` (then the
/// snapshots are not listed).
async fn budget(ctx: &SnapshotCtx, namespace: &str, uid: &str) -> Result<Option<Budget>> {
    let quotas: Api<ResourceQuota> = Api::namespaced(ctx.kube.client.clone(), namespace);
    let quotas = quotas.list(&ListParams::default()).await?;
    let limit = quota::limit(&quotas.items).map_err(Error::Config)?;
    let Some(limit) = limit else {
        return Ok(None);
    };
    let snapshots: Api<SandboxSnapshot> = Api::namespaced(ctx.kube.client.clone(), namespace);
    let snapshots = snapshots.list(&ListParams::default()).await?;
    Ok(Some(Budget {
        used: quota::used(&snapshots.items, uid),
        limit,
    }))
}
