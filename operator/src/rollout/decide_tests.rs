//! Every decision of a RolloutGroup reconcile, as tables: inputs in, plan out, no API server.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::*;
use crate::queue::book::WaitReason;
use crate::rollout::observe::observe;
use orchard_api::{
    AdmissionOrder, PositiveFraction, RolloutGroupSpec, SandboxSpec, SandboxTemplate,
    TrajectoryRecord,
};

fn t(s: &str) -> Timestamp {
    s.parse().expect("a timestamp")
}

fn now() -> Timestamp {
    t("2026-01-01T00:10:00Z")
}

const RESYNC: Duration = Duration::from_secs(300);

fn defaults() -> ResourceDefaults {
    ResourceDefaults {
        cpu: "1".into(),
        memory: "2Gi".into(),
    }
}

/// Group `g`: N = 2 of at most 4, strides of 2, exactly one positive wanted.
fn group(early_stop: EarlyStop, cleanup: CleanupPolicy) -> RolloutGroup {
    let mut g = RolloutGroup::new(
        "g",
        RolloutGroupSpec {
            launch_jitter_seconds: None,
            group_size: 2,
            max_trajectories: 4,
            stride: Some(2),
            positive_fraction: PositiveFraction { min: 0.5, max: 0.5 },
            early_stop,
            filter: None,
            template: SandboxTemplate {
                metadata: Default::default(),
                spec: SandboxSpec::default(),
            },
            trajectory_timeout_seconds: None,
            cleanup,
            queue: None,
            retry: None,
            active_deadline_seconds: None,
        },
    );
    g.metadata.namespace = Some("team".into());
    g.metadata.uid = Some("uid-g".into());
    g.metadata.generation = Some(1);
    g.metadata.creation_timestamp = Some(Time(t("2026-01-01T00:08:30Z")));
    g
}

fn plain() -> RolloutGroup {
    group(EarlyStop::StrideBoundary, CleanupPolicy::Delete)
}

fn queued(mut g: RolloutGroup) -> RolloutGroup {
    g.spec.queue = Some("q".into());
    g
}

fn with_status(mut g: RolloutGroup, status: RolloutGroupStatus) -> RolloutGroup {
    g.status = Some(status);
    g
}

fn phase(phase: RolloutPhase, trajectories: Vec<TrajectoryRecord>) -> RolloutGroupStatus {
    RolloutGroupStatus {
        phase: Some(phase),
        trajectories,
        ..RolloutGroupStatus::default()
    }
}

fn params() -> Params {
    bar_params(&plain().spec).expect("valid")
}

/// Trajectory `index` (stride `index / 2`): running without `outcome`, else finished with `reward`.
fn record(index: u32, outcome: Option<(TrajectoryStatus, f64)>) -> TrajectoryRecord {
    TrajectoryRecord {
        name: format!("g-{index}"),
        stride: i32::try_from(index / 2).expect("small"),
        status: outcome.map(|(s, _)| s),
        reward: outcome.map(|(_, r)| r),
        length: outcome.map(|_| 10 + i64::from(index)),
        artifact: None,
        reason: None,
        attempts: 1,
        previous_attempts: Vec::new(),
        waiting: None,
    }
}

fn done(index: u32, reward: f64) -> TrajectoryRecord {
    record(index, Some((TrajectoryStatus::Completed, reward)))
}

fn running(index: u32) -> TrajectoryRecord {
    record(index, None)
}

fn stopped(index: u32, reason: &str) -> TrajectoryRecord {
    TrajectoryRecord {
        reason: Some(reason.into()),
        ..running(index)
    }
}

/// What the group observes when its status lists `records` (and their children exist).
fn observed(records: Vec<TrajectoryRecord>) -> Observation {
    Observation {
        records: records
            .into_iter()
            .map(|r| {
                let index = r.name["g-".len()..].parse().expect("an index");
                (index, r)
            })
            .collect(),
        ..Observation::default()
    }
}

fn named(names: &[&str]) -> Targets {
    Targets::Named(names.iter().map(|n| n.to_string()).collect())
}

/// A short word for an entry, for the table.
fn entry_word(entry: &Entry) -> String {
    match entry {
        Entry::Cleanup(targets) => format!("cleanup {targets:?}"),
        Entry::Invalid(failure) => format!("invalid {}", failure.reason),
        Entry::Failed => "failed".into(),
        Entry::Run(_, None) => "run".into(),
        Entry::Run(_, Some(retry)) => format!("run, {} attempts", retry.max_attempts),
    }
}

#[test]
fn the_entry_follows_the_phase_and_the_spec() {
    let mut invalid = plain();
    invalid.spec.stride = Some(3);
    let complete_trajectories = vec![
        stopped(0, "Cancelled"),
        stopped(1, DEADLINE_EXCEEDED),
        stopped(2, "SandboxDeleted"),
        done(3, 1.0),
    ];
    let cases: Vec<(&str, RolloutGroup, String)> = vec![
        ("new", plain(), "run".into()),
        (
            "generating",
            with_status(plain(), phase(RolloutPhase::Generating, vec![running(0)])),
            "run".into(),
        ),
        (
            "queued",
            with_status(plain(), phase(RolloutPhase::Queued, vec![])),
            "run".into(),
        ),
        (
            "complete, cleanup Delete",
            with_status(
                plain(),
                phase(RolloutPhase::Complete, complete_trajectories.clone()),
            ),
            format!("cleanup {:?}", Targets::All),
        ),
        (
            "complete, cleanup Keep, Eager: the cancelled and the aborted at the deadline",
            with_status(
                group(EarlyStop::Eager, CleanupPolicy::Keep),
                phase(RolloutPhase::Complete, complete_trajectories.clone()),
            ),
            format!("cleanup {:?}", named(&["g-0", "g-1"])),
        ),
        (
            "complete, cleanup Keep, StrideBoundary: the aborted at the deadline",
            with_status(
                group(EarlyStop::StrideBoundary, CleanupPolicy::Keep),
                phase(RolloutPhase::Complete, complete_trajectories),
            ),
            format!("cleanup {:?}", named(&["g-1"])),
        ),
        (
            "complete with an invalid spec: cleaned up first",
            with_status(invalid.clone(), phase(RolloutPhase::Complete, vec![])),
            format!("cleanup {:?}", Targets::All),
        ),
        ("invalid", invalid.clone(), "invalid InvalidSpec".into()),
        (
            "failed with an invalid spec: failed again",
            with_status(invalid.clone(), phase(RolloutPhase::Failed, vec![])),
            "invalid InvalidSpec".into(),
        ),
        (
            "failed",
            with_status(plain(), phase(RolloutPhase::Failed, vec![])),
            "failed".into(),
        ),
    ];
    for (case, g, expected) in cases {
        assert_eq!(
            entry_word(&plan_entry(&g, &defaults(), now())),
            expected,
            "{case}"
        );
    }

    let Entry::Invalid(failure) = plan_entry(&invalid, &defaults(), now()) else {
        panic!("an invalid spec fails");
    };
    assert!(failure.message.contains("divide"), "{}", failure.message);
    assert_eq!(failure.status.phase, Some(RolloutPhase::Failed));
    assert_eq!(failure.status.message.as_deref(), Some(&*failure.message));
    let Entry::Run(run, None) = plan_entry(&plain(), &defaults(), now()) else {
        panic!("a valid group runs");
    };
    assert_eq!(run, params());
}

#[test]
fn targets_pick_by_name() {
    assert!(Targets::All.picks("anything"));
    assert!(named(&["g-1"]).picks("g-1"));
    assert!(!named(&["g-1"]).picks("g-10"));
    let status = phase(
        RolloutPhase::Generating,
        vec![
            done(0, 1.0),
            running(1),
            record(2, Some((TrajectoryStatus::Aborted, 0.0))),
            stopped(3, "Cancelled"),
        ],
    );
    assert_eq!(
        finished(&status),
        named(&["g-0", "g-2"]),
        "only recorded outcomes"
    );
    assert_eq!(
        finished(&RolloutGroupStatus::default()),
        named(&[]),
        "nothing listed"
    );
}

#[test]
fn a_short_latest_stride_is_repaired() {
    let launch = |index, stride| Launch {
        index,
        stride,
        attempt: 1,
        resources: None,
        launch_after: None,
    };
    let cases: Vec<(&str, Vec<TrajectoryRecord>, Vec<Launch>)> = vec![
        ("nothing launched", vec![], vec![]),
        ("a whole stride", vec![running(0), running(1)], vec![]),
        ("two whole strides", (0..4).map(running).collect(), vec![]),
        (
            "the first stride short",
            vec![running(0)],
            vec![launch(1, 0)],
        ),
        (
            "the second stride short",
            vec![done(0, 0.0), done(1, 0.0), running(2)],
            vec![launch(3, 1)],
        ),
        (
            "the start of the second stride missing",
            vec![done(0, 0.0), done(1, 0.0), running(3)],
            vec![launch(2, 1)],
        ),
    ];
    for (case, records, expected) in cases {
        assert_eq!(
            plan_repair(&observed(records), &params(), None),
            expected,
            "{case}"
        );
    }
}

/// A short word for a step, for the table.
fn step_word(next: &Next) -> String {
    match next {
        Next::Wait => "wait".into(),
        Next::Launch(stride) => format!(
            "launch stride {} ({} from {})",
            stride.index, stride.count, stride.first
        ),
        Next::Finish(decision) => format!(
            "finish {} with {} positives",
            decision.selection.as_str(),
            decision.positives
        ),
    }
}

/// A row of the step table: case, parameters, records, deadline, the step in words.
type StepRow<'a> = (
    &'a str,
    &'a Params,
    Vec<TrajectoryRecord>,
    Option<Timestamp>,
    &'a str,
);

#[test]
fn the_step_follows_the_bar_engine_until_the_deadline() {
    let stride_boundary = params();
    let eager = bar_params(&group(EarlyStop::Eager, CleanupPolicy::Delete).spec).expect("valid");
    let later = Some(t("2026-01-01T00:20:00Z"));
    let passed = Some(t("2026-01-01T00:09:59Z"));
    let cases: Vec<StepRow> = vec![
        (
            "nothing launched",
            &stride_boundary,
            vec![],
            None,
            "launch stride 0 (2 from 0)",
        ),
        (
            "the first stride runs",
            &stride_boundary,
            vec![done(0, 1.0), running(1)],
            None,
            "wait",
        ),
        (
            "the first stride balances",
            &stride_boundary,
            vec![done(0, 1.0), done(1, 0.0)],
            None,
            "finish Balanced with 1 positives",
        ),
        (
            "the first stride cannot balance",
            &stride_boundary,
            vec![done(0, 0.0), done(1, 0.0)],
            None,
            "launch stride 1 (2 from 2)",
        ),
        (
            "the budget is spent without a positive",
            &stride_boundary,
            (0..4).map(|i| done(i, 0.0)).collect(),
            None,
            "finish Dropped with 0 positives",
        ),
        (
            "StrideBoundary waits for the whole stride",
            &stride_boundary,
            vec![done(0, 0.0), done(1, 0.0), done(2, 1.0), running(3)],
            None,
            "wait",
        ),
        (
            "Eager takes a balanced group while others run",
            &eager,
            vec![done(0, 0.0), done(1, 0.0), done(2, 1.0), running(3)],
            None,
            "finish Balanced with 1 positives",
        ),
        (
            "a deadline still ahead changes nothing",
            &stride_boundary,
            vec![done(0, 1.0), running(1)],
            later,
            "wait",
        ),
        (
            "a passed deadline decides from what finished",
            &stride_boundary,
            vec![done(0, 0.0), done(1, 0.0), done(2, 1.0), running(3)],
            passed,
            "finish Balanced with 1 positives",
        ),
        (
            "a deadline passed before anything launched",
            &stride_boundary,
            vec![],
            passed,
            "finish Dropped with 0 positives",
        ),
    ];
    for (case, params, records, deadline, expected) in cases {
        let mut observation = observed(records);
        let next = plan_step(params, &mut observation, deadline, now());
        assert_eq!(step_word(&next), expected, "{case}");
    }
}

#[test]
fn a_passed_deadline_aborts_what_runs_and_nothing_else() {
    let mut observation = observed(vec![done(0, 1.0), running(1)]);
    let before = observation.clone();
    plan_step(
        &params(),
        &mut observation,
        Some(t("2026-01-01T00:20:00Z")),
        now(),
    );
    assert_eq!(observation, before, "a deadline ahead leaves it alone");
    // Exactly at the deadline counts as passed.
    plan_step(&params(), &mut observation, Some(now()), now());
    assert_eq!(observation.records[&0], done(0, 1.0));
    assert_eq!(
        observation.records[&1].status,
        Some(TrajectoryStatus::Aborted)
    );
    assert_eq!(
        observation.records[&1].reason.as_deref(),
        Some(DEADLINE_EXCEEDED)
    );
}

#[test]
fn a_stride_names_and_launches_its_trajectories() {
    let stride = Stride {
        index: 1,
        first: 2,
        count: 2,
    };
    assert_eq!(stride.names("g"), ["g-2", "g-3"]);
    assert_eq!(
        stride.launches(),
        [
            Launch {
                index: 2,
                stride: 1,
                attempt: 1,
                resources: None,
                launch_after: None,
            },
            Launch {
                index: 3,
                stride: 1,
                attempt: 1,
                resources: None,
                launch_after: None,
            }
        ]
    );
}

fn key() -> QueueKey {
    QueueKey {
        namespace: "team".into(),
        name: "q".into(),
    }
}

#[test]
fn the_queue_verdict_becomes_the_standing_and_the_launch() {
    let stride = Stride {
        index: 1,
        first: 2,
        count: 2,
    };
    let since = t("2026-01-01T00:09:00Z");
    let limits = Some(Limits {
        max_running: 8,
        order: AdmissionOrder::Fifo,
    });
    let waiting = |reason: WaitReason, position: Option<u32>, limits: Option<Limits>| {
        Some(QueueVerdict {
            key: key(),
            verdict: Verdict::Waiting {
                reason,
                position,
                since,
                used: 7,
            },
            limits,
        })
    };
    let waiting_standing = |reason: WaitReason, position: Option<u32>, limits: Option<Limits>| {
        QueueStanding::Waiting {
            reason: reason.as_str(),
            position,
            since,
            message: waiting_message(&key(), 1, 2, reason, position, 7, limits),
        }
    };
    let cases: Vec<(&str, Option<QueueVerdict>, Admission)> = vec![
        (
            "no queue: launch",
            None,
            Admission {
                standing: QueueStanding::NoQueue,
                launch: true,
                withdraw: false,
            },
        ),
        (
            "admitted: launch and leave the waiting list",
            Some(QueueVerdict {
                key: key(),
                verdict: Verdict::Admitted { since },
                limits,
            }),
            Admission {
                standing: QueueStanding::Admitted {
                    queue: "q".into(),
                    stride: 1,
                },
                launch: true,
                withdraw: true,
            },
        ),
        (
            "queued: wait in line",
            waiting(WaitReason::Queued, Some(2), limits),
            Admission {
                standing: waiting_standing(WaitReason::Queued, Some(2), limits),
                launch: false,
                withdraw: false,
            },
        ),
        (
            "no such queue",
            waiting(WaitReason::QueueNotFound, None, None),
            Admission {
                standing: waiting_standing(WaitReason::QueueNotFound, None, None),
                launch: false,
                withdraw: false,
            },
        ),
        (
            "a stride larger than the queue",
            waiting(WaitReason::StrideExceedsQueue, None, limits),
            Admission {
                standing: waiting_standing(WaitReason::StrideExceedsQueue, None, limits),
                launch: false,
                withdraw: false,
            },
        ),
    ];
    for (case, verdict, expected) in cases {
        assert_eq!(admit(&stride, verdict), expected, "{case}");
    }
    let QueueStanding::Waiting { message, .. } =
        admit(&stride, waiting(WaitReason::Queued, Some(2), limits)).standing
    else {
        panic!("waiting");
    };
    assert!(
        message.contains("7 of 8 slots in use, position 2"),
        "{message}"
    );

    assert_eq!(
        unasked(true),
        Admission {
            standing: QueueStanding::Unchanged,
            launch: false,
            withdraw: true,
        },
        "on a queue, a group that asks nothing leaves the waiting list and keeps its condition"
    );
    assert_eq!(
        unasked(false),
        Admission {
            standing: QueueStanding::NoQueue,
            launch: false,
            withdraw: false,
        }
    );
}

fn input(params: &Params, queued: bool, deadline: Option<Timestamp>) -> StatusInput<'_> {
    StatusInput {
        params,
        retry: None,
        queued,
        deadline,
        resync: RESYNC,
        now: now(),
    }
}

fn balanced() -> GroupDecision {
    let mut observation = observed(vec![done(0, 1.0), done(1, 0.0)]);
    match plan_step(&params(), &mut observation, None, now()) {
        Next::Finish(decision) => decision,
        other => panic!("balanced: {other:?}"),
    }
}

fn queue_waiting(reason: WaitReason) -> QueueStanding {
    QueueStanding::Waiting {
        reason: reason.as_str(),
        position: Some(1),
        since: now(),
        message: format!("waits: {}", reason.as_str()),
    }
}

/// A short description of a status plan, for the table.
#[derive(Debug, PartialEq)]
struct Summary {
    conflict: Option<String>,
    phase: Option<RolloutPhase>,
    event: Option<(bool, String)>,
    completion: Option<&'static str>,
    delete: Option<Targets>,
    requeue: Option<Duration>,
}

fn summary(plan: &StatusPlan) -> Summary {
    match plan {
        StatusPlan::Conflict(failure) => Summary {
            conflict: Some(failure.message.clone()),
            phase: failure.status.phase,
            event: None,
            completion: None,
            delete: None,
            requeue: None,
        },
        StatusPlan::Record(record) => Summary {
            conflict: None,
            phase: record.status.phase,
            event: record
                .admission_event
                .as_ref()
                .map(|e| (e.warning, e.reason.clone())),
            completion: record.completion.as_ref().map(|c| c.selection),
            delete: record.delete.clone(),
            requeue: Some(record.requeue),
        },
    }
}

fn recorded(
    phase: RolloutPhase,
    delete: Option<Targets>,
    requeue: Duration,
    completion: Option<&'static str>,
) -> Summary {
    Summary {
        conflict: None,
        phase: Some(phase),
        event: None,
        completion,
        delete,
        requeue: Some(requeue),
    }
}

/// One row of the status table.
struct StatusCase<'a> {
    case: &'a str,
    group: RolloutGroup,
    observation: Observation,
    decision: Option<&'a GroupDecision>,
    standing: QueueStanding,
    blocked: Vec<ChildState<()>>,
    queued: bool,
    deadline: Option<Timestamp>,
    expected: Summary,
}

#[test]
fn the_status_plan_follows_the_creates_the_decision_and_the_queue() {
    let p = params();
    let generating = || observed(vec![done(0, 0.0), running(1)]);
    let waiting = || ChildState::Waiting("a previous group's g-1".to_string());
    let conflict = || ChildState::Conflict("Sandbox g-1 has no valid seal".to_string());
    let decision = balanced();
    let complete = || observed(vec![done(0, 1.0), done(1, 0.0)]);
    let in_ten_seconds = t("2026-01-01T00:10:10Z");
    let row = |case, group, observation, standing, expected| StatusCase {
        case,
        group,
        observation,
        decision: None,
        standing,
        blocked: vec![],
        queued: false,
        deadline: None,
        expected,
    };
    let cases = vec![
        StatusCase {
            blocked: vec![waiting(), conflict()],
            expected: Summary {
                conflict: Some("Sandbox g-1 has no valid seal".into()),
                phase: Some(RolloutPhase::Failed),
                event: None,
                completion: None,
                delete: None,
                requeue: None,
            },
            ..row(
                "a conflict fails the group, after any wait",
                plain(),
                generating(),
                QueueStanding::NoQueue,
                recorded(RolloutPhase::Failed, None, RESYNC, None),
            )
        },
        StatusCase {
            decision: Some(&decision),
            blocked: vec![conflict()],
            expected: Summary {
                conflict: Some("Sandbox g-1 has no valid seal".into()),
                phase: Some(RolloutPhase::Failed),
                event: None,
                completion: None,
                delete: None,
                requeue: None,
            },
            ..row(
                "a conflict fails even a decided group",
                plain(),
                complete(),
                QueueStanding::NoQueue,
                recorded(RolloutPhase::Failed, None, RESYNC, None),
            )
        },
        row(
            "nothing launched: pending, back at the resync",
            plain(),
            Observation::default(),
            QueueStanding::NoQueue,
            recorded(RolloutPhase::Pending, None, RESYNC, None),
        ),
        row(
            "generating without a queue: nothing released",
            plain(),
            generating(),
            QueueStanding::NoQueue,
            recorded(RolloutPhase::Generating, None, RESYNC, None),
        ),
        StatusCase {
            blocked: vec![waiting()],
            ..row(
                "a name still held: back soon",
                plain(),
                generating(),
                QueueStanding::NoQueue,
                recorded(
                    RolloutPhase::Generating,
                    None,
                    PREVIOUS_INCARNATION_RECHECK,
                    None,
                ),
            )
        },
        StatusCase {
            decision: Some(&decision),
            ..row(
                "decided: complete, cleaned up, back at the resync",
                plain(),
                complete(),
                QueueStanding::NoQueue,
                recorded(
                    RolloutPhase::Complete,
                    Some(Targets::All),
                    RESYNC,
                    Some("Balanced"),
                ),
            )
        },
        StatusCase {
            decision: Some(&decision),
            ..row(
                "decided under Keep: the cancelled stay (StrideBoundary)",
                group(EarlyStop::StrideBoundary, CleanupPolicy::Keep),
                observed(vec![done(0, 1.0), done(1, 0.0), running(2)]),
                QueueStanding::NoQueue,
                recorded(
                    RolloutPhase::Complete,
                    Some(named(&[])),
                    RESYNC,
                    Some("Balanced"),
                ),
            )
        },
        StatusCase {
            decision: Some(&decision),
            ..row(
                "decided under Keep and Eager: the cancelled go",
                group(EarlyStop::Eager, CleanupPolicy::Keep),
                observed(vec![done(0, 1.0), done(1, 0.0), running(2)]),
                QueueStanding::NoQueue,
                recorded(
                    RolloutPhase::Complete,
                    Some(named(&["g-2"])),
                    RESYNC,
                    Some("Balanced"),
                ),
            )
        },
        StatusCase {
            decision: Some(&decision),
            blocked: vec![waiting()],
            queued: true,
            deadline: Some(in_ten_seconds),
            ..row(
                "decided: no release, no wait, no deadline",
                queued(plain()),
                complete(),
                QueueStanding::Unchanged,
                recorded(
                    RolloutPhase::Complete,
                    Some(Targets::All),
                    RESYNC,
                    Some("Balanced"),
                ),
            )
        },
        StatusCase {
            queued: true,
            ..row(
                "on a queue under Delete: the finished are released",
                queued(plain()),
                generating(),
                QueueStanding::Unchanged,
                recorded(
                    RolloutPhase::Generating,
                    Some(named(&["g-0"])),
                    RESYNC,
                    None,
                ),
            )
        },
        StatusCase {
            queued: true,
            ..row(
                "on a queue under Keep: nothing released",
                queued(group(EarlyStop::StrideBoundary, CleanupPolicy::Keep)),
                generating(),
                QueueStanding::Unchanged,
                recorded(RolloutPhase::Generating, None, RESYNC, None),
            )
        },
        StatusCase {
            queued: true,
            expected: Summary {
                event: Some((false, "Queued".into())),
                ..recorded(
                    RolloutPhase::Queued,
                    Some(named(&["g-0"])),
                    QUEUE_RECHECK,
                    None,
                )
            },
            ..row(
                "queued: told, and back to refresh the position",
                queued(plain()),
                generating(),
                queue_waiting(WaitReason::Queued),
                recorded(RolloutPhase::Queued, None, RESYNC, None),
            )
        },
        StatusCase {
            queued: true,
            blocked: vec![waiting()],
            expected: Summary {
                event: Some((false, "Queued".into())),
                ..recorded(
                    RolloutPhase::Queued,
                    Some(named(&["g-0"])),
                    PREVIOUS_INCARNATION_RECHECK,
                    None,
                )
            },
            ..row(
                "queued with a name still held: the sooner recheck",
                queued(plain()),
                generating(),
                queue_waiting(WaitReason::Queued),
                recorded(RolloutPhase::Queued, None, RESYNC, None),
            )
        },
        StatusCase {
            queued: true,
            expected: Summary {
                event: Some((true, "QueueNotFound".into())),
                ..recorded(RolloutPhase::Queued, Some(named(&[])), QUEUE_RECHECK, None)
            },
            ..row(
                "no such queue: a warning",
                queued(plain()),
                Observation::default(),
                queue_waiting(WaitReason::QueueNotFound),
                recorded(RolloutPhase::Queued, None, RESYNC, None),
            )
        },
        StatusCase {
            queued: true,
            expected: Summary {
                event: Some((false, "Admitted".into())),
                ..recorded(RolloutPhase::Generating, Some(named(&[])), RESYNC, None)
            },
            ..row(
                "admitted: told",
                queued(plain()),
                observed(vec![running(0), running(1)]),
                QueueStanding::Admitted {
                    queue: "q".into(),
                    stride: 0,
                },
                recorded(RolloutPhase::Generating, None, RESYNC, None),
            )
        },
        StatusCase {
            deadline: Some(in_ten_seconds),
            ..row(
                "a deadline ahead: back just after it",
                plain(),
                generating(),
                QueueStanding::NoQueue,
                recorded(
                    RolloutPhase::Generating,
                    None,
                    Duration::from_millis(10_001),
                    None,
                ),
            )
        },
        StatusCase {
            deadline: Some(t("2026-01-01T01:00:00Z")),
            ..row(
                "a deadline beyond the resync: the resync",
                plain(),
                generating(),
                QueueStanding::NoQueue,
                recorded(RolloutPhase::Generating, None, RESYNC, None),
            )
        },
    ];
    for c in cases {
        let plan = plan_status(
            &c.group,
            &c.observation,
            c.decision,
            &c.standing,
            &c.blocked,
            &input(&p, c.queued, c.deadline),
        );
        assert_eq!(summary(&plan), c.expected, "{}", c.case);
    }
}

#[test]
fn a_completion_tells_what_it_decided_and_how_long_it_took() {
    let decision = balanced();
    let observation = observed(vec![done(0, 1.0), done(1, 0.0), running(2)]);
    let p = params();
    let plan = plan_status(
        &plain(),
        &observation,
        Some(&decision),
        &QueueStanding::NoQueue,
        &[],
        &input(&p, false, None),
    );
    let StatusPlan::Record(record) = plan else {
        panic!("recorded");
    };
    let completion = record.completion.clone().expect("complete");
    assert_eq!(
        (
            completion.selection,
            completion.positives,
            completion.launched
        ),
        ("Balanced", 1, 3)
    );
    assert_eq!(completion.seconds, Some(90.0));
    assert_eq!(Some(completion.message), record.status.message);
    assert_eq!(record.new_outcomes, ["completed", "completed"]);

    let mut unborn = plain();
    unborn.metadata.creation_timestamp = None;
    let StatusPlan::Record(record) = plan_status(
        &unborn,
        &observation,
        Some(&decision),
        &QueueStanding::NoQueue,
        &[],
        &input(&p, false, None),
    ) else {
        panic!("recorded");
    };
    assert_eq!(record.completion.and_then(|c| c.seconds), None);
}

/// A row of the outcome table: case, records before, records after, the labels counted.
type OutcomeRow<'a> = (
    &'a str,
    Vec<TrajectoryRecord>,
    Vec<TrajectoryRecord>,
    Vec<&'a str>,
);

#[test]
fn only_outcomes_recorded_for_the_first_time_are_counted() {
    let aborted = record(2, Some((TrajectoryStatus::Aborted, 0.0)));
    let truncated = record(3, Some((TrajectoryStatus::Truncated, 0.5)));
    let cases: Vec<OutcomeRow> = vec![
        ("nothing", vec![], vec![], vec![]),
        ("still running", vec![running(0)], vec![running(0)], vec![]),
        (
            "a new outcome",
            vec![running(0)],
            vec![done(0, 1.0)],
            vec!["completed"],
        ),
        (
            "a trajectory first seen finished",
            vec![],
            vec![done(0, 1.0)],
            vec!["completed"],
        ),
        (
            "known before",
            vec![done(0, 1.0)],
            vec![done(0, 1.0)],
            vec![],
        ),
        (
            "one of each",
            vec![done(0, 1.0)],
            vec![done(0, 1.0), running(1), aborted, truncated],
            vec!["aborted", "truncated"],
        ),
        (
            "cancelled is no outcome",
            vec![running(1)],
            vec![stopped(1, "Cancelled")],
            vec![],
        ),
    ];
    for (case, before, after, expected) in cases {
        let previous = phase(RolloutPhase::Generating, before);
        let status = phase(RolloutPhase::Generating, after);
        assert_eq!(new_outcomes(&previous, &status), expected, "{case}");
    }
}

fn admitted(reason: &str) -> RolloutGroupStatus {
    RolloutGroupStatus {
        conditions: vec![Condition {
            type_: ADMITTED.into(),
            status: if reason == "Admitted" {
                "True"
            } else {
                "False"
            }
            .into(),
            reason: reason.into(),
            message: format!("{reason}!"),
            last_transition_time: Time(now()),
            observed_generation: Some(1),
        }],
        ..RolloutGroupStatus::default()
    }
}

#[test]
fn a_change_of_the_queues_answer_is_told_once() {
    let event = |warning: bool, reason: &str| {
        Some(AdmissionEvent {
            warning,
            reason: reason.into(),
            message: format!("{reason}!"),
        })
    };
    let none = RolloutGroupStatus::default();
    let cases: Vec<(
        &str,
        Option<RolloutGroupStatus>,
        RolloutGroupStatus,
        Option<AdmissionEvent>,
    )> = vec![
        ("no queue", None, none.clone(), None),
        (
            "first queued",
            None,
            admitted("Queued"),
            event(false, "Queued"),
        ),
        (
            "still queued",
            Some(admitted("Queued")),
            admitted("Queued"),
            None,
        ),
        (
            "queued, then admitted",
            Some(admitted("Queued")),
            admitted("Admitted"),
            event(false, "Admitted"),
        ),
        (
            "admitted, then queued again",
            Some(admitted("Admitted")),
            admitted("Queued"),
            event(false, "Queued"),
        ),
        (
            "no such queue",
            Some(none.clone()),
            admitted("QueueNotFound"),
            event(true, "QueueNotFound"),
        ),
        (
            "a stride larger than the queue",
            Some(admitted("Queued")),
            admitted("StrideExceedsQueue"),
            event(true, "StrideExceedsQueue"),
        ),
        ("the condition gone", Some(admitted("Queued")), none, None),
    ];
    for (case, previous, status, expected) in cases {
        assert_eq!(
            admission_event(previous.as_ref(), &status),
            expected,
            "{case}"
        );
    }
}

#[test]
fn the_observation_and_the_repair_agree_with_the_children() {
    // A crash left g-1 uncreated: the status lists g-0, the cache shows g-0 and g-2 of the next
    // stride; the repair finishes stride 1 (g-3) only.
    let previous = phase(RolloutPhase::Generating, vec![done(0, 0.0)]);
    let child = |index: u32| crate::rollout::observe::ChildView {
        name: format!("g-{index}"),
        uid: format!("uid-{index}"),
        stride: index / 2,
        attempt: 1,
        result: None,
        failure: None,
        resources: None,
        deleting: false,
        waiting: None,
    };
    let observation = observe(
        "g",
        &previous,
        &[child(0), child(2)],
        &BTreeSet::new(),
        None,
    );
    assert_eq!(
        plan_repair(&observation, &params(), None),
        [Launch {
            index: 3,
            stride: 1,
            attempt: 1,
            resources: None,
            launch_after: None,
        }]
    );
}

mod retries {
    use super::*;
    use crate::retry::RetryParams;
    use crate::rollout::observe::{ChildView, Superseded};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use orchard_api::{
        AttemptRecord, OomEscalation, RetryPolicy, SandboxResources, TrajectoryResult,
    };

    /// `plain()` with a retry policy: 3 attempts, memory doubled up to 256Mi, evictions retried;
    /// the template asks for 64Mi.
    fn retrying() -> RolloutGroup {
        let mut g = plain();
        g.spec.template.spec.resources = Some(SandboxResources {
            memory: Some(Quantity("64Mi".into())),
            ..SandboxResources::default()
        });
        g.spec.retry = Some(RetryPolicy {
            max_attempts: 3,
            on_oom: Some(OomEscalation {
                memory_factor: 2.0,
                cpu_factor: None,
                max_memory: Quantity("256Mi".into()),
                max_cpu: None,
            }),
            on_eviction: true,
        });
        g
    }

    fn policy() -> RetryParams {
        match plan_entry(&retrying(), &defaults(), now()) {
            Entry::Run(_, Some(retry)) => *retry,
            other => panic!("a retrying group runs: {other:?}"),
        }
    }

    fn ended(reason: &str, memory: &str) -> AttemptRecord {
        AttemptRecord {
            reason: reason.into(),
            message: Some(format!("{reason}!")),
            memory: Some(Quantity(memory.into())),
            cpu: Some(Quantity("1".into())),
        }
    }

    /// Trajectory `index` after `previous` attempts ended, with `attempts` launched.
    fn retried(index: u32, attempts: i32, previous: Vec<AttemptRecord>) -> TrajectoryRecord {
        TrajectoryRecord {
            attempts,
            previous_attempts: previous,
            ..running(index)
        }
    }

    #[test]
    fn the_entry_resolves_the_policy_or_fails_the_group() {
        assert_eq!(
            entry_word(&plan_entry(&retrying(), &defaults(), now())),
            "run, 3 attempts"
        );
        let mut below_default = retrying();
        below_default.spec.template.spec.resources = None;
        let Entry::Invalid(failure) = plan_entry(&below_default, &defaults(), now()) else {
            panic!("maxMemory below the operator's default memory fails the group");
        };
        assert_eq!(failure.reason, "InvalidSpec");
        assert!(
            failure
                .message
                .contains("retry.onOOM.maxMemory 256Mi is below the 2Gi")
                && failure.message.contains("--default-memory"),
            "{}",
            failure.message
        );
        assert_eq!(failure.status.phase, Some(RolloutPhase::Failed));
    }

    #[test]
    fn a_retry_is_created_again_under_its_name_with_what_its_retry_gives_it() {
        let p = policy();
        let mut observation = observed(vec![
            retried(0, 1, vec![ended("OOMKilled", "64Mi")]),
            retried(1, 1, vec![ended("PodDeleted", "64Mi")]),
        ]);
        observation.relaunch = vec![0, 1];
        let launches = plan_repair(&observation, &params(), Some(&p));
        let grown = SandboxResources {
            memory: Some(Quantity("128Mi".into())),
            ..SandboxResources::default()
        };
        assert_eq!(
            launches,
            [
                Launch {
                    index: 0,
                    stride: 0,
                    attempt: 2,
                    resources: Some(grown),
                    launch_after: None,
                },
                Launch {
                    index: 1,
                    stride: 0,
                    attempt: 2,
                    resources: None,
                    launch_after: None,
                },
            ],
            "OOM: twice the memory; a lost pod: the template's resources"
        );
        // The third attempt after a second OOM kill at 128Mi gets the cap.
        let mut observation = observed(vec![
            retried(
                0,
                2,
                vec![ended("OOMKilled", "64Mi"), ended("OOMKilled", "128Mi")],
            ),
            running(1),
        ]);
        observation.relaunch = vec![0];
        let launches = plan_repair(&observation, &params(), Some(&p));
        assert_eq!(launches.len(), 1);
        assert_eq!(launches[0].attempt, 3);
        assert_eq!(
            launches[0].resources,
            Some(SandboxResources {
                memory: Some(Quantity("256Mi".into())),
                ..SandboxResources::default()
            })
        );
    }

    #[test]
    fn a_retry_is_not_a_new_launch_and_bar_waits_for_its_last_attempt() {
        let cases: Vec<(&str, Vec<TrajectoryRecord>, &str)> = vec![
            (
                "g-1 waits for its second attempt: the stride is not over",
                vec![
                    done(0, 0.0),
                    retried(1, 1, vec![ended("OOMKilled", "64Mi")]),
                ],
                "wait",
            ),
            (
                "g-1's second attempt runs",
                vec![
                    done(0, 0.0),
                    retried(1, 2, vec![ended("OOMKilled", "64Mi")]),
                ],
                "wait",
            ),
            (
                "g-1's second attempt balances the stride: one outcome per trajectory",
                vec![
                    done(0, 0.0),
                    TrajectoryRecord {
                        attempts: 2,
                        previous_attempts: vec![ended("OOMKilled", "64Mi")],
                        ..done(1, 1.0)
                    },
                ],
                "finish Balanced with 1 positives",
            ),
            (
                "g-1 ran out of attempts: backfill, and the next stride",
                vec![
                    done(0, 0.0),
                    TrajectoryRecord {
                        attempts: 3,
                        previous_attempts: vec![
                            ended("OOMKilled", "64Mi"),
                            ended("OOMKilled", "128Mi"),
                        ],
                        reason: Some("OOMKilled".into()),
                        ..record(1, Some((TrajectoryStatus::Aborted, 0.0)))
                    },
                ],
                "launch stride 1 (2 from 2)",
            ),
        ];
        for (case, records, expected) in cases {
            let mut observation = observed(records);
            assert_eq!(
                observation.launched(),
                2,
                "{case}: two trajectories, whatever the attempts"
            );
            let next = plan_step(&params(), &mut observation, None, now());
            assert_eq!(step_word(&next), expected, "{case}");
        }
    }

    fn child(attempt: u32, memory: &str, result: TrajectoryResult) -> ChildView {
        ChildView {
            name: "g-1".into(),
            uid: format!("uid-a{attempt}"),
            stride: 0,
            attempt,
            result: Some(result),
            failure: None,
            resources: Some(SandboxResources {
                memory: Some(Quantity(memory.into())),
                ..SandboxResources::default()
            }),
            deleting: false,
            waiting: None,
        }
    }

    fn oom_killed() -> TrajectoryResult {
        TrajectoryResult {
            reward: None,
            status: TrajectoryStatus::Aborted,
            length: None,
            exit_code: None,
            artifact: None,
            reason: Some("OOMKilled".into()),
            message: Some("killed at its limit".into()),
        }
    }

    fn plan(g: &RolloutGroup, children: &[ChildView], retry: &RetryParams) -> Record {
        let previous = g.status.clone().unwrap_or_default();
        let observation = observe("g", &previous, children, &BTreeSet::new(), Some(retry));
        let p = params();
        let input = StatusInput {
            retry: Some(retry),
            ..input(&p, false, None)
        };
        match plan_status(g, &observation, None, &QueueStanding::NoQueue, &[], &input) {
            StatusPlan::Record(record) => *record,
            other => panic!("recorded: {other:?}"),
        }
    }

    #[test]
    fn an_ended_attempt_is_recorded_told_and_deleted_by_its_uid() {
        let p = policy();
        let g = with_status(
            retrying(),
            phase(RolloutPhase::Generating, vec![done(0, 0.0), running(1)]),
        );
        let record = plan(&g, &[child(1, "64Mi", oom_killed())], &p);
        let trajectory = &record.status.trajectories[1];
        assert_eq!(trajectory.status, None, "not an outcome");
        assert_eq!(
            trajectory.previous_attempts,
            [AttemptRecord {
                reason: "OOMKilled".into(),
                message: Some("killed at its limit".into()),
                memory: Some(Quantity("64Mi".into())),
                cpu: Some(Quantity("1".into())),
            }]
        );
        assert_eq!(record.status.running_trajectories, 1);
        assert_eq!(record.status.trajectories_launched, 2);
        assert_eq!(
            record.superseded,
            [Superseded {
                name: "g-1".into(),
                uid: "uid-a1".into()
            }]
        );
        assert_eq!(
            record.retries,
            [Retried {
                reason: "OOMKilled".into(),
                message: "trajectory g-1 attempt 1 ended OOMKilled (memory 64Mi, cpu 1); attempt 2 gets memory 128Mi, cpu 1".into(),
            }]
        );
        assert_eq!(
            record.new_outcomes,
            Vec::<&str>::new(),
            "no outcome is counted"
        );
        assert_eq!(
            record.requeue, PREVIOUS_INCARNATION_RECHECK,
            "back soon for the next attempt"
        );

        // The next reconcile: the status says so already; nothing new is told, the deletion waits.
        let mut deleting = child(1, "64Mi", oom_killed());
        deleting.deleting = true;
        let g = with_status(retrying(), record.status.clone());
        let again = plan(&g, &[deleting], &p);
        assert!(again.retries.is_empty() && again.superseded.is_empty());
        assert_eq!(again.status.trajectories, record.status.trajectories);
        assert_eq!(again.requeue, PREVIOUS_INCARNATION_RECHECK);
    }

    #[test]
    fn exhausted_attempts_record_the_trajectory_aborted_oom_killed() {
        let p = policy();
        let g = with_status(
            retrying(),
            phase(
                RolloutPhase::Generating,
                vec![
                    done(0, 0.0),
                    retried(
                        1,
                        3,
                        vec![ended("OOMKilled", "64Mi"), ended("OOMKilled", "128Mi")],
                    ),
                ],
            ),
        );
        let record = plan(&g, &[child(3, "256Mi", oom_killed())], &p);
        let trajectory = &record.status.trajectories[1];
        assert_eq!(trajectory.status, Some(TrajectoryStatus::Aborted));
        assert_eq!(trajectory.reason.as_deref(), Some("OOMKilled"));
        assert_eq!(trajectory.attempts, 3);
        assert_eq!(trajectory.previous_attempts.len(), 2);
        assert_eq!(record.new_outcomes, ["aborted"]);
        assert!(
            record.superseded.is_empty(),
            "the last attempt stays until clean-up"
        );
        assert!(record.retries.is_empty());
        assert_eq!(record.status.backfill_trajectories, 1);
        assert_eq!(record.requeue, RESYNC);
    }
}
