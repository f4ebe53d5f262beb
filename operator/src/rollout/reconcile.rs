//! One RolloutGroup reconcile: observe progress from the group's status and its child Sandboxes,
//! finish an interrupted stride launch, ask the BAR engine for the next step, launch a stride or record
//! the group, and clean up. Children are created before the status lists them, so a crash at any point
//! neither launches a stride twice nor forgets one. Only children whose controller reference carries
//! the group's UID count: a group recreated under an old name never sees its predecessor's trajectories.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{info, instrument, warn};

use super::build::desired_trajectory;
use super::observe::{ChildView, Observation, observe};
use super::params::bar_params;
use super::status::{failed_status, group_status};
use crate::api::{
    CleanupPolicy, EarlyStop, RolloutGroup, RolloutGroupStatus, RolloutPhase, STRIDE_LABEL,
    Sandbox, TrajectoryRecord, TrajectoryStatus,
};
use crate::bar::{Progress, Step, next_step};
use crate::context::{Context, object_key};
use crate::error::{Error, Result};
use crate::events::publish;
use crate::metrics::ReconcileTimer;
use crate::own_writes::child_key;
use crate::ownership::{Owner, controlled_by};
use crate::writes::{
    self, ChildState, StatusWrite, cache_holds, create_child, delete_if_same, existing_state,
};

/// Controller name used in metrics and logs.
pub const CONTROLLER: &str = "rolloutgroup";

/// How often a group waiting for a previous group's trajectories to be removed looks again, in case
/// the watch misses their deletion (it wakes the reconcile first in the normal case).
const PREVIOUS_INCARNATION_RECHECK: Duration = Duration::from_secs(1);

/// Reconciles one RolloutGroup.
#[instrument(skip_all, fields(group = %object_key(group.as_ref())))]
pub async fn reconcile(group: Arc<RolloutGroup>, ctx: Arc<Context>) -> Result<Action> {
    let _slot = ctx.rollout_slots.acquire().await;
    let _timer = ReconcileTimer::start(&ctx.metrics, CONTROLLER);
    let next = reconcile_inner(&group, &ctx).await?;
    // The incarnation that holds the name now (the queued object may be an older one).
    let uid = ctx
        .caches
        .rollout_groups
        .get(&ObjectRef::from_obj(group.as_ref()))
        .and_then(|o| o.uid())
        .unwrap_or_default();
    ctx.reconciled(CONTROLLER, &uid);
    Ok(ctx.next_action(&uid, next))
}

/// Retries a failed reconcile with per-object exponential backoff.
pub fn error_policy(group: Arc<RolloutGroup>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = object_key(group.as_ref());
    let delay = ctx.reconcile_failed(CONTROLLER, &group.uid().unwrap_or_default(), error);
    warn!(group = %key, %error, retry_in_ms = delay.as_millis() as u64, "rolloutgroup reconcile failed");
    Action::requeue(delay)
}

/// The group's children as the Sandbox cache shows them: same namespace, controlled by this group's
/// UID.
fn owned_children(ctx: &Context, group: &RolloutGroup) -> Vec<Arc<Sandbox>> {
    let namespace = group.namespace().unwrap_or_default();
    let uid = group.uid().unwrap_or_default();
    ctx.caches
        .sandboxes
        .state()
        .into_iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|s| controlled_by(s.meta(), &uid))
        .collect()
}

/// What the pure observation needs of the group's children.
fn children_of(ctx: &Context, group: &RolloutGroup) -> Vec<ChildView> {
    owned_children(ctx, group)
        .into_iter()
        .map(|s| ChildView {
            name: s.name_any(),
            stride: s
                .labels()
                .get(STRIDE_LABEL)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            result: s.status.as_ref().and_then(|st| st.result.clone()),
            deleting: s.meta().deletion_timestamp.is_some(),
        })
        .collect()
}

/// Returns when to reconcile again (`None`: on the next change only).
async fn reconcile_inner(cached: &RolloutGroup, ctx: &Arc<Context>) -> Result<Option<Duration>> {
    if cached.meta().deletion_timestamp.is_some() {
        return Ok(None);
    }
    if !ctx.leadership.is_leader() {
        // A standby replica keeps its caches warm and writes nothing; gaining the Lease reconciles all.
        return Ok(None);
    }
    let Some(group) = writes::freshest(ctx, &ctx.caches.rollout_groups, cached, |g, status| {
        g.status = Some(status);
    }) else {
        // Deleted since it was queued.
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
        return Ok(Some(ctx.settings.resync));
    }
    let params = match bar_params(&group.spec) {
        Ok(params) => params,
        Err(message) => {
            let status = failed_status(group, "InvalidSpec", message.clone(), now);
            writes::write_status(
                ctx,
                &ctx.caches.rollout_groups,
                group,
                group.status.as_ref(),
                &status,
            )
            .await?;
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
    let mut blocked = Vec::new();
    // A crash between creating a stride's children, or a name still held by a previous group's
    // trajectory, may have left the latest stride short: finish it.
    for (index, stride) in observation.incomplete_latest_stride(params.stride) {
        blocked
            .extend(create_trajectory(ctx, group, &owner, index, stride, &mut observation).await?);
    }

    let pool = observation.pool();
    let step = next_step(
        &params,
        &Progress {
            launched: observation.launched(),
            terminal: &pool,
        },
    );
    let decision = match step {
        Step::LaunchStride {
            stride_index,
            count,
        } => {
            let first = stride_index * params.stride;
            for index in first..first + count {
                blocked.extend(
                    create_trajectory(ctx, group, &owner, index, stride_index, &mut observation)
                        .await?,
                );
            }
            info!(group = %object_key(group), stride = stride_index, count, "stride launched");
            publish(
                ctx,
                group,
                EventType::Normal,
                "StrideLaunched",
                format!("stride {stride_index}: {count} trajectories"),
            )
            .await;
            None
        }
        Step::Wait => None,
        Step::Finish(decision) => Some(decision),
    };

    if let Some(conflict) = blocked.iter().find_map(|b| match b {
        ChildState::Conflict(why) => Some(why.clone()),
        _ => None,
    }) {
        let status = failed_status(group, "NameConflict", conflict.clone(), now);
        writes::write_status(
            ctx,
            &ctx.caches.rollout_groups,
            group,
            group.status.as_ref(),
            &status,
        )
        .await?;
        warn!(group = %object_key(group), %conflict, "rolloutgroup cannot launch a trajectory");
        publish(ctx, group, EventType::Warning, "NameConflict", conflict).await;
        return Ok(None);
    }
    let status = group_status(group, &observation, decision.as_ref(), params.stride, now);
    let written = writes::write_status(
        ctx,
        &ctx.caches.rollout_groups,
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
        ctx.metrics
            .bar_groups
            .with_label_values(&[decision.selection.as_str()])
            .inc();
        ctx.metrics
            .bar_launched_per_group
            .observe(f64::from(observation.launched()));
        let message = status.message.clone().unwrap_or_default();
        info!(group = %object_key(group), selection = decision.selection.as_str(), positives = decision.positives, launched = observation.launched(), "group complete");
        publish(ctx, group, EventType::Normal, "Complete", message).await;
        cleanup(ctx, group, &status).await?;
    }
    if !blocked.is_empty() {
        return Ok(Some(PREVIOUS_INCARNATION_RECHECK));
    }
    Ok(Some(ctx.settings.resync))
}

/// Which of `names` are really gone (the cache may lag behind our own creates). A Sandbox under the
/// name that is not this group's counts as gone.
async fn confirm_gone(
    ctx: &Context,
    group: &RolloutGroup,
    names: &[String],
) -> Result<BTreeSet<String>> {
    let namespace = group.namespace().unwrap_or_default();
    let uid = group.uid().unwrap_or_default();
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut gone = BTreeSet::new();
    for name in names {
        if ctx
            .own_writes
            .recorded(&uid, &child_key("Sandbox", name), "create")
        {
            continue;
        }
        let ours = api
            .get_opt(name)
            .await?
            .is_some_and(|s| controlled_by(s.meta(), &uid));
        if !ours {
            gone.insert(name.clone());
        }
    }
    Ok(gone)
}

/// Creates trajectory `index` and records it as running. A name held by a previous group's trajectory
/// comes back as a wait (the stride is finished once it is gone), one held by anything else as a
/// conflict; neither object is touched.
async fn create_trajectory(
    ctx: &Context,
    group: &RolloutGroup,
    owner: &OwnerReference,
    index: u32,
    stride: u32,
    observation: &mut Observation,
) -> Result<Option<ChildState<()>>> {
    let sandbox = desired_trajectory(group, owner, index, stride);
    let namespace = group.namespace().unwrap_or_default();
    let name = sandbox.name_any();
    let uid = group.uid().unwrap_or_default();
    let key = child_key("Sandbox", &name);
    let as_owner = Owner {
        kind: "RolloutGroup",
        name: group.meta().name.as_deref().unwrap_or_default(),
        uid: &uid,
    };
    let cached = ctx
        .caches
        .sandboxes
        .get(&ObjectRef::new(&name).within(&namespace));
    let state = match cached {
        Some(existing) => existing_state((*existing).clone(), as_owner).unit(),
        None if ctx.own_writes.recorded(&uid, &key, "create") => ChildState::Ours(()),
        None => {
            let state = create_child(ctx, &namespace, &sandbox, as_owner).await?;
            if let ChildState::Ours(created) = &state {
                ctx.own_writes.record(&uid, &key, "create", || {
                    cache_holds(
                        &ctx.caches.sandboxes,
                        &namespace,
                        &name,
                        created.meta().uid.as_deref(),
                    )
                });
            }
            state.unit()
        }
    };
    if state != ChildState::Ours(()) {
        info!(group = %object_key(group), trajectory = %name, ?state, "trajectory name not available yet");
        return Ok(Some(state));
    }
    observation
        .records
        .entry(index)
        .or_insert(TrajectoryRecord {
            name,
            stride: i32::try_from(stride).unwrap_or(i32::MAX),
            status: None,
            reward: None,
            length: None,
            artifact: None,
            reason: None,
        });
    Ok(None)
}

fn count_new_outcomes(ctx: &Context, previous: &RolloutGroupStatus, status: &RolloutGroupStatus) {
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
            ctx.metrics
                .bar_trajectories
                .with_label_values(&[label])
                .inc();
        }
    }
}

/// After completion: `Eager` deletes the trajectories still running; `cleanup: Delete` deletes them all.
async fn cleanup(ctx: &Context, group: &RolloutGroup, status: &RolloutGroupStatus) -> Result<()> {
    let cancelled: BTreeSet<&str> = status
        .trajectories
        .iter()
        .filter(|r| r.reason.as_deref() == Some("Cancelled"))
        .map(|r| r.name.as_str())
        .collect();
    let delete_all = group.spec.cleanup == CleanupPolicy::Delete;
    let eager = group.spec.early_stop == EarlyStop::Eager;
    let namespace = group.namespace().unwrap_or_default();
    let uid = group.uid().unwrap_or_default();
    for child in owned_children(ctx, group) {
        let name = child.name_any();
        let key = child_key("Sandbox", &name);
        if child.meta().deletion_timestamp.is_some()
            || !(delete_all || (eager && cancelled.contains(name.as_str())))
            || ctx.own_writes.recorded(&uid, &key, "delete")
        {
            continue;
        }
        delete_if_same::<Sandbox>(ctx, &namespace, &name, &child.uid().unwrap_or_default()).await?;
        ctx.own_writes.record(&uid, &key, "delete", || {
            ctx.caches
                .sandboxes
                .get(&ObjectRef::new(&name).within(&namespace))
                .is_none_or(|c| c.uid() != child.uid() || c.meta().deletion_timestamp.is_some())
        });
    }
    Ok(())
}
