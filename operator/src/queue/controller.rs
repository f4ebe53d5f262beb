//! The queue loop: for every queue whose accounting may have changed (a labelled Sandbox or Pod
//! changed, a stride was admitted or withdrawn, the RolloutQueue itself changed), wake the groups whose
//! stride is admissible now, forget waiting groups that were deleted, export the queue metrics and
//! write the RolloutQueue's status when it changed (at most once per [`STATUS_INTERVAL`] per queue).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::admission::{in_use, limits};
use super::book::{InUse, QueueKey, QueueView};
use crate::plumbing::conditions::{self, Desired};
use crate::plumbing::time::floor_to_second;
use crate::plumbing::writes;
use crate::queue::context::QueueCtx;
use orchard_api::{RolloutQueue, RolloutQueueStatus, WaitingStride};

/// Least time between two status writes of one queue.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// How long changes are gathered before a pass (many trajectories finish together).
const GATHER: Duration = Duration::from_millis(50);
/// Every queue is looked at this often even without a signal.
const SWEEP: Duration = Duration::from_secs(10);
/// Waiting strides listed in a queue's status.
pub const LISTED_WAITING: usize = 20;
/// The condition type saying the operator accounts for the queue.
pub const ACTIVE: &str = "Active";

/// The status of `queue` as the book and the caches show it (pure).
pub fn queue_status(queue: &RolloutQueue, view: &QueueView, now: Timestamp) -> RolloutQueueStatus {
    let previous = queue.status.clone().unwrap_or_default();
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let waiting_trajectories: u64 = view.waiting.iter().map(|r| u64::from(r.count)).sum();
    let max = queue.spec.max_running_trajectories;
    RolloutQueueStatus {
        running_trajectories: i32::try_from(view.used).unwrap_or(i32::MAX),
        waiting_groups: count(view.waiting.len()),
        waiting_trajectories: i32::try_from(waiting_trajectories).unwrap_or(i32::MAX),
        oldest_waiting_since: view
            .waiting
            .iter()
            .map(|r| r.since)
            .min()
            .map(|t| Time(floor_to_second(t))),
        waiting: view
            .waiting
            .iter()
            .take(LISTED_WAITING)
            .map(|r| WaitingStride {
                group: r.group.clone(),
                trajectories: i32::try_from(r.count).unwrap_or(i32::MAX),
                since: Time(floor_to_second(r.since)),
            })
            .collect(),
        conditions: conditions::merge(
            &previous.conditions,
            vec![Desired::new(
                ACTIVE,
                true,
                "Admitting",
                format!(
                    "{} of {max} slots in use, {} groups waiting",
                    view.used,
                    view.waiting.len()
                ),
            )],
            queue.metadata.generation,
            now,
        ),
        observed_generation: queue.metadata.generation,
    }
}

/// Runs the queue loop until `shutdown`.
pub async fn run(
    ctx: Arc<QueueCtx>,
    mut dirty: mpsc::UnboundedReceiver<QueueKey>,
    shutdown: CancellationToken,
) {
    let mut pending: BTreeSet<QueueKey> = BTreeSet::new();
    let mut last_write: BTreeMap<QueueKey, Instant> = BTreeMap::new();
    // Queues with a held-back status write whose retry timer is already running (one per queue).
    let retrying: Arc<std::sync::Mutex<BTreeSet<QueueKey>>> = Arc::default();
    let mut sweep = tokio::time::interval(SWEEP);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            key = dirty.next() => match key {
                Some(key) => {
                    pending.insert(key);
                    // Gather what arrives with it.
                    let until = Instant::now() + GATHER;
                    while let Ok(Some(key)) = tokio::time::timeout_at(until, dirty.next()).await {
                        pending.insert(key);
                    }
                }
                None => return,
            },
            _ = sweep.tick() => {
                pending.extend(all_queues(&ctx));
            }
        }
        let keys = std::mem::take(&mut pending);
        for key in keys {
            if let Some(retry_in) = pass(&ctx, &key, &mut last_write).await {
                // A status write was due but too soon after the last one: come back, once.
                let first = retrying
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key.clone());
                if first {
                    let book = ctx.clone();
                    let retrying = retrying.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(retry_in).await;
                        retrying
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&key);
                        book.book.mark_dirty(key);
                    });
                }
            }
        }
    }
}

/// Every queue the cache or the book knows.
fn all_queues(ctx: &QueueCtx) -> Vec<QueueKey> {
    let mut keys: BTreeSet<QueueKey> = ctx
        .kube
        .caches
        .rollout_queues
        .state()
        .iter()
        .map(|q| QueueKey {
            namespace: q.namespace().unwrap_or_default(),
            name: q.name_any(),
        })
        .collect();
    keys.extend(ctx.book.keys());
    keys.into_iter().collect()
}

/// One pass over queue `key`; returns when to come back for a status write held back.
async fn pass(
    ctx: &QueueCtx,
    key: &QueueKey,
    last_write: &mut BTreeMap<QueueKey, Instant>,
) -> Option<Duration> {
    let groups = &ctx.kube.caches.rollout_groups;
    ctx.book.retain_groups(key, |request| {
        groups
            .get(&ObjectRef::new(&request.group).within(&key.namespace))
            .is_some_and(|g| {
                g.uid().as_deref() == Some(request.uid.as_str())
                    && g.metadata.deletion_timestamp.is_none()
            })
    });
    let (held, seen) = in_use(ctx, key);
    let is_seen = |name: &str| seen.contains(name);
    let (wake, view) = ctx.book.view(
        key,
        limits(ctx, key),
        &InUse {
            holders: &held,
            seen: &is_seen,
        },
    );
    for request in wake {
        ctx.book
            .wake(ObjectRef::new(&request.group).within(&key.namespace));
    }
    export_metrics(ctx, key, &view);
    let queue = ctx
        .kube
        .caches
        .rollout_queues
        .get(&ObjectRef::new(&key.name).within(&key.namespace));
    ctx.book.forget_if_idle(key);
    let queue = queue?;
    if !ctx.kube.leadership.is_leader() || queue.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = queue_status(&queue, &view, Timestamp::now());
    if queue.status.as_ref() == Some(&status) {
        return None;
    }
    if let Some(at) = last_write.get(key) {
        let since = at.elapsed();
        if since < STATUS_INTERVAL {
            return Some(STATUS_INTERVAL - since);
        }
    }
    last_write.insert(key.clone(), Instant::now());
    let previous = queue.status.as_ref();
    if let Err(err) = writes::write_status(
        &ctx.kube,
        &ctx.kube.caches.rollout_queues,
        &*queue,
        previous,
        &status,
    )
    .await
    {
        warn!(queue = %key, %err, "rolloutqueue status write failed (retrying)");
        return Some(STATUS_INTERVAL);
    }
    None
}

fn export_metrics(ctx: &QueueCtx, key: &QueueKey, view: &QueueView) {
    let labels = [key.namespace.as_str(), key.name.as_str()];
    ctx.kube
        .metrics
        .queue_running
        .with_label_values(&labels)
        .set(i64::from(view.used));
    ctx.kube
        .metrics
        .queue_waiting_groups
        .with_label_values(&labels)
        .set(i64::try_from(view.waiting.len()).unwrap_or(i64::MAX));
    ctx.kube
        .metrics
        .queue_waiting_trajectories
        .with_label_values(&labels)
        .set(view.waiting.iter().map(|r| i64::from(r.count)).sum());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::order::Request;
    use orchard_api::{AdmissionOrder, RolloutQueueSpec};

    #[test]
    fn the_status_counts_slots_and_lists_waiting_strides_in_order() {
        let mut queue = RolloutQueue::new(
            "q",
            RolloutQueueSpec {
                max_running_trajectories: 16,
                admission: AdmissionOrder::Fair,
            },
        );
        queue.metadata.generation = Some(2);
        let at = |s: i64| Timestamp::from_second(1_700_000_000 + s).unwrap();
        let request = |group: &str, since: i64| Request {
            uid: group.into(),
            group: group.into(),
            created: at(0),
            last_admitted: None,
            since: at(since),
            count: 8,
        };
        let view = QueueView {
            used: 12,
            waiting: vec![request("b", 30), request("a", 10)],
        };
        let status = queue_status(&queue, &view, at(40));
        assert_eq!(status.running_trajectories, 12);
        assert_eq!(status.waiting_groups, 2);
        assert_eq!(status.waiting_trajectories, 16);
        assert_eq!(status.oldest_waiting_since, Some(Time(at(10))));
        assert_eq!(status.waiting[0].group, "b", "admission order is kept");
        assert_eq!(status.observed_generation, Some(2));
        queue.status = Some(status.clone());
        assert_eq!(
            queue_status(&queue, &view, at(50)),
            status,
            "the same view gives the same status: no write"
        );
    }
}
