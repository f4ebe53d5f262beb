//! One Sandbox reconcile: ensure the children the builders describe, compute the status from the
//! watch caches, write it only if it changed, and requeue exactly at the next deadline (expiry or
//! startup timeout), never on a periodic sweep.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{info, instrument, warn};

use super::build::{desired_pod, pod_name};
use super::expiry::{Lifecycle, annotated_heartbeat, expiry_deadline};
use super::run_result::aborted;
use super::status::{
    Observed, desired_status, expired_status, hold_back_transient, is_trajectory, rollout_group_of,
};
use super::{apply, runner};
use crate::api::{Sandbox, SandboxPhase, SandboxStatus};
use crate::context::{Context, object_key};
use crate::error::{Error, Result};
use crate::events::publish;
use crate::metrics::ReconcileTimer;

/// Controller name used in metrics and logs.
pub const CONTROLLER: &str = "sandbox";

/// Reconciles one Sandbox.
#[instrument(skip_all, fields(sandbox = %object_key(sandbox.as_ref())))]
pub async fn reconcile(sandbox: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ReconcileTimer::start(&ctx.metrics, CONTROLLER);
    let result = reconcile_inner(&sandbox, &ctx).await;

    if result.is_ok() {
        ctx.reconciled(CONTROLLER, &object_key(sandbox.as_ref()));
    }
    result
}

/// Retries a failed reconcile with per-object exponential backoff.
pub fn error_policy(sandbox: Arc<Sandbox>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = object_key(sandbox.as_ref());
    let delay = ctx.reconcile_failed(CONTROLLER, &key, error);
    warn!(sandbox = %key, %error, retry_in_ms = delay.as_millis() as u64, "sandbox reconcile failed");
    Action::requeue(delay)
}

async fn reconcile_inner(cached: &Sandbox, ctx: &Arc<Context>) -> Result<Action> {
    if cached.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if !ctx.leadership.is_leader() {
        // A standby replica keeps its caches warm and writes nothing; gaining the Lease reconciles all.
        return Ok(Action::await_change());
    }
    // Work from our own last status write when the cache has not caught up with it yet.
    let uid = cached.uid().unwrap_or_default();
    let fresher = ctx
        .written_status
        .newer_than_cache(&uid, cached.meta().resource_version.as_deref());
    let sandbox = &match fresher {
        Some(status) => Sandbox {
            status: Some(status),
            ..cached.clone()
        },
        None => cached.clone(),
    };
    let namespace = sandbox.namespace().ok_or(Error::MissingField {
        kind: "Sandbox",
        field: "metadata.namespace",
    })?;
    let name = sandbox.name_any();
    let owner = sandbox
        .controller_owner_ref(&())
        .ok_or(Error::MissingField {
            kind: "Sandbox",
            field: "metadata.uid",
        })?;
    let previous = sandbox.status.clone().unwrap_or_default();

    if matches!(
        previous.phase,
        Some(SandboxPhase::Failed | SandboxPhase::Expired)
    ) {
        // Terminal: free the pod's resources, keep the Sandbox so its status says why.
        if ctx
            .caches
            .pods
            .get(&ObjectRef::new(&pod_name(&name)).within(&namespace))
            .is_some()
        {
            apply::delete_pod(ctx, &namespace, &pod_name(&name)).await?;
        }
        return Ok(Action::await_change());
    }

    apply::ensure_baseline(ctx, &namespace).await?;
    apply::ensure_egress_policy(ctx, sandbox, &owner).await?;

    let pod_key = format!("{namespace}/{}", pod_name(&name));
    let cached_pod = ctx
        .caches
        .pods
        .get(&ObjectRef::new(&pod_name(&name)).within(&namespace));
    let mut pod = cached_pod
        .map(|p| (*p).clone())
        .or_else(|| ctx.created_pods.get(&pod_key));
    let mut pod_gone = false;
    if pod.is_none() && previous.pod_name.is_some() {
        // The status names a pod the cache does not show: ask the API server before declaring it gone.
        pod = apply::fetch_pod(ctx, &namespace, &pod_name(&name)).await?;
        pod_gone = pod.is_none();
    }
    if pod.is_none() && !pod_gone {
        // The token Secret and the Pod are independent writes: send them together (the kubelet waits
        // for the Secret before it starts the Pod).
        let desired = desired_pod(sandbox, &owner, &ctx.settings.pod);
        let (secret, created) = futures::future::join(
            apply::ensure_token_secret(ctx, sandbox, &owner),
            apply::create_pod(ctx, &desired),
        )
        .await;
        secret?;
        pod = Some(created?);
    } else {
        apply::ensure_token_secret(ctx, sandbox, &owner).await?;
    }

    let now = Timestamp::now();
    let lifecycle = Lifecycle::of(
        sandbox,
        ctx.settings.default_ttl_seconds,
        ctx.settings.default_heartbeat_timeout_seconds,
    );
    if let Err(problem) = annotated_heartbeat(sandbox, now) {
        warn!(sandbox = %object_key(sandbox), %problem, "heartbeat annotation ignored");
    }
    let observed = Observed {
        pod: pod.as_ref(),
        pod_gone,
        now,
        lifecycle,
        startup_timeout_seconds: ctx.settings.startup_timeout_seconds,
        agent_port: ctx.settings.pod.agent_port,
    };
    let status = desired_status(sandbox, &observed);
    let created = sandbox.meta().creation_timestamp.as_ref().map(|t| t.0);
    if sandbox.status.as_ref() != Some(&status)
        && let Some(wait) = hold_back_transient(
            sandbox.status.as_ref(),
            &status,
            created,
            now,
            ctx.settings.status_coalesce,
        )
    {
        // A young sandbox usually becomes Ready within the window: write once, then.
        return Ok(Action::requeue(wait));
    }
    if sandbox.status.as_ref() != Some(&status) {
        if let Some(written) = apply::patch_status(ctx, sandbox, &status).await? {
            ctx.written_status.remember(
                &uid,
                written.meta().resource_version.clone(),
                status.clone(),
            );
        }
        report_transition(ctx, sandbox, &previous, &status, now).await;
    }
    if sandbox.spec.run.is_some() {
        let current = Sandbox {
            status: Some(status.clone()),
            ..sandbox.clone()
        };
        runner::ensure_runner(ctx, &current);
    }

    if status.phase == Some(SandboxPhase::Failed) {
        apply::delete_pod(ctx, &namespace, &pod_name(&name)).await?;
        return Ok(Action::await_change());
    }

    let ready_time = status.ready_time.as_ref().map(|t| t.0);
    let heartbeat = status
        .last_heartbeat_time
        .as_ref()
        .map(|t| t.0)
        .or(ready_time);
    if let Some((deadline, cause)) = expiry_deadline(ready_time, heartbeat, lifecycle) {
        if now >= deadline {
            expire(ctx, sandbox, &status, cause.as_str(), now).await?;
            return Ok(Action::await_change());
        }
        return Ok(Action::requeue(
            until(now, deadline).min(ctx.settings.resync),
        ));
    }
    // Not Ready yet: come back when the startup timeout would fail it (watch events usually come first).
    let created = sandbox
        .meta()
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(now);
    let startup_deadline = created
        .saturating_add(k8s_openapi::jiff::SignedDuration::from_secs(
            ctx.settings.startup_timeout_seconds,
        ))
        .unwrap_or(now);
    Ok(Action::requeue(
        until(now, startup_deadline).min(ctx.settings.resync),
    ))
}

/// Time from `now` until `deadline` (zero if it passed), with a millisecond of slack so the requeue
/// lands at or just after the deadline rather than just before it.
fn until(now: Timestamp, deadline: Timestamp) -> Duration {
    let remaining = deadline.duration_since(now);
    Duration::try_from(remaining).unwrap_or(Duration::ZERO) + Duration::from_millis(1)
}

/// Ends an expired sandbox. A standalone sandbox is deleted. A trajectory of a RolloutGroup keeps its
/// Sandbox object (phase Expired, with an aborted result if it had none) so the group cannot lose its
/// outcome; only its pod is deleted, and the group's cleanup removes the object.
async fn expire(
    ctx: &Context,
    sandbox: &Sandbox,
    status: &SandboxStatus,
    cause: &str,
    now: Timestamp,
) -> Result<()> {
    let in_group = rollout_group_of(sandbox).is_some();
    if in_group || (is_trajectory(sandbox) && status.result.is_none()) {
        let mut expired = expired_status(sandbox, cause, now);
        if expired.result.is_none() {
            expired.result = Some(aborted(
                "Expired",
                format!("the sandbox reached its {cause} deadline before the trajectory finished"),
                None,
            ));
        }
        apply::patch_status(ctx, sandbox, &expired).await?;
    }
    let namespace = sandbox.namespace().unwrap_or_default();
    if in_group {
        apply::delete_pod(ctx, &namespace, &pod_name(&sandbox.name_any())).await?;
    } else {
        apply::delete_sandbox(ctx, sandbox).await?;
    }
    ctx.metrics.expirations.with_label_values(&[cause]).inc();
    info!(sandbox = %object_key(sandbox), cause, in_group, "sandbox expired");
    let note = if in_group {
        format!("the {cause} deadline passed; pod deleted, the RolloutGroup removes the sandbox")
    } else {
        format!("the {cause} deadline passed; sandbox deleted")
    };
    publish(ctx, sandbox, EventType::Normal, "Expired", note).await;
    Ok(())
}

async fn report_transition(
    ctx: &Context,
    sandbox: &Sandbox,
    previous: &SandboxStatus,
    status: &SandboxStatus,
    now: Timestamp,
) {
    if previous.phase == status.phase {
        return;
    }
    match status.phase {
        Some(SandboxPhase::Ready) if previous.ready_time.is_none() => {
            if let Some(created) = sandbox.meta().creation_timestamp.as_ref() {
                let seconds = now.duration_since(created.0).as_secs_f64().max(0.0);
                ctx.metrics.sandbox_ready_seconds.observe(seconds);
            }
            info!(sandbox = %object_key(sandbox), endpoint = status.agent_endpoint.as_deref().unwrap_or(""), "sandbox ready");
            let note = format!(
                "agent answering at {}",
                status.agent_endpoint.as_deref().unwrap_or("?")
            );
            publish(ctx, sandbox, EventType::Normal, "Ready", note).await;
        }
        Some(SandboxPhase::Failed) => {
            let reason = status.reason.clone().unwrap_or_else(|| "Failed".into());
            ctx.metrics
                .sandbox_failures
                .with_label_values(&[reason.as_str()])
                .inc();
            let message = status.message.clone().unwrap_or_default();
            warn!(sandbox = %object_key(sandbox), %reason, %message, "sandbox failed");
            publish(ctx, sandbox, EventType::Warning, &reason, message).await;
        }
        _ => {}
    }
}
