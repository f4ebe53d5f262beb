//! What the RolloutGroup controller asks before launching a stride: the queue's limits and the slots
//! in use from the caches, handed to the book under its lock.

use std::collections::BTreeSet;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::accounting::{holders, in_queue, retrying};
use super::book::{InUse, Limits, QueueKey, Verdict, WaitReason};
use super::order::Request;
use crate::queue::context::QueueCtx;
use orchard_api::RolloutGroup;

/// The queue `group` names, if any.
pub fn queue_of(group: &RolloutGroup) -> Option<QueueKey> {
    let name = group.spec.queue.clone().filter(|q| !q.is_empty())?;
    Some(QueueKey {
        namespace: group.namespace().unwrap_or_default(),
        name,
    })
}

/// The queue's spec from the cache (`None`: it does not exist).
pub fn limits(ctx: &QueueCtx, key: &QueueKey) -> Option<Limits> {
    let queue = ctx
        .kube
        .caches
        .rollout_queues
        .get(&ObjectRef::new(&key.name).within(&key.namespace))?;
    if queue.metadata.deletion_timestamp.is_some() {
        return None;
    }
    Some(Limits {
        max_running: u32::try_from(queue.spec.max_running_trajectories.max(1)).unwrap_or(1),
        order: queue.spec.admission,
    })
}

/// The trajectories holding `key`'s slots and the names the Sandbox cache shows, now.
pub fn in_use(ctx: &QueueCtx, key: &QueueKey) -> (BTreeSet<String>, BTreeSet<String>) {
    let sandboxes = ctx.kube.caches.sandboxes.state();
    let pods = ctx.kube.caches.pods.state();
    let groups = ctx.kube.caches.rollout_groups.state();
    let mut held = holders(
        &key.namespace,
        &key.name,
        sandboxes.iter().map(AsRef::as_ref),
        pods.iter().map(AsRef::as_ref),
        &ctx.kube.key,
    );
    held.extend(retrying(
        &key.namespace,
        &key.name,
        groups.iter().map(AsRef::as_ref),
    ));
    let seen = sandboxes
        .iter()
        .filter(|s| in_queue(s.as_ref(), &key.namespace, &key.name, &ctx.kube.key))
        .map(|s| s.name_any())
        .collect();
    (held, seen)
}

/// What a group whose stride `stride` of `count` trajectories waits on `key` tells its user (pure).
pub fn waiting_message(
    key: &QueueKey,
    stride: u32,
    count: u32,
    reason: WaitReason,
    position: Option<u32>,
    used: u32,
    limits: Option<Limits>,
) -> String {
    let max = limits.map_or(0, |l| l.max_running);
    match reason {
        WaitReason::QueueNotFound => format!(
            "stride {stride} waits: RolloutQueue {} does not exist in namespace {}; create it (or recreate the group without spec.queue)",
            key.name, key.namespace
        ),
        WaitReason::StrideExceedsQueue => format!(
            "stride {stride} of {count} trajectories can never be admitted whole by RolloutQueue {} (maxRunningTrajectories {max}); raise maxRunningTrajectories or use a smaller stride",
            key.name
        ),
        WaitReason::Queued => format!(
            "stride {stride} of {count} trajectories waits for RolloutQueue {}: {used} of {max} slots in use, position {} in line",
            key.name,
            position.map_or_else(|| "?".to_string(), |p| p.to_string())
        ),
    }
}

/// Asks `key` to admit `group`'s stride of `names.len()` trajectories.
pub fn ask(
    ctx: &QueueCtx,
    group: &RolloutGroup,
    key: &QueueKey,
    names: &[String],
    now: Timestamp,
) -> Verdict {
    let status = group.status.as_ref();
    let request = Request {
        uid: group.uid().unwrap_or_default(),
        group: group.name_any(),
        created: group
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(now, |t| t.0),
        last_admitted: status
            .and_then(|s| s.last_admission_time.as_ref())
            .map(|t| t.0),
        since: now,
        count: u32::try_from(names.len()).unwrap_or(u32::MAX),
    };
    let (held, seen) = in_use(ctx, key);
    let is_seen = |name: &str| seen.contains(name);
    let verdict = ctx.book.request(
        key,
        limits(ctx, key),
        request,
        names,
        &InUse {
            holders: &held,
            seen: &is_seen,
        },
    );
    if let Verdict::Admitted { since } = &verdict {
        let labels = [key.namespace.as_str(), key.name.as_str()];
        let waited = now.duration_since(*since).as_secs_f64().max(0.0);
        ctx.kube
            .metrics
            .queue_wait_seconds
            .with_label_values(&labels)
            .observe(waited);
        ctx.kube
            .metrics
            .queue_admitted
            .with_label_values(&labels)
            .inc_by(u64::try_from(names.len()).unwrap_or(0));
    }
    verdict
}
