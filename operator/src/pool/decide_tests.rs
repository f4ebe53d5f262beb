//! Every decision of a SandboxPool reconcile, as tables: inputs in, plan out, no API server.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use super::*;
use crate::pool::members::fixtures;

fn pool(replicas: i32) -> SandboxPool {
    let mut pool = fixtures::pool(replicas);
    pool.metadata.generation = Some(3);
    pool
}

fn condition<'a>(status: &'a SandboxPoolStatus, type_: &str) -> &'a str {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map_or("absent", |c| c.status.as_str())
}

#[test]
fn a_full_pool_is_ready_and_settled() {
    let plan = Plan {
        replicas: 2,
        ready: 2,
        ..Plan::default()
    };
    let status = pool_status(&pool(2), &plan, (5, 9), None, None, Timestamp::UNIX_EPOCH);
    assert_eq!(
        (
            status.replicas,
            status.ready_replicas,
            status.starting_replicas
        ),
        (2, 2, 0)
    );
    assert_eq!((status.claimed_last_minute, status.claimed_total), (5, 9));
    assert_eq!(status.selector.as_deref(), Some("orchard.dev/pool=py"));
    assert_eq!(status.observed_generation, Some(3));
    assert_eq!(condition(&status, "Ready"), "True");
    assert_eq!(condition(&status, "Reconciling"), "False");
    assert_eq!(condition(&status, "Stalled"), "False");
}

#[test]
fn a_filling_pool_reconciles_and_failing_members_stall_it() {
    let plan = Plan {
        replicas: 2,
        ready: 1,
        ..Plan::default()
    };
    let status = pool_status(&pool(3), &plan, (0, 0), None, None, Timestamp::UNIX_EPOCH);
    assert_eq!(status.starting_replicas, 1);
    assert_eq!(condition(&status, "Ready"), "False");
    assert_eq!(condition(&status, "Reconciling"), "True");
    let stalled = pool_status(
        &pool(3),
        &plan,
        (0, 0),
        Some((
            "MemberFailed".into(),
            "py-abcde: ErrImagePull: not found".into(),
        )),
        None,
        Timestamp::UNIX_EPOCH,
    );
    assert_eq!(condition(&stalled, "Stalled"), "True");
    assert!(
        stalled
            .conditions
            .iter()
            .any(|c| c.message.contains("ErrImagePull"))
    );
}

fn member(name: &str, ready: bool, age: i64) -> MemberView {
    MemberView {
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: "1".into(),
        created: Some(Timestamp::from_second(1_000_000 - age).expect("time")),
        ready,
        failed: None,
        terminating: false,
        lost: false,
        current: true,
    }
}

fn failed(name: &str, why: &str) -> MemberView {
    MemberView {
        failed: Some(why.into()),
        ..member(name, false, 5)
    }
}

fn outdated(name: &str) -> MemberView {
    MemberView {
        current: false,
        ..member(name, true, 50)
    }
}

fn stalled(mut pool: SandboxPool) -> SandboxPool {
    pool.status = Some(SandboxPoolStatus {
        conditions: vec![Condition {
            type_: conditions::STALLED.into(),
            status: "True".into(),
            reason: "MemberFailed".into(),
            message: "x: boom".into(),
            observed_generation: Some(3),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::UNIX_EPOCH,
            ),
        }],
        ..SandboxPoolStatus::default()
    });
    pool
}

fn refused(mut pool: SandboxPool) -> SandboxPool {
    pool.spec.template.priority_class_name = Some("vip".into());
    pool
}

const SECOND: Duration = Duration::from_secs(1);

/// One row of the table.
struct Case {
    case: &'static str,
    pool: SandboxPool,
    members: Vec<MemberView>,
    last_failure: Option<(Duration, &'static str)>,
    expected: Summary,
}

/// What a plan does, in short.
#[derive(Debug, PartialEq)]
struct Summary {
    delete: Vec<(String, Removal, Option<String>)>,
    start: usize,
    baseline: bool,
    refill: Option<String>,
    stalled: Option<(String, String)>,
    stalled_status: Option<String>,
    gauges: (i32, i32),
    requeue: Duration,
}

fn summary(plan: &PoolPlan) -> Summary {
    Summary {
        delete: plan
            .delete
            .iter()
            .map(|d| (d.member.name.clone(), d.why, d.failure.clone()))
            .collect(),
        start: plan.start,
        baseline: plan.baseline,
        refill: plan.refill.clone(),
        stalled: plan.stalled.clone(),
        stalled_status: plan
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::STALLED && c.status == "True")
            .map(|c| c.reason.clone()),
        gauges: (plan.ready, plan.starting),
        requeue: plan.requeue,
    }
}

/// A plan that does nothing but keep `ready` Ready members, back in a minute.
fn idle(ready: i32) -> Summary {
    Summary {
        delete: vec![],
        start: 0,
        baseline: false,
        refill: None,
        stalled: None,
        stalled_status: None,
        gauges: (ready, 0),
        requeue: CLAIM_COUNTS_AGE,
    }
}

fn starting(start: usize, replicas: i32, ready: i32) -> Option<String> {
    Some(format!(
        "starting {start} member(s) to keep {replicas} ({ready} Ready, claimed members are replaced)"
    ))
}

fn problem(reason: &str, message: &str) -> Option<(String, String)> {
    Some((reason.to_string(), message.to_string()))
}

fn run(
    pool: &SandboxPool,
    members: &[MemberView],
    last_failure: Option<(Duration, &str)>,
) -> PoolPlan {
    run_with_snapshot(pool, members, last_failure, None)
}

fn run_with_snapshot(
    pool: &SandboxPool,
    members: &[MemberView],
    last_failure: Option<(Duration, &str)>,
    snapshot: Option<(bool, String)>,
) -> PoolPlan {
    let placement = Placement::default();
    decide(
        pool,
        &Observed {
            members,
            last_failure: last_failure.map(|(ago, why)| (ago, why.to_string())),
            claims: (1, 7),
            placement: &placement,
            snapshot,
            now: Timestamp::UNIX_EPOCH,
        },
    )
}

#[test]
fn a_pool_starts_no_member_before_its_snapshot_is_ready() {
    let waiting = run_with_snapshot(
        &pool(2),
        &[],
        None,
        Some((false, "SandboxSnapshot prepared is Committing".into())),
    );
    assert_eq!(waiting.start, 0);
    assert_eq!(waiting.requeue, super::SNAPSHOT_RECHECK);
    let reconciling = waiting
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Reconciling")
        .expect("Reconciling");
    assert_eq!(
        (reconciling.status.as_str(), reconciling.reason.as_str()),
        ("True", "SnapshotNotReady")
    );
    let failed = run_with_snapshot(
        &pool(2),
        &[],
        None,
        Some((true, "SandboxSnapshot prepared failed".into())),
    );
    assert_eq!(failed.start, 0);
    assert_eq!(
        failed.stalled.as_ref().map(|(reason, _)| reason.as_str()),
        Some("SnapshotFailed")
    );
    let resolved = run_with_snapshot(&pool(2), &[], None, None);
    assert_eq!(
        resolved.start, 2,
        "a Ready snapshot is an image like any other"
    );
}

#[test]
fn the_plan_follows_the_members_the_failures_and_the_placement_policy() {
    let refusal = placement::check(&refused(pool(2)).spec.template, &Placement::default())
        .expect_err("refused");
    let row = |case, pool, members, expected| Case {
        case,
        pool,
        members,
        last_failure: None,
        expected,
    };
    let cases = vec![
        row(
            "a full pool",
            pool(2),
            vec![member("a", true, 10), member("b", true, 5)],
            idle(2),
        ),
        row(
            "a full pool with a member starting",
            pool(2),
            vec![member("a", true, 10), member("b", false, 5)],
            Summary {
                gauges: (1, 1),
                ..idle(1)
            },
        ),
        row(
            "a short pool starts what is missing",
            pool(3),
            vec![member("a", true, 10)],
            Summary {
                start: 2,
                baseline: true,
                refill: starting(2, 3, 1),
                ..idle(1)
            },
        ),
        row(
            "an empty pool of a batch",
            pool(16),
            vec![],
            Summary {
                start: 16,
                baseline: true,
                refill: starting(16, 16, 0),
                ..idle(0)
            },
        ),
        row(
            "more missing than a batch: the rest at once after",
            pool(20),
            vec![],
            Summary {
                start: 16,
                baseline: true,
                refill: starting(16, 20, 0),
                requeue: Duration::ZERO,
                ..idle(0)
            },
        ),
        row(
            "a surplus goes, starting members first",
            pool(1),
            vec![member("old", true, 100), member("new", false, 1)],
            Summary {
                delete: vec![("new".into(), Removal::Surplus, None)],
                ..idle(1)
            },
        ),
        row(
            "outdated members are replaced",
            pool(2),
            vec![outdated("o"), member("a", true, 10)],
            Summary {
                delete: vec![("o".into(), Removal::Outdated, None)],
                start: 1,
                baseline: true,
                refill: starting(1, 2, 1),
                ..idle(1)
            },
        ),
        row(
            "a member failing now is replaced at once, remembered and stalls the pool",
            pool(2),
            vec![
                failed("f", "ErrImagePull: not found"),
                member("a", true, 10),
            ],
            Summary {
                delete: vec![(
                    "f".into(),
                    Removal::Failed,
                    Some("f: ErrImagePull: not found".into()),
                )],
                start: 1,
                baseline: true,
                refill: starting(1, 2, 1),
                stalled: problem("MemberFailed", "f: ErrImagePull: not found"),
                stalled_status: Some("MemberFailed".into()),
                ..idle(1)
            },
        ),
        row(
            "two failing now: each remembered as the first",
            pool(0),
            vec![failed("f", "A: a"), failed("g", "B: b")],
            Summary {
                delete: vec![
                    ("f".into(), Removal::Failed, Some("f: A: a".into())),
                    ("g".into(), Removal::Failed, Some("f: A: a".into())),
                ],
                stalled: problem("MemberFailed", "f: A: a"),
                stalled_status: Some("MemberFailed".into()),
                ..idle(0)
            },
        ),
        Case {
            last_failure: Some((2 * SECOND, "x: boom")),
            ..row(
                "members failed 2 s ago: no starts for 3 s more",
                pool(2),
                vec![member("a", true, 10)],
                Summary {
                    stalled: problem("MemberFailed", "x: boom"),
                    stalled_status: Some("MemberFailed".into()),
                    requeue: 3 * SECOND,
                    ..idle(1)
                },
            )
        },
        Case {
            last_failure: Some((2 * SECOND, "x: boom")),
            ..row(
                "members failed 2 s ago, the pool says so already: no second warning",
                stalled(pool(2)),
                vec![member("a", true, 10)],
                Summary {
                    stalled_status: Some("MemberFailed".into()),
                    requeue: 3 * SECOND,
                    ..idle(1)
                },
            )
        },
        Case {
            last_failure: Some((FAILURE_PAUSE, "x: boom")),
            ..row(
                "the pause just ended: starts, still stalled",
                pool(2),
                vec![member("a", true, 10)],
                Summary {
                    start: 1,
                    baseline: true,
                    refill: starting(1, 2, 1),
                    stalled: problem("MemberFailed", "x: boom"),
                    stalled_status: Some("MemberFailed".into()),
                    ..idle(1)
                },
            )
        },
        Case {
            last_failure: Some((STALLED_FOR, "x: boom")),
            ..row(
                "a failure a minute old is forgotten",
                stalled(pool(1)),
                vec![member("a", true, 10)],
                idle(1),
            )
        },
        Case {
            last_failure: Some((2 * SECOND, "x: boom")),
            ..row(
                "a failure now wins over an older one",
                pool(1),
                vec![failed("f", "C: c")],
                Summary {
                    delete: vec![("f".into(), Removal::Failed, Some("f: C: c".into()))],
                    stalled: problem("MemberFailed", "f: C: c"),
                    stalled_status: Some("MemberFailed".into()),
                    requeue: 3 * SECOND,
                    ..idle(0)
                },
            )
        },
        row(
            "a refused template loses its members and starts none",
            refused(pool(2)),
            vec![member("a", true, 10), member("b", false, 5)],
            Summary {
                delete: vec![
                    ("b".into(), Removal::Surplus, None),
                    ("a".into(), Removal::Surplus, None),
                ],
                stalled: problem(placement::REASON, &refusal),
                stalled_status: Some(placement::REASON.into()),
                ..idle(0)
            },
        ),
        Case {
            last_failure: Some((2 * SECOND, "x: boom")),
            ..row(
                "a refusal wins over failures",
                refused(pool(2)),
                vec![failed("f", "C: c")],
                Summary {
                    delete: vec![("f".into(), Removal::Failed, Some("f: C: c".into()))],
                    stalled: problem(placement::REASON, &refusal),
                    stalled_status: Some(placement::REASON.into()),
                    requeue: 3 * SECOND,
                    ..idle(0)
                },
            )
        },
    ];
    for c in cases {
        let plan = run(&c.pool, &c.members, c.last_failure);
        assert_eq!(summary(&plan), c.expected, "{}", c.case);
    }
}

#[test]
fn the_status_is_written_only_when_it_changes() {
    let members = [member("a", true, 10), member("b", false, 5)];
    let first = run(&pool(2), &members, None);
    assert!(first.write, "no status yet");
    assert_eq!(first.status.claimed_last_minute, 1);
    assert_eq!(first.status.claimed_total, 7);
    assert_eq!((first.status.replicas, first.status.ready_replicas), (2, 1));
    let mut written = pool(2);
    written.status = Some(first.status.clone());
    let again = run(&written, &members, None);
    assert!(!again.write, "the same view gives the same status");
    assert_eq!(again.status, first.status);
    let ready = run(
        &written,
        &[member("a", true, 10), member("b", true, 5)],
        None,
    );
    assert!(ready.write, "a member became Ready");
}
