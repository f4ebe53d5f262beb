//! One RolloutGroup reconcile: observe progress from the group's status and its child Sandboxes,
//! finish an interrupted stride launch, ask the BAR engine for the next step, launch a stride or record
//! the group, and clean up. Children are created before the status lists them, so a crash at any point
//! neither launches a stride twice nor forgets one. Only children sealed for the group's UID count: a
//! group recreated under an old name never sees its predecessor's trajectories, and a Sandbox somebody
//! else made with a controller reference to the group is never counted, adopted or deleted (under a
//! trajectory name it fails the group with `NameConflict`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{info, instrument, warn};

use super::apply::{children_of, cleanup, confirm_gone, create_trajectory, release_finished};
use super::build::trajectory_name;
use super::observe::{DEADLINE_EXCEEDED, deadline_of, observe};
use super::params::bar_params;
use super::status::{ADMITTED as ADMITTED_CONDITION, QueueStanding, failed_status, group_status};
use crate::plumbing::error::{Error, Result};
use crate::plumbing::events::publish;
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::reconcile::Reconcile;
use crate::plumbing::writes::{self, ChildState, StatusWrite};
use crate::queue::admission::{self, queue_of, waiting_message};
use crate::queue::book::Verdict;
use crate::rollout::context::RolloutCtx;
use orchard_api::{
    CleanupPolicy, RolloutGroup, RolloutGroupStatus, RolloutPhase, TrajectoryStatus,
};
use orchard_bar::{Progress, Step, decide, next_step};

/// Controller name used in metrics and logs.
pub const CONTROLLER: &str = "rolloutgroup";

/// How often a group waiting for a previous group's trajectories to be removed looks again, in case
/// the watch misses their deletion (it wakes the reconcile first in the normal case).
const PREVIOUS_INCARNATION_RECHECK: Duration = Duration::from_secs(1);

/// How often a group whose stride waits for its queue looks again (to refresh its position; the queue
/// loop wakes it as soon as the stride is admissible).
const QUEUE_RECHECK: Duration = Duration::from_secs(5);

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
        .run(&group, reconcile_inner(&group, &ctx))
        .await
}

/// Retries a failed reconcile with per-object exponential backoff.
pub fn error_policy(group: Arc<RolloutGroup>, error: &Error, ctx: Arc<RolloutCtx>) -> Action {
    reconciler(&ctx).retry(&group, error)
}

/// Records that the group cannot run (phase Failed, `reason`, `message`).
async fn fail(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Result<()> {
    let status = failed_status(group, reason, message.to_string(), now);
    let current = group.status.as_ref();
    writes::write_status(
        &ctx.kube,
        &ctx.kube.caches.rollout_groups,
        group,
        current,
        &status,
    )
    .await?;
    Ok(())
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
    let name = group.name_any();
    let previous = group.status.clone().unwrap_or_default();
    let now = Timestamp::now();

    if previous.phase == Some(RolloutPhase::Complete) {
        cleanup(ctx, group, &previous).await?;
        return Ok(Some(ctx.kube.resync));
    }
    let params = match bar_params(&group.spec) {
        Ok(params) => params,
        Err(message) => {
            fail(ctx, group, "InvalidSpec", &message, now).await?;
            warn!(group = %object_key(group), %message, "rolloutgroup cannot run");
            return Ok(None);
        }
    };
    if previous.phase == Some(RolloutPhase::Failed) {
        return Ok(None);
    }
    let owner = group.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: "RolloutGroup",
        field: "metadata.uid",
    })?;

    let children = children_of(ctx, group);
    let mut observation = observe(&name, &previous, &children, &BTreeSet::new());
    if !observation.unseen.is_empty() {
        let gone = confirm_gone(ctx, group, &observation.unseen).await?;
        if !gone.is_empty() {
            observation = observe(&name, &previous, &children, &gone);
        }
    }
    let queue = queue_of(group);
    let uid = group.uid().unwrap_or_default();
    let mut blocked = Vec::new();
    // A crash between creating a stride's children, or a name still held by a previous group's
    // trajectory, may have left the latest stride short: finish it. Its queue admitted it before.
    for (index, stride) in observation.incomplete_latest_stride(params.stride) {
        if let Some(key) = &queue {
            ctx.queues
                .book
                .reserve(key, &[trajectory_name(&name, index)]);
        }
        blocked
            .extend(create_trajectory(ctx, group, &owner, index, stride, &mut observation).await?);
    }

    let deadline = deadline_of(&group.spec, previous.start_time.as_ref().map(|t| t.0));
    let mut standing = if queue.is_some() {
        QueueStanding::Unchanged
    } else {
        QueueStanding::NoQueue
    };
    let decision = if deadline.is_some_and(|at| now >= at) {
        // The group's own deadline: what has not finished is aborted and the group is decided from
        // what it has, as if its budget were spent.
        observation.abort_unfinished(DEADLINE_EXCEEDED);
        Some(decide(&params, &observation.pool()))
    } else {
        let pool = observation.pool();
        let step = next_step(
            &params,
            &Progress {
                launched: observation.launched(),
                terminal: &pool,
            },
        );
        match step {
            Step::LaunchStride {
                stride_index,
                count,
            } => {
                let first = stride_index * params.stride;
                let names: Vec<String> = (first..first + count)
                    .map(|index| trajectory_name(&name, index))
                    .collect();
                let admitted = match &queue {
                    None => true,
                    Some(key) => match admission::ask(&ctx.queues, group, key, &names, now) {
                        Verdict::Admitted { .. } => {
                            standing = QueueStanding::Admitted {
                                queue: key.name.clone(),
                                stride: stride_index,
                            };
                            true
                        }
                        Verdict::Waiting {
                            reason,
                            position,
                            since,
                            used,
                        } => {
                            let limits = admission::limits(&ctx.queues, key);
                            standing = QueueStanding::Waiting {
                                reason: reason.as_str(),
                                position,
                                since,
                                message: waiting_message(
                                    key,
                                    stride_index,
                                    count,
                                    reason,
                                    position,
                                    used,
                                    limits,
                                ),
                            };
                            false
                        }
                    },
                };
                if admitted {
                    for index in first..first + count {
                        blocked.extend(
                            create_trajectory(
                                ctx,
                                group,
                                &owner,
                                index,
                                stride_index,
                                &mut observation,
                            )
                            .await?,
                        );
                    }
                    info!(group = %object_key(group), stride = stride_index, count, "stride launched");
                    publish(
                        &ctx.kube,
                        group,
                        EventType::Normal,
                        "StrideLaunched",
                        format!("stride {stride_index}: {count} trajectories"),
                    )
                    .await;
                }
                None
            }
            Step::Wait => None,
            Step::Finish(decision) => Some(decision),
        }
    };
    if let Some(key) = &queue
        && !matches!(standing, QueueStanding::Waiting { .. })
    {
        // Not (or no longer) waiting: leave the queue's waiting list.
        ctx.queues.book.withdraw(key, &uid);
    }

    if let Some(conflict) = blocked.iter().find_map(|b| match b {
        ChildState::Conflict(why) => Some(why.clone()),
        _ => None,
    }) {
        fail(ctx, group, "NameConflict", &conflict, now).await?;
        warn!(group = %object_key(group), %conflict, "rolloutgroup cannot launch a trajectory");
        publish(
            &ctx.kube,
            group,
            EventType::Warning,
            "NameConflict",
            conflict,
        )
        .await;
        return Ok(None);
    }
    let status = group_status(
        group,
        &observation,
        decision.as_ref(),
        params.stride,
        &standing,
        now,
    );
    report_admission(ctx, group, group.status.as_ref(), &status).await;
    let written = writes::write_status(
        &ctx.kube,
        &ctx.kube.caches.rollout_groups,
        group,
        group.status.as_ref(),
        &status,
    )
    .await?;
    if written == StatusWrite::Gone {
        // Deleted (and perhaps recreated) since the cache showed it: its events bring us back.
        return Ok(None);
    }
    count_new_outcomes(ctx, &previous, &status);
    if let Some(decision) = decision {
        ctx.kube
            .metrics
            .bar_groups
            .with_label_values(&[decision.selection.as_str()])
            .inc();
        ctx.kube
            .metrics
            .bar_launched_per_group
            .observe(f64::from(observation.launched()));
        if let Some(created) = group.metadata.creation_timestamp.as_ref() {
            ctx.kube
                .metrics
                .bar_group_duration
                .with_label_values(&[decision.selection.as_str()])
                .observe(now.duration_since(created.0).as_secs_f64().max(0.0));
        }
        let message = status.message.clone().unwrap_or_default();
        info!(group = %object_key(group), selection = decision.selection.as_str(), positives = decision.positives, launched = observation.launched(), "group complete");
        publish(&ctx.kube, group, EventType::Normal, "Complete", message).await;
        cleanup(ctx, group, &status).await?;
        return Ok(Some(ctx.kube.resync));
    }
    if queue.is_some() && group.spec.cleanup == CleanupPolicy::Delete {
        // On a queue a finished trajectory's Sandbox (and Pod) would hold its slot until the group
        // completes: its outcome is in the status just written, so it goes now.
        release_finished(ctx, group, &status).await?;
    }
    if !blocked.is_empty() {
        return Ok(Some(PREVIOUS_INCARNATION_RECHECK));
    }
    let mut next = ctx.kube.resync;
    if matches!(standing, QueueStanding::Waiting { .. }) {
        next = next.min(QUEUE_RECHECK);
    }
    if let Some(at) = deadline {
        let left = Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO);
        next = next.min(left + Duration::from_millis(1));
    }
    Ok(Some(next))
}

fn count_new_outcomes(
    ctx: &RolloutCtx,
    previous: &RolloutGroupStatus,
    status: &RolloutGroupStatus,
) {
    for record in &status.trajectories {
        let Some(outcome) = record.status else {
            continue;
        };
        let known = previous
            .trajectories
            .iter()
            .any(|p| p.name == record.name && p.status.is_some());
        if !known {
            let label = match outcome {
                TrajectoryStatus::Completed => "completed",
                TrajectoryStatus::Truncated => "truncated",
                TrajectoryStatus::Aborted => "aborted",
            };
            ctx.kube
                .metrics
                .bar_trajectories
                .with_label_values(&[label])
                .inc();
        }
    }
}

/// An event when the queue's answer to the group changes (the `Admitted` condition's reason): admitted
/// (a stride may launch), queued (with its position), or refused (no such queue, a stride larger
/// than the queue).
async fn report_admission(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    previous: Option<&RolloutGroupStatus>,
    status: &RolloutGroupStatus,
) {
    let admitted = |s: &RolloutGroupStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == ADMITTED_CONDITION)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let Some((reason, message)) = admitted(status) else {
        return;
    };
    if previous.and_then(admitted).map(|(r, _)| r) == Some(reason.clone()) {
        return;
    }
    let kind = if matches!(reason.as_str(), "Admitted" | "Queued") {
        EventType::Normal
    } else {
        EventType::Warning
    };
    publish(&ctx.kube, group, kind, &reason, message).await;
}
