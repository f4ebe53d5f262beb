//! What one RolloutGroup reconcile does, decided without I/O. Two kinds of answer shape a later
//! decision within one reconcile, so there are four decisions with the I/O between them:
//!
//! 1. [`plan_entry`]: from the group alone, whether it runs ([`Entry`]): a Complete group is cleaned
//!    up, an invalid spec (or retry policy) fails it, a Failed group is left alone; otherwise BAR's
//!    parameters and the retry policy.
//! 2. [`plan_repair`]: from the observation (`apply::observe`: the status, the children the cache
//!    shows, a live read of those it does not), the rest of a latest stride that a crash or a name
//!    still held left short, and the next attempts of retried trajectories whose previous attempt
//!    is gone ([`Launch`]); `execute::create` creates them (reserving their queue slots: a retry
//!    keeps its trajectory's slot and is never asked of the queue again) and reports the names it
//!    could not get. What it created counts as launched below.
//! 3. [`plan_step`]: from the observation after those creates, the group's deadline and the BAR
//!    engine (`orchard_bar::{decide, next_step}`), what comes next ([`Next`]): finish, wait, or launch
//!    a stride. A stride on a queue is asked of the queue first (`execute::ask_queue`: the book
//!    registers the request and reserves an admitted stride's names under its lock, so the verdict
//!    is an answer, not an input known in advance); [`admit`] (or [`unasked`] when no stride is due)
//!    turns it into the group's standing and whether to launch ([`Admission`]); `execute::launch`
//!    creates the stride, and again reports the names it could not get.
//! 4. [`plan_status`]: from the observation after every create and what the creates could not get,
//!    the group's end (`NameConflict`) or its status, the events and metrics of the transition, the
//!    children to delete after the write and when to come back ([`StatusPlan`]).
//!
//! Everything here is unit-tested with tables (`decide_tests.rs`); the scripted-API tests
//! (`reconcile_tests.rs`) cover the I/O around it.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

pub use super::build::Launch;
use super::build::trajectory_name;
use super::jitter::offsets;
use super::observe::{DEADLINE_EXCEEDED, Observation, Superseded};
use super::params::bar_params;
use super::retry::retry_params;
use super::status::{ADMITTED, QueueStanding, failed_status, group_status};
use crate::plumbing::time::until;
use crate::plumbing::writes::ChildState;
use crate::queue::admission::waiting_message;
use crate::queue::book::{Limits, QueueKey, Verdict};
use crate::retry::{ResourceDefaults, RetryParams, retry_message};
use orchard_api::{
    CleanupPolicy, EarlyStop, RolloutGroup, RolloutGroupStatus, RolloutPhase, TrajectoryStatus,
};
use orchard_bar::{GroupDecision, Params, Progress, Step, decide, next_step};

/// How often a group waiting for a previous group's trajectories to be removed looks again, in case
/// the watch misses their deletion (it wakes the reconcile first in the normal case).
pub const PREVIOUS_INCARNATION_RECHECK: Duration = Duration::from_secs(1);

/// How often a group whose stride waits for its queue looks again (to refresh its position; the queue
/// loop wakes it as soon as the stride is admissible).
pub const QUEUE_RECHECK: Duration = Duration::from_secs(5);

/// Which of the group's children to delete (of those the cache shows, not already being deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// Every one.
    All,
    /// Those of these names.
    Named(BTreeSet<String>),
}

impl Targets {
    /// Whether the child named `name` is one of them.
    pub fn picks(&self, name: &str) -> bool {
        match self {
            Targets::All => true,
            Targets::Named(names) => names.contains(name),
        }
    }
}

/// After completion (pure): `Eager` deletes the trajectories still running when the group was
/// decided (`Cancelled`), the group's deadline those it aborted; `cleanup: Delete` deletes them all.
pub fn cleanup(group: &RolloutGroup, status: &RolloutGroupStatus) -> Targets {
    if group.spec.cleanup == CleanupPolicy::Delete {
        return Targets::All;
    }
    let eager = group.spec.early_stop == EarlyStop::Eager;
    Targets::Named(
        status
            .trajectories
            .iter()
            .filter(|r| match r.reason.as_deref() {
                Some("Cancelled") => eager,
                Some(reason) => reason == DEADLINE_EXCEEDED,
                None => false,
            })
            .map(|r| r.name.clone())
            .collect(),
    )
}

/// Before completion, on a queue (pure): the trajectories whose outcome `status` records (the group
/// keeps what a trainer needs), so their slots are freed.
pub fn finished(status: &RolloutGroupStatus) -> Targets {
    Targets::Named(
        status
            .trajectories
            .iter()
            .filter(|r| r.status.is_some())
            .map(|r| r.name.clone())
            .collect(),
    )
}

/// A group that cannot run.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    /// `InvalidSpec` or `NameConflict`.
    pub reason: &'static str,
    /// What a user reads.
    pub message: String,
    /// The Failed status to write.
    pub status: RolloutGroupStatus,
}

fn failure(
    group: &RolloutGroup,
    reason: &'static str,
    message: String,
    now: Timestamp,
) -> Box<Failure> {
    Box::new(Failure {
        reason,
        status: failed_status(group, reason, message.clone(), now),
        message,
    })
}

/// Whether a group runs at all.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// Complete: its status is final; delete these children, look again at the resync.
    Cleanup(Targets),
    /// Its spec cannot be turned into BAR parameters: it fails (`InvalidSpec`).
    Invalid(Box<Failure>),
    /// Failed before: nothing to do.
    Failed,
    /// Run BAR with these parameters, retrying trajectories under this policy (if any).
    Run(Params, Option<Box<RetryParams>>),
}

/// Whether `group` runs (pure), given the operator's default resources `defaults` (what a template
/// without memory starts with, which a retry's `maxMemory` must not be below). A Complete group is
/// cleaned up before its spec is looked at; an invalid spec fails a group even if it failed before
/// (the write is then a no-op).
pub fn plan_entry(group: &RolloutGroup, defaults: &ResourceDefaults, now: Timestamp) -> Entry {
    let previous = group.status.clone().unwrap_or_default();
    if previous.phase == Some(RolloutPhase::Complete) {
        return Entry::Cleanup(cleanup(group, &previous));
    }
    let params = match bar_params(&group.spec) {
        Ok(params) => params,
        Err(message) => return Entry::Invalid(failure(group, "InvalidSpec", message, now)),
    };
    let retry = match retry_params(&group.spec, defaults) {
        Ok(retry) => retry,
        Err(message) => return Entry::Invalid(failure(group, "InvalidSpec", message, now)),
    };
    if previous.phase == Some(RolloutPhase::Failed) {
        return Entry::Failed;
    }
    Entry::Run(params, retry.map(Box::new))
}

/// The trajectories missing from the latest stride (pure): a crash between creating a stride's
/// children, or a name still held by a previous group's trajectory, may have left it short. Its
/// queue admitted it before, so they are created without asking again. Then the next attempts of
/// retried trajectories whose name is free, with what their retry gives them (`retry::after`).
pub fn plan_repair(
    observation: &Observation,
    params: &Params,
    retry: Option<&RetryParams>,
) -> Vec<Launch> {
    let mut launches: Vec<Launch> = observation
        .incomplete_latest_stride(params.stride)
        .into_iter()
        .map(|(index, stride)| Launch {
            index,
            stride,
            attempt: 1,
            resources: None,
            launch_after: None,
        })
        .collect();
    for &index in &observation.relaunch {
        let Some(record) = observation.records.get(&index) else {
            continue;
        };
        let resources = retry.and_then(|policy| {
            let amounts = policy.after(record.previous_attempts.last()?)?;
            policy.resources(amounts)
        });
        launches.push(Launch {
            index,
            stride: u32::try_from(record.stride).unwrap_or(0),
            attempt: u32::try_from(record.previous_attempts.len())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
            resources,
            launch_after: None,
        });
    }
    launches
}

/// A stride the BAR engine asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stride {
    /// Stride index.
    pub index: u32,
    /// Index of its first trajectory.
    pub first: u32,
    /// Trajectories in it.
    pub count: u32,
}

impl Stride {
    /// Its trajectories.
    pub fn launches(&self) -> Vec<Launch> {
        (self.first..self.first + self.count)
            .map(|index| Launch {
                index,
                stride: self.index,
                attempt: 1,
                resources: None,
                launch_after: None,
            })
            .collect()
    }

    /// Its trajectories launched at `now` by the group with UID `uid`, their starts spread over
    /// `jitter` (`jitter::offsets`).
    pub fn jittered(&self, uid: &str, jitter: Duration, now: Timestamp) -> Vec<Launch> {
        let mut launches = self.launches();
        let indices: Vec<u32> = launches.iter().map(|l| l.index).collect();
        for (launch, offset) in launches.iter_mut().zip(offsets(uid, &indices, jitter)) {
            launch.launch_after = SignedDuration::try_from(offset)
                .ok()
                .filter(|o| !o.is_zero())
                .and_then(|o| now.checked_add(o).ok());
        }
        launches
    }

    /// The names of its trajectories in group `group`.
    pub fn names(&self, group: &str) -> Vec<String> {
        (self.first..self.first + self.count)
            .map(|index| trajectory_name(group, index))
            .collect()
    }
}

/// What comes after the observation.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Trajectories run and nothing can be decided yet.
    Wait,
    /// Launch this stride (once its queue admits it, if the group names one).
    Launch(Stride),
    /// The group is decided.
    Finish(GroupDecision),
}

/// What comes next for a group with `params` that observes `observation` (pure). Once the group's
/// own `deadline` has passed, what has not finished is aborted in `observation`
/// (`DeadlineExceeded`) and the group is decided from what it has, as if its budget were spent;
/// otherwise the BAR engine's next step.
pub fn plan_step(
    params: &Params,
    observation: &mut Observation,
    deadline: Option<Timestamp>,
    now: Timestamp,
) -> Next {
    if deadline.is_some_and(|at| now >= at) {
        observation.abort_unfinished(DEADLINE_EXCEEDED);
        return Next::Finish(decide(params, &observation.pool()));
    }
    let pool = observation.pool();
    let step = next_step(
        params,
        &Progress {
            launched: observation.launched(),
            terminal: &pool,
        },
    );
    match step {
        Step::LaunchStride {
            stride_index,
            count,
        } => Next::Launch(Stride {
            index: stride_index,
            first: stride_index * params.stride,
            count,
        }),
        Step::Wait => Next::Wait,
        Step::Finish(decision) => Next::Finish(decision),
    }
}

/// What a queue answered to a stride.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueVerdict {
    /// The queue.
    pub key: QueueKey,
    /// Its verdict.
    pub verdict: Verdict,
    /// Its spec (`None`: it does not exist).
    pub limits: Option<Limits>,
}

/// Where the group stands with its queue, and what follows.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    /// For the status.
    pub standing: QueueStanding,
    /// Create the stride now.
    pub launch: bool,
    /// Leave the queue's waiting list (the group is not, or no longer, waiting).
    pub withdraw: bool,
}

/// The admission of a group that asked for no stride this time (pure): its `Admitted` condition
/// stays; on a queue it leaves the waiting list.
pub fn unasked(queued: bool) -> Admission {
    Admission {
        standing: if queued {
            QueueStanding::Unchanged
        } else {
            QueueStanding::NoQueue
        },
        launch: false,
        withdraw: queued,
    }
}

/// The admission of `stride` (pure): launched at once without a queue (`verdict` `None`), else as
/// the queue's verdict says; a waiting stride stays on the waiting list.
pub fn admit(stride: &Stride, verdict: Option<QueueVerdict>) -> Admission {
    let Some(QueueVerdict {
        key,
        verdict,
        limits,
    }) = verdict
    else {
        return Admission {
            standing: QueueStanding::NoQueue,
            launch: true,
            withdraw: false,
        };
    };
    match verdict {
        Verdict::Admitted { .. } => Admission {
            standing: QueueStanding::Admitted {
                queue: key.name.clone(),
                stride: stride.index,
            },
            launch: true,
            withdraw: true,
        },
        Verdict::Waiting {
            reason,
            position,
            since,
            used,
        } => Admission {
            standing: QueueStanding::Waiting {
                reason: reason.as_str(),
                position,
                since,
                message: waiting_message(
                    &key,
                    stride.index,
                    stride.count,
                    reason,
                    position,
                    used,
                    limits,
                ),
            },
            launch: false,
            withdraw: false,
        },
    }
}

/// What the status decision needs besides the group, its observation and its standing.
#[derive(Debug, Clone)]
pub struct StatusInput<'a> {
    /// The group's BAR parameters.
    pub params: &'a Params,
    /// The group's retry policy.
    pub retry: Option<&'a RetryParams>,
    /// The group names a queue.
    pub queued: bool,
    /// The group's own deadline, if it has one and started.
    pub deadline: Option<Timestamp>,
    /// Longest time between two reconciles.
    pub resync: Duration,
    /// Current time.
    pub now: Timestamp,
}

/// The Event of a change in the queue's answer (the `Admitted` condition's reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionEvent {
    /// A Warning (refused), else Normal (admitted, queued).
    pub warning: bool,
    /// The condition's reason.
    pub reason: String,
    /// Its message.
    pub message: String,
}

/// What a completed group is worth telling: metrics, a log line, an Event.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// `Balanced`, `Relaxed`, `TopRanked` or `Dropped`.
    pub selection: &'static str,
    /// Positive members.
    pub positives: u32,
    /// Trajectories launched.
    pub launched: u32,
    /// Seconds since the group's creation, when known.
    pub seconds: Option<f64>,
    /// The status message (the Event's note).
    pub message: String,
}

/// The status to record and what follows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// The status.
    pub status: RolloutGroupStatus,
    /// Told before the write.
    pub admission_event: Option<AdmissionEvent>,
    /// After the write: outcomes recorded for the first time (`bar_trajectories` label values).
    pub new_outcomes: Vec<&'static str>,
    /// After the write: the group completed.
    pub completion: Option<Completion>,
    /// After the write: attempts the status now records as retried, told as Events and counted.
    pub retries: Vec<Retried>,
    /// After the write: the children of ended attempts to delete (by UID).
    pub superseded: Vec<Superseded>,
    /// After that: children to delete (the clean-up of a completed group, the finished
    /// trajectories of a group on a queue).
    pub delete: Option<Targets>,
    /// When to reconcile again.
    pub requeue: Duration,
}

/// The end of a reconcile.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusPlan {
    /// A trajectory's name is held by an object that is not the group's: it fails (`NameConflict`).
    Conflict(Box<Failure>),
    /// Record the group's status.
    Record(Box<Record>),
}

/// The end of a reconcile of `group` (pure) that observes `observation` after its creates, could
/// not get the children `blocked` (waits and conflicts), was decided if `decision` and stands
/// `standing` with its queue.
pub fn plan_status(
    group: &RolloutGroup,
    observation: &Observation,
    decision: Option<&GroupDecision>,
    standing: &QueueStanding,
    blocked: &[ChildState<()>],
    input: &StatusInput,
) -> StatusPlan {
    let now = input.now;
    if let Some(conflict) = blocked.iter().find_map(|b| match b {
        ChildState::Conflict(why) => Some(why.clone()),
        _ => None,
    }) {
        return StatusPlan::Conflict(failure(group, "NameConflict", conflict, now));
    }
    let status = group_status(
        group,
        observation,
        decision,
        input.params.stride,
        standing,
        now,
    );
    let previous = group.status.clone().unwrap_or_default();
    let admission_event = admission_event(group.status.as_ref(), &status);
    let new_outcomes = new_outcomes(&previous, &status);
    let retries = retried(&previous, &status, input.retry);
    let superseded = observation.superseded.clone();
    let record = if let Some(decision) = decision {
        let seconds = group
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|created| now.duration_since(created.0).as_secs_f64().max(0.0));
        Record {
            admission_event,
            new_outcomes,
            retries,
            superseded,
            completion: Some(Completion {
                selection: decision.selection.as_str(),
                positives: decision.positives,
                launched: observation.launched(),
                seconds,
                message: status.message.clone().unwrap_or_default(),
            }),
            delete: Some(cleanup(group, &status)),
            requeue: input.resync,
            status,
        }
    } else {
        // On a queue a finished trajectory's Sandbox (and Pod) would hold its slot until the group
        // completes: its outcome is in the status just written, so it goes now.
        let delete = (input.queued && group.spec.cleanup == CleanupPolicy::Delete)
            .then(|| finished(&status));
        // A retry waits for its previous attempt's Sandbox to go: its deletion wakes the group, and
        // so does this recheck if the watch misses it.
        let requeue = if blocked.is_empty() && observation.awaiting_removal.is_empty() {
            let mut next = input.resync;
            if matches!(standing, QueueStanding::Waiting { .. }) {
                next = next.min(QUEUE_RECHECK);
            }
            if let Some(at) = input.deadline {
                next = next.min(until(now, at));
            }
            next
        } else {
            PREVIOUS_INCARNATION_RECHECK
        };
        Record {
            status,
            admission_event,
            new_outcomes,
            retries,
            superseded,
            completion: None,
            delete,
            requeue,
        }
    };
    StatusPlan::Record(Box::new(record))
}

/// The outcomes `status` records that `previous` did not (pure), as `bar_trajectories` labels.
pub fn new_outcomes(
    previous: &RolloutGroupStatus,
    status: &RolloutGroupStatus,
) -> Vec<&'static str> {
    status
        .trajectories
        .iter()
        .filter_map(|record| {
            let outcome = record.status?;
            let known = previous
                .trajectories
                .iter()
                .any(|p| p.name == record.name && p.status.is_some());
            (!known).then_some(match outcome {
                TrajectoryStatus::Completed => "completed",
                TrajectoryStatus::Truncated => "truncated",
                TrajectoryStatus::Aborted => "aborted",
            })
        })
        .collect()
}

/// An attempt the status newly records as retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retried {
    /// How the attempt ended (`OOMKilled`, `Evicted`, `PodDeleted`, `NodeLost`): the metric's label.
    pub reason: String,
    /// The Event's message.
    pub message: String,
}

/// What `status` records as retried that `previous` did not (pure), one message per retried attempt:
/// how it ended, what it ran with, and what the next attempt gets under `retry`.
pub fn retried(
    previous: &RolloutGroupStatus,
    status: &RolloutGroupStatus,
    retry: Option<&RetryParams>,
) -> Vec<Retried> {
    let mut messages = Vec::new();
    for record in &status.trajectories {
        let known = previous
            .trajectories
            .iter()
            .find(|p| p.name == record.name)
            .map_or(0, |p| p.previous_attempts.len());
        for (position, ended) in record.previous_attempts.iter().enumerate().skip(known) {
            let next = retry.and_then(|policy| policy.after(ended));
            messages.push(Retried {
                reason: ended.reason.clone(),
                message: format!(
                    "trajectory {} {}",
                    record.name,
                    retry_message(position + 1, ended, next)
                ),
            });
        }
    }
    messages
}

/// An Event when the queue's answer to the group changes (the `Admitted` condition's reason, pure):
/// admitted (a stride may launch), queued (with its position), or refused (no such queue, a stride
/// larger than the queue).
pub fn admission_event(
    previous: Option<&RolloutGroupStatus>,
    status: &RolloutGroupStatus,
) -> Option<AdmissionEvent> {
    let admitted = |s: &RolloutGroupStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == ADMITTED)
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let (reason, message) = admitted(status)?;
    if previous.and_then(admitted).map(|(r, _)| r) == Some(reason.clone()) {
        return None;
    }
    Some(AdmissionEvent {
        warning: !matches!(reason.as_str(), "Admitted" | "Queued"),
        reason,
        message,
    })
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
