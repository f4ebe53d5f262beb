//! What a RolloutGroup has launched and what came of it (pure), derived from its own status and its
//! child Sandboxes — never from memory, so a restarted operator resumes exactly.
//!
//! - A trajectory is launched if the status lists it or a child Sandbox for it exists (a crash can
//!   leave children the status does not list yet).
//! - Its outcome is the one recorded in the status, else the child's `status.result`.
//! - A listed trajectory without an outcome whose child is gone (confirmed by the caller with a live
//!   read, since the cache may lag) is aborted with reason `SandboxDeleted`; it is never launched again.
//! - With a `retry` policy, an attempt that ran out of memory or lost its pod (`retry::attempt_end`)
//!   is not an outcome while attempts are left: it is appended to the record's `previousAttempts`, its
//!   child is deleted ([`Observation::superseded`]), and once the name is free the next attempt is
//!   created under it ([`Observation::relaunch`]). The child's attempt label tells an old attempt still
//!   being removed from the new one. A record with as many `previousAttempts` as `attempts` is waiting
//!   for its next attempt; `attempts` grows when that attempt is created (children before status).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::build::{trajectory_index, trajectory_name};
use super::retry::attempt_end;
use crate::retry::RetryParams;
use orchard_api::{
    RolloutGroupSpec, RolloutGroupStatus, SandboxPhase, SandboxResources, SandboxStatus,
    TrajectoryRecord, TrajectoryResult, TrajectoryStatus,
};

/// Abort reason of the trajectories still unfinished when the group's own deadline passed.
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// When the group's `activeDeadlineSeconds` ends: counted from its first admitted stride (`start`);
/// `None` without a deadline or before the first stride.
pub fn deadline_of(spec: &RolloutGroupSpec, start: Option<Timestamp>) -> Option<Timestamp> {
    let seconds = spec.active_deadline_seconds.filter(|s| *s > 0)?;
    start?.checked_add(SignedDuration::from_secs(seconds)).ok()
}
use orchard_bar::{Outcome, Trajectory};

/// What the controller sees of one child Sandbox.
#[derive(Debug, Clone, PartialEq)]
pub struct ChildView {
    /// Sandbox name.
    pub name: String,
    /// Its UID (an old attempt is deleted by it, never a new one under the same name).
    pub uid: String,
    /// Stride label.
    pub stride: u32,
    /// Attempt label (1 when absent).
    pub attempt: u32,
    /// Recorded result, if any.
    pub result: Option<TrajectoryResult>,
    /// Why the Sandbox failed (`status.reason`, `status.message`), if it is Failed.
    pub failure: Option<(String, String)>,
    /// The resources its spec asks for.
    pub resources: Option<SandboxResources>,
    /// Being deleted.
    pub deleting: bool,
    /// Why it has not started, while it waits to be scheduled: its `Scheduled=False` condition as
    /// `reason: message` (not a launch jitter's wait, which ends by itself).
    pub waiting: Option<String>,
}

/// A child of an attempt that ended and was retried: deleted by its UID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Superseded {
    /// Sandbox name (the trajectory's).
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// The group's trajectories as observed now.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observation {
    /// Every launched trajectory, by index.
    pub records: BTreeMap<u32, TrajectoryRecord>,
    /// Listed trajectories without outcome whose child the cache does not show.
    pub unseen: Vec<String>,
    /// Children of ended attempts, to delete (not already being deleted).
    pub superseded: Vec<Superseded>,
    /// Trajectories (indices) whose next attempt is due and whose name is free.
    pub relaunch: Vec<u32>,
    /// Trajectories whose next attempt waits for the previous attempt's Sandbox to be removed.
    pub awaiting_removal: Vec<String>,
}

/// Whether `record` has an outcome (a status, or a reason such as `Cancelled`).
fn settled(record: &TrajectoryRecord) -> bool {
    record.status.is_some() || record.reason.is_some()
}

/// Attempts of `record` that ended and were retried.
fn ended(record: &TrajectoryRecord) -> u32 {
    u32::try_from(record.previous_attempts.len()).unwrap_or(u32::MAX)
}

/// Attempts of `record` launched.
fn attempts(record: &TrajectoryRecord) -> u32 {
    u32::try_from(record.attempts).unwrap_or(0).max(1)
}

/// Whether `record` waits for its next attempt: every attempt launched has ended and been retried.
pub fn awaits_attempt(record: &TrajectoryRecord) -> bool {
    !settled(record) && !record.previous_attempts.is_empty() && ended(record) >= attempts(record)
}

impl Observation {
    /// Trajectories launched (a retried trajectory counts once).
    pub fn launched(&self) -> u32 {
        u32::try_from(self.records.len()).unwrap_or(u32::MAX)
    }

    /// Terminal trajectories as the BAR engine sees them (one outcome per trajectory: its last
    /// attempt's).
    pub fn pool(&self) -> Vec<Trajectory> {
        self.records.values().filter_map(bar_trajectory).collect()
    }

    /// Names of launched trajectories that have no outcome yet.
    pub fn running(&self) -> Vec<String> {
        self.records
            .values()
            .filter(|r| !settled(r))
            .map(|r| r.name.clone())
            .collect()
    }

    /// Marks every trajectory without an outcome aborted with `reason` (the group is being decided
    /// without them).
    pub fn abort_unfinished(&mut self, reason: &str) {
        for record in self.records.values_mut().filter(|r| !settled(r)) {
            record.status = Some(TrajectoryStatus::Aborted);
            record.reason = Some(reason.to_string());
        }
    }

    /// Records attempt `attempt` of trajectory `index` of stride `stride` of group `group` as
    /// launched (and running, unless it is known already): its child was just created, or found to
    /// be ours.
    pub fn record_launch(&mut self, group: &str, index: u32, stride: u32, attempt: u32) {
        let record = self.records.entry(index).or_insert_with(|| {
            TrajectoryRecord::launched(
                trajectory_name(group, index),
                i32::try_from(stride).unwrap_or(i32::MAX),
            )
        });
        let attempt = i32::try_from(attempt).unwrap_or(i32::MAX);
        if attempt > record.attempts {
            record.attempts = attempt;
        }
        self.relaunch.retain(|i| *i != index);
    }

    /// Indices of the latest stride that have no trajectory (a crash interrupted its launch).
    pub fn incomplete_latest_stride(&self, stride_size: u32) -> Vec<(u32, u32)> {
        let Some(&last) = self.records.keys().next_back() else {
            return Vec::new();
        };
        let stride = last / stride_size.max(1);
        (stride * stride_size..(stride + 1) * stride_size)
            .filter(|index| !self.records.contains_key(index))
            .map(|index| (index, stride))
            .collect()
    }
}

/// The BAR view of a finished trajectory (`None` while it runs or after it was cancelled).
pub fn bar_trajectory(record: &TrajectoryRecord) -> Option<Trajectory> {
    let outcome = match record.status? {
        TrajectoryStatus::Completed => Outcome::Completed,
        TrajectoryStatus::Truncated => Outcome::Truncated,
        TrajectoryStatus::Aborted => Outcome::Aborted,
    };
    Some(Trajectory {
        name: record.name.clone(),
        reward: record.reward.unwrap_or(0.0),
        outcome,
        // Unknown length ranks last among equals.
        length: record
            .length
            .and_then(|l| u64::try_from(l).ok())
            .unwrap_or(u64::MAX),
    })
}

fn record_result(record: &mut TrajectoryRecord, result: &TrajectoryResult) {
    record.status = Some(result.status);
    record.reward = result.reward;
    record.length = result.length;
    record.artifact = result.artifact.clone();
    record.reason = result.reason.clone();
}

/// What came of the current attempt of `record` whose child is `child`, which has a result.
/// Without a policy, or for an ending no retry fixes, the result is the outcome; an ending a retry
/// fixes, with attempts and room to grow left, becomes a previous attempt; one without is the
/// outcome, with the ending's own reason (`OOMKilled` rather than `SandboxFailed`).
fn settle_attempt(
    record: &mut TrajectoryRecord,
    child: &ChildView,
    result: &TrajectoryResult,
    retry: Option<&RetryParams>,
) -> bool {
    let failure = child
        .failure
        .as_ref()
        .map(|(reason, message)| (reason.as_str(), message.as_str()));
    let Some((policy, end)) = retry.and_then(|p| Some((p, attempt_end(result, failure)?))) else {
        record_result(record, result);
        return false;
    };
    let ran = policy.ran(child.resources.as_ref());
    match ran.filter(|ran| policy.next(end.cause, child.attempt, *ran).is_some()) {
        Some(ran) => {
            record.attempts = i32::try_from(child.attempt).unwrap_or(i32::MAX);
            record
                .previous_attempts
                .push(RetryParams::record(&end, ran));
            true
        }
        None => {
            record_result(record, result);
            record.reason = Some(end.reason);
            false
        }
    }
}

/// How much of a scheduler's message a trajectory's record keeps (a group's status of many
/// trajectories must stay far below the API server's object size limit).
const WAIT_MESSAGE_KEPT: usize = 256;

/// A Sandbox's wait to be scheduled (pure): its `Scheduled=False` condition as `reason: message`, cut
/// to [`WAIT_MESSAGE_KEPT`] bytes; a launch jitter's wait is none (it ends by itself).
pub fn scheduling_wait(status: &SandboxStatus) -> Option<String> {
    if status.phase != Some(SandboxPhase::Pending) {
        return None;
    }
    let scheduled = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Scheduled" && c.status == "False")?;
    if scheduled.reason == "LaunchJitter" || scheduled.reason.is_empty() {
        return None;
    }
    let text = if scheduled.message.is_empty() {
        scheduled.reason.clone()
    } else {
        format!("{}: {}", scheduled.reason, scheduled.message)
    };
    Some(crate::plumbing::text::cut(&text, WAIT_MESSAGE_KEPT))
}

/// What the record of a trajectory whose current attempt is `child` says it waits for (pure): the
/// child's wait to be scheduled, for a retried attempt without an outcome (a first attempt's wait is
/// its Sandbox's to tell; a retry's escalated resources may fit no node, which the group's reader must
/// see).
fn waiting_of(record: &TrajectoryRecord, child: &ChildView) -> Option<String> {
    let current = child.attempt > ended(record) && child.result.is_none();
    (current && record.attempts > 1 && !settled(record))
        .then(|| child.waiting.clone())
        .flatten()
}

/// Observes group `group` from its previous status and its children under its retry policy
/// `retry`; names in `gone` were confirmed deleted by a live read.
pub fn observe(
    group: &str,
    previous: &RolloutGroupStatus,
    children: &[ChildView],
    gone: &BTreeSet<String>,
    retry: Option<&RetryParams>,
) -> Observation {
    let mut records: BTreeMap<u32, TrajectoryRecord> = previous
        .trajectories
        .iter()
        .filter_map(|r| Some((trajectory_index(group, &r.name)?, r.clone())))
        .collect();
    let by_name: BTreeMap<&str, &ChildView> =
        children.iter().map(|c| (c.name.as_str(), c)).collect();
    for child in children {
        if let Some(index) = trajectory_index(group, &child.name) {
            records.entry(index).or_insert_with(|| TrajectoryRecord {
                attempts: i32::try_from(child.attempt).unwrap_or(i32::MAX),
                ..TrajectoryRecord::launched(
                    trajectory_name(group, index),
                    i32::try_from(child.stride).unwrap_or(i32::MAX),
                )
            });
        }
    }
    let mut observation = Observation::default();
    for (&index, record) in &mut records {
        if settled(record) {
            continue;
        }
        let supersede = |observation: &mut Observation, child: &ChildView| {
            if !child.deleting {
                observation.superseded.push(Superseded {
                    name: child.name.clone(),
                    uid: child.uid.clone(),
                });
            }
        };
        match by_name.get(record.name.as_str()) {
            // An attempt that ended and was retried, still being removed: never the new one.
            Some(child) if child.attempt <= ended(record) => {
                supersede(&mut observation, child);
                if awaits_attempt(record) {
                    observation.awaiting_removal.push(record.name.clone());
                }
            }
            Some(child) => {
                // Created before the status said so (a crash between the two): it is the current one.
                if i32::try_from(child.attempt).unwrap_or(i32::MAX) > record.attempts {
                    record.attempts = i32::try_from(child.attempt).unwrap_or(i32::MAX);
                }
                if let Some(result) = &child.result
                    && settle_attempt(record, child, result, retry)
                {
                    supersede(&mut observation, child);
                    observation.awaiting_removal.push(record.name.clone());
                }
                record.waiting = waiting_of(record, child);
            }
            None if awaits_attempt(record) => observation.relaunch.push(index),
            None if gone.contains(&record.name) => {
                record.status = Some(TrajectoryStatus::Aborted);
                record.reason = Some("SandboxDeleted".into());
            }
            None => observation.unseen.push(record.name.clone()),
        }
    }
    observation.records = records;
    observation
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(reward: f64, length: i64) -> TrajectoryResult {
        TrajectoryResult {
            reward: Some(reward),
            status: TrajectoryStatus::Completed,
            length: Some(length),
            exit_code: Some(0),
            artifact: Some(format!("a{length}")),
            reason: None,
            message: None,
        }
    }

    fn child(index: u32, stride: u32, result: Option<TrajectoryResult>) -> ChildView {
        ChildView {
            name: trajectory_name("g", index),
            uid: format!("uid-{index}"),
            stride,
            attempt: 1,
            result,
            failure: None,
            resources: None,
            deleting: false,
            waiting: None,
        }
    }

    fn listed(index: u32, stride: i32) -> TrajectoryRecord {
        TrajectoryRecord::launched(trajectory_name("g", index), stride)
    }

    #[test]
    fn children_results_become_records_and_the_pool() {
        let previous = RolloutGroupStatus {
            trajectories: vec![listed(0, 0), listed(1, 0)],
            ..Default::default()
        };
        let obs = observe(
            "g",
            &previous,
            &[child(0, 0, Some(result(1.0, 10))), child(1, 0, None)],
            &BTreeSet::new(),
            None,
        );
        assert_eq!(obs.launched(), 2);
        assert_eq!(obs.running(), vec!["g-1".to_string()]);
        let pool = obs.pool();
        assert_eq!(pool.len(), 1);
        assert_eq!(pool[0].name, "g-0");
        assert_eq!(pool[0].length, 10);
        assert_eq!(obs.records[&0].artifact.as_deref(), Some("a10"));
    }

    #[test]
    fn recorded_outcomes_survive_deleted_children() {
        let mut done = listed(0, 0);
        done.status = Some(TrajectoryStatus::Completed);
        done.reward = Some(0.0);
        let previous = RolloutGroupStatus {
            trajectories: vec![done],
            ..Default::default()
        };
        let obs = observe("g", &previous, &[], &BTreeSet::new(), None);
        assert_eq!(obs.pool().len(), 1);
        assert!(obs.unseen.is_empty());
    }

    #[test]
    fn children_the_status_does_not_list_yet_count_as_launched() {
        let obs = observe(
            "g",
            &RolloutGroupStatus::default(),
            &[child(0, 0, None), child(1, 0, None)],
            &BTreeSet::new(),
            None,
        );
        assert_eq!(obs.launched(), 2);
        assert_eq!(obs.incomplete_latest_stride(4), vec![(2, 0), (3, 0)]);
    }

    #[test]
    fn listed_trajectories_without_children_are_unseen_until_confirmed_gone() {
        let previous = RolloutGroupStatus {
            trajectories: vec![listed(0, 0)],
            ..Default::default()
        };
        let obs = observe("g", &previous, &[], &BTreeSet::new(), None);
        assert_eq!(obs.unseen, vec!["g-0".to_string()]);
        assert_eq!(obs.running(), vec!["g-0".to_string()]);
        let gone = BTreeSet::from(["g-0".to_string()]);
        let obs = observe("g", &previous, &[], &gone, None);
        assert!(obs.unseen.is_empty());
        assert_eq!(obs.records[&0].reason.as_deref(), Some("SandboxDeleted"));
        assert_eq!(obs.pool()[0].outcome, Outcome::Aborted);
        assert_eq!(
            obs.launched(),
            1,
            "a deleted trajectory is not launched again"
        );
    }

    #[test]
    fn complete_strides_need_nothing() {
        let children: Vec<ChildView> = (0..8).map(|i| child(i, i / 4, None)).collect();
        let obs = observe(
            "g",
            &RolloutGroupStatus::default(),
            &children,
            &BTreeSet::new(),
            None,
        );
        assert!(obs.incomplete_latest_stride(4).is_empty());
        assert!(
            Observation::default()
                .incomplete_latest_stride(4)
                .is_empty()
        );
    }

    #[test]
    fn the_deadline_counts_from_the_first_stride_and_aborts_what_is_unfinished() {
        use orchard_api::{SandboxSpec, SandboxTemplate};
        let mut spec = RolloutGroupSpec {
            launch_jitter_seconds: None,
            group_size: 2,
            max_trajectories: 4,
            stride: Some(2),
            positive_fraction: Default::default(),
            early_stop: Default::default(),
            filter: None,
            template: SandboxTemplate {
                metadata: Default::default(),
                spec: SandboxSpec::default(),
            },
            trajectory_timeout_seconds: None,
            cleanup: Default::default(),
            queue: None,
            retry: None,
            active_deadline_seconds: None,
        };
        let start = Timestamp::from_second(1_700_000_000).unwrap();
        assert_eq!(deadline_of(&spec, Some(start)), None, "no deadline set");
        spec.active_deadline_seconds = Some(60);
        assert_eq!(deadline_of(&spec, None), None, "not started");
        assert_eq!(
            deadline_of(&spec, Some(start)),
            Some(Timestamp::from_second(1_700_000_060).unwrap())
        );

        let mut done = listed(0, 0);
        done.status = Some(TrajectoryStatus::Completed);
        let previous = RolloutGroupStatus {
            trajectories: vec![done, listed(1, 0)],
            ..Default::default()
        };
        let mut obs = observe("g", &previous, &[child(1, 0, None)], &BTreeSet::new(), None);
        obs.abort_unfinished(DEADLINE_EXCEEDED);
        assert_eq!(
            obs.records[&0].reason, None,
            "finished ones keep their outcome"
        );
        assert_eq!(obs.records[&1].status, Some(TrajectoryStatus::Aborted));
        assert_eq!(obs.records[&1].reason.as_deref(), Some(DEADLINE_EXCEEDED));
        assert!(obs.running().is_empty());
    }

    #[test]
    fn unknown_lengths_rank_last_and_missing_rewards_count_as_zero() {
        let mut record = listed(3, 0);
        record.status = Some(TrajectoryStatus::Aborted);
        let t = bar_trajectory(&record).unwrap();
        assert_eq!(t.length, u64::MAX);
        assert_eq!(t.reward, 0.0);
        assert_eq!(bar_trajectory(&listed(4, 0)), None);
    }

    mod retries {
        use super::*;
        use crate::retry::policy::Escalation;
        use crate::retry::{Amounts, RetryParams};
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        use orchard_api::{AttemptRecord, SandboxResources};
        use orchard_bar::Fraction;

        const MI: u64 = 1 << 20;

        fn policy() -> RetryParams {
            RetryParams {
                max_attempts: 3,
                on_oom: Some(Escalation {
                    memory_factor: Fraction::from_f64(2.0).unwrap(),
                    cpu_factor: None,
                    max_memory: 256 * MI,
                    max_cpu: None,
                }),
                on_eviction: true,
                defaults: Amounts {
                    memory: 2048 * MI,
                    cpu: 1000,
                },
                base: Some(memory("64Mi")),
                start: Amounts {
                    memory: 64 * MI,
                    cpu: 1000,
                },
            }
        }

        fn memory(amount: &str) -> SandboxResources {
            SandboxResources {
                memory: Some(Quantity(amount.into())),
                ..SandboxResources::default()
            }
        }

        fn aborted(reason: &str) -> TrajectoryResult {
            TrajectoryResult {
                reward: None,
                status: TrajectoryStatus::Aborted,
                length: None,
                exit_code: None,
                artifact: None,
                reason: Some(reason.into()),
                message: Some(format!("{reason}!")),
            }
        }

        /// Attempt `attempt` of g-0 with `amount` of memory, ended with `result` (and `failure`).
        fn attempt(
            attempt: u32,
            amount: &str,
            result: Option<TrajectoryResult>,
            failure: Option<(&str, &str)>,
        ) -> ChildView {
            ChildView {
                uid: format!("uid-a{attempt}"),
                attempt,
                failure: failure.map(|(r, m)| (r.to_string(), m.to_string())),
                resources: Some(memory(amount)),
                ..child(0, 0, result)
            }
        }

        fn oom(n: u32, amount: &str) -> ChildView {
            attempt(n, amount, Some(aborted("OOMKilled")), None)
        }

        fn ended(reason: &str, amount: &str) -> AttemptRecord {
            AttemptRecord {
                reason: reason.into(),
                message: Some(format!("{reason}!")),
                memory: Some(Quantity(amount.into())),
                cpu: Some(Quantity("1".into())),
            }
        }

        /// g-0 with `attempts` launched and `previous` ended.
        fn record(attempts: i32, previous: Vec<AttemptRecord>) -> TrajectoryRecord {
            TrajectoryRecord {
                attempts,
                previous_attempts: previous,
                ..listed(0, 0)
            }
        }

        /// What a case observes of g-0.
        #[derive(Debug, PartialEq)]
        struct Seen {
            attempts: i32,
            previous: Vec<(String, String)>,
            outcome: Option<(TrajectoryStatus, Option<String>)>,
            superseded: Vec<String>,
            relaunch: Vec<u32>,
            awaiting: Vec<String>,
            unseen: Vec<String>,
        }

        fn seen(
            listed: Option<TrajectoryRecord>,
            children: Vec<ChildView>,
            gone: &[&str],
            retry: Option<&RetryParams>,
        ) -> Seen {
            let previous = RolloutGroupStatus {
                trajectories: listed.into_iter().collect(),
                ..Default::default()
            };
            let gone: BTreeSet<String> = gone.iter().map(|g| g.to_string()).collect();
            let obs = observe("g", &previous, &children, &gone, retry);
            let record = obs.records[&0].clone();
            Seen {
                attempts: record.attempts,
                previous: record
                    .previous_attempts
                    .iter()
                    .map(|a| {
                        (
                            a.reason.clone(),
                            a.memory.clone().map(|q| q.0).unwrap_or_default(),
                        )
                    })
                    .collect(),
                outcome: record.status.map(|s| (s, record.reason.clone())),
                superseded: obs.superseded.iter().map(|s| s.uid.clone()).collect(),
                relaunch: obs.relaunch.clone(),
                awaiting: obs.awaiting_removal.clone(),
                unseen: obs.unseen.clone(),
            }
        }

        fn expect(attempts: i32, previous: &[(&str, &str)]) -> Seen {
            Seen {
                attempts,
                previous: previous
                    .iter()
                    .map(|(r, m)| (r.to_string(), m.to_string()))
                    .collect(),
                outcome: None,
                superseded: vec![],
                relaunch: vec![],
                awaiting: vec![],
                unseen: vec![],
            }
        }

        #[test]
        fn a_retried_attempt_that_waits_to_be_scheduled_says_why_in_its_record() {
            let p = policy();
            let unschedulable = "Unschedulable: 0/1 nodes are available: 1 Insufficient memory.";
            let waiting = |attempt_no: u32, result| ChildView {
                waiting: Some(unschedulable.to_string()),
                ..attempt(attempt_no, "128Mi", result, None)
            };
            let said = |listed: TrajectoryRecord, child: ChildView| {
                let previous = RolloutGroupStatus {
                    trajectories: vec![listed],
                    ..Default::default()
                };
                observe("g", &previous, &[child], &BTreeSet::new(), Some(&p)).records[&0]
                    .waiting
                    .clone()
            };
            let retried = || record(2, vec![ended("OOMKilled", "64Mi")]);
            assert_eq!(
                said(retried(), waiting(2, None)).as_deref(),
                Some(unschedulable),
                "attempt 2 waits"
            );
            assert_eq!(
                said(record(1, vec![]), waiting(1, None)),
                None,
                "a first attempt's wait is its Sandbox's to tell"
            );
            let done = TrajectoryResult {
                reward: Some(1.0),
                status: TrajectoryStatus::Completed,
                ..aborted("x")
            };
            assert_eq!(said(retried(), waiting(2, Some(done))), None, "finished");
            let mut stale = retried();
            stale.waiting = Some(unschedulable.into());
            assert_eq!(
                said(stale, attempt(2, "128Mi", None, None)),
                None,
                "scheduled since"
            );
        }

        #[test]
        fn a_sandboxs_wait_to_be_scheduled_is_its_scheduled_condition_but_not_a_jitter() {
            let status = |phase, reason: &str, message: &str| SandboxStatus {
                phase: Some(phase),
                conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                    type_: "Scheduled".into(),
                    status: "False".into(),
                    reason: reason.into(),
                    message: message.into(),
                    last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        Timestamp::UNIX_EPOCH,
                    ),
                    observed_generation: None,
                }],
                ..SandboxStatus::default()
            };
            assert_eq!(
                scheduling_wait(&status(SandboxPhase::Pending, "Unschedulable", "no fit")),
                Some("Unschedulable: no fit".into())
            );
            assert_eq!(
                scheduling_wait(&status(SandboxPhase::Pending, "LaunchJitter", "at 12:00")),
                None
            );
            assert_eq!(
                scheduling_wait(&status(SandboxPhase::Ready, "Unschedulable", "old")),
                None
            );
            let long = "x".repeat(1000);
            let cut = scheduling_wait(&status(SandboxPhase::Pending, "QuotaExceeded", &long));
            assert_eq!(cut.map(|c| c.len()), Some(WAIT_MESSAGE_KEPT));
        }

        #[test]
        fn attempts_are_retried_replaced_and_recorded_once() {
            let p = policy();
            let a1 = || ended("OOMKilled", "64Mi");
            let mut deleting = oom(1, "64Mi");
            deleting.deleting = true;
            type Row<'a> = (
                &'a str,
                Option<TrajectoryRecord>,
                Vec<ChildView>,
                &'a [&'a str],
                Option<&'a RetryParams>,
                Seen,
            );
            let cases: Vec<Row> = vec![
                (
                    "attempt 1 OOM-killed: recorded as a previous attempt, its child deleted",
                    Some(record(1, vec![])),
                    vec![oom(1, "64Mi")],
                    &[],
                    Some(&p),
                    Seen {
                        superseded: vec!["uid-a1".into()],
                        awaiting: vec!["g-0".into()],
                        ..expect(1, &[("OOMKilled", "64Mi")])
                    },
                ),
                (
                    "found OOM-killed before the status listed it",
                    None,
                    vec![oom(1, "64Mi")],
                    &[],
                    Some(&p),
                    Seen {
                        superseded: vec!["uid-a1".into()],
                        awaiting: vec!["g-0".into()],
                        ..expect(1, &[("OOMKilled", "64Mi")])
                    },
                ),
                (
                    "the ended attempt not deleted yet (a crash after the status write): deleted now",
                    Some(record(1, vec![a1()])),
                    vec![oom(1, "64Mi")],
                    &[],
                    Some(&p),
                    Seen {
                        superseded: vec!["uid-a1".into()],
                        awaiting: vec!["g-0".into()],
                        ..expect(1, &[("OOMKilled", "64Mi")])
                    },
                ),
                (
                    "the ended attempt being deleted: awaited, never taken for the next one",
                    Some(record(1, vec![a1()])),
                    vec![deleting.clone()],
                    &[],
                    Some(&p),
                    Seen {
                        awaiting: vec!["g-0".into()],
                        ..expect(1, &[("OOMKilled", "64Mi")])
                    },
                ),
                (
                    "the name free: the next attempt is due (not unseen, not deleted)",
                    Some(record(1, vec![a1()])),
                    vec![],
                    &["g-0"],
                    Some(&p),
                    Seen {
                        relaunch: vec![0],
                        ..expect(1, &[("OOMKilled", "64Mi")])
                    },
                ),
                (
                    "the next attempt created before the status said so: it is the current one",
                    Some(record(1, vec![a1()])),
                    vec![attempt(2, "128Mi", None, None)],
                    &[],
                    Some(&p),
                    expect(2, &[("OOMKilled", "64Mi")]),
                ),
                (
                    "attempt 2 runs",
                    Some(record(2, vec![a1()])),
                    vec![attempt(2, "128Mi", None, None)],
                    &[],
                    Some(&p),
                    expect(2, &[("OOMKilled", "64Mi")]),
                ),
                (
                    "attempt 2 not in the cache yet: unseen, as any launched one",
                    Some(record(2, vec![a1()])),
                    vec![],
                    &[],
                    Some(&p),
                    Seen {
                        unseen: vec!["g-0".into()],
                        ..expect(2, &[("OOMKilled", "64Mi")])
                    },
                ),
                (
                    "attempt 2 deleted from outside: SandboxDeleted, never relaunched",
                    Some(record(2, vec![a1()])),
                    vec![],
                    &["g-0"],
                    Some(&p),
                    Seen {
                        outcome: Some((TrajectoryStatus::Aborted, Some("SandboxDeleted".into()))),
                        ..expect(2, &[("OOMKilled", "64Mi")])
                    },
                ),
                (
                    "attempt 2 completes: the trajectory's one outcome",
                    Some(record(2, vec![a1()])),
                    vec![attempt(2, "128Mi", Some(result(1.0, 7)), None)],
                    &[],
                    Some(&p),
                    Seen {
                        outcome: Some((TrajectoryStatus::Completed, None)),
                        ..expect(2, &[("OOMKilled", "64Mi")])
                    },
                ),
                (
                    "attempt 2 OOM-killed too: retried at 256Mi next",
                    Some(record(2, vec![a1()])),
                    vec![oom(2, "128Mi")],
                    &[],
                    Some(&p),
                    Seen {
                        superseded: vec!["uid-a2".into()],
                        awaiting: vec!["g-0".into()],
                        ..expect(2, &[("OOMKilled", "64Mi"), ("OOMKilled", "128Mi")])
                    },
                ),
                (
                    "attempt 3 of 3 OOM-killed: aborted OOMKilled, the attempt stays",
                    Some(record(3, vec![a1(), ended("OOMKilled", "128Mi")])),
                    vec![oom(3, "256Mi")],
                    &[],
                    Some(&p),
                    Seen {
                        outcome: Some((TrajectoryStatus::Aborted, Some("OOMKilled".into()))),
                        ..expect(3, &[("OOMKilled", "64Mi"), ("OOMKilled", "128Mi")])
                    },
                ),
                (
                    "OOM-killed at maxMemory: aborted OOMKilled with attempts left",
                    Some(record(2, vec![a1()])),
                    vec![oom(2, "256Mi")],
                    &[],
                    Some(&p),
                    Seen {
                        outcome: Some((TrajectoryStatus::Aborted, Some("OOMKilled".into()))),
                        ..expect(2, &[("OOMKilled", "64Mi")])
                    },
                ),
                (
                    "a failed sandbox's OOM kill is named as such",
                    Some(record(1, vec![])),
                    vec![attempt(
                        1,
                        "256Mi",
                        Some(aborted("SandboxFailed")),
                        Some(("OOMKilled", "killed")),
                    )],
                    &[],
                    Some(&p),
                    Seen {
                        outcome: Some((TrajectoryStatus::Aborted, Some("OOMKilled".into()))),
                        ..expect(1, &[])
                    },
                ),
                (
                    "without a policy: the result as it is",
                    Some(record(1, vec![])),
                    vec![attempt(
                        1,
                        "64Mi",
                        Some(aborted("SandboxFailed")),
                        Some(("OOMKilled", "killed")),
                    )],
                    &[],
                    None,
                    Seen {
                        outcome: Some((TrajectoryStatus::Aborted, Some("SandboxFailed".into()))),
                        ..expect(1, &[])
                    },
                ),
                (
                    "a lost pod: retried with the same resources",
                    Some(record(1, vec![])),
                    vec![attempt(
                        1,
                        "64Mi",
                        Some(aborted("SandboxFailed")),
                        Some(("PodDeleted", "gone")),
                    )],
                    &[],
                    Some(&p),
                    Seen {
                        superseded: vec!["uid-a1".into()],
                        awaiting: vec!["g-0".into()],
                        ..expect(1, &[("PodDeleted", "64Mi")])
                    },
                ),
                (
                    "an ending no retry fixes: the outcome",
                    Some(record(1, vec![])),
                    vec![attempt(1, "64Mi", Some(aborted("TimeExceeded")), None)],
                    &[],
                    Some(&p),
                    Seen {
                        outcome: Some((TrajectoryStatus::Aborted, Some("TimeExceeded".into()))),
                        ..expect(1, &[])
                    },
                ),
            ];
            for (case, listed, children, gone, retry, expected) in cases {
                assert_eq!(seen(listed, children, gone, retry), expected, "{case}");
            }
        }

        #[test]
        fn a_retried_trajectory_is_launched_once_and_runs_until_its_last_attempt() {
            let p = policy();
            let previous = RolloutGroupStatus {
                trajectories: vec![record(1, vec![]), listed(1, 0)],
                ..Default::default()
            };
            let mut other = child(1, 0, Some(result(0.0, 3)));
            other.uid = "uid-other".into();
            let obs = observe(
                "g",
                &previous,
                &[oom(1, "64Mi"), other],
                &BTreeSet::new(),
                Some(&p),
            );
            assert_eq!(obs.launched(), 2, "a retry is not a new trajectory");
            assert_eq!(
                obs.running(),
                ["g-0"],
                "it runs until its last attempt ends"
            );
            assert_eq!(obs.pool().len(), 1, "only g-1 is in BAR's pool");
            let mut relaunched = obs.clone();
            relaunched.relaunch = vec![0];
            relaunched.record_launch("g", 0, 0, 2);
            assert_eq!(relaunched.records[&0].attempts, 2);
            assert!(relaunched.relaunch.is_empty());
            assert_eq!(relaunched.launched(), 2);
        }
    }
}
