//! Every branch of `decide::decide`: a snapshot's life from the first reconcile to its deletion.

use crate::plumbing::cached_pod::CachedPod;

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, Pod, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::committer::{CommitTarget, CommitterSettings};
use super::decide::{CommitterStep, Observed, Plan, condition, decide, reason, touches_quota};
use super::quota::{Budget, Limit};
use crate::pod::naming::TASK_CONTAINER;
use orchard_api::{
    SNAPSHOT_FINALIZER, Sandbox, SandboxPhase, SandboxSnapshot, SandboxSnapshotSpec,
    SandboxSnapshotStatus, SandboxSpec, SandboxStatus, SnapshotPhase,
};

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn settings() -> CommitterSettings {
    CommitterSettings {
        registry: Some("localhost:5000/snaps".into()),
        namespace: "orchard-snapshots".into(),
        image: "committer:dev".into(),
        containerd_socket: "/run/containerd/containerd.sock".into(),
        insecure_registry: false,
        registry_secret: None,
        timeout_seconds: 600,
        pause_limit_seconds: 120,
        node_lost_seconds: Some(30),
    }
}

fn snapshot(finalized: bool, status: Option<SandboxSnapshotStatus>) -> SandboxSnapshot {
    let mut s = SandboxSnapshot::new(
        "prepared",
        SandboxSnapshotSpec {
            sandbox: "prep".into(),
            paths: vec![],
            ttl_seconds_after_unused: None,
        },
    );
    s.metadata.namespace = Some("team".into());
    s.metadata.uid = Some("snap-uid".into());
    s.metadata.generation = Some(1);
    if finalized {
        s.metadata.finalizers = Some(vec![SNAPSHOT_FINALIZER.into()]);
    }
    s.status = status;
    s
}

fn sandbox(phase: SandboxPhase, reason: Option<&str>) -> Sandbox {
    let mut s = Sandbox::new(
        "prep",
        SandboxSpec {
            image: "localhost:5000/debian-python:trixie".into(),
            ..SandboxSpec::default()
        },
    );
    s.metadata.namespace = Some("team".into());
    s.status = Some(SandboxStatus {
        phase: Some(phase),
        reason: reason.map(str::to_string),
        message: reason.map(|r| format!("{r} happened")),
        pod_name: Some("prep".into()),
        ..SandboxStatus::default()
    });
    s
}

fn task_status(state: ContainerState) -> ContainerStatus {
    ContainerStatus {
        name: TASK_CONTAINER.into(),
        container_id: Some("containerd://c0ffee".into()),
        image: "localhost:5000/debian-python:trixie".into(),
        image_id: "localhost:5000/debian-python@sha256:abc".into(),
        ready: true,
        state: Some(state),
        ..ContainerStatus::default()
    }
}

fn running() -> ContainerState {
    ContainerState {
        running: Some(ContainerStateRunning::default()),
        ..ContainerState::default()
    }
}

fn sandbox_pod() -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("prep".into()),
            namespace: Some("team".into()),
            uid: Some("pod-uid".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some("node-a".into()),
            containers: vec![Container {
                name: TASK_CONTAINER.into(),
                image: Some("localhost:5000/debian-python:trixie".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            container_statuses: Some(vec![task_status(running())]),
            ..PodStatus::default()
        }),
    }
}

fn committer(state: ContainerState, created: i64) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("commit-snap-uid".into()),
            namespace: Some("orchard-snapshots".into()),
            creation_timestamp: Some(Time(at(created))),
            ..ObjectMeta::default()
        },
        spec: None,
        status: Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: super::committer::CONTAINER.into(),
                state: Some(state),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        }),
    }
}

fn terminated(code: i32, message: &str) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code,
            message: Some(message.into()),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    }
}

struct World {
    sandbox: Option<Sandbox>,
    pod: Option<CachedPod>,
    committer: Option<Pod>,
    referrers: Vec<String>,
    settings: CommitterSettings,
    budget: Option<Budget>,
    now: Timestamp,
}

impl World {
    fn ready() -> Self {
        Self {
            sandbox: Some(sandbox(SandboxPhase::Ready, None)),
            pod: Some(CachedPod::from(&sandbox_pod())),
            committer: None,
            referrers: vec![],
            settings: settings(),
            budget: None,
            now: at(10),
        }
    }

    fn decide(&self, snapshot: &SandboxSnapshot) -> Plan {
        decide(
            snapshot,
            &Observed {
                sandbox: self.sandbox.as_ref(),
                sandbox_pod: self.pod.as_ref(),
                committer: self.committer.as_ref(),
                referrers: &self.referrers,
                settings: &self.settings,
                budget: self.budget.as_ref(),
                now: self.now,
            },
        )
    }
}

fn ready_condition(plan: &Plan) -> (String, String, String) {
    let c = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::READY)
        .expect("a Ready condition");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

fn condition_of(plan: &Plan, type_: &str) -> (String, String) {
    let c = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .expect("the condition");
    (c.status.clone(), c.reason.clone())
}

/// The status of a snapshot after `plan`, for the next reconcile.
fn after(plan: &Plan) -> SandboxSnapshot {
    snapshot(true, Some(plan.status.clone()))
}

#[test]
fn a_new_snapshot_of_a_ready_sandbox_starts_its_committer_on_the_sandboxs_node() {
    let plan = World::ready().decide(&snapshot(false, None));
    assert!(plan.add_finalizer, "the finalizer comes first");
    assert_eq!(
        plan.committer,
        CommitterStep::Create(CommitTarget {
            node_name: "node-a".into(),
            pod_uid: "pod-uid".into(),
            container_id: "c0ffee".into(),
            base_image: "localhost:5000/debian-python@sha256:abc".into(),
            target: "localhost:5000/snaps/team/prepared:snap-uid".into(),
            room: None,
        })
    );
    assert_eq!(plan.status.phase, Some(SnapshotPhase::Pending));
    assert_eq!(plan.status.node_name.as_deref(), Some("node-a"));
    assert_eq!(plan.status.pod_uid.as_deref(), Some("pod-uid"));
    assert_eq!(
        plan.status.base_image.as_deref(),
        Some("localhost:5000/debian-python@sha256:abc"),
        "the digest the node runs, not the tag"
    );
    assert_eq!(ready_condition(&plan).1, reason::WAITING_FOR_COMMITTER);
    assert_eq!(condition_of(&plan, "Reconciling").0, "True");
    assert!(plan.write);
    assert!(!plan.finalizer_removed());
}

#[test]
fn without_a_digest_the_base_is_the_image_the_pod_names() {
    let mut world = World::ready();
    let statuses = world.pod.as_mut().unwrap().status.as_mut().unwrap();
    statuses.container_statuses.as_mut().unwrap()[0].image_id = "sha256:1234".into();
    let CommitterStep::Create(target) = world.decide(&snapshot(true, None)).committer else {
        panic!("a committer is started");
    };
    assert_eq!(target.base_image, "localhost:5000/debian-python:trixie");
}

/// A case: its name, the sandbox and its pod, the reason and part of the message expected.
type Case = (
    &'static str,
    Option<Sandbox>,
    Option<Pod>,
    &'static str,
    &'static str,
);

#[test]
fn a_sandbox_that_is_not_ready_fails_the_snapshot_at_once() {
    let mut unanswering = sandbox(SandboxPhase::Starting, None);
    if let Some(status) = unanswering.status.as_mut() {
        status.conditions = vec![Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "AgentNotResponding".into(),
            message: "the agent stopped answering its readiness probe".into(),
            last_transition_time: Time(at(0)),
            observed_generation: None,
        }];
    }
    let cases: [Case; 6] = [
        (
            "missing",
            None,
            None,
            reason::SANDBOX_NOT_FOUND,
            "no Sandbox prep in this namespace",
        ),
        (
            "starting",
            Some(sandbox(SandboxPhase::Starting, None)),
            Some(sandbox_pod()),
            reason::SANDBOX_NOT_READY,
            "Sandbox prep is not Ready (Starting)",
        ),
        (
            "stopped answering",
            Some(unanswering),
            Some(sandbox_pod()),
            reason::SANDBOX_NOT_READY,
            "Sandbox prep is not Ready (Starting, AgentNotResponding: the agent stopped answering its readiness probe)",
        ),
        (
            "failed",
            Some(sandbox(SandboxPhase::Failed, Some("OOMKilled"))),
            None,
            reason::SANDBOX_NOT_READY,
            "Sandbox prep is not Ready (Failed, OOMKilled: OOMKilled happened)",
        ),
        (
            "lost its node",
            Some(sandbox(SandboxPhase::Failed, Some("NodeLost"))),
            None,
            reason::NODE_GONE,
            "Sandbox prep lost its node: NodeLost happened",
        ),
        (
            "no pod known",
            Some(sandbox(SandboxPhase::Ready, None)),
            None,
            reason::SANDBOX_NOT_READY,
            "its pod is not known",
        ),
    ];
    for (case, sandbox, pod, want_reason, want_message) in cases {
        let world = World {
            sandbox,
            pod: pod.map(|pod| CachedPod::from(&pod)),
            ..World::ready()
        };
        let plan = world.decide(&snapshot(true, None));
        assert_eq!(plan.committer, CommitterStep::Keep, "{case}");
        assert_eq!(plan.status.phase, Some(SnapshotPhase::Failed), "{case}");
        let (status, reason, message) = ready_condition(&plan);
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", want_reason),
            "{case}"
        );
        assert!(message.contains(want_message), "{case}: {message}");
        assert_eq!(
            condition_of(&plan, "Stalled"),
            ("True".into(), want_reason.into())
        );
        assert_eq!(plan.status.completion_time, Some(Time(at(10))), "{case}");
        assert_eq!(plan.notes.len(), 1, "{case}: one warning event");
    }
}

#[test]
fn a_stopped_task_container_is_not_committed() {
    let mut world = World::ready();
    let status = world.pod.as_mut().unwrap().status.as_mut().unwrap();
    status.container_statuses = Some(vec![task_status(terminated(0, "")).into()]);
    let plan = world.decide(&snapshot(true, None));
    assert_eq!(ready_condition(&plan).1, reason::SANDBOX_NOT_READY);
}

#[test]
fn without_a_registry_snapshots_are_refused() {
    let mut world = World::ready();
    world.settings.registry = None;
    let plan = world.decide(&snapshot(true, None));
    assert_eq!(plan.status.phase, Some(SnapshotPhase::Failed));
    let (_, reason, message) = ready_condition(&plan);
    assert_eq!(reason, reason::SNAPSHOTS_DISABLED);
    assert!(message.contains("snapshots.registry"), "{message}");
}

#[test]
fn the_committer_is_followed_to_its_result() {
    let first = World::ready().decide(&snapshot(true, None));
    let mut world = World::ready();
    world.committer = Some(committer(
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ContainerCreating".into()),
                ..ContainerStateWaiting::default()
            }),
            ..ContainerState::default()
        },
        10,
    ));
    let starting = world.decide(&after(&first));
    assert_eq!(starting.status.phase, Some(SnapshotPhase::Pending));
    assert_eq!(starting.committer, CommitterStep::Keep);
    assert!(ready_condition(&starting).2.contains("ContainerCreating"));
    assert_eq!(
        starting.requeue,
        Some(Duration::from_secs(660) + Duration::from_millis(1)),
        "back at the committer's deadline at the latest"
    );

    world.committer = Some(committer(running(), 10));
    let committing = world.decide(&after(&starting));
    assert_eq!(committing.status.phase, Some(SnapshotPhase::Committing));
    assert_eq!(ready_condition(&committing).1, reason::COMMITTING);

    world.committer = Some(committer(
        terminated(
            0,
            "result=ok\nimage=localhost:5000/snaps/team/prepared@sha256:feed\nsize=2048\npausedMs=31\n",
        ),
        10,
    ));
    world.now = at(20);
    let done = world.decide(&after(&committing));
    assert_eq!(done.status.phase, Some(SnapshotPhase::Ready));
    assert_eq!(
        done.status.image.as_deref(),
        Some("localhost:5000/snaps/team/prepared@sha256:feed")
    );
    assert_eq!(done.status.size_bytes, Some(2048));
    assert_eq!(done.status.paused_milliseconds, Some(31));
    assert_eq!(done.status.completion_time, Some(Time(at(20))));
    assert_eq!(done.committer, CommitterStep::Delete);
    let (status, reason, message) = ready_condition(&done);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", reason::COMMITTED)
    );
    assert!(message.contains("paused 31 ms"), "{message}");
    assert_eq!(condition_of(&done, "Reconciling").0, "False");
    assert_eq!(done.notes[0].reason, "SnapshotReady");

    // Ready is final: the committer is deleted if it is still there, nothing else changes.
    let again = world.decide(&after(&done));
    assert_eq!(again.committer, CommitterStep::Delete);
    assert_eq!(again.status.image, done.status.image);
    assert!(!again.write, "nothing changed: {:?}", again.status);
}

#[test]
fn a_refused_push_fails_with_the_registrys_answer() {
    let mut world = World::ready();
    world.committer = Some(committer(
        terminated(
            1,
            "result=failed\nreason=PushRefused\nmessage=pushing x failed: dial tcp 127.0.0.1:5999: connect: connection refused\n",
        ),
        5,
    ));
    let plan = world.decide(&after(&World::ready().decide(&snapshot(true, None))));
    assert_eq!(plan.status.phase, Some(SnapshotPhase::Failed));
    let (_, reason, message) = ready_condition(&plan);
    assert_eq!(reason, reason::PUSH_REFUSED);
    assert!(message.contains("connection refused"), "{message}");
    assert_eq!(plan.committer, CommitterStep::Delete);
}

#[test]
fn a_committer_that_ends_without_a_word_or_never_ends_fails_the_snapshot() {
    let pending = after(&World::ready().decide(&snapshot(true, None)));
    let mut world = World::ready();
    world.committer = Some(committer(terminated(137, ""), 5));
    let (_, reason, message) = ready_condition(&world.decide(&pending));
    assert_eq!(reason, reason::COMMITTER_FAILED);
    assert!(message.contains("exited with code 137"), "{message}");

    world.committer = Some(committer(running(), 0));
    world.now = at(661);
    let (_, reason, message) = ready_condition(&world.decide(&pending));
    assert_eq!(reason, reason::COMMITTER_FAILED);
    assert!(message.contains("did not finish within 600s"), "{message}");

    world.committer = Some(committer(
        ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ErrImagePull".into()),
                message: Some("committer:dev: not found".into()),
            }),
            ..ContainerState::default()
        },
        0,
    ));
    world.now = at(20);
    let (_, reason, message) = ready_condition(&world.decide(&pending));
    assert_eq!(reason, reason::COMMITTER_FAILED);
    assert!(message.contains("--snapshot-committer-image"), "{message}");

    world.committer = None;
    let (_, reason, message) = ready_condition(&world.decide(&pending));
    assert_eq!(
        reason,
        reason::COMMITTER_FAILED,
        "it was started and is gone"
    );
    assert!(message.contains("disappeared"), "{message}");
    world.sandbox = Some(sandbox(SandboxPhase::Failed, Some("NodeLost")));
    let (_, reason, _) = ready_condition(&world.decide(&pending));
    assert_eq!(reason, reason::NODE_GONE);
}

fn ready_snapshot(ttl: Option<i64>, unused_since: Option<i64>) -> SandboxSnapshot {
    let world = World::ready();
    let mut done = world.decide(&snapshot(true, None)).status;
    done.phase = Some(SnapshotPhase::Ready);
    done.image = Some("r/x@sha256:aa".into());
    done.completion_time = Some(Time(at(0)));
    done.unused_since = unused_since.map(|s| Time(at(s)));
    let mut s = snapshot(true, Some(done));
    s.spec.ttl_seconds_after_unused = ttl;
    s
}

#[test]
fn an_unused_snapshot_goes_after_its_ttl() {
    let mut world = World::ready();
    world.now = at(100);
    let unused = world.decide(&ready_snapshot(Some(60), None));
    assert_eq!(unused.status.unused_since, Some(Time(at(100))));
    assert_eq!(condition_of(&unused, condition::IN_USE).0, "False");
    assert_eq!(
        unused.requeue,
        Some(Duration::from_secs(60) + Duration::from_millis(1))
    );
    assert!(!unused.delete);

    world.now = at(161);
    assert!(world.decide(&ready_snapshot(Some(60), Some(100))).delete);

    world.referrers = vec!["Sandbox fork-1".into()];
    let used = world.decide(&ready_snapshot(Some(60), Some(100)));
    assert!(!used.delete, "a snapshot in use stays");
    assert_eq!(used.status.unused_since, None);
    assert_eq!(
        condition_of(&used, condition::IN_USE),
        ("True".into(), "Referenced".into())
    );

    world.referrers.clear();
    let kept = world.decide(&ready_snapshot(None, None));
    assert!(!kept.delete && kept.requeue.is_none(), "no TTL: kept");
}

#[test]
fn a_deleted_snapshot_waits_for_its_users_and_its_committer() {
    let mut deleted = ready_snapshot(None, None);
    deleted.metadata.deletion_timestamp = Some(Time(at(5)));
    let mut world = World::ready();
    world.referrers = (1..=7).map(|i| format!("Sandbox fork-{i}")).collect();
    let waits = world.decide(&deleted);
    assert!(!waits.remove_finalizer);
    let in_use = waits
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == condition::IN_USE)
        .unwrap();
    assert_eq!(in_use.reason, "DeletionWaits");
    assert!(
        in_use.message.contains("Sandbox fork-5 and 2 more"),
        "{}",
        in_use.message
    );
    assert_eq!(waits.notes[0].reason, "DeletionWaits");
    assert!(waits.requeue.is_some());

    world.referrers.clear();
    world.committer = Some(committer(running(), 0));
    let committer_left = world.decide(&deleted);
    assert_eq!(committer_left.committer, CommitterStep::Delete);
    assert!(
        !committer_left.remove_finalizer,
        "not before the committer is gone"
    );

    world.committer = None;
    let free = world.decide(&deleted);
    assert!(free.remove_finalizer);
    assert!(!free.write, "no status write to an object about to go");
}

impl Plan {
    fn finalizer_removed(&self) -> bool {
        self.remove_finalizer
    }
}

fn budget(limit: u64, used: u64) -> Budget {
    Budget {
        limit: Limit {
            bytes: limit,
            text: limit.to_string(),
            quota: "snapshots".into(),
        },
        used,
    }
}

#[test]
fn a_commit_starts_only_with_room_under_the_size_quota_and_is_told_the_room() {
    let mut world = World::ready();
    let fresh = snapshot(true, None);
    assert!(
        touches_quota(&fresh, &world.decide(&fresh)),
        "a plan starting a commit needs the quota"
    );
    world.budget = Some(budget(4096, 1000));
    let plan = world.decide(&fresh);
    match &plan.committer {
        CommitterStep::Create(target) => {
            assert_eq!(target.room, Some((3096, "snapshots".to_string())))
        }
        other => panic!("a committer is started: {other:?}"),
    }

    world.budget = Some(budget(4096, 4096));
    let full = world.decide(&fresh);
    assert_eq!(full.committer, CommitterStep::Keep, "no commit, no pause");
    assert_eq!(full.status.phase, Some(SnapshotPhase::Failed));
    let (_, why, message) = ready_condition(&full);
    assert_eq!(why, reason::QUOTA_EXCEEDED);
    assert!(
        message.contains(
            "4096 of 4096 bytes (ResourceQuota snapshots, orchard.dev/snapshot-bytes: 4096)"
        ),
        "{message}"
    );
    assert_eq!(full.notes[0].reason, reason::QUOTA_EXCEEDED);
}

#[test]
fn a_pushed_layer_that_no_longer_fits_fails_the_snapshot_instead_of_making_it_ready() {
    let started = World::ready().decide(&snapshot(true, None));
    let mut world = World::ready();
    world.committer = Some(committer(
        terminated(
            0,
            "result=ok\nimage=localhost:5000/snaps/team/prepared@sha256:feed\nsize=2048\npausedMs=31\n",
        ),
        10,
    ));
    let pending = after(&started);
    let unchecked = world.decide(&pending);
    assert_eq!(unchecked.status.phase, Some(SnapshotPhase::Ready));
    assert!(
        touches_quota(&pending, &unchecked),
        "becoming Ready needs the quota"
    );
    assert!(
        !touches_quota(&after(&unchecked), &world.decide(&after(&unchecked))),
        "staying Ready does not"
    );

    world.budget = Some(budget(4096, 2048));
    let fits = world.decide(&pending);
    assert_eq!(
        fits.status.phase,
        Some(SnapshotPhase::Ready),
        "exactly at the limit"
    );

    world.budget = Some(budget(4096, 2049));
    let over = world.decide(&pending);
    assert_eq!(over.status.phase, Some(SnapshotPhase::Failed));
    assert_eq!(over.status.image, None, "forks never run it");
    assert_eq!(over.committer, CommitterStep::Delete);
    let (_, why, message) = ready_condition(&over);
    assert_eq!(why, reason::QUOTA_EXCEEDED);
    assert!(message.contains("(2048 bytes) does not fit"), "{message}");
    assert!(message.contains("sha256:feed was pushed"), "{message}");

    world.committer = Some(committer(
        terminated(
            1,
            "result=failed\nreason=QuotaExceeded\nmessage=the committed layer is 9000 bytes\n",
        ),
        10,
    ));
    let refused = world.decide(&pending);
    assert_eq!(refused.status.phase, Some(SnapshotPhase::Failed));
    assert_eq!(ready_condition(&refused).1, reason::QUOTA_EXCEEDED);
}
