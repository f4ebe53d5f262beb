//! The exact requests one RolloutGroup reconcile sends, against a scripted API server
//! (`plumbing::mock_api`): a new group launches its first stride, a balanced first stride completes the
//! group and deletes its trajectories by UID, and a stride that cannot balance launches the next one;
//! a forged trajectory is neither counted nor cleaned up; an invalid spec fails the group, a Complete
//! group only cleans up, and a stride for a missing queue creates nothing. Retries: an OOM-killed
//! attempt is recorded, told and deleted by its UID; while it is being removed nothing is created;
//! once it is gone the next attempt is created under the same name with the attempt label and twice
//! the memory. The decisions themselves are tabled in `decide_tests.rs`.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use serde_json::{Value, json};

use super::build::desired_trajectory;
use super::reconcile;
use crate::plumbing::mock_api::{Expect, Scripted, TestCaches, cache, scripted, test_token_key};
use crate::plumbing::reconcile_slots::ReconcileSlots;
use crate::queue::context::QueueCtx;
use crate::rollout::context::RolloutCtx;
use orchard_api::{
    CleanupPolicy, EarlyStop, PositiveFraction, RolloutGroup, RolloutGroupSpec, RolloutGroupStatus,
    RolloutPhase, SandboxSpec, SandboxStatus, SandboxTemplate, TrajectoryRecord, TrajectoryResult,
    TrajectoryStatus,
};

const GROUPS: &str = "/apis/orchard.dev/v1alpha1/namespaces/team/rolloutgroups";
const SANDBOXES: &str = "/apis/orchard.dev/v1alpha1/namespaces/team/sandboxes";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team/events";

/// N = 2 of at most 4, strides of 2, exactly one positive wanted.
fn group() -> RolloutGroup {
    let mut g = RolloutGroup::new(
        "g1",
        RolloutGroupSpec {
            launch_jitter_seconds: None,
            group_size: 2,
            max_trajectories: 4,
            stride: Some(2),
            positive_fraction: PositiveFraction { min: 0.5, max: 0.5 },
            early_stop: EarlyStop::StrideBoundary,
            filter: None,
            template: SandboxTemplate {
                metadata: Default::default(),
                spec: SandboxSpec {
                    image: "busybox".into(),
                    ..SandboxSpec::default()
                },
            },
            trajectory_timeout_seconds: None,
            cleanup: CleanupPolicy::Delete,
            queue: None,
            retry: None,
            active_deadline_seconds: None,
        },
    );
    g.metadata.namespace = Some("team".into());
    g.metadata.uid = Some("uid-g1".into());
    g.metadata.generation = Some(1);
    g.metadata.resource_version = Some("20".into());
    g.metadata.creation_timestamp = Some(Time(Timestamp::now()));
    g
}

/// The group after its first stride was launched and recorded.
fn launched(mut g: RolloutGroup) -> RolloutGroup {
    g.status = Some(RolloutGroupStatus {
        phase: Some(RolloutPhase::Generating),
        trajectories: (0..2)
            .map(|i| TrajectoryRecord {
                name: format!("g1-{i}"),
                stride: 0,
                status: None,
                reward: None,
                length: None,
                artifact: None,
                reason: None,
                attempts: 1,
                previous_attempts: Vec::new(),
                waiting: None,
            })
            .collect(),
        ..RolloutGroupStatus::default()
    });
    g
}

/// Trajectory `index` of stride 0, finished with `reward`.
fn finished(g: &RolloutGroup, index: u32, reward: f64) -> orchard_api::Sandbox {
    let owner = g.controller_owner_ref(&()).expect("owner");
    let mut s = desired_trajectory(
        g,
        &owner,
        &crate::rollout::decide::Launch {
            index,
            stride: 0,
            attempt: 1,
            resources: None,
            launch_after: None,
        },
        &test_token_key(),
    );
    s.metadata.uid = Some(format!("uid-t{index}"));
    s.status = Some(SandboxStatus {
        result: Some(TrajectoryResult {
            reward: Some(reward),
            status: TrajectoryStatus::Completed,
            length: Some(10 + i64::from(index)),
            exit_code: Some(0),
            artifact: None,
            reason: None,
            message: None,
        }),
        ..SandboxStatus::default()
    });
    s
}

fn status_write(g: &RolloutGroup, check: impl Fn(&Value) + Send + 'static) -> Expect {
    let mut written = g.clone();
    written.metadata.resource_version = Some("21".into());
    Expect::new(
        "PATCH",
        format!("{GROUPS}/g1/status"),
        200,
        serde_json::to_value(&written).expect("json"),
    )
    .body(move |patch| {
        assert_eq!(
            patch.as_array().and_then(|ops| ops.first()),
            Some(&json!({"op": "test", "path": "/metadata/uid", "value": "uid-g1"})),
            "the status write is guarded by the group's UID: {patch}"
        );
        check(patch);
    })
}

/// The value a JSON patch gives `/status/<field>` (or `field` inside a whole `/status`).
fn patched<'a>(patch: &'a Value, field: &str) -> Option<&'a Value> {
    let path = format!("/status/{field}");
    patch.as_array()?.iter().find_map(|op| {
        if op["path"] == path.as_str() {
            Some(&op["value"])
        } else if op["path"] == "/status" {
            op["value"].get(field)
        } else {
            None
        }
    })
}

fn trajectory_create(index: u32) -> Expect {
    Expect::create(SANDBOXES, "uid-new").body(move |sandbox| {
        assert_eq!(sandbox["metadata"]["name"], format!("g1-{index}"));
        assert_eq!(sandbox["metadata"]["ownerReferences"][0]["uid"], "uid-g1");
        assert_eq!(
            sandbox["metadata"]["labels"]["orchard.dev/stride"],
            if index < 2 { "0" } else { "1" }
        );
        assert_eq!(
            sandbox["metadata"]["annotations"]["orchard.dev/seal"],
            test_token_key().seal("Sandbox", "team", &format!("g1-{index}"), "uid-g1"),
            "sealed for the group"
        );
    })
}

/// A co-tenant's own Sandbox `g1-3` (not made by the operator) with a controller reference to the
/// group, which anyone who may create Sandboxes can write, and a reward of 1 in its status.
fn forged_trajectory() -> orchard_api::Sandbox {
    serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {
            "name": "g1-3",
            "namespace": "team",
            "uid": "uid-forged",
            "ownerReferences": [{"apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutGroup",
                "name": "g1", "uid": "uid-g1", "controller": true}],
        },
        "spec": {"image": "attacker"},
        "status": {"result": {"status": "completed", "reward": 1.0}},
    }))
    .expect("a sandbox")
}

/// The RolloutGroup controller's context on a script.
fn ctx(script: &Scripted) -> Arc<RolloutCtx> {
    Arc::new(RolloutCtx {
        kube: script.kube.clone(),
        slots: ReconcileSlots::new(8),
        queues: Arc::new(QueueCtx {
            kube: script.kube.clone(),
            book: Arc::default(),
        }),
        defaults: crate::retry::ResourceDefaults {
            cpu: "1".into(),
            memory: "2Gi".into(),
        },
    })
}

#[tokio::test]
async fn a_new_group_launches_its_first_stride_then_records_it() {
    let g = group();
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    let script = scripted(
        &caches,
        vec![
            trajectory_create(0),
            trajectory_create(1),
            Expect::create(EVENTS, "uid-event")
                .body(|event| assert_eq!(event["reason"], "StrideLaunched")),
            status_write(&g, |patch| {
                let names: Vec<&Value> = patched(patch, "trajectories")
                    .and_then(Value::as_array)
                    .map(|t| t.iter().map(|r| &r["name"]).collect())
                    .unwrap_or_default();
                assert_eq!(names, [&json!("g1-0"), &json!("g1-1")], "{patch}");
            }),
        ],
    );
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn nothing_is_decided_before_every_cache_has_its_first_list() {
    use std::sync::atomic::Ordering;
    let g = group();
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    // The same script as a first stride's: the early reconcile must send none of it.
    let script = scripted(
        &caches,
        vec![
            trajectory_create(0),
            trajectory_create(1),
            Expect::create(EVENTS, "uid-event"),
            status_write(&g, |_| {}),
        ],
    );
    // Just restarted: the Pod cache has not listed yet, so trajectories that run are not seen.
    script.kube.filled.pods.store(false, Ordering::Relaxed);
    let early = reconcile(Arc::new(g.clone()), ctx(&script))
        .await
        .expect("reconcile");
    assert_eq!(
        early,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_millis(200))
    );
    script.kube.filled.pods.store(true, Ordering::Relaxed);
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_balanced_stride_completes_the_group_and_deletes_its_trajectories_by_uid() {
    let g = launched(group());
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    cache(&mut caches.sandboxes, finished(&g, 0, 1.0));
    cache(&mut caches.sandboxes, finished(&g, 1, 0.0));
    let deleted = |index: u32| {
        Expect::delete(format!("{SANDBOXES}/g1-{index}")).body(move |delete| {
            assert_eq!(delete["preconditions"]["uid"], format!("uid-t{index}"));
        })
    };
    let script = scripted(
        &caches,
        vec![
            status_write(&g, |patch| {
                assert_eq!(patched(patch, "phase"), Some(&json!("Complete")), "{patch}");
                assert_eq!(
                    patched(patch, "selection"),
                    Some(&json!("Balanced")),
                    "{patch}"
                );
            }),
            Expect::create(EVENTS, "uid-event")
                .body(|event| assert_eq!(event["reason"], "Complete")),
            deleted(0),
            deleted(1),
        ],
    );
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_stride_that_cannot_balance_launches_the_next_one() {
    let g = launched(group());
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    cache(&mut caches.sandboxes, finished(&g, 0, 0.0));
    cache(&mut caches.sandboxes, finished(&g, 1, 0.0));
    let script = scripted(
        &caches,
        vec![
            trajectory_create(2),
            trajectory_create(3),
            Expect::create(EVENTS, "uid-event")
                .body(|event| assert_eq!(event["reason"], "StrideLaunched")),
            status_write(&g, |patch| {
                assert_ne!(patched(patch, "phase"), Some(&json!("Complete")), "{patch}");
            }),
        ],
    );
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_forged_trajectory_is_never_counted_and_fails_the_group_when_its_name_comes_up() {
    let g = launched(group());
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    cache(&mut caches.sandboxes, finished(&g, 0, 0.0));
    cache(&mut caches.sandboxes, finished(&g, 1, 0.0));
    cache(&mut caches.sandboxes, forged_trajectory());
    // Stride 0 cannot balance; stride 1 is launched in order: g1-2 is created, g1-3's name is held by
    // somebody else's Sandbox, which is neither adopted nor counted.
    let script = scripted(
        &caches,
        vec![
            trajectory_create(2),
            Expect::create(EVENTS, "uid-event")
                .body(|event| assert_eq!(event["reason"], "StrideLaunched")),
            status_write(&g, |patch| {
                assert_eq!(patched(patch, "phase"), Some(&json!("Failed")), "{patch}");
                let message = patched(patch, "message")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                assert!(
                    message.contains("Sandbox g1-3") && message.contains("no valid seal"),
                    "{patch}"
                );
                assert!(!patch.to_string().contains("\"reward\":1.0"), "{patch}");
            }),
            Expect::create(EVENTS, "uid-event")
                .body(|event| assert_eq!(event["reason"], "NameConflict")),
        ],
    );
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_forged_trajectory_gives_no_reward_and_is_not_cleaned_up_with_the_group() {
    let g = launched(group());
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    cache(&mut caches.sandboxes, finished(&g, 0, 1.0));
    cache(&mut caches.sandboxes, finished(&g, 1, 0.0));
    cache(&mut caches.sandboxes, forged_trajectory());
    // The first stride balances on its own two trajectories: g1-3 is not launched, not listed, and
    // not deleted (the group's clean-up deletes only its own).
    let deleted = |index: u32| {
        Expect::delete(format!("{SANDBOXES}/g1-{index}")).body(move |delete| {
            assert_eq!(delete["preconditions"]["uid"], format!("uid-t{index}"));
        })
    };
    let script = scripted(
        &caches,
        vec![
            status_write(&g, |patch| {
                assert_eq!(patched(patch, "phase"), Some(&json!("Complete")), "{patch}");
                let names: Vec<&Value> = patched(patch, "trajectories")
                    .and_then(Value::as_array)
                    .map(|t| t.iter().map(|r| &r["name"]).collect())
                    .unwrap_or_default();
                assert!(!names.contains(&&json!("g1-3")), "{patch}");
                assert!(!patch.to_string().contains("g1-3"), "{patch}");
            }),
            Expect::create(EVENTS, "uid-event")
                .body(|event| assert_eq!(event["reason"], "Complete")),
            deleted(0),
            deleted(1),
        ],
    );
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn an_invalid_spec_fails_the_group_with_one_status_write() {
    let mut g = group();
    g.spec.stride = Some(3);
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    let script = scripted(
        &caches,
        vec![status_write(&g, |patch| {
            assert_eq!(patched(patch, "phase"), Some(&json!("Failed")), "{patch}");
            let message = patched(patch, "message")
                .and_then(Value::as_str)
                .unwrap_or("");
            assert!(message.contains("stride"), "{patch}");
        })],
    );
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_complete_group_deletes_what_its_clean_up_picks_and_writes_nothing() {
    let mut g = launched(group());
    if let Some(status) = g.status.as_mut() {
        status.phase = Some(RolloutPhase::Complete);
    }
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    cache(&mut caches.sandboxes, finished(&g, 0, 1.0));
    cache(&mut caches.sandboxes, finished(&g, 1, 0.0));
    let script = scripted(
        &caches,
        vec![
            Expect::delete(format!("{SANDBOXES}/g1-0")),
            Expect::delete(format!("{SANDBOXES}/g1-1")),
        ],
    );
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_stride_for_a_missing_queue_creates_nothing_and_says_why() {
    let mut g = group();
    g.spec.queue = Some("q".into());
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    let script = scripted(
        &caches,
        vec![
            Expect::create(EVENTS, "uid-event").body(|event| {
                assert_eq!(event["reason"], "QueueNotFound");
                assert_eq!(event["type"], "Warning");
            }),
            status_write(&g, |patch| {
                assert_eq!(patched(patch, "phase"), Some(&json!("Queued")), "{patch}");
            }),
        ],
    );
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

/// `group()` retrying: 3 attempts, memory doubled up to 256Mi; the template asks for 64Mi.
fn retrying() -> RolloutGroup {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut g = group();
    g.spec.template.spec.resources = Some(orchard_api::SandboxResources {
        memory: Some(Quantity("64Mi".into())),
        ..Default::default()
    });
    g.spec.retry = Some(orchard_api::RetryPolicy {
        max_attempts: 3,
        on_oom: Some(orchard_api::OomEscalation {
            memory_factor: 2.0,
            cpu_factor: None,
            max_memory: Quantity("256Mi".into()),
            max_cpu: None,
        }),
        on_eviction: false,
    });
    g
}

/// Attempt 1 of trajectory 1, whose run's command the OOM killer ended.
fn oom_killed(g: &RolloutGroup) -> orchard_api::Sandbox {
    let mut s = finished(g, 1, 0.0);
    s.status = Some(SandboxStatus {
        result: Some(TrajectoryResult {
            reward: None,
            status: TrajectoryStatus::Aborted,
            length: None,
            exit_code: None,
            artifact: None,
            reason: Some("OOMKilled".into()),
            message: Some("the run's command was killed at its limit of 64Mi".into()),
        }),
        ..SandboxStatus::default()
    });
    s
}

/// The status after attempt 1 of g1-1 ended out of memory and was recorded for a retry.
fn awaiting_attempt_2(mut g: RolloutGroup) -> RolloutGroup {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    if let Some(status) = g.status.as_mut() {
        status.trajectories[1].previous_attempts = vec![orchard_api::AttemptRecord {
            reason: "OOMKilled".into(),
            message: Some("the run's command was killed at its limit of 64Mi".into()),
            memory: Some(Quantity("64Mi".into())),
            cpu: Some(Quantity("1".into())),
        }];
    }
    g
}

#[tokio::test]
async fn an_oom_killed_attempt_is_recorded_told_and_its_sandbox_deleted_by_uid() {
    let g = launched(retrying());
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    cache(&mut caches.sandboxes, finished(&g, 0, 1.0));
    cache(&mut caches.sandboxes, oom_killed(&g));
    let script = scripted(
        &caches,
        vec![
            status_write(&g, |patch| {
                assert_ne!(patched(patch, "phase"), Some(&json!("Complete")), "{patch}");
                let text = patch.to_string();
                assert!(
                    text.contains(r#""previousAttempts":[{"cpu":"1","memory":"64Mi","message":"the run's command was killed at its limit of 64Mi","reason":"OOMKilled"}]"#),
                    "the ended attempt is recorded: {patch}"
                );
                assert!(!text.contains(r#""status":"aborted""#), "no outcome: {patch}");
            }),
            Expect::create(EVENTS, "uid-event").body(|event| {
                assert_eq!(event["reason"], "TrajectoryRetry");
                assert_eq!(
                    event["note"],
                    "trajectory g1-1 attempt 1 ended OOMKilled (memory 64Mi, cpu 1); attempt 2 gets memory 128Mi, cpu 1"
                );
            }),
            Expect::delete(format!("{SANDBOXES}/g1-1")).body(|delete| {
                assert_eq!(
                    delete["preconditions"]["uid"], "uid-t1",
                    "only the ended attempt"
                );
            }),
        ],
    );
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn an_ended_attempt_still_being_removed_is_waited_for() {
    let g = awaiting_attempt_2(launched(retrying()));
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    cache(&mut caches.sandboxes, finished(&g, 0, 1.0));
    let mut old = oom_killed(&g);
    old.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    cache(&mut caches.sandboxes, old);
    // No create under a name still held, no second delete; the status (filled in for this
    // fixture) keeps the trajectory waiting.
    let script = scripted(
        &caches,
        vec![status_write(&g, |patch| {
            let text = patch.to_string();
            assert!(!text.contains(r#""attempts":2"#), "{patch}");
            assert!(!text.contains(r#""status":"aborted""#), "{patch}");
        })],
    );
    let next = reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    assert_eq!(
        next,
        kube::runtime::controller::Action::requeue(super::decide::PREVIOUS_INCARNATION_RECHECK)
    );
    script.finish().await;
}

#[tokio::test]
async fn once_the_ended_attempt_is_gone_the_next_is_created_with_more_memory() {
    let g = awaiting_attempt_2(launched(retrying()));
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_groups, g.clone());
    cache(&mut caches.sandboxes, finished(&g, 0, 1.0));
    let script = scripted(
        &caches,
        vec![
            Expect::create(SANDBOXES, "uid-attempt-2").body(|sandbox| {
                assert_eq!(sandbox["metadata"]["name"], "g1-1", "the same name");
                assert_eq!(sandbox["metadata"]["labels"]["orchard.dev/attempt"], "2");
                assert_eq!(sandbox["metadata"]["labels"]["orchard.dev/stride"], "0");
                assert_eq!(sandbox["spec"]["resources"], json!({"memory": "128Mi"}));
                assert_eq!(
                    sandbox["metadata"]["annotations"]["orchard.dev/seal"],
                    test_token_key().seal("Sandbox", "team", "g1-1", "uid-g1"),
                    "sealed for the group"
                );
            }),
            status_write(&g, |patch| {
                let attempts = patched(patch, "trajectories")
                    .and_then(|t| t.get(1))
                    .map(|t| t["attempts"].clone())
                    .or_else(|| {
                        patch.as_array().and_then(|ops| {
                            ops.iter()
                                .find(|op| op["path"] == "/status/trajectories/1/attempts")
                                .map(|op| op["value"].clone())
                        })
                    });
                assert_eq!(attempts, Some(json!(2)), "{patch}");
            }),
        ],
    );
    reconcile(Arc::new(g), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}
