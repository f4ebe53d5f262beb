//! A RolloutGroup's status from its observation and the BAR decision (pure). Once `Complete`, the
//! status is final: later events (cancelled trajectories reporting, children being deleted) never
//! change what a trainer already read.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::observe::Observation;
use crate::plumbing::conditions::{self, Desired, Progress};
use crate::plumbing::time::floor_to_second;
use orchard_api::{
    GroupMember, RolloutGroup, RolloutGroupStatus, RolloutPhase, Selection, TrajectoryStatus,
};
use orchard_bar::{self as bar, Class, GroupDecision, classify};

/// The `Complete` condition type.
pub const COMPLETE: &str = "Complete";
/// The `Admitted` condition type (groups on a RolloutQueue only).
pub const ADMITTED: &str = "Admitted";

/// Where a group on a RolloutQueue stands after this reconcile's request, if it made one.
#[derive(Debug, Clone, PartialEq)]
pub enum QueueStanding {
    /// The group names no queue.
    NoQueue,
    /// No stride was asked for this time: the `Admitted` condition stays as it was.
    Unchanged,
    /// The queue admitted a stride now.
    Admitted {
        /// Queue name.
        queue: String,
        /// Stride index.
        stride: u32,
    },
    /// A stride waits for admission.
    Waiting {
        /// `Queued`, `QueueNotFound` or `StrideExceedsQueue`.
        reason: &'static str,
        /// 1-based position in the queue's admission order.
        position: Option<u32>,
        /// When it began to wait.
        since: Timestamp,
        /// What a user reads.
        message: String,
    },
}

fn selection(selection: bar::Selection) -> Selection {
    match selection {
        bar::Selection::Balanced => Selection::Balanced,
        bar::Selection::Relaxed => Selection::Relaxed,
        bar::Selection::TopRanked => Selection::TopRanked,
        bar::Selection::Dropped => Selection::Dropped,
    }
}

fn member_status(outcome: bar::Outcome) -> TrajectoryStatus {
    match outcome {
        bar::Outcome::Completed => TrajectoryStatus::Completed,
        bar::Outcome::Truncated => TrajectoryStatus::Truncated,
        bar::Outcome::Aborted => TrajectoryStatus::Aborted,
    }
}

/// The status of `group` after observing `observation`; `decision` is set when BAR finished the group,
/// `stride_size` is s. Trajectories still running when a group finishes are marked `Cancelled`.
pub fn group_status(
    group: &RolloutGroup,
    observation: &Observation,
    decision: Option<&GroupDecision>,
    stride_size: u32,
    queue: &QueueStanding,
    now: Timestamp,
) -> RolloutGroupStatus {
    let previous = group.status.clone().unwrap_or_default();
    let generation = group.metadata.generation;
    let mut records: Vec<_> = observation.records.values().cloned().collect();
    if decision.is_some() {
        for record in records
            .iter_mut()
            .filter(|r| r.status.is_none() && r.reason.is_none())
        {
            record.reason = Some("Cancelled".into());
        }
    }
    let pool = observation.pool();
    let count = |class: Class| {
        i32::try_from(pool.iter().filter(|t| classify(t) == class).count()).unwrap_or(i32::MAX)
    };
    let launched = i32::try_from(records.len()).unwrap_or(i32::MAX);
    let running = i32::try_from(
        records
            .iter()
            .filter(|r| r.status.is_none() && r.reason.is_none())
            .count(),
    )
    .unwrap_or(i32::MAX);
    let strides_launched = observation.records.keys().next_back().map_or(0, |last| {
        i32::try_from(last / stride_size.max(1) + 1).unwrap_or(i32::MAX)
    });
    let start_time = previous
        .start_time
        .clone()
        .or_else(|| (launched > 0).then(|| Time(floor_to_second(now))));

    let mut status = RolloutGroupStatus {
        phase: Some(if launched == 0 {
            RolloutPhase::Pending
        } else {
            RolloutPhase::Generating
        }),
        strides_launched,
        trajectories_launched: launched,
        positive_trajectories: count(Class::Positive),
        negative_trajectories: count(Class::Negative),
        backfill_trajectories: count(Class::Backfill),
        running_trajectories: running,
        observed_generation: generation,
        start_time,
        last_admission_time: previous.last_admission_time.clone(),
        ..RolloutGroupStatus::default()
    };
    let complete = match decision {
        Some(decision) => {
            let chosen = selection(decision.selection);
            status.phase = Some(RolloutPhase::Complete);
            status.selection = Some(chosen);
            status.positives = Some(i32::try_from(decision.positives).unwrap_or(i32::MAX));
            status.drop_reason = decision.drop_reason.map(|r| r.as_str().to_string());
            status.completion_time = previous
                .completion_time
                .clone()
                .or_else(|| Some(Time(floor_to_second(now))));
            status.group = decision
                .group
                .iter()
                .map(|member| GroupMember {
                    name: member.name.clone(),
                    reward: member.reward,
                    status: member_status(member.outcome),
                    length: i64::try_from(member.length).unwrap_or(i64::MAX),
                    artifact: records
                        .iter()
                        .find(|r| r.name == member.name)
                        .and_then(|r| r.artifact.clone()),
                })
                .collect();
            let message = match decision.drop_reason {
                Some(reason) => format!(
                    "group dropped ({}) after {launched} trajectories; create another RolloutGroup for this prompt",
                    reason.as_str()
                ),
                None => format!(
                    "{:?} group of {} with {} positives after {launched} trajectories",
                    chosen,
                    decision.group.len(),
                    decision.positives
                ),
            };
            status.message = Some(message.clone());
            Desired::new(COMPLETE, true, format!("{chosen:?}"), message)
        }
        None => Desired::new(
            COMPLETE,
            false,
            if launched == 0 {
                "Pending"
            } else {
                "Generating"
            },
            format!("{launched} trajectories launched, {running} running"),
        ),
    };
    status.trajectories = records;
    let mut desired = vec![complete];
    match queue {
        QueueStanding::NoQueue => {}
        QueueStanding::Unchanged => {
            if let Some(kept) = previous.conditions.iter().find(|c| c.type_ == ADMITTED) {
                desired.push(Desired::new(
                    ADMITTED,
                    kept.status == "True",
                    kept.reason.clone(),
                    kept.message.clone(),
                ));
            }
        }
        QueueStanding::Admitted { queue, stride } => {
            status.last_admission_time = Some(Time(floor_to_second(now)));
            desired.push(Desired::new(
                ADMITTED,
                true,
                "Admitted",
                format!("stride {stride} admitted by RolloutQueue {queue}"),
            ));
        }
        QueueStanding::Waiting {
            reason,
            position,
            since,
            message,
        } => {
            if decision.is_none() {
                status.phase = Some(RolloutPhase::Queued);
                status.queue_position = position.and_then(|p| i32::try_from(p).ok());
                status.queued_since = Some(Time(floor_to_second(*since)));
                status.message = Some(message.clone());
            }
            desired.push(Desired::new(ADMITTED, false, *reason, message.clone()));
        }
    }
    let progress = match (decision, queue) {
        (Some(_), _) => Progress::Settled,
        (
            None,
            QueueStanding::Waiting {
                reason, message, ..
            },
        ) if *reason != "Queued" => Progress::Stalled((*reason).to_string(), message.clone()),
        (None, QueueStanding::Waiting { message, .. }) => {
            Progress::Reconciling("Queued".into(), message.clone())
        }
        (None, _) if launched == 0 => Progress::Reconciling("Pending".into(), String::new()),
        (None, _) => Progress::Reconciling(
            "Generating".into(),
            format!("{launched} trajectories launched, {running} running"),
        ),
    };
    desired.extend(conditions::kstatus(&progress));
    status.conditions = conditions::merge(&previous.conditions, desired, generation, now);
    status
}

/// A Failed status for a group that cannot run: `reason` is `InvalidSpec` (its spec cannot be turned
/// into BAR parameters) or `NameConflict` (a trajectory's name is held by an object not its own).
/// Terminal: the spec is immutable.
pub fn failed_status(
    group: &RolloutGroup,
    reason: &str,
    message: String,
    now: Timestamp,
) -> RolloutGroupStatus {
    let previous = group.status.clone().unwrap_or_default();
    RolloutGroupStatus {
        phase: Some(RolloutPhase::Failed),
        message: Some(message.clone()),
        observed_generation: group.metadata.generation,
        conditions: conditions::merge(
            &previous.conditions,
            std::iter::once(Desired::new(COMPLETE, false, reason, message.clone()))
                .chain(conditions::kstatus(&Progress::Stalled(
                    reason.to_string(),
                    message.clone(),
                )))
                .collect(),
            group.metadata.generation,
            now,
        ),
        ..previous
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::{
        CleanupPolicy, EarlyStop, PositiveFraction, RolloutGroupSpec, SandboxSpec, SandboxTemplate,
        TrajectoryRecord,
    };
    use orchard_bar::{Member, Outcome};

    fn group() -> RolloutGroup {
        let mut g = RolloutGroup::new(
            "g",
            RolloutGroupSpec {
                launch_jitter_seconds: None,
                group_size: 2,
                max_trajectories: 4,
                stride: Some(2),
                positive_fraction: PositiveFraction::default(),
                early_stop: EarlyStop::StrideBoundary,
                filter: None,
                template: SandboxTemplate {
                    metadata: Default::default(),
                    spec: SandboxSpec::default(),
                },
                trajectory_timeout_seconds: None,
                cleanup: CleanupPolicy::Delete,
                queue: None,
                retry: None,
                active_deadline_seconds: None,
            },
        );
        g.metadata.generation = Some(1);
        g
    }

    fn record(index: u32, status: Option<TrajectoryStatus>, reward: f64) -> TrajectoryRecord {
        TrajectoryRecord {
            name: format!("g-{index}"),
            stride: i32::try_from(index / 2).unwrap(),
            status,
            reward: status.map(|_| reward),
            length: status.map(|_| 10 + i64::from(index)),
            artifact: Some(format!("art-{index}")),
            reason: None,
            attempts: 1,
            previous_attempts: Vec::new(),
            waiting: None,
        }
    }

    fn observation(records: Vec<TrajectoryRecord>) -> Observation {
        Observation {
            records: records
                .into_iter()
                .enumerate()
                .map(|(i, r)| (u32::try_from(i).unwrap(), r))
                .collect(),
            ..Observation::default()
        }
    }

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_generating_group_counts_its_trajectories() {
        let obs = observation(vec![
            record(0, Some(TrajectoryStatus::Completed), 1.0),
            record(1, None, 0.0),
            record(2, Some(TrajectoryStatus::Aborted), 0.0),
        ]);
        let status = group_status(&group(), &obs, None, 2, &QueueStanding::NoQueue, now());
        assert_eq!(status.phase, Some(RolloutPhase::Generating));
        assert_eq!(status.trajectories_launched, 3);
        assert_eq!(status.strides_launched, 2);
        assert_eq!(
            (
                status.positive_trajectories,
                status.negative_trajectories,
                status.backfill_trajectories
            ),
            (1, 0, 1)
        );
        assert_eq!(status.running_trajectories, 1);
        assert!(!conditions::is_true(&status.conditions, COMPLETE));
        assert!(status.start_time.is_some());
    }

    #[test]
    fn a_finished_group_records_members_with_artifacts_and_cancels_runners() {
        let obs = observation(vec![
            record(0, Some(TrajectoryStatus::Completed), 1.0),
            record(1, Some(TrajectoryStatus::Completed), 0.0),
            record(2, None, 0.0),
        ]);
        let decision = GroupDecision {
            selection: bar::Selection::Balanced,
            group: vec![
                Member {
                    name: "g-0".into(),
                    reward: 1.0,
                    outcome: Outcome::Completed,
                    length: 10,
                    positive: true,
                },
                Member {
                    name: "g-1".into(),
                    reward: 0.0,
                    outcome: Outcome::Completed,
                    length: 11,
                    positive: false,
                },
            ],
            positives: 1,
            drop_reason: None,
        };
        let status = group_status(
            &group(),
            &obs,
            Some(&decision),
            2,
            &QueueStanding::NoQueue,
            now(),
        );
        assert_eq!(status.phase, Some(RolloutPhase::Complete));
        assert_eq!(status.selection, Some(Selection::Balanced));
        assert_eq!(status.positives, Some(1));
        assert_eq!(status.group.len(), 2);
        assert_eq!(status.group[0].artifact.as_deref(), Some("art-0"));
        assert_eq!(status.trajectories[2].reason.as_deref(), Some("Cancelled"));
        assert_eq!(status.running_trajectories, 0);
        assert!(conditions::is_true(&status.conditions, COMPLETE));
        assert!(status.completion_time.is_some());
    }

    #[test]
    fn a_dropped_group_says_so() {
        let obs = observation(vec![record(0, Some(TrajectoryStatus::Completed), 0.0)]);
        let decision = GroupDecision::dropped(bar::DropReason::ZeroVariance);
        let status = group_status(
            &group(),
            &obs,
            Some(&decision),
            2,
            &QueueStanding::NoQueue,
            now(),
        );
        assert_eq!(status.selection, Some(Selection::Dropped));
        assert_eq!(status.drop_reason.as_deref(), Some("ZeroVariance"));
        assert!(status.group.is_empty());
        assert!(
            status
                .message
                .unwrap()
                .contains("create another RolloutGroup")
        );
    }

    #[test]
    fn nothing_launched_is_pending() {
        let status = group_status(
            &group(),
            &Observation::default(),
            None,
            2,
            &QueueStanding::NoQueue,
            now(),
        );
        assert_eq!(status.phase, Some(RolloutPhase::Pending));
        assert!(status.start_time.is_none());
    }

    #[test]
    fn a_waiting_stride_is_queued_with_its_position_and_an_admission_sets_the_fair_key() {
        let waiting = QueueStanding::Waiting {
            reason: "Queued",
            position: Some(3),
            since: now(),
            message: "waiting for 2 slots of RolloutQueue q".into(),
        };
        let status = group_status(&group(), &Observation::default(), None, 2, &waiting, now());
        assert_eq!(status.phase, Some(RolloutPhase::Queued));
        assert_eq!(status.queue_position, Some(3));
        assert!(status.queued_since.is_some());
        let admitted = status
            .conditions
            .iter()
            .find(|c| c.type_ == ADMITTED)
            .unwrap();
        assert_eq!(
            (admitted.status.as_str(), admitted.reason.as_str()),
            ("False", "Queued")
        );
        assert!(status.last_admission_time.is_none());

        let mut g = group();
        g.status = Some(status);
        let standing = QueueStanding::Admitted {
            queue: "q".into(),
            stride: 0,
        };
        let status = group_status(&g, &Observation::default(), None, 2, &standing, now());
        assert_eq!(status.queue_position, None, "no longer waiting");
        assert_eq!(status.queued_since, None);
        assert!(status.last_admission_time.is_some());
        let admitted = status
            .conditions
            .iter()
            .find(|c| c.type_ == ADMITTED)
            .unwrap();
        assert_eq!(admitted.status, "True");

        g.status = Some(status.clone());
        let kept = group_status(
            &g,
            &Observation::default(),
            None,
            2,
            &QueueStanding::Unchanged,
            now(),
        );
        assert_eq!(
            kept.conditions, status.conditions,
            "Unchanged keeps the Admitted condition"
        );
        assert_eq!(kept.last_admission_time, status.last_admission_time);
    }

    #[test]
    fn kstatus_conditions_follow_the_group() {
        let state = |status: &RolloutGroupStatus| {
            let word = |t: &str| {
                status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == t)
                    .map(|c| (c.status.clone(), c.reason.clone()))
            };
            (word(conditions::RECONCILING), word(conditions::STALLED))
        };
        let t = |s: &str, r: &str| Some((s.to_string(), r.to_string()));
        let pending = group_status(
            &group(),
            &Observation::default(),
            None,
            2,
            &QueueStanding::NoQueue,
            now(),
        );
        assert_eq!(
            state(&pending),
            (t("True", "Pending"), t("False", "Progressing"))
        );
        let missing = QueueStanding::Waiting {
            reason: "QueueNotFound",
            position: None,
            since: now(),
            message: "no queue".into(),
        };
        let stalled = group_status(&group(), &Observation::default(), None, 2, &missing, now());
        assert_eq!(
            state(&stalled),
            (t("False", "Stalled"), t("True", "QueueNotFound"))
        );
        let failed = failed_status(&group(), "InvalidSpec", "bad".into(), now());
        assert_eq!(
            state(&failed),
            (t("False", "Stalled"), t("True", "InvalidSpec"))
        );
        assert!(
            failed
                .conditions
                .iter()
                .all(|c| c.observed_generation == Some(1))
        );
    }
}
