//! One RolloutGroup reconcile: observe progress from the group's status and its child Sandboxes,
//! finish an interrupted stride launch, ask the BAR engine for the next step, launch a stride or record
//! the group, and clean up. Children are created before the status lists them, so a crash at any point
//! neither launches a stride twice nor forgets one. Only children sealed for the group's UID count: a
//! group recreated under an old name never sees its predecessor's trajectories, and a Sandbox somebody
//! else made with a controller reference to the group is never counted, adopted or deleted (under a
//! trajectory name it fails the group with `NameConflict`).
//!
//! This file only orchestrates: observe (`apply::observe`), decide (`decide`: four pure decisions,
//! because what the creates and the queue answer shapes the next one) and execute (`execute`).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::instrument;

use super::apply::{delete_children, observe};
use super::decide::{
    Entry, Next, StatusInput, StatusPlan, admit, plan_entry, plan_repair, plan_status, plan_step,
    unasked,
};
use super::execute;
use super::observe::deadline_of;
use crate::plumbing::error::{Error, Result};
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::reconcile::Reconcile;
use crate::queue::admission::queue_of;
use crate::rollout::context::RolloutCtx;
use orchard_api::RolloutGroup;

/// Controller name used in metrics and logs.
pub const CONTROLLER: &str = "rolloutgroup";

fn reconciler(ctx: &RolloutCtx) -> Reconcile<'_, RolloutGroup> {
    Reconcile {
        kube: &ctx.kube,
        controller: CONTROLLER,
        store: &ctx.kube.caches.rollout_groups,
        slots: Some(&ctx.slots),
    }
}

/// Reconciles one RolloutGroup.
#[instrument(skip_all, fields(group = %object_key(group.as_ref())))]
pub async fn reconcile(group: Arc<RolloutGroup>, ctx: Arc<RolloutCtx>) -> Result<Action> {
    reconciler(&ctx)
        .run(&group, Box::pin(reconcile_inner(&group, &ctx)))
        .await
}

/// Retries a failed reconcile with per-object exponential backoff.
pub fn error_policy(group: Arc<RolloutGroup>, error: &Error, ctx: Arc<RolloutCtx>) -> Action {
    reconciler(&ctx).retry(&group, error)
}

/// Returns when to reconcile again (`None`: on the next change only).
async fn reconcile_inner(queued: &RolloutGroup, ctx: &Arc<RolloutCtx>) -> Result<Option<Duration>> {
    let Some(group) = reconciler(ctx).fresh(queued, |g: &mut RolloutGroup, status| {
        g.status = Some(status);
    }) else {
        return Ok(None);
    };
    let group = &group;
    group.namespace().ok_or(Error::MissingField {
        kind: "RolloutGroup",
        field: "metadata.namespace",
    })?;
    let now = Timestamp::now();
    let (params, retry) = match plan_entry(group, &ctx.defaults, now) {
        Entry::Cleanup(targets) => {
            delete_children(ctx, group, &targets).await?;
            return Ok(Some(ctx.kube.resync));
        }
        Entry::Invalid(failure) => {
            execute::fail_invalid(ctx, group, &failure).await?;
            return Ok(None);
        }
        Entry::Failed => return Ok(None),
        Entry::Run(params, retry) => (params, retry.map(|r| *r)),
    };
    let owner = group.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: "RolloutGroup",
        field: "metadata.uid",
    })?;

    let mut observation = observe(ctx, group, retry.as_ref()).await?;
    let queue = queue_of(group);
    let repair = plan_repair(&observation, &params, retry.as_ref());
    let mut blocked = execute::create(
        ctx,
        group,
        &owner,
        queue.as_ref(),
        &repair,
        &mut observation,
    )
    .await?;

    let previous_start = group.status.as_ref().and_then(|s| s.start_time.as_ref());
    let deadline = deadline_of(&group.spec, previous_start.map(|t| t.0));
    let next = plan_step(&params, &mut observation, deadline, now);
    let admission = match &next {
        Next::Launch(stride) => {
            let verdict = execute::ask_queue(ctx, group, queue.as_ref(), stride, now);
            let admission = admit(stride, verdict);
            if admission.launch {
                blocked
                    .extend(execute::launch(ctx, group, &owner, stride, &mut observation).await?);
            }
            admission
        }
        Next::Wait | Next::Finish(_) => unasked(queue.is_some()),
    };
    if let Some(key) = &queue
        && admission.withdraw
    {
        ctx.queues
            .book
            .withdraw(key, &group.uid().unwrap_or_default());
    }

    let decision = match &next {
        Next::Finish(decision) => Some(decision),
        Next::Wait | Next::Launch(_) => None,
    };
    let input = StatusInput {
        params: &params,
        retry: retry.as_ref(),
        queued: queue.is_some(),
        deadline,
        resync: ctx.kube.resync,
        now,
    };
    let plan = plan_status(
        group,
        &observation,
        decision,
        &admission.standing,
        &blocked,
        &input,
    );
    match plan {
        StatusPlan::Conflict(failure) => {
            execute::fail_conflict(ctx, group, &failure).await?;
            Ok(None)
        }
        StatusPlan::Record(record) => execute::record(ctx, group, *record).await,
    }
}
