//! The I/O half of a queue loop pass: wake the groups the book found admissible, export a
//! [`QueuePlan`]'s gauges and write its status (see `decide`).

use kube::runtime::reflector::ObjectRef;
use tracing::warn;

use super::book::QueueKey;
use super::decide::{Gauges, STATUS_INTERVAL};
use super::order::Request;
use crate::plumbing::writes;
use crate::queue::context::QueueCtx;
use orchard_api::{RolloutQueue, RolloutQueueStatus};

/// Asks the RolloutGroup controller to reconcile the groups of `requests` (their stride is
/// admissible now).
pub fn wake(ctx: &QueueCtx, key: &QueueKey, requests: Vec<Request>) {
    for request in requests {
        ctx.book
            .wake(ObjectRef::new(&request.group).within(&key.namespace));
    }
}

/// Exports `gauges` for queue `key`.
pub fn export_metrics(ctx: &QueueCtx, key: &QueueKey, gauges: Gauges) {
    let labels = [key.namespace.as_str(), key.name.as_str()];
    let metrics = &ctx.kube.metrics;
    metrics
        .queue_running
        .with_label_values(&labels)
        .set(gauges.running);
    metrics
        .queue_waiting_groups
        .with_label_values(&labels)
        .set(gauges.waiting_groups);
    metrics
        .queue_waiting_trajectories
        .with_label_values(&labels)
        .set(gauges.waiting_trajectories);
}

/// Writes `status` for `queue`; returns when to come back if the write failed.
pub async fn write_status(
    ctx: &QueueCtx,
    key: &QueueKey,
    queue: &RolloutQueue,
    status: &RolloutQueueStatus,
) -> Option<std::time::Duration> {
    if let Err(err) = writes::write_status(
        &ctx.kube,
        &ctx.kube.caches.rollout_queues,
        queue,
        queue.status.as_ref(),
        status,
    )
    .await
    {
        warn!(queue = %key, %err, "rolloutqueue status write failed (retrying)");
        return Some(STATUS_INTERVAL);
    }
    None
}
