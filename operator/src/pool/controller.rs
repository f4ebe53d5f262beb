//! The SandboxPool reconcile: keep `replicas` unclaimed members built from the current template
//! (start missing ones, delete failed, outdated and surplus ones), and write the pool's status. A
//! member is one Pod write: its agent token is derived from the Pod's own annotations, so it follows
//! the Pod into a claim. A delete is conditional on the member's UID and resourceVersion, so a member
//! claimed meanwhile is never deleted by its former pool.
//!
//! This file only orchestrates: observe (the members the operator knows, the book's memory),
//! decide (`decide::decide`, pure: a `PoolPlan`) and execute (`execute::execute`).

use crate::plumbing::cached_pod::CachedPod;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::instrument;

use super::book::PoolKey;
use super::decide::{Observed, decide};
use super::execute::execute;
use super::members::{MemberView, view};
use super::template::template_hash;
use crate::plumbing::error::{Error, Result};
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::own_writes::child_key;
use crate::plumbing::reconcile::Reconcile;
use crate::pool::context::PoolCtx;
use crate::snapshot::source::{Source, resolve};
use orchard_api::{POOL_LABEL, SandboxPool};

/// Controller name used in metrics and logs.
pub const CONTROLLER: &str = "sandboxpool";

/// The key of `pool` in the book.
pub fn key_of(pool: &SandboxPool) -> PoolKey {
    PoolKey {
        namespace: pool.namespace().unwrap_or_default(),
        name: pool.name_any(),
    }
}

fn reconciler(ctx: &PoolCtx) -> Reconcile<'_, SandboxPool> {
    Reconcile {
        kube: &ctx.kube,
        controller: CONTROLLER,
        store: &ctx.kube.caches.sandbox_pools,
        slots: None,
    }
}

/// Reconciles one SandboxPool: at least every resync (its members' failures age out of the book).
#[instrument(skip_all, fields(pool = %object_key(pool.as_ref())))]
pub async fn reconcile(pool: Arc<SandboxPool>, ctx: Arc<PoolCtx>) -> Result<Action> {
    // The events of many claims fold into one full reconcile: one held off is not a reconcile (it is
    // neither counted nor timed in the reconcile metrics).
    if pool.meta().deletion_timestamp.is_none()
        && let Some(wait) = ctx.book.full_reconcile(&key_of(&pool))
    {
        return Ok(Action::requeue(wait));
    }
    let work = async {
        let next = reconcile_inner(&pool, &ctx).await?;
        Ok(next.or(Some(ctx.kube.resync)))
    };
    reconciler(&ctx).run(&pool, work).await
}

/// Retries a failed reconcile with per-object exponential backoff.
pub fn error_policy(pool: Arc<SandboxPool>, error: &Error, ctx: Arc<PoolCtx>) -> Action {
    reconciler(&ctx).retry(&pool, error)
}

/// The members of `pool` the operator knows: the cache's, and the ones it created moments ago that
/// the cache does not show yet; members it deleted moments ago count as terminating.
fn members(ctx: &PoolCtx, pool: &SandboxPool, hash: &str) -> Vec<MemberView> {
    let namespace = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let uid = pool.uid().unwrap_or_default();
    let mut seen: Vec<MemberView> = ctx
        .kube
        .caches
        .pods
        .state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()))
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(POOL_LABEL))
                .is_some_and(|v| *v == name)
        })
        .filter_map(|p| view(p, &uid, hash, &ctx.kube.key))
        .collect();
    for created in ctx.kube.own_writes.objects::<Pod>(&uid) {
        if let Some(member) = view(&CachedPod::from(&created), &uid, hash, &ctx.kube.key)
            && !seen.iter().any(|m| m.uid == member.uid)
        {
            seen.push(member);
        }
    }
    for member in &mut seen {
        if ctx
            .kube
            .own_writes
            .recorded(&uid, &child_key("Pod", &member.name), "delete")
        {
            member.terminating = true;
        }
    }
    seen
}

async fn reconcile_inner(cached: &SandboxPool, ctx: &Arc<PoolCtx>) -> Result<Option<Duration>> {
    let key = key_of(cached);
    if cached.meta().deletion_timestamp.is_some() {
        ctx.book.forget(&key);
        return Ok(None);
    }
    let Some(pool) = reconciler(ctx).fresh(cached, |p: &mut SandboxPool, status| {
        p.status = Some(status);
    }) else {
        return Ok(None);
    };
    pool.namespace().ok_or(Error::MissingField {
        kind: "SandboxPool",
        field: "metadata.namespace",
    })?;
    let owner = pool.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: "SandboxPool",
        field: "metadata.uid",
    })?;
    // A template naming a SandboxSnapshot builds members from the snapshot's image (and hashes it:
    // a recreated snapshot replaces the members).
    let namespace = pool.namespace().unwrap_or_default();
    let (template, source) = resolve(&ctx.kube.caches.snapshots, &namespace, &pool.spec.template);
    let snapshot = match source {
        Source::Wait(message) => Some((false, message)),
        Source::Fail(message) => Some((true, message)),
        Source::Image | Source::Snapshot(_) => None,
    };
    let mut pool = pool;
    pool.spec.template = template;
    let hash = template_hash(&pool.spec.template);
    let seen = members(ctx, &pool, &hash);
    let observed = Observed {
        members: &seen,
        last_failure: ctx.book.last_failure(&key),
        claims: ctx.book.claim_counts(&key),
        placement: &ctx.pods.settings.placement,
        snapshot,
        now: Timestamp::now(),
    };
    let plan = decide(&pool, &observed);
    let next = execute(ctx, &pool, &key, &owner, plan).await?;
    if next.is_zero() {
        ctx.book.continue_now(&key);
    }
    Ok(Some(next))
}
