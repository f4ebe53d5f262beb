//! One Sandbox reconcile: ensure the children the builders describe, compute the status from the
//! watch caches, write it only if it changed, and requeue exactly at the next deadline (expiry or
//! startup timeout), never on a periodic sweep.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{info, instrument, warn};

use super::expiry::{annotated_heartbeat, expiry_deadline, failed_deadline};
use super::run_result::aborted;
use super::status::{
    Observed, POLICY_ENFORCEMENT_MISSING, desired_status, expired_status, policy_warning_at,
    startup_clock,
};
use super::{apply, runner};
use crate::plumbing::error::{Error, Result};
use crate::plumbing::events::publish;
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::metrics::ReconcileTimer;
use crate::plumbing::time::until;
use crate::plumbing::writes::{self, ChildState, StatusWrite};
use crate::pod::naming::pod_name;
use crate::pod::placement;
use crate::pod::spec::desired_pod;
use crate::pod::token::new_nonce;
use crate::sandbox::blocked::Blocked;
use crate::sandbox::claim::{PoolStep, announce_identity, claim_or_fallback, is_claimed_member};
use crate::sandbox::coalesce::{first_status_can_wait, hold_back_transient};
use crate::sandbox::context::SandboxCtx;
use crate::sandbox::identity::{is_trajectory, rollout_group_of};
use crate::sandbox::refusals::{admission_rejection, quota_refusal};
use orchard_api::Lifecycle;
use orchard_api::{Sandbox, SandboxPhase, SandboxStatus};

/// Controller name used in metrics and logs.
pub const CONTROLLER: &str = "sandbox";

/// Reconciles one Sandbox.
#[instrument(skip_all, fields(sandbox = %object_key(sandbox.as_ref())))]
pub async fn reconcile(sandbox: Arc<Sandbox>, ctx: Arc<SandboxCtx>) -> Result<Action> {
    let _slot = ctx.slots.acquire().await;
    let _timer = ReconcileTimer::start(&ctx.kube.metrics, CONTROLLER);
    // Leadership is a cancellation signal: a reconcile still running when this replica steps down
    // is dropped (its request in flight aborted) and counts as one that had nothing to do.
    let next = ctx
        .kube
        .leadership
        .while_leader(reconcile_inner(&sandbox, &ctx))
        .await
        .unwrap_or(Ok(None))?;
    // The incarnation that holds the name now (the queued object may be an older one).
    let uid = ctx
        .kube
        .caches
        .sandboxes
        .get(&ObjectRef::from_obj(sandbox.as_ref()))
        .and_then(|o| o.uid())
        .unwrap_or_default();
    ctx.kube.reconciled(CONTROLLER, &uid);
    Ok(ctx.kube.next_action(&uid, next))
}

/// Retries a failed reconcile with per-object exponential backoff.
pub fn error_policy(sandbox: Arc<Sandbox>, error: &Error, ctx: Arc<SandboxCtx>) -> Action {
    let key = object_key(sandbox.as_ref());
    let delay = ctx
        .kube
        .reconcile_failed(CONTROLLER, &sandbox.uid().unwrap_or_default(), error);
    warn!(sandbox = %key, %error, retry_in_ms = delay.as_millis() as u64, "sandbox reconcile failed");
    Action::requeue(delay)
}

/// How often a sandbox whose Pod a ResourceQuota refused tries again (quotas are not watched).
const QUOTA_RECHECK: Duration = Duration::from_secs(3);

/// How often a sandbox waiting for a previous incarnation's children looks again, in case the watch
/// misses their deletion (it wakes the reconcile first in the normal case).
const PREVIOUS_INCARNATION_RECHECK: Duration = Duration::from_secs(1);

/// The first blocked child, a conflict before a wait.
fn blocked_by(states: &[&ChildState<()>]) -> Option<Blocked> {
    let conflict = states.iter().find_map(|s| match s {
        ChildState::Conflict(why) => Some(Blocked::NameConflict(why.clone())),
        _ => None,
    });
    conflict.or_else(|| {
        states.iter().find_map(|s| match s {
            ChildState::Waiting(why) => Some(Blocked::PreviousIncarnation(why.clone())),
            _ => None,
        })
    })
}

/// Returns when to reconcile again (`None`: on the next change only).
async fn reconcile_inner(cached: &Sandbox, ctx: &Arc<SandboxCtx>) -> Result<Option<Duration>> {
    if cached.meta().deletion_timestamp.is_some() {
        return Ok(None);
    }
    if !ctx.kube.leadership.is_leader() {
        // A standby replica keeps its caches warm and writes nothing; gaining the Lease reconciles all.
        return Ok(None);
    }
    let Some(sandbox) = writes::freshest(
        &ctx.kube,
        &ctx.kube.caches.sandboxes,
        cached,
        |s, status| {
            s.status = Some(status);
        },
    ) else {
        // Deleted since it was queued.
        return Ok(None);
    };
    let known = apply::known_pod(ctx, &sandbox);
    // A sandbox of a pool runs with the pool template's values where its spec leaves them unset (the
    // network and lifecycle defaults as its Pod recorded them when it was claimed or created).
    let recorded = match &known {
        Some(ChildState::Ours(pod)) => crate::pool::template::recorded_defaults(pod),
        _ => None,
    };
    let (sandbox, pool) =
        crate::pool::resolve(&ctx.kube.caches.sandbox_pools, &sandbox, recorded.as_ref());
    let sandbox = &sandbox;
    let namespace = sandbox.namespace().ok_or(Error::MissingField {
        kind: "Sandbox",
        field: "metadata.namespace",
    })?;
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
        // Terminal: free the pod's resources, keep the Sandbox so its status says why, until its TTL.
        apply::delete_own_pod(ctx, sandbox).await?;
        return remove_failed_at_ttl(ctx, sandbox, &previous).await;
    }

    // The placement policy gates the Pod's creation only: a sandbox whose Pod exists keeps it.
    let refused = (known.is_none() && previous.pod_name.is_none())
        .then(|| placement::check(&sandbox.spec, &ctx.pods.settings.placement).err())
        .flatten();
    // The egress policy exists before the Pod starts, and before a claim relabels a pool member into
    // its selector. Refused before anything is created: no baseline, no policy.
    let egress = if refused.is_some() {
        ChildState::Ours(())
    } else {
        crate::pod::apply::ensure_baseline(&ctx.kube, &ctx.pods, &namespace).await?;
        apply::ensure_egress_policy(ctx, sandbox, &owner).await?
    };
    let mut blocked = refused
        .map(Blocked::PlacementRefused)
        .or_else(|| blocked_by(&[&egress]));

    let mut pod = None;
    let mut pod_gone = false;
    match known {
        Some(ChildState::Ours(own)) => pod = Some(own),
        Some(other) => blocked = blocked_by(&[&other.unit()]).or(blocked),
        None if previous.pod_name.is_some() => {
            // The status names a pod the cache does not show: ask the API server before declaring it gone.
            pod = apply::fetch_own_pod(ctx, sandbox).await?;
            pod_gone = pod.is_none();
        }
        None if blocked.is_none() => {
            let mut start_cold = true;
            if let Some(pool_name) = sandbox.spec.pool.as_deref() {
                match claim_or_fallback(ctx, sandbox, &owner, pool.as_deref(), pool_name).await? {
                    PoolStep::Claimed(member) => {
                        pod = Some(*member);
                        start_cold = false;
                    }
                    PoolStep::Wait(why) => {
                        blocked = Some(why);
                        start_cold = false;
                    }
                    PoolStep::Cold => {}
                }
            }
            if start_cold {
                let defaults = pool
                    .as_deref()
                    .map(|p| crate::pool::template::defaults_of(&p.spec.template));
                let (created, refused) =
                    create_own_pod(ctx, sandbox, &owner, defaults.as_ref()).await?;
                pod = created;
                blocked = refused;
            }
        }
        None => {}
    }
    let now = Timestamp::now();
    let lifecycle = Lifecycle::of(
        &sandbox.spec,
        ctx.settings.default_ttl_seconds,
        ctx.settings.default_heartbeat_timeout_seconds,
    );
    if let Err(problem) = annotated_heartbeat(sandbox, now) {
        warn!(sandbox = %object_key(sandbox), %problem, "heartbeat annotation ignored");
    }
    let waiting = matches!(
        blocked,
        Some(Blocked::PreviousIncarnation(_) | Blocked::Pool { .. })
    );
    let over_quota = matches!(blocked, Some(Blocked::QuotaExceeded(_)));
    let observed = Observed {
        pod: pod.as_ref(),
        pod_gone,
        now,
        lifecycle,
        startup_timeout_seconds: ctx.settings.startup_timeout_seconds,
        agent_port: ctx.pods.settings.pod.agent_port,
        blocked,
        key: &ctx.kube.key,
    };
    let status = desired_status(sandbox, &observed);
    if status.ready_time.is_some()
        && previous.ready_time.is_none()
        && let Some(member) = pod.as_ref().filter(|p| is_claimed_member(sandbox, p))
    {
        // Commands must see the sandbox's name from the first one on.
        announce_identity(ctx, sandbox, member).await?;
    }
    let created = sandbox.meta().creation_timestamp.as_ref().map(|t| t.0);
    if sandbox.status.as_ref() != Some(&status)
        && let Some(wait) = hold_back_transient(
            sandbox.status.as_ref(),
            &status,
            created,
            now,
            ctx.settings.status_coalesce,
            first_status_can_wait(sandbox, &ctx.kube.key),
        )
    {
        // A young sandbox usually becomes Ready within the window: write once, then.
        let wait = if waiting {
            wait.min(PREVIOUS_INCARNATION_RECHECK)
        } else if over_quota {
            wait.min(QUOTA_RECHECK)
        } else {
            wait
        };
        return Ok(Some(wait));
    }
    if sandbox.status.as_ref() != Some(&status) {
        let written = writes::write_status(
            &ctx.kube,
            &ctx.kube.caches.sandboxes,
            sandbox,
            sandbox.status.as_ref(),
            &status,
        )
        .await?;
        if written == StatusWrite::Gone {
            // Deleted (and perhaps recreated) since the cache showed it: its events bring us back.
            return Ok(None);
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
        apply::delete_own_pod(ctx, sandbox).await?;
        return remove_failed_at_ttl(ctx, sandbox, &status).await;
    }
    if waiting {
        return Ok(Some(PREVIOUS_INCARNATION_RECHECK));
    }
    if over_quota {
        return Ok(Some(QUOTA_RECHECK));
    }

    let ready_time = status.ready_time.as_ref().map(|t| t.0);
    let heartbeat = status
        .last_heartbeat_time
        .as_ref()
        .map(|t| t.0)
        .or(ready_time);
    if let Some((deadline, cause)) = expiry_deadline(ready_time, heartbeat, lifecycle) {
        if now >= deadline {
            let late = now.duration_since(deadline).as_secs_f64().max(0.0);
            ctx.kube
                .metrics
                .expiry_lateness
                .with_label_values(&[cause.as_str()])
                .observe(late);
            expire(ctx, sandbox, &status, cause.as_str(), now).await?;
            return Ok(None);
        }
        return Ok(Some(until(now, deadline).min(ctx.kube.resync)));
    }
    // Not Ready yet: come back when the startup timeout would fail it (watch events usually come first;
    // a trajectory not scheduled yet has no startup deadline, its pod's scheduling wakes it).
    let Some(started) = startup_clock(sandbox, pod.as_ref(), &ctx.kube.key) else {
        return Ok(Some(ctx.kube.resync));
    };
    let startup_deadline = started
        .saturating_add(k8s_openapi::jiff::SignedDuration::from_secs(
            ctx.settings.startup_timeout_seconds,
        ))
        .unwrap_or(now);
    // A sandbox still waiting for its NetworkPolicies says so once that has lasted too long.
    let next = pod
        .as_ref()
        .and_then(policy_warning_at)
        .filter(|at| *at > now)
        .map_or(startup_deadline, |at| at.min(startup_deadline));
    Ok(Some(until(now, next).min(ctx.kube.resync)))
}

/// Creates the sandbox's own Pod (recording `defaults`, its pool template's network and lifecycle, for
/// a cold start from a pool); a refusal that is not an error becomes the returned block (Pod Security
/// admission, a full quota, the name held by another object).
async fn create_own_pod(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    owner: &OwnerReference,
    defaults: Option<&crate::pool::template::PoolDefaults>,
) -> Result<(Option<Pod>, Option<Blocked>)> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let credentials = crate::pod::token::credentials(
        &ctx.kube.key,
        &namespace,
        &pod_name(&sandbox.name_any()),
        &new_nonce(),
    );
    let mut desired = desired_pod(
        sandbox,
        owner,
        &ctx.pods.pod_shape(),
        &credentials,
        &ctx.kube.key,
    );
    if let Some(defaults) = defaults {
        crate::pool::template::record_defaults(&mut desired, defaults);
    }
    match apply::create_pod(ctx, sandbox, &desired).await {
        Ok(ChildState::Ours(created)) => Ok((Some(created), None)),
        Ok(other) => Ok((None, blocked_by(&[&other.unit()]))),
        Err(Error::Kube(kube::Error::Api(status))) => {
            if let Some(why) = admission_rejection(status.code, &status.message) {
                Ok((None, Some(Blocked::PodRejected(why))))
            } else if let Some(why) = quota_refusal(status.code, &status.message) {
                Ok((None, Some(Blocked::QuotaExceeded(why))))
            } else {
                Err(Error::Kube(kube::Error::Api(status)))
            }
        }
        Err(err) => Err(err),
    }
}

/// A standalone Failed sandbox is deleted when its TTL ends ([`failed_deadline`]); until then the
/// reconcile comes back at that time. An Expired one was deleted already, and a RolloutGroup's
/// trajectories are removed by their group.
async fn remove_failed_at_ttl(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    status: &SandboxStatus,
) -> Result<Option<Duration>> {
    if status.phase != Some(SandboxPhase::Failed)
        || rollout_group_of(sandbox, &ctx.kube.key).is_some()
    {
        return Ok(None);
    }
    let now = Timestamp::now();
    let lifecycle = Lifecycle::of(
        &sandbox.spec,
        ctx.settings.default_ttl_seconds,
        ctx.settings.default_heartbeat_timeout_seconds,
    );
    let created = sandbox
        .meta()
        .creation_timestamp
        .as_ref()
        .map_or(now, |t| t.0);
    let ready = status.ready_time.as_ref().map(|t| t.0);
    let deadline = failed_deadline(created, ready, lifecycle);
    if now < deadline {
        return Ok(Some(until(now, deadline).min(ctx.kube.resync)));
    }
    apply::delete_sandbox(ctx, sandbox).await?;
    ctx.kube
        .metrics
        .expirations
        .with_label_values(&["ttl"])
        .inc();
    info!(sandbox = %object_key(sandbox), "failed sandbox deleted at its ttl");
    let note = "the ttl deadline passed; the failed sandbox was deleted".to_string();
    publish(&ctx.kube, sandbox, EventType::Normal, "Expired", note).await;
    Ok(None)
}

/// Ends an expired sandbox. A standalone sandbox is deleted. A trajectory of a RolloutGroup keeps its
/// Sandbox object (phase Expired, with an aborted result if it had none) so the group cannot lose its
/// outcome; only its pod is deleted, and the group's cleanup removes the object.
async fn expire(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    status: &SandboxStatus,
    cause: &str,
    now: Timestamp,
) -> Result<()> {
    let in_group = rollout_group_of(sandbox, &ctx.kube.key).is_some();
    if in_group || (is_trajectory(sandbox, &ctx.kube.key) && status.result.is_none()) {
        let mut expired = expired_status(sandbox, cause, now);
        if expired.result.is_none() {
            expired.result = Some(aborted(
                "Expired",
                format!("the sandbox reached its {cause} deadline before the trajectory finished"),
                None,
            ));
        }
        writes::write_status(
            &ctx.kube,
            &ctx.kube.caches.sandboxes,
            sandbox,
            Some(status),
            &expired,
        )
        .await?;
    }
    if in_group {
        apply::delete_own_pod(ctx, sandbox).await?;
    } else {
        apply::delete_sandbox(ctx, sandbox).await?;
    }
    ctx.kube
        .metrics
        .expirations
        .with_label_values(&[cause])
        .inc();
    info!(sandbox = %object_key(sandbox), cause, in_group, "sandbox expired");
    let note = if in_group {
        format!("the {cause} deadline passed; pod deleted, the RolloutGroup removes the sandbox")
    } else {
        format!("the {cause} deadline passed; sandbox deleted")
    };
    publish(&ctx.kube, sandbox, EventType::Normal, "Expired", note).await;
    Ok(())
}

async fn report_transition(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    previous: &SandboxStatus,
    status: &SandboxStatus,
    now: Timestamp,
) {
    let ready_reason = |s: &SandboxStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == crate::sandbox::status::condition::READY)
            .map(|c| c.reason.clone())
    };
    let missing = Some(POLICY_ENFORCEMENT_MISSING.to_string());
    if ready_reason(status) == missing && ready_reason(previous) != missing {
        let message = status
            .conditions
            .iter()
            .find(|c| c.type_ == crate::sandbox::status::condition::READY)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        warn!(sandbox = %object_key(sandbox), %message, "sandbox waits for NetworkPolicies nobody enforces");
        publish(
            &ctx.kube,
            sandbox,
            EventType::Warning,
            POLICY_ENFORCEMENT_MISSING,
            message,
        )
        .await;
    }
    if previous.phase == status.phase {
        return;
    }
    match status.phase {
        Some(SandboxPhase::Ready) if previous.ready_time.is_none() => {
            if let Some(created) = sandbox.meta().creation_timestamp.as_ref() {
                let seconds = now.duration_since(created.0).as_secs_f64().max(0.0);
                ctx.kube.metrics.sandbox_ready_seconds.observe(seconds);
            }
            // No event: the Ready condition's transition time says it, and an event would be one
            // more API write per sandbox (docs/CONTROLLER.md, "API calls per sandbox").
            info!(sandbox = %object_key(sandbox), endpoint = status.agent_endpoint.as_deref().unwrap_or(""), "sandbox ready");
        }
        Some(SandboxPhase::Failed) => {
            let reason = status.reason.clone().unwrap_or_else(|| "Failed".into());
            ctx.kube
                .metrics
                .sandbox_failures
                .with_label_values(&[reason.as_str()])
                .inc();
            let message = status.message.clone().unwrap_or_default();
            warn!(sandbox = %object_key(sandbox), %reason, %message, "sandbox failed");
            publish(&ctx.kube, sandbox, EventType::Warning, &reason, message).await;
        }
        _ => {}
    }
}
