//! What one pass of the queue loop over a queue does, decided without I/O: from the queue as the
//! cache shows it, the book's view of it (slots in use, waiting strides in admission order), the
//! replica's leadership and how long ago it last wrote the queue's status, [`decide`] gives a
//! [`QueuePlan`]: the gauges to export and whether to write the status now, later or not at all.
//! The groups to wake are the book's answer (`QueueBook::view`), not a decision of the pass.
//!
//! Everything here is unit-tested with tables (`decide_tests.rs`).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::book::QueueView;
use crate::plumbing::conditions::{self, Desired};
use crate::plumbing::time::floor_to_second;
use orchard_api::{RolloutQueue, RolloutQueueStatus, WaitingStride};

/// Least time between two status writes of one queue.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);
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

/// The queue's gauges (`orchard_queue_running_trajectories`, `..._waiting_groups`,
/// `..._waiting_trajectories`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gauges {
    /// Slots in use.
    pub running: i64,
    /// Strides waiting.
    pub waiting_groups: i64,
    /// Trajectories those strides ask for.
    pub waiting_trajectories: i64,
}

/// The gauges of a queue the book shows as `view` (pure).
pub fn gauges(view: &QueueView) -> Gauges {
    Gauges {
        running: i64::from(view.used),
        waiting_groups: i64::try_from(view.waiting.len()).unwrap_or(i64::MAX),
        waiting_trajectories: view.waiting.iter().map(|r| i64::from(r.count)).sum(),
    }
}

/// What becomes of a queue's status in one pass.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusStep {
    /// Nothing to write: no such RolloutQueue, being deleted, a standby replica, or no change.
    Keep,
    /// Changed, but written less than [`STATUS_INTERVAL`] ago: come back after this long.
    HoldBack(Duration),
    /// Write it.
    Write(Box<RolloutQueueStatus>),
}

/// One pass over a queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuePlan {
    /// Exported whether or not the RolloutQueue exists (its groups may still wait on it).
    pub gauges: Gauges,
    /// Its status.
    pub status: StatusStep,
}

/// What the pass does with a queue (pure): `queue` is the RolloutQueue as the cache shows it (if
/// it exists), `view` the book's view of it, `leader` whether this replica writes, and
/// `since_last_write` how long ago this replica last wrote its status (if it did).
pub fn decide(
    queue: Option<&RolloutQueue>,
    view: &QueueView,
    leader: bool,
    since_last_write: Option<Duration>,
    now: Timestamp,
) -> QueuePlan {
    let gauges = gauges(view);
    let status = match queue {
        Some(queue) if leader && queue.metadata.deletion_timestamp.is_none() => {
            let status = queue_status(queue, view, now);
            if queue.status.as_ref() == Some(&status) {
                StatusStep::Keep
            } else if let Some(since) = since_last_write.filter(|s| *s < STATUS_INTERVAL) {
                StatusStep::HoldBack(STATUS_INTERVAL - since)
            } else {
                StatusStep::Write(Box::new(status))
            }
        }
        _ => StatusStep::Keep,
    };
    QueuePlan { gauges, status }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
