//! The queue loop: for every queue whose accounting may have changed (a labelled Sandbox or Pod
//! changed, a stride was admitted or withdrawn, the RolloutQueue itself changed), wake the groups whose
//! stride is admissible now, forget waiting groups that were deleted, export the queue metrics and
//! write the RolloutQueue's status when it changed (at most once per `decide::STATUS_INTERVAL` per queue).
//!
//! A pass observes (the book, the caches), decides (`decide::decide`, pure: a `QueuePlan`) and
//! executes (`execute`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admission::{in_use, limits};
use super::book::{InUse, QueueKey};
use super::decide::{StatusStep, decide};
use super::execute::{export_metrics, wake, write_status};
use crate::queue::context::QueueCtx;

/// How long changes are gathered before a pass (many trajectories finish together).
const GATHER: Duration = Duration::from_millis(50);
/// Every queue is looked at this often even without a signal.
const SWEEP: Duration = Duration::from_secs(10);

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
        if !ctx.kube.filled.all_filled() {
            // Counts from half-listed caches would be wrong: wait for the first lists (the sweep
            // brings every queue back).
            continue;
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
    let (admissible, view) = ctx.book.view(
        key,
        limits(ctx, key),
        &InUse {
            holders: &held,
            seen: &is_seen,
        },
    );
    wake(ctx, key, admissible);
    let queue = ctx
        .kube
        .caches
        .rollout_queues
        .get(&ObjectRef::new(&key.name).within(&key.namespace));
    let plan = decide(
        queue.as_deref(),
        &view,
        ctx.kube.leadership.is_leader(),
        last_write.get(key).map(Instant::elapsed),
        Timestamp::now(),
    );
    export_metrics(ctx, key, plan.gauges);
    ctx.book.forget_if_idle(key);
    match plan.status {
        StatusStep::Keep => None,
        StatusStep::HoldBack(after) => Some(after),
        StatusStep::Write(status) => {
            last_write.insert(key.clone(), Instant::now());
            let queue = queue?;
            write_status(ctx, key, &queue, &status).await
        }
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
