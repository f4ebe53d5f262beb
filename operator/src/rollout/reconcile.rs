//! One RolloutGroup reconcile: observe progress from the group's status and its child Sandboxes,
//! finish an interrupted stride launch, ask the BAR engine for the next step, launch a stride or record
//! the group, and clean up. Children are created before the status lists them, so a crash at any point
//! neither launches a stride twice nor forgets one.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, instrument, warn};

use super::build::desired_trajectory;
use super::observe::{ChildView, Observation, observe};
use super::params::bar_params;
use super::status::{failed_status, group_status};
use crate::api::{
    CleanupPolicy, EarlyStop, ROLLOUT_GROUP_LABEL, RolloutGroup, RolloutGroupStatus, RolloutPhase,
    STRIDE_LABEL, Sandbox, TrajectoryRecord, TrajectoryStatus,
};
use crate::bar::{Progress, Step, next_step};
use crate::context::{Context, FIELD_MANAGER, object_key};
use crate::error::{Error, Result};
use crate::events::publish;
use crate::merge_patch;
use crate::metrics::ReconcileTimer;

/// Controller name used in metrics and logs.
pub const CONTROLLER: &str = "rolloutgroup";

/// Reconciles one RolloutGroup.
#[instrument(skip_all, fields(group = %object_key(group.as_ref())))]
pub async fn reconcile(group: Arc<RolloutGroup>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ReconcileTimer::start(&ctx.metrics, CONTROLLER);
    let result = reconcile_inner(&group, &ctx).await;
    if result.is_ok() {
        ctx.reconciled(CONTROLLER, &object_key(group.as_ref()));
    }
    result
}

/// Retries a failed reconcile with per-object exponential backoff.
pub fn error_policy(group: Arc<RolloutGroup>, error: &Error, ctx: Arc<Context>) -> Action {
    let key = object_key(group.as_ref());
    let delay = ctx.reconcile_failed(CONTROLLER, &key, error);
    warn!(group = %key, %error, retry_in_ms = delay.as_millis() as u64, "rolloutgroup reconcile failed");
    Action::requeue(delay)
}

/// The group's children as the Sandbox cache shows them (same namespace, group label, owned by this uid).
fn children_of(ctx: &Context, group: &RolloutGroup) -> Vec<ChildView> {
    let namespace = group.namespace().unwrap_or_default();
    let name = group.name_any();
    let uid = group.uid().unwrap_or_default();
    ctx.caches
        .sandboxes
        .state()
        .into_iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|s| s.labels().get(ROLLOUT_GROUP_LABEL) == Some(&name))
        .filter(|s| s.owner_references().iter().any(|o| o.uid == uid))
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

async fn reconcile_inner(cached: &RolloutGroup, ctx: &Arc<Context>) -> Result<Action> {
    if cached.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if !ctx.leadership.is_leader() {
        // A standby replica keeps its caches warm and writes nothing; gaining the Lease reconciles all.
        return Ok(Action::await_change());
    }
    let uid = cached.uid().unwrap_or_default();
    let group = &match ctx
        .written_group_status
        .newer_than_cache(&uid, cached.meta().resource_version.as_deref())
    {
        Some(status) => RolloutGroup {
            status: Some(status),
            ..cached.clone()
        },
        None => cached.clone(),
    };
    let namespace = group.namespace().ok_or(Error::MissingField {
        kind: "RolloutGroup",
        field: "metadata.namespace",
    })?;
    let name = group.name_any();
    let previous = group.status.clone().unwrap_or_default();
    let now = Timestamp::now();

    if previous.phase == Some(RolloutPhase::Complete) {
        cleanup(ctx, group, &previous).await?;
        return Ok(Action::requeue(ctx.settings.resync));
    }
    let params = match bar_params(&group.spec) {
        Ok(params) => params,
        Err(message) => {
            let status = failed_status(group, message.clone(), now);
            write_status(ctx, group, &previous, &status).await?;
            warn!(group = %object_key(group), %message, "rolloutgroup cannot run");
            return Ok(Action::await_change());
        }
    };
    let owner = group.controller_owner_ref(&()).ok_or(Error::MissingField {
        kind: "RolloutGroup",
        field: "metadata.uid",
    })?;

    let children = children_of(ctx, group);
    let mut observation = observe(&name, &previous, &children, &BTreeSet::new());
    if !observation.unseen.is_empty() {
        let gone = confirm_gone(ctx, &namespace, &observation.unseen).await?;
        if !gone.is_empty() {
            observation = observe(&name, &previous, &children, &gone);
        }
    }
    // A crash between creating a stride's children may have left it short: finish it.
    for (index, stride) in observation.incomplete_latest_stride(params.stride) {
        create_trajectory(ctx, group, &owner, index, stride, &mut observation).await?;
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
                create_trajectory(ctx, group, &owner, index, stride_index, &mut observation)
                    .await?;
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

    let status = group_status(group, &observation, decision.as_ref(), params.stride, now);
    count_new_outcomes(ctx, &previous, &status);
    write_status(ctx, group, &previous, &status).await?;
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
    Ok(Action::requeue(ctx.settings.resync))
}

/// Which of `names` are really gone (the cache may lag behind our own creates).
async fn confirm_gone(
    ctx: &Context,
    namespace: &str,
    names: &[String],
) -> Result<BTreeSet<String>> {
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), namespace);
    let mut gone = BTreeSet::new();
    for name in names {
        if ctx
            .recent
            .contains(&format!("sandboxes/{namespace}/{name}"))
        {
            continue;
        }
        if api.get_opt(name).await?.is_none() {
            gone.insert(name.clone());
        }
    }
    Ok(gone)
}

/// Creates trajectory `index` (server-side apply: repeating it is harmless) and records it as running.
async fn create_trajectory(
    ctx: &Context,
    group: &RolloutGroup,
    owner: &k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    index: u32,
    stride: u32,
    observation: &mut Observation,
) -> Result<()> {
    let sandbox = desired_trajectory(group, owner, index, stride);
    let namespace = group.namespace().unwrap_or_default();
    let name = sandbox.name_any();
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&sandbox),
    )
    .await?;
    ctx.metrics.api_write("sandboxes", "apply");
    ctx.recent.record(format!("sandboxes/{namespace}/{name}"));
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
    Ok(())
}

async fn write_status(
    ctx: &Context,
    group: &RolloutGroup,
    previous: &RolloutGroupStatus,
    status: &RolloutGroupStatus,
) -> Result<()> {
    let from = serde_json::to_value(previous).map_err(|source| Error::Serialize {
        what: "rolloutgroup status",
        source,
    })?;
    let to = serde_json::to_value(status).map_err(|source| Error::Serialize {
        what: "rolloutgroup status",
        source,
    })?;
    let Some(change) = merge_patch::diff(&from, &to) else {
        return Ok(());
    };
    let namespace = group.namespace().unwrap_or_default();
    let api: Api<RolloutGroup> = Api::namespaced(ctx.client.clone(), &namespace);
    let written = api
        .patch_status(
            &group.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": change})),
        )
        .await?;
    ctx.metrics.api_write("rolloutgroups/status", "patch");
    ctx.written_group_status.remember(
        &group.uid().unwrap_or_default(),
        written.meta().resource_version.clone(),
        status.clone(),
    );
    Ok(())
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
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &namespace);
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..DeleteParams::default()
    };
    for child in children_of(ctx, group) {
        if child.deleting {
            continue;
        }
        let key = format!("delete/sandboxes/{namespace}/{}", child.name);
        if !(delete_all || (eager && cancelled.contains(child.name.as_str())))
            || ctx.recent.contains(&key)
        {
            continue;
        }
        match api.delete(&child.name, &params).await {
            Ok(_) => ctx.metrics.api_write("sandboxes", "delete"),
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(err) => return Err(err.into()),
        }
        ctx.recent.record(key);
    }
    Ok(())
}
