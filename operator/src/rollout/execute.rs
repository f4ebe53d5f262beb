//! The I/O half of a RolloutGroup reconcile: carry out what `decide` planned (trajectory creates,
//! the queue's question, a failure, a status and what follows it) through the thin write layer of
//! `apply` and the queues' book, and report the answers the next decision needs.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::apply::{create_trajectory, delete_children, delete_superseded};
use super::decide::{AdmissionEvent, Completion, Failure, Launch, QueueVerdict, Record, Stride};
use super::observe::Observation;
use crate::plumbing::error::Result;
use crate::plumbing::events::publish;
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::metrics::RETRY_KIND_TRAJECTORY;
use crate::plumbing::writes::{self, ChildState, StatusWrite};
use crate::queue::admission;
use crate::queue::book::QueueKey;
use crate::rollout::context::RolloutCtx;
use orchard_api::RolloutGroup;

/// Creates the trajectories `launches` of `group` and records those it got in `observation`;
/// returns the names it could not get (waits and conflicts). With `queue`, each name is reserved
/// first: its stride was admitted before (the rest of a stride a crash left short, or a retry, whose
/// trajectory kept its slot).
pub async fn create(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    owner: &OwnerReference,
    queue: Option<&QueueKey>,
    launches: &[Launch],
    observation: &mut Observation,
) -> Result<Vec<ChildState<()>>> {
    let name = group.name_any();
    let mut blocked = Vec::new();
    for launch in launches {
        if let Some(key) = queue {
            ctx.queues
                .book
                .reserve(key, &[super::build::trajectory_name(&name, launch.index)]);
        }
        match create_trajectory(ctx, group, owner, launch).await? {
            ChildState::Ours(()) => {
                observation.record_launch(&name, launch.index, launch.stride, launch.attempt);
                if launch.attempt > 1 {
                    info!(group = %object_key(group), trajectory = %super::build::trajectory_name(&name, launch.index), attempt = launch.attempt, resources = ?launch.resources, "trajectory retried");
                }
            }
            other => blocked.push(other),
        }
    }
    Ok(blocked)
}

/// Asks `queue` to admit `group`'s `stride` (the book registers the request, or reserves the
/// stride's names when it admits it); `None` without a queue.
pub fn ask_queue(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    queue: Option<&QueueKey>,
    stride: &Stride,
    now: Timestamp,
) -> Option<QueueVerdict> {
    let key = queue?;
    let names = stride.names(&group.name_any());
    let verdict = admission::ask(&ctx.queues, group, key, &names, now);
    Some(QueueVerdict {
        key: key.clone(),
        verdict,
        limits: admission::limits(&ctx.queues, key),
    })
}

/// Launches `stride` of `group`: creates its trajectories (recording them in `observation`) and
/// tells so; returns the names it could not get.
pub async fn launch(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    owner: &OwnerReference,
    stride: &Stride,
    observation: &mut Observation,
) -> Result<Vec<ChildState<()>>> {
    let jitter = super::jitter::jitter_of(&group.spec);
    let uid = group.uid().unwrap_or_default();
    let launches = stride.jittered(&uid, jitter, Timestamp::now());
    let blocked = create(ctx, group, owner, None, &launches, observation).await?;
    let (stride_index, count) = (stride.index, stride.count);
    info!(group = %object_key(group), stride = stride_index, count, "stride launched");
    publish(
        &ctx.kube,
        group,
        EventType::Normal,
        "StrideLaunched",
        format!("stride {stride_index}: {count} trajectories"),
    )
    .await;
    Ok(blocked)
}

/// Records that the group cannot run (its Failed status).
pub async fn fail(ctx: &RolloutCtx, group: &RolloutGroup, failure: &Failure) -> Result<()> {
    writes::write_status(
        &ctx.kube,
        &ctx.kube.caches.rollout_groups,
        group,
        group.status.as_ref(),
        &failure.status,
    )
    .await?;
    Ok(())
}

/// Fails a group whose spec cannot be run.
pub async fn fail_invalid(ctx: &RolloutCtx, group: &RolloutGroup, failure: &Failure) -> Result<()> {
    fail(ctx, group, failure).await?;
    let message = &failure.message;
    warn!(group = %object_key(group), %message, "rolloutgroup cannot run");
    Ok(())
}

/// Fails a group a trajectory's name is held for by an object not its own.
pub async fn fail_conflict(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    failure: &Failure,
) -> Result<()> {
    fail(ctx, group, failure).await?;
    let conflict = failure.message.clone();
    warn!(group = %object_key(group), %conflict, "rolloutgroup cannot launch a trajectory");
    publish(
        &ctx.kube,
        group,
        EventType::Warning,
        failure.reason,
        conflict,
    )
    .await;
    Ok(())
}

/// Carries out `record` for `group`; returns when to reconcile again.
pub async fn record(
    ctx: &RolloutCtx,
    group: &RolloutGroup,
    record: Record,
) -> Result<Option<std::time::Duration>> {
    if let Some(event) = record.admission_event {
        report_admission(ctx, group, event).await;
    }
    let written = writes::write_status(
        &ctx.kube,
        &ctx.kube.caches.rollout_groups,
        group,
        group.status.as_ref(),
        &record.status,
    )
    .await?;
    if written == StatusWrite::Gone {
        // Deleted (and perhaps recreated) since the cache showed it: its events bring us back.
        return Ok(None);
    }
    for label in record.new_outcomes {
        ctx.kube
            .metrics
            .bar_trajectories
            .with_label_values(&[label])
            .inc();
    }
    for super::decide::Retried { reason, message } in record.retries {
        ctx.kube
            .metrics
            .retries
            .with_label_values(&[RETRY_KIND_TRAJECTORY, reason.as_str()])
            .inc();
        info!(group = %object_key(group), retry = %message, "trajectory attempt ended, retrying");
        publish(
            &ctx.kube,
            group,
            EventType::Normal,
            "TrajectoryRetry",
            message,
        )
        .await;
    }
    delete_superseded(ctx, group, &record.superseded).await?;
    if let Some(completion) = record.completion {
        complete(ctx, group, completion).await;
    }
    if let Some(targets) = &record.delete {
        delete_children(ctx, group, targets).await?;
    }
    Ok(Some(record.requeue))
}

/// Tells that the group completed: metrics, a log line, an Event.
async fn complete(ctx: &RolloutCtx, group: &RolloutGroup, completion: Completion) {
    let Completion {
        selection,
        positives,
        launched,
        seconds,
        message,
    } = completion;
    let metrics = &ctx.kube.metrics;
    metrics.bar_groups.with_label_values(&[selection]).inc();
    metrics.bar_launched_per_group.observe(f64::from(launched));
    if let Some(seconds) = seconds {
        metrics
            .bar_group_duration
            .with_label_values(&[selection])
            .observe(seconds);
    }
    info!(group = %object_key(group), selection, positives, launched, "group complete");
    publish(&ctx.kube, group, EventType::Normal, "Complete", message).await;
}

/// The Event of a change in the queue's answer.
async fn report_admission(ctx: &RolloutCtx, group: &RolloutGroup, event: AdmissionEvent) {
    let kind = if event.warning {
        EventType::Warning
    } else {
        EventType::Normal
    };
    publish(&ctx.kube, group, kind, &event.reason, event.message).await;
}
