//! Every decision of a Sandbox reconcile, as tables: inputs in, plan out, no API server.

use crate::plumbing::cached_pod::CachedPod;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::*;
use crate::pod::fixtures::pod;
use crate::sandbox::fixtures::{CREATED, key, sandbox, t, trajectory};
use orchard_api::{LifecycleSpec, RunSpec};

fn settings() -> SandboxSettings {
    SandboxSettings {
        default_ttl_seconds: 3600,
        max_ttl_seconds: 7200,
        default_heartbeat_timeout_seconds: 0,
        startup_timeout_seconds: 600,
        status_coalesce: Duration::from_millis(500),
        concurrency: 8,
        simulated_agent: false,
    }
}

const RESYNC: Duration = Duration::from_secs(300);

fn input<'a>(settings: &'a SandboxSettings, now: &str) -> StatusInput<'a> {
    StatusInput {
        settings,
        agent_port: 9090,
        resync: RESYNC,
        key: key(),
        now: t(now),
        enforcement: &Verdict::Unknown,
        egress_proxy: false,
        retry: None,
    }
}

fn with_status(mut s: Sandbox, status: SandboxStatus) -> Sandbox {
    s.status = Some(status);
    s
}

fn phase(phase: SandboxPhase) -> SandboxStatus {
    SandboxStatus {
        phase: Some(phase),
        ..SandboxStatus::default()
    }
}

fn ready_pod() -> CachedPod {
    pod(Some("node"), Some("10.0.0.7"), true)
}

/// The settle plan, failing the test when the status is held back.
fn settled(plan: StatusPlan) -> Settle {
    match plan {
        StatusPlan::Settle(settle) => *settle,
        StatusPlan::HoldBack(wait) => panic!("held back for {wait:?}"),
    }
}

#[test]
fn the_children_plan_follows_the_phase_the_known_pod_and_the_placement_policy() {
    let ours = ChildState::Ours(ready_pod());
    let waiting = ChildState::Waiting("an old pod".to_string());
    let conflict = ChildState::Conflict("someone's pod".to_string());
    let mut picky = sandbox();
    picky.spec.priority_class_name = Some("vip".into());
    let named = |s: Sandbox| {
        with_status(
            s,
            SandboxStatus {
                pod_name: Some("s1".into()),
                ..SandboxStatus::default()
            },
        )
    };
    let allow_all = Placement::default();
    let cases: Vec<(&str, Sandbox, Option<&ChildState<CachedPod>>, ChildPlan)> = vec![
        (
            "failed",
            with_status(sandbox(), phase(SandboxPhase::Failed)),
            Some(&ours),
            ChildPlan::Terminal,
        ),
        (
            "expired",
            with_status(sandbox(), phase(SandboxPhase::Expired)),
            None,
            ChildPlan::Terminal,
        ),
        (
            "new",
            sandbox(),
            None,
            ChildPlan::Ensure {
                pod: PodStep::Start,
            },
        ),
        (
            "its pod in the cache",
            sandbox(),
            Some(&ours),
            ChildPlan::Ensure {
                pod: PodStep::Known,
            },
        ),
        (
            "a previous incarnation's pod",
            sandbox(),
            Some(&waiting),
            ChildPlan::Ensure {
                pod: PodStep::Blocked(Blocked::PreviousIncarnation("an old pod".into())),
            },
        ),
        (
            "somebody else's pod",
            sandbox(),
            Some(&conflict),
            ChildPlan::Ensure {
                pod: PodStep::Blocked(Blocked::NameConflict("someone's pod".into())),
            },
        ),
        (
            "a named pod the cache lacks",
            named(sandbox()),
            None,
            ChildPlan::Ensure {
                pod: PodStep::Fetch,
            },
        ),
        (
            "a refused spec with a pod keeps it",
            picky.clone(),
            Some(&ours),
            ChildPlan::Ensure {
                pod: PodStep::Known,
            },
        ),
        (
            "a refused spec whose status names a pod keeps it",
            named(picky.clone()),
            None,
            ChildPlan::Ensure {
                pod: PodStep::Fetch,
            },
        ),
    ];
    for (case, s, known, want) in cases {
        assert_eq!(
            plan_children(&s, known, &allow_all, None, None),
            want,
            "{case}"
        );
    }
    let strict = Placement::from_policy(&crate::pod::placement::PlacementPolicy::default());
    assert!(
        matches!(plan_children(&picky, None, &strict, None, None), ChildPlan::Refused(Blocked::PlacementRefused(why)) if why.contains("vip")),
        "a refused spec without a pod creates nothing"
    );
}

#[test]
fn a_conflict_blocks_before_a_wait() {
    let wait = ChildState::<()>::Waiting("w".into());
    let conflict = ChildState::<()>::Conflict("c".into());
    let ours = ChildState::Ours(());
    assert_eq!(blocked_by(&[&ours]), None);
    assert_eq!(
        blocked_by(&[&wait, &conflict]),
        Some(Blocked::NameConflict("c".into()))
    );
    assert_eq!(
        blocked_by(&[&ours, &wait]),
        Some(Blocked::PreviousIncarnation("w".into()))
    );
}

#[test]
fn waits_come_back_at_their_recheck_and_transient_phases_of_young_sandboxes_are_held_back() {
    let settings = settings();
    let young = "2026-01-01T00:00:00.200Z";
    let old = "2026-01-01T00:00:05Z";
    let pending = with_status(sandbox(), phase(SandboxPhase::Pending));
    let outcome = |blocked: Option<Blocked>| ChildOutcome {
        blocked,
        ..ChildOutcome::default()
    };
    let previous = Some(Blocked::PreviousIncarnation("old pod".into()));
    let quota = Some(Blocked::QuotaExceeded("full".into()));
    let pool = Some(Blocked::Pool {
        reason: "WaitingForPoolMember",
        message: "none ready".into(),
        stalled: false,
    });
    for (case, blocked, now, want) in [
        (
            "young, previous incarnation",
            previous.clone(),
            young,
            StatusPlan::HoldBack(Duration::from_millis(300)),
        ),
        (
            "young, over quota",
            quota.clone(),
            young,
            StatusPlan::HoldBack(Duration::from_millis(300)),
        ),
        (
            "young, nothing in the way",
            None,
            young,
            StatusPlan::HoldBack(Duration::from_millis(300)),
        ),
    ] {
        assert_eq!(
            plan_status(&pending, &outcome(blocked), &input(&settings, now)),
            want,
            "{case}"
        );
    }
    for (case, blocked, want) in [
        (
            "previous incarnation",
            previous,
            PREVIOUS_INCARNATION_RECHECK,
        ),
        ("pool member", pool, PREVIOUS_INCARNATION_RECHECK),
        ("quota", quota, QUOTA_RECHECK),
    ] {
        let plan = settled(plan_status(
            &pending,
            &outcome(blocked),
            &input(&settings, old),
        ));
        assert_eq!(plan.then, Then::Requeue(want), "{case}");
        assert!(!plan.run && !plan.announce_identity, "{case}");
    }
}

#[test]
fn a_sandbox_becoming_ready_is_written_noted_and_comes_back_at_its_ttl() {
    let settings = settings();
    let s = with_status(sandbox(), phase(SandboxPhase::Starting));
    let outcome = ChildOutcome {
        pod: Some(ready_pod()),
        ..ChildOutcome::default()
    };
    let plan = settled(plan_status(
        &s,
        &outcome,
        &input(&settings, "2026-01-01T00:00:02Z"),
    ));
    assert_eq!(plan.status.phase, Some(SandboxPhase::Ready));
    assert!(plan.write);
    assert_eq!(plan.notes, vec![Note::Ready(Some(2.0))]);
    assert!(!plan.announce_identity, "not a claimed member");
    assert!(!plan.run);
    // The TTL counts from Ready (now, floored to the second): an hour, capped by the resync.
    assert_eq!(plan.then, Then::Requeue(RESYNC));

    // Recomputing the same status writes nothing and notes nothing.
    let again = with_status(sandbox(), plan.status.clone());
    let plan = settled(plan_status(
        &again,
        &outcome,
        &input(&settings, "2026-01-01T00:00:03Z"),
    ));
    assert!(!plan.write && plan.notes.is_empty());
}

#[test]
fn deadlines_decide_when_to_come_back_and_when_to_expire() {
    let settings = settings();
    let ready_at = |lifecycle: Option<LifecycleSpec>, heartbeat: Option<&str>| {
        let mut s = sandbox();
        s.spec.lifecycle = lifecycle;
        with_status(
            s,
            SandboxStatus {
                phase: Some(SandboxPhase::Ready),
                ready_time: Some(Time(t("2026-01-01T00:00:01Z"))),
                last_heartbeat_time: heartbeat.map(|h| Time(t(h))),
                ..SandboxStatus::default()
            },
        )
    };
    let outcome = ChildOutcome {
        pod: Some(ready_pod()),
        ..ChildOutcome::default()
    };
    let short = Some(LifecycleSpec {
        ttl_seconds: Some(60),
        heartbeat_timeout_seconds: None,
    });
    let beat = Some(LifecycleSpec {
        ttl_seconds: None,
        heartbeat_timeout_seconds: Some(30),
    });
    let then = |s: &Sandbox, now: &str| {
        let plan = settled(plan_status(s, &outcome, &input(&settings, now)));
        plan.then
    };
    assert_eq!(
        then(&ready_at(short.clone(), None), "2026-01-01T00:00:31Z"),
        Then::Requeue(Duration::from_millis(30_001)),
        "30 s before the TTL"
    );
    assert_eq!(
        then(&ready_at(short, None), "2026-01-01T00:01:03.5Z"),
        Then::Expire {
            cause: ExpiryCause::Ttl,
            late: 2.5
        }
    );
    assert_eq!(
        then(
            &ready_at(beat.clone(), Some("2026-01-01T00:00:20Z")),
            "2026-01-01T00:00:40Z"
        ),
        Then::Requeue(Duration::from_millis(10_001)),
        "the heartbeat deadline is the nearer one"
    );
    assert!(matches!(
        then(&ready_at(beat, None), "2026-01-01T00:00:40Z"),
        Then::Expire {
            cause: ExpiryCause::Heartbeat,
            ..
        }
    ));
}

#[test]
fn a_sandbox_not_ready_comes_back_at_its_startup_deadline_and_a_failure_ends_it() {
    let settings = settings();
    let s = with_status(sandbox(), phase(SandboxPhase::Pending));
    let starting = ChildOutcome {
        pod: Some(pod(Some("node"), None, false)),
        ..ChildOutcome::default()
    };
    let plan = settled(plan_status(
        &s,
        &starting,
        &input(&settings, "2026-01-01T00:09:00Z"),
    ));
    assert_eq!(plan.then, Then::Requeue(Duration::from_millis(60_001)));

    let plan = settled(plan_status(
        &s,
        &starting,
        &input(&settings, "2026-01-01T00:10:01Z"),
    ));
    assert_eq!(plan.status.phase, Some(SandboxPhase::Failed));
    assert_eq!(plan.then, Then::Terminal);
    assert!(
        matches!(&plan.notes[..], [Note::Failed { reason, .. }] if reason == "StartupTimeout"),
        "{:?}",
        plan.notes
    );

    let gone = ChildOutcome {
        pod_gone: Some(crate::pod::disruption::gone_failure(None, None)),
        ..ChildOutcome::default()
    };
    let plan = settled(plan_status(
        &with_status(sandbox(), phase(SandboxPhase::Ready)),
        &gone,
        &input(&settings, "2026-01-01T00:00:05Z"),
    ));
    assert_eq!(
        (plan.status.phase, plan.then),
        (Some(SandboxPhase::Failed), Then::Terminal)
    );
}

#[test]
fn an_oom_kill_fails_the_sandbox_with_a_warning_named_oom_killed() {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated};
    let settings = settings();
    let killed = crate::pod::fixtures::with_task_state(
        ready_pod(),
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some("OOMKilled".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    );
    let outcome = ChildOutcome {
        pod: Some(killed),
        ..ChildOutcome::default()
    };
    let plan = settled(plan_status(
        &with_status(sandbox(), phase(SandboxPhase::Ready)),
        &outcome,
        &input(&settings, "2026-01-01T00:00:05Z"),
    ));
    assert_eq!(plan.then, Then::Terminal);
    assert!(
        matches!(&plan.notes[..], [Note::Failed { reason, message }]
            if reason == "OOMKilled" && message.contains("spec.resources.memory")),
        "{:?}",
        plan.notes
    );
}

#[test]
fn a_cluster_without_enforcement_is_written_at_once_and_each_settle_tells_the_evidence() {
    use crate::sandbox::enforcement::Evidence;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, EnvVar};
    let settings = settings();
    let mut gated = crate::pod::fixtures::with_task_state(
        pod(Some("node"), Some("10.0.0.7"), false),
        ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(Time(t(CREATED))),
            }),
            ..Default::default()
        },
    );
    if let Some(spec) = gated.spec.as_mut() {
        spec.containers[0].env = Some(vec![EnvVar {
            name: crate::pod::policy_canary::CANARY_VARIABLE.into(),
            value: Some("10.0.0.1:6443".into()),
            ..Default::default()
        }]);
    }
    let outcome = ChildOutcome {
        pod: Some(gated.clone()),
        ..ChildOutcome::default()
    };
    let young = with_status(sandbox(), phase(SandboxPhase::Pending));
    let now = "2026-01-01T00:00:00.400Z";
    // Within the coalescing window a Starting sandbox is held back...
    assert!(matches!(
        plan_status(&young, &outcome, &input(&settings, now)),
        StatusPlan::HoldBack(_)
    ));
    // ...but not one the verdict tells that nothing enforces its policies.
    let missing = Verdict::Missing {
        since: t(CREATED),
        sandbox: "ns/first".into(),
    };
    let told = StatusInput {
        enforcement: &missing,
        ..input(&settings, now)
    };
    let plan = settled(plan_status(&young, &outcome, &told));
    assert!(plan.write);
    assert!(
        matches!(&plan.notes[..], [Note::PolicyEnforcementMissing(m)] if m.contains("ns/first")),
        "{:?}",
        plan.notes
    );
    assert_eq!(
        plan.evidence, None,
        "told by the verdict: no evidence of its own"
    );

    // Its own wait past 30 s is evidence; so is its agent passing the wait.
    let plan = settled(plan_status(
        &young,
        &outcome,
        &input(&settings, "2026-01-01T00:00:30Z"),
    ));
    assert!(
        matches!(&plan.evidence, Some(Evidence::Missing { sandbox, .. }) if sandbox == "/s1"),
        "{:?}",
        plan.evidence
    );
    let mut passed = gated;
    passed.status = ready_pod().status;
    let ready = ChildOutcome {
        pod: Some(passed),
        ..ChildOutcome::default()
    };
    let plan = settled(plan_status(
        &young,
        &ready,
        &input(&settings, "2026-01-01T00:00:03Z"),
    ));
    assert_eq!(
        plan.evidence,
        Some(Evidence::Enforced {
            at: t("2026-01-01T00:00:03Z")
        })
    );
}

#[test]
fn a_trajectory_with_a_run_asks_for_its_runner() {
    let settings = settings();
    let mut s = with_status(sandbox(), phase(SandboxPhase::Ready));
    s.spec.run = Some(RunSpec {
        command: vec!["/bin/true".into()],
        ..serde_json::from_value(serde_json::json!({"command": ["x"]})).unwrap()
    });
    let outcome = ChildOutcome {
        pod: Some(ready_pod()),
        ..ChildOutcome::default()
    };
    let plan = settled(plan_status(
        &s,
        &outcome,
        &input(&settings, "2026-01-01T00:00:05Z"),
    ));
    assert!(plan.run);
}

#[test]
fn a_policy_wait_that_lasts_is_noted_once() {
    let missing = |message: &str| SandboxStatus {
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: POLICY_ENFORCEMENT_MISSING.into(),
            message: message.into(),
            last_transition_time: Time(t(CREATED)),
            observed_generation: None,
        }],
        ..SandboxStatus::default()
    };
    let now = t("2026-01-01T00:00:05Z");
    let created = Some(t(CREATED));
    assert_eq!(
        transition_notes(created, &SandboxStatus::default(), &missing("why"), now),
        vec![Note::PolicyEnforcementMissing("why".into())]
    );
    assert!(transition_notes(created, &missing("why"), &missing("why"), now).is_empty());
}

#[test]
fn a_failed_sandbox_is_removed_at_its_ttl_unless_its_group_removes_it() {
    let settings = settings();
    let failed = |s: Sandbox, ready: Option<&str>| {
        let status = SandboxStatus {
            phase: Some(SandboxPhase::Failed),
            ready_time: ready.map(|r| Time(t(r))),
            ..SandboxStatus::default()
        };
        (with_status(s, status.clone()), status)
    };
    let removal = |(s, status): (Sandbox, SandboxStatus), now: &str| {
        failed_removal(&s, &status, &settings, RESYNC, key(), t(now))
    };
    assert_eq!(
        removal(failed(sandbox(), None), "2026-01-01T00:59:00Z"),
        Removal::After(Duration::from_millis(60_001)),
        "never Ready: the TTL counts from creation"
    );
    assert_eq!(
        removal(
            failed(sandbox(), Some("2026-01-01T00:30:00Z")),
            "2026-01-01T01:00:00Z"
        ),
        Removal::After(RESYNC),
        "Ready once: from Ready, capped by the resync"
    );
    assert_eq!(
        removal(failed(sandbox(), None), "2026-01-01T01:00:00Z"),
        Removal::Now
    );
    assert_eq!(
        removal(failed(trajectory(), None), "2026-01-01T05:00:00Z"),
        Removal::NotOurs,
        "a group's trajectory"
    );
    let expired = with_status(sandbox(), phase(SandboxPhase::Expired));
    assert_eq!(
        failed_removal(
            &expired,
            &phase(SandboxPhase::Expired),
            &settings,
            RESYNC,
            key(),
            t("2026-01-01T05:00:00Z")
        ),
        Removal::NotOurs
    );
}

#[test]
fn an_expired_trajectory_keeps_its_object_and_an_aborted_result() {
    let now = t("2026-01-01T02:00:00Z");
    let ready = phase(SandboxPhase::Ready);
    let plain = expiry(&sandbox(), &ready, ExpiryCause::Ttl, key(), now);
    assert_eq!(
        (plain.last_status, plain.pod_only),
        (None, false),
        "a plain sandbox is deleted"
    );
    assert!(plain.note.contains("ttl"));

    let grouped = expiry(&trajectory(), &ready, ExpiryCause::Heartbeat, key(), now);
    assert!(grouped.pod_only);
    let last = grouped.last_status.expect("the group learns why");
    assert_eq!(last.phase, Some(SandboxPhase::Expired));
    let result = last.result.expect("an aborted result");
    assert_eq!(result.reason.as_deref(), Some("Expired"));

    let mut runner = sandbox();
    runner.spec.run = Some(serde_json::from_value(serde_json::json!({"command": ["x"]})).unwrap());
    let standalone = expiry(&runner, &ready, ExpiryCause::Ttl, key(), now);
    assert!(!standalone.pod_only, "a standalone trajectory is deleted");
    assert!(
        standalone.last_status.is_some(),
        "after recording its result"
    );
}

#[test]
fn a_jittered_trajectory_waits_for_its_start_and_comes_back_then() {
    let settings = settings();
    let annotated = |mut s: Sandbox, at: &str| {
        s.metadata
            .annotations
            .get_or_insert_default()
            .insert(orchard_api::LAUNCH_AFTER_ANNOTATION.into(), at.into());
        s
    };
    // The seal covers the owner, not the annotation: the group writes both at creation.
    let jittered = annotated(trajectory(), "2026-01-01T00:00:00.750Z");
    assert_eq!(
        launch_wait(&jittered, key(), t("2026-01-01T00:00:00.100Z")),
        Some(t("2026-01-01T00:00:00.750Z"))
    );
    assert_eq!(
        launch_wait(&jittered, key(), t("2026-01-01T00:00:00.750Z")),
        None,
        "due"
    );
    let forged = annotated(
        crate::sandbox::fixtures::forged_trajectory(),
        "2026-01-01T00:00:30Z",
    );
    assert_eq!(
        launch_wait(&forged, key(), t(CREATED)),
        None,
        "not the operator's trajectory"
    );
    let plain = annotated(sandbox(), "2026-01-01T00:00:30Z");
    assert_eq!(
        launch_wait(&plain, key(), t(CREATED)),
        None,
        "not a trajectory"
    );

    let pending = with_status(jittered, phase(SandboxPhase::Pending));
    let outcome = ChildOutcome {
        blocked: Some(Blocked::LaunchJitter(t("2026-01-01T00:00:07Z"))),
        ..ChildOutcome::default()
    };
    let plan = settled(plan_status(
        &pending,
        &outcome,
        &input(&settings, "2026-01-01T00:00:05Z"),
    ));
    assert_eq!(plan.then, Then::Requeue(Duration::from_millis(2001)));
    let scheduled = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Scheduled")
        .expect("Scheduled");
    assert_eq!(scheduled.reason, "LaunchJitter");
    assert!(
        scheduled.message.contains("00:00:07"),
        "{}",
        scheduled.message
    );
}

#[test]
fn a_sandbox_without_a_pod_waits_for_its_snapshot_or_fails_with_it() {
    let settings = settings();
    let mut from_snapshot = sandbox();
    from_snapshot.spec.image = String::new();
    from_snapshot.spec.from_snapshot = Some("prepared".into());
    let waiting = Blocked::Snapshot {
        failed: false,
        message: "SandboxSnapshot prepared is Committing".into(),
    };
    // Before its CachedPod exists the snapshot decides; once it has one, the CachedPod does.
    assert_eq!(
        plan_children(
            &from_snapshot,
            None,
            &Placement::default(),
            None,
            Some(&waiting)
        ),
        ChildPlan::Ensure {
            pod: PodStep::Blocked(waiting.clone())
        }
    );
    let own = ChildState::Ours(ready_pod());
    assert_eq!(
        plan_children(
            &from_snapshot,
            Some(&own),
            &Placement::default(),
            None,
            Some(&waiting)
        ),
        ChildPlan::Ensure {
            pod: PodStep::Known
        }
    );

    let outcome = |blocked: Blocked| ChildOutcome {
        blocked: Some(blocked),
        ..ChildOutcome::default()
    };
    let pending = with_status(from_snapshot.clone(), phase(SandboxPhase::Pending));
    let wait = settled(plan_status(
        &pending,
        &outcome(waiting),
        &input(&settings, "2026-01-01T00:00:05Z"),
    ));
    assert_eq!(wait.status.phase, Some(SandboxPhase::Pending));
    let ready = wait
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert_eq!(ready.reason, "SnapshotNotReady");
    assert!(ready.message.contains("is Committing"), "{}", ready.message);
    assert_eq!(wait.then, Then::Requeue(SNAPSHOT_RECHECK));

    let failed = settled(plan_status(
        &pending,
        &outcome(Blocked::Snapshot {
            failed: true,
            message: "SandboxSnapshot prepared failed (PushRefused: no)".into(),
        }),
        &input(&settings, "2026-01-01T00:00:05Z"),
    ));
    assert_eq!(failed.status.phase, Some(SandboxPhase::Failed));
    assert_eq!(failed.status.reason.as_deref(), Some("SnapshotFailed"));
    assert_eq!(failed.then, Then::Terminal);
}
