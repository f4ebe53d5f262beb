//! One Sandbox reconcile: observe (the freshest Sandbox, the Pod the operator knows, the pool it
//! names), decide what to do about its children (`decide::plan_children`), do it
//! (`execute::ensure_children`), decide its status and what follows (`decide::plan_status`), do that
//! (`execute::settle`). It requeues exactly at the next deadline (expiry or startup timeout), never
//! on a periodic sweep.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::{instrument, warn};

use super::apply;
use super::blocked::Blocked;
use super::context::SandboxCtx;
use super::decide::{ChildPlan, StatusInput, StatusPlan, plan_children, plan_status};
use super::execute::{end_terminal, ensure_children, settle};
use super::expiry::annotated_heartbeat;
use super::retry::policy_of;
use crate::plumbing::error::{Error, Result};
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::reconcile::Reconcile;
use crate::plumbing::writes::ChildState;
use crate::pool::template::recorded_defaults;
use crate::snapshot::source::{Source, resolve};
use orchard_api::{Sandbox, SandboxPool};

/// Controller name used in metrics and logs.
pub const CONTROLLER: &str = "sandbox";

fn reconciler(ctx: &SandboxCtx) -> Reconcile<'_, Sandbox> {
    Reconcile {
        kube: &ctx.kube,
        controller: CONTROLLER,
        store: &ctx.kube.caches.sandboxes,
        slots: Some(&ctx.slots),
    }
}

/// Reconciles one Sandbox.
#[instrument(skip_all, fields(sandbox = %object_key(sandbox.as_ref())))]
pub async fn reconcile(sandbox: Arc<Sandbox>, ctx: Arc<SandboxCtx>) -> Result<Action> {
    // Boxed: the reconcile's state is large, and every layer above would copy it (callgrind).
    reconciler(&ctx)
        .run(&sandbox, Box::pin(reconcile_inner(&sandbox, &ctx)))
        .await
}

/// Retries a failed reconcile with per-object exponential backoff.
pub fn error_policy(sandbox: Arc<Sandbox>, error: &Error, ctx: Arc<SandboxCtx>) -> Action {
    reconciler(&ctx).retry(&sandbox, error)
}

/// `sandbox` with its image resolved from the SandboxSnapshot it names (or its pool's template
/// names), `pool` with its template's likewise (a claim compares the two), and why the sandbox
/// cannot have that image yet, if it cannot (pure over the cache).
fn resolve_snapshots(
    ctx: &SandboxCtx,
    sandbox: Sandbox,
    pool: Option<Arc<SandboxPool>>,
) -> (Sandbox, Option<Arc<SandboxPool>>, Option<Blocked>) {
    let snapshots = &ctx.kube.caches.snapshots;
    let namespace = sandbox.namespace().unwrap_or_default();
    let (spec, source) = resolve(snapshots, &namespace, &sandbox.spec);
    let blocked = match source {
        Source::Wait(message) => Some(Blocked::Snapshot {
            failed: false,
            message,
        }),
        Source::Fail(message) => Some(Blocked::Snapshot {
            failed: true,
            message,
        }),
        Source::Image | Source::Snapshot(_) => None,
    };
    let pool = pool.map(|pool| {
        let (template, _) = resolve(snapshots, &namespace, &pool.spec.template);
        if template == pool.spec.template {
            return pool;
        }
        let mut resolved = (*pool).clone();
        resolved.spec.template = template;
        Arc::new(resolved)
    });
    (Sandbox { spec, ..sandbox }, pool, blocked)
}

/// Returns when to reconcile again (`None`: on the next change only).
async fn reconcile_inner(queued: &Sandbox, ctx: &Arc<SandboxCtx>) -> Result<Option<Duration>> {
    let Some(sandbox) = reconciler(ctx).fresh(queued, |s: &mut Sandbox, status| {
        s.status = Some(status);
    }) else {
        return Ok(None);
    };
    let known = apply::known_pod(ctx, &sandbox);
    // A previous incarnation's Pod holding the name on a lost node would hold it until the Node
    // object is deleted.
    if let Some(ChildState::Waiting(_)) = &known {
        apply::remove_if_stuck_on_lost_node(ctx, &sandbox).await?;
    }
    // A sandbox of a pool runs with the pool template's values where its spec leaves them unset (the
    // network and lifecycle defaults as its Pod recorded them when it was claimed or created).
    let recorded = match &known {
        Some(ChildState::Ours(pod)) => recorded_defaults(pod),
        _ => None,
    };
    let (sandbox, pool) =
        crate::pool::resolve(&ctx.kube.caches.sandbox_pools, &sandbox, recorded.as_ref());
    // A sandbox (or pool template) naming a SandboxSnapshot runs the snapshot's image.
    let (sandbox, pool, snapshot) = resolve_snapshots(ctx, sandbox, pool);
    let sandbox = &sandbox;
    sandbox.namespace().ok_or(Error::MissingField {
        kind: "Sandbox",
        field: "metadata.namespace",
    })?;
    let owner = sandbox
        .controller_owner_ref(&())
        .ok_or(Error::MissingField {
            kind: "Sandbox",
            field: "metadata.uid",
        })?;

    let retry = policy_of(sandbox, &ctx.kube.key, &ctx.resource_defaults);
    let plan = plan_children(
        sandbox,
        known.as_ref(),
        &ctx.pods.settings.placement,
        retry.as_ref().err().map(String::as_str),
        snapshot.as_ref(),
    );
    let retry = retry.ok().flatten();
    if plan == ChildPlan::Terminal {
        // Terminal: free the pod's resources, keep the Sandbox so its status says why, until its TTL.
        let status = sandbox.status.clone().unwrap_or_default();
        return Box::pin(end_terminal(ctx, sandbox, &status)).await;
    }
    let outcome = Box::pin(ensure_children(
        ctx,
        sandbox,
        &owner,
        pool.as_deref(),
        known,
        &plan,
        retry.as_ref(),
    ))
    .await?;
    let now = Timestamp::now();
    if let Err(problem) = annotated_heartbeat(sandbox, now) {
        warn!(sandbox = %object_key(sandbox), %problem, "heartbeat annotation ignored");
    }
    let enforcement = ctx.enforcement.current();
    let input = StatusInput {
        enforcement: &enforcement,
        egress_proxy: ctx.pods.settings.pod.egress_proxy_url.is_some(),
        settings: &ctx.settings,
        agent_port: ctx.pods.settings.pod.agent_port,
        resync: ctx.kube.resync,
        key: &ctx.kube.key,
        now,
        retry: retry.as_ref(),
    };
    match plan_status(sandbox, &outcome, &input) {
        StatusPlan::HoldBack(wait) => Ok(Some(wait)),
        StatusPlan::Settle(plan) => {
            Box::pin(settle(ctx, sandbox, outcome.pod.as_ref(), *plan)).await
        }
    }
}
