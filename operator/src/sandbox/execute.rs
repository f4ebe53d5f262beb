//! The I/O half of a Sandbox reconcile: carry out a [`ChildPlan`] and a [`Settle`] (see `decide`),
//! through the thin write layer of `apply` and the claim of a pool member (`claim`).

use crate::plumbing::cached_pod::CachedPod;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::apply;
use super::blocked::Blocked;
use super::claim::{PoolStep, announce_identity, claim_or_fallback};
use super::context::SandboxCtx;
use super::decide::{
    ChildOutcome, ChildPlan, Expiry, Note, PodStep, Removal, Settle, blocked_by, expiry,
    failed_removal,
};
use super::expiry::ExpiryCause;
use super::refusals::{admission_rejection, quota_refusal};
use super::runner;
use crate::plumbing::error::{Error, Result};
use crate::plumbing::events::publish;
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::metrics::RETRY_KIND_SANDBOX;
use crate::plumbing::writes::{self, ChildState, StatusWrite};
use crate::pod::naming::{attempt, own_pod_name_of};
use crate::pod::spec::desired_pod;
use crate::pod::token::new_nonce;
use crate::pool::template::{PoolDefaults, defaults_of, record_defaults};
use crate::retry::RetryParams;
use crate::sandbox::retry::as_attempt;
use orchard_api::{Sandbox, SandboxPool, SandboxStatus};

/// Carries out `plan` for `sandbox` (whose Pod the operator knows as `known`; `pool` is the pool it
/// names, if that exists; `retry` its retry policy): the policies first, then the Pod.
pub async fn ensure_children(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    owner: &OwnerReference,
    pool: Option<&SandboxPool>,
    known: Option<ChildState<CachedPod>>,
    plan: &ChildPlan,
    retry: Option<&RetryParams>,
) -> Result<ChildOutcome> {
    let step = match plan {
        ChildPlan::Terminal => return Ok(ChildOutcome::default()),
        ChildPlan::Refused(why) => {
            // Refused before anything is created: no baseline, no policy.
            return Ok(ChildOutcome {
                blocked: Some(why.clone()),
                ..ChildOutcome::default()
            });
        }
        ChildPlan::Ensure { pod } => pod,
    };
    let namespace = sandbox.namespace().unwrap_or_default();
    crate::pod::apply::ensure_baseline(&ctx.kube, &ctx.pods, &namespace).await?;
    let egress = apply::ensure_egress_policy(ctx, sandbox, owner).await?;
    let mut outcome = ChildOutcome {
        blocked: blocked_by(&[&egress]),
        ..ChildOutcome::default()
    };
    match step {
        PodStep::Known => {
            if let Some(ChildState::Ours(pod)) = known {
                outcome.pod = Some(pod);
            }
        }
        PodStep::Blocked(why) => outcome.blocked = Some(why.clone()),
        PodStep::Fetch => {
            outcome.pod = apply::fetch_own_pod(ctx, sandbox)
                .await?
                .map(|pod| CachedPod::from(&pod));
            if outcome.pod.is_none() {
                outcome.pod_gone = Some(apply::gone_failure(ctx, sandbox).await);
            }
        }
        PodStep::Start if outcome.blocked.is_none() => {
            match super::decide::launch_wait(sandbox, &ctx.kube.key, Timestamp::now()) {
                Some(at) => outcome.blocked = Some(Blocked::LaunchJitter(at)),
                None => {
                    (outcome.pod, outcome.blocked) =
                        start_pod(ctx, sandbox, owner, pool, retry).await?
                }
            }
        }
        PodStep::Start => {}
    }
    Ok(outcome)
}

/// The Pod of a sandbox that has none: a claimed member of its pool, or its own, started cold; or
/// why it waits. A later attempt of a retried sandbox (`spec.retry`) removes the Pods of the earlier
/// ones and starts its own, with the resources its retry gives it.
async fn start_pod(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    owner: &OwnerReference,
    pool: Option<&SandboxPool>,
    retry: Option<&RetryParams>,
) -> Result<(Option<CachedPod>, Option<Blocked>)> {
    let defaults = pool.map(|p| defaults_of(&p.spec.template));
    if attempt(sandbox) > 1 {
        apply::delete_previous_attempts(ctx, sandbox).await?;
        let next = as_attempt(sandbox, retry);
        return create_own_pod(ctx, &next, owner, defaults.as_ref()).await;
    }
    if let Some(pool_name) = sandbox.spec.pool.as_deref() {
        match claim_or_fallback(ctx, sandbox, owner, pool, pool_name).await? {
            PoolStep::Claimed(member) => return Ok((Some(CachedPod::from(&*member)), None)),
            PoolStep::Wait(why) => return Ok((None, Some(why))),
            PoolStep::Cold => {}
        }
    }
    create_own_pod(ctx, sandbox, owner, defaults.as_ref()).await
}

/// Creates the sandbox's own Pod (recording `defaults`, its pool template's network and lifecycle, for
/// a cold start from a pool); a refusal that is not an error becomes the returned block (Pod Security
/// admission, a full quota, the name held by another object).
async fn create_own_pod(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    owner: &OwnerReference,
    defaults: Option<&PoolDefaults>,
) -> Result<(Option<CachedPod>, Option<Blocked>)> {
    let namespace = sandbox.namespace().unwrap_or_default();
    let credentials = crate::pod::token::credentials(
        &ctx.kube.key,
        &namespace,
        &own_pod_name_of(sandbox),
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
        record_defaults(&mut desired, defaults);
    }
    match apply::create_pod(ctx, sandbox, &desired).await {
        Ok(ChildState::Ours(created)) => Ok((Some(CachedPod::from(&created)), None)),
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

/// Carries out `settle` for `sandbox` whose Pod is `pod`; returns when to reconcile again.
pub async fn settle(
    ctx: &Arc<SandboxCtx>,
    sandbox: &Sandbox,
    pod: Option<&CachedPod>,
    settle: Settle,
) -> Result<Option<std::time::Duration>> {
    if settle.announce_identity
        && let Some(member) = pod
    {
        // Commands must see the sandbox's name from the first one on.
        announce_identity(ctx, sandbox, member).await?;
    }
    if settle.write {
        let written = writes::write_status(
            &ctx.kube,
            &ctx.kube.caches.sandboxes,
            sandbox,
            sandbox.status.as_ref(),
            &settle.status,
        )
        .await?;
        if written == StatusWrite::Gone {
            // Deleted (and perhaps recreated) since the cache showed it: its events bring us back.
            return Ok(None);
        }
        for note in &settle.notes {
            tell(ctx, sandbox, &settle.status, note).await;
        }
    }
    if let Some(evidence) = settle.evidence.clone() {
        ctx.enforcement.observe(vec![evidence]);
    }
    if settle.run {
        let current = Sandbox {
            status: Some(settle.status.clone()),
            ..sandbox.clone()
        };
        runner::ensure_runner(ctx, &current);
    }
    match settle.then {
        super::decide::Then::Terminal => end_terminal(ctx, sandbox, &settle.status).await,
        super::decide::Then::Requeue(after) => Ok(Some(after)),
        super::decide::Then::Expire { cause, late } => {
            ctx.kube
                .metrics
                .expiry_lateness
                .with_label_values(&[cause.as_str()])
                .observe(late);
            expire(ctx, sandbox, &settle.status, cause).await?;
            Ok(None)
        }
    }
}

/// Ends a terminal sandbox's stay: its Pod is deleted at once (its resources freed), the Sandbox
/// when [`failed_removal`] says.
pub async fn end_terminal(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    status: &SandboxStatus,
) -> Result<Option<std::time::Duration>> {
    apply::delete_own_pod(ctx, sandbox).await?;
    // Its Pod on a lost node would stay (terminating) until the Node object is deleted.
    apply::remove_if_stuck_on_lost_node(ctx, sandbox).await?;
    let removal = failed_removal(
        sandbox,
        status,
        &ctx.settings,
        ctx.kube.resync,
        &ctx.kube.key,
        Timestamp::now(),
    );
    match removal {
        Removal::NotOurs => Ok(None),
        Removal::After(after) => Ok(Some(after)),
        Removal::Now => {
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
    }
}

/// Ends an expired sandbox as [`expiry`] says.
async fn expire(
    ctx: &SandboxCtx,
    sandbox: &Sandbox,
    status: &SandboxStatus,
    cause: ExpiryCause,
) -> Result<()> {
    let Expiry {
        last_status,
        pod_only,
        note,
    } = expiry(sandbox, status, cause, &ctx.kube.key, Timestamp::now());
    if let Some(last) = last_status {
        writes::write_status(
            &ctx.kube,
            &ctx.kube.caches.sandboxes,
            sandbox,
            Some(status),
            &last,
        )
        .await?;
    }
    if pod_only {
        apply::delete_own_pod(ctx, sandbox).await?;
    } else {
        apply::delete_sandbox(ctx, sandbox).await?;
    }
    let cause = cause.as_str();
    ctx.kube
        .metrics
        .expirations
        .with_label_values(&[cause])
        .inc();
    info!(sandbox = %object_key(sandbox), cause, in_group = pod_only, "sandbox expired");
    publish(&ctx.kube, sandbox, EventType::Normal, "Expired", note).await;
    Ok(())
}

/// Tells what `note` says: an Event, a log line, a metric.
async fn tell(ctx: &SandboxCtx, sandbox: &Sandbox, status: &SandboxStatus, note: &Note) {
    let metrics = &ctx.kube.metrics;
    match note {
        Note::PolicyEnforcementMissing(message) => {
            warn!(sandbox = %object_key(sandbox), %message, "sandbox waits for NetworkPolicies nobody enforces");
            let reason = super::status::POLICY_ENFORCEMENT_MISSING;
            publish(
                &ctx.kube,
                sandbox,
                EventType::Warning,
                reason,
                message.clone(),
            )
            .await;
        }
        Note::Ready(seconds) => {
            if let Some(seconds) = seconds {
                metrics.sandbox_ready_seconds.observe(*seconds);
            }
            // No event: the Ready condition's transition time says it, and an event would be one
            // more API write per sandbox (docs/CONTROLLER.md, "API calls per sandbox").
            let endpoint = status.agent_endpoint.as_deref().unwrap_or("");
            info!(sandbox = %object_key(sandbox), endpoint, "sandbox ready");
        }
        Note::Retried { reason, message } => {
            metrics
                .retries
                .with_label_values(&[RETRY_KIND_SANDBOX, reason.as_str()])
                .inc();
            info!(sandbox = %object_key(sandbox), %reason, %message, "sandbox pod lost, retrying");
            publish(
                &ctx.kube,
                sandbox,
                EventType::Normal,
                "SandboxRetry",
                message.clone(),
            )
            .await;
        }
        Note::Failed { reason, message } => {
            metrics
                .sandbox_failures
                .with_label_values(&[reason.as_str()])
                .inc();
            warn!(sandbox = %object_key(sandbox), %reason, %message, "sandbox failed");
            publish(
                &ctx.kube,
                sandbox,
                EventType::Warning,
                reason,
                message.clone(),
            )
            .await;
        }
    }
}
