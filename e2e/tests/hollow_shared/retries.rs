//! RolloutGroup retries on the local node, whose faults stand in for what a real kubelet does: a
//! trajectory's pod evicted because the node was low on memory is created again under the same name
//! with twice the memory (`retry.onOOM`), a pod deleted under a trajectory is created again with the
//! same resources (`retry.onEviction`), and a trajectory that loses every attempt stops at
//! `maxAttempts`, aborted. BAR sees one outcome per trajectory: its last attempt's. On a RolloutQueue a
//! retry keeps its trajectory's slot: another group waiting for it is not let in while the trajectory
//! has no Sandbox and no Pod running (fails with an operator that counts slots from Sandboxes and Pods
//! alone: checked with that mutant).
//!
//! The local node runs task commands as host processes without a memory cgroup of their own, so a
//! real OOM kill (a command over its limit) cannot happen here: `e2e/tests/rollout_retry.rs` checks
//! that on the real node.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use orchard_operator::api::{ATTEMPT_LABEL, RolloutGroup, Sandbox, Selection, TrajectoryStatus};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::rollouts::{
    GROUP_TIMEOUT, assert_matches_engine, group, is_complete,
};
use orchard_testcluster::wait;
use serde_json::{Value, json};

/// A runner whose trajectory 0 marks each attempt's start with a file in `marks` and waits there
/// (the test ends the attempt), until `waits` attempts have started; other trajectories and later
/// attempts write reward `i % 2` at once.
fn script(marks: &Path, waits: u32) -> String {
    let marks = marks.display();
    format!(
        "i=${{ORCHARD_SANDBOX##*-}}\n\
         if [ \"$i\" = 0 ] && [ \"$(ls {marks} | wc -l)\" -lt {waits} ]; then touch {marks}/attempt-$$; sleep 300; fi\n\
         printf '{{\"reward\": %d, \"length\": %d}}' \"$(( i % 2 ))\" \"$(( 100 + i ))\" > result.json\n"
    )
}

/// A directory for the attempt marks of the test's namespace `ns` (the node's processes share the
/// host's filesystem).
fn marks(ns: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("orchard-retries-{ns}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for the marks");
    dir
}

/// Waits until `count` attempts of trajectory 0 have started their run.
async fn started(marks: &Path, count: usize) {
    wait::poll(
        &format!("attempt {count} of trajectory 0 running"),
        Duration::from_secs(90),
        || async {
            let seen = std::fs::read_dir(marks).map(|d| d.count()).unwrap_or(0);
            (seen >= count).then_some(())
        },
    )
    .await;
}

/// A group of two trajectories (one positive wanted), its Sandboxes kept, with `template` (and
/// `script`) and `retry`.
fn retrying(name: &str, script: &str, resources: Value, retry: Value) -> RolloutGroup {
    group(
        name,
        json!({
            "groupSize": 2, "maxTrajectories": 2,
            "template": {"spec": {
                "image": "busybox:1.36",
                "resources": resources,
                "run": {"command": ["/bin/sh", "-c", script], "timeoutSeconds": 600, "resultPath": "result.json"},
            }},
            "cleanup": "Keep",
            "retry": retry,
        }),
    )
}

fn attempt_label(sandbox: &Sandbox) -> Option<String> {
    sandbox
        .metadata
        .labels
        .as_ref()?
        .get(ATTEMPT_LABEL)
        .cloned()
}

#[tokio::test]
async fn an_attempt_evicted_for_memory_is_retried_under_its_name_with_twice_the_memory() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("retry-memory").await;
    let marks = marks(&ns);
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    groups
        .create(
            &PostParams::default(),
            &retrying(
                "mem",
                &script(&marks, 1),
                json!({"memory": "64Mi"}),
                json!({"maxAttempts": 3, "onOOM": {"memoryFactor": 2, "maxMemory": "256Mi"}}),
            ),
        )
        .await
        .expect("create group");
    started(&marks, 1).await;
    assert!(env.node.hollow().evict(&ns, "mem-0"), "the node runs mem-0");

    let done = wait::until(&groups, "mem", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    assert_eq!(
        status.trajectories_launched, 2,
        "a retry is not a new trajectory"
    );
    assert_eq!(status.selection, Some(Selection::Balanced), "{status:?}");
    let retried = &status.trajectories[0];
    assert_eq!(retried.name, "mem-0");
    assert_eq!(retried.attempts, 2, "{retried:?}");
    assert_eq!(
        retried.status,
        Some(TrajectoryStatus::Completed),
        "{retried:?}"
    );
    assert_eq!(retried.reward, Some(0.0));
    let [first] = retried.previous_attempts.as_slice() else {
        panic!("one earlier attempt: {retried:?}");
    };
    assert_eq!(first.reason, "Evicted");
    assert_eq!(first.memory.as_ref().map(|q| q.0.as_str()), Some("64Mi"));
    assert!(
        first
            .message
            .as_deref()
            .is_some_and(|m| m.contains("low on resource: memory")),
        "{first:?}"
    );
    assert_eq!(status.trajectories[1].attempts, 1);
    assert!(status.trajectories[1].previous_attempts.is_empty());
    assert_matches_engine(&done);

    // The trajectory's Sandbox is the second attempt: same name, its label, twice the memory.
    let sandbox = sandboxes.get("mem-0").await.expect("mem-0");
    assert_eq!(attempt_label(&sandbox).as_deref(), Some("2"));
    let memory = sandbox
        .spec
        .resources
        .as_ref()
        .and_then(|r| r.memory.as_ref())
        .map(|q| q.0.clone());
    assert_eq!(memory.as_deref(), Some("128Mi"));
    let result = sandbox.status.as_ref().and_then(|s| s.result.as_ref());
    assert_eq!(
        result.map(|r| r.status),
        Some(TrajectoryStatus::Completed),
        "{result:?}"
    );
    let _ = std::fs::remove_dir_all(&marks);
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_pod_deleted_under_a_trajectory_is_retried_with_the_same_resources() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("retry-lost").await;
    let marks = marks(&ns);
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    groups
        .create(
            &PostParams::default(),
            &retrying(
                "lost",
                &script(&marks, 1),
                json!({"cpu": "100m"}),
                json!({"maxAttempts": 2, "onEviction": true}),
            ),
        )
        .await
        .expect("create group");
    started(&marks, 1).await;
    pods.delete("lost-0", &DeleteParams::default())
        .await
        .expect("delete the pod of lost-0");

    let done = wait::until(&groups, "lost", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    let retried = &status.trajectories[0];
    assert_eq!(retried.attempts, 2, "{retried:?}");
    assert_eq!(
        retried.status,
        Some(TrajectoryStatus::Completed),
        "{retried:?}"
    );
    assert_eq!(
        retried
            .previous_attempts
            .iter()
            .map(|a| a.reason.as_str())
            .collect::<Vec<_>>(),
        ["PodDeleted"]
    );
    assert_eq!(status.trajectories_launched, 2);
    let sandbox = sandboxes.get("lost-0").await.expect("lost-0");
    assert_eq!(attempt_label(&sandbox).as_deref(), Some("2"));
    assert_eq!(
        serde_json::to_value(&sandbox.spec.resources).expect("json"),
        json!({"cpu": "100m"}),
        "the template's resources, as they were"
    );
    let metrics = env.operator().metrics().await.expect("metrics");
    assert!(
        orchard_testcluster::operator_process::metric_sum(
            &metrics,
            "orchard_retries_total",
            &[("kind", "trajectory"), ("reason", "PodDeleted")]
        ) >= 1.0,
        "the retry is counted"
    );
    let _ = std::fs::remove_dir_all(&marks);
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_trajectory_that_loses_every_attempt_stops_at_max_attempts_aborted() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("retry-spent").await;
    let marks = marks(&ns);
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    groups
        .create(
            &PostParams::default(),
            &retrying(
                "spent",
                &script(&marks, 10),
                json!({}),
                json!({"maxAttempts": 2, "onEviction": true}),
            ),
        )
        .await
        .expect("create group");
    for attempt in 1..=2 {
        started(&marks, attempt).await;
        // The second attempt's pod may not be the node's yet when its mark appears: retry briefly.
        wait::poll(
            &format!("attempt {attempt} evicted"),
            Duration::from_secs(30),
            || async { env.node.hollow().evict(&ns, "spent-0").then_some(()) },
        )
        .await;
    }
    let done = wait::until(&groups, "spent", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    let spent = &status.trajectories[0];
    assert_eq!(spent.attempts, 2, "{spent:?}");
    assert_eq!(spent.status, Some(TrajectoryStatus::Aborted), "{spent:?}");
    assert_eq!(
        spent.reason.as_deref(),
        Some("Evicted"),
        "the last attempt's reason"
    );
    assert_eq!(spent.previous_attempts.len(), 1);
    assert_eq!(status.backfill_trajectories, 1);
    assert_eq!(status.trajectories_launched, 2);
    assert_eq!(
        std::fs::read_dir(&marks).map(|d| d.count()).unwrap_or(0),
        2,
        "no third attempt"
    );
    let _ = std::fs::remove_dir_all(&marks);
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_retry_on_a_queue_keeps_its_slot_and_never_lets_another_group_in() {
    use kube::api::{Patch, PatchParams};
    use orchard_operator::api::{CleanupPolicy, RolloutPhase, RolloutQueue};
    use orchard_testcluster::test_support::rollouts::watch_pod_peak;
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("retry-queue").await;
    let marks = marks(&ns);
    let queues: Api<RolloutQueue> = Api::namespaced(client.clone(), &ns);
    queues
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutQueue",
                "metadata": {"name": "q"},
                "spec": {"maxRunningTrajectories": 2, "admission": "FIFO"},
            }))
            .expect("a queue"),
        )
        .await
        .expect("create queue");
    let peak = watch_pod_peak(&client, &ns, "orchard.dev/rollout-queue=q");
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let on_queue = |name: &str, script: &str| {
        let mut g = retrying(
            name,
            script,
            json!({}),
            json!({"maxAttempts": 2, "onEviction": true}),
        );
        g.spec.queue = Some("q".into());
        g.spec.cleanup = CleanupPolicy::Delete;
        g
    };
    groups
        .create(&PostParams::default(), &on_queue("a", &script(&marks, 1)))
        .await
        .expect("create a");
    started(&marks, 1).await;
    // b needs both slots: a-1 finishes at once (its Sandbox is deleted to free its slot), a-0 holds
    // the other one.
    groups
        .create(&PostParams::default(), &on_queue("b", &script(&marks, 0)))
        .await
        .expect("create b");
    let queued = |g: Option<&RolloutGroup>| {
        g.and_then(|g| g.status.as_ref())
            .is_some_and(|s| s.phase == Some(RolloutPhase::Queued))
    };
    wait::until(&groups, "b", "Queued", Duration::from_secs(30), queued).await;

    // Hold a-0's first attempt in deletion: between it and its retry, a-0 has a finished Sandbox and
    // no Pod, and only its group's status says it still runs.
    let hold = json!({"metadata": {"finalizers": ["orchard.test/hold"]}});
    sandboxes
        .patch("a-0", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("hold a-0");
    assert!(env.node.hollow().evict(&ns, "a-0"), "the node runs a-0");
    wait::until(
        &groups,
        "a",
        "a-0 waiting for its retry",
        Duration::from_secs(30),
        |g: Option<&RolloutGroup>| {
            g.and_then(|g| g.status.as_ref())
                .is_some_and(|s| s.trajectories[0].previous_attempts.len() == 1)
        },
    )
    .await;
    wait::until(
        &sandboxes,
        "a-0",
        "a-0 being deleted",
        Duration::from_secs(30),
        |s: Option<&Sandbox>| s.is_some_and(|s| s.metadata.deletion_timestamp.is_some()),
    )
    .await;
    // Longer than a waiting group's recheck (5 s): b asks again meanwhile, and must still wait.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let b_now = groups.get("b").await.expect("b");
    assert!(
        queued(Some(&b_now)),
        "b was let in while a-0 waited for its retry: {:?}",
        b_now.status
    );
    let release = json!({"metadata": {"finalizers": null}});
    sandboxes
        .patch("a-0", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("release a-0");

    let a_done = wait::until(&groups, "a", "Complete", GROUP_TIMEOUT, is_complete).await;
    let b_done = wait::until(&groups, "b", "Complete", GROUP_TIMEOUT, is_complete).await;
    let a_status = a_done.status.clone().expect("status");
    assert_eq!(a_status.trajectories[0].attempts, 2, "{a_status:?}");
    assert_eq!(
        a_status.trajectories[0].status,
        Some(TrajectoryStatus::Completed)
    );
    let most = peak.lock().map(|p| p.most).unwrap_or(usize::MAX);
    assert!(most <= 2, "at most 2 trajectory pods at once, saw {most}");
    let completed = a_status.completion_time.expect("a completed").0;
    let admitted = b_done
        .status
        .as_ref()
        .and_then(|s| s.last_admission_time.clone())
        .expect("b admitted")
        .0;
    assert!(
        admitted >= completed,
        "b admitted at {admitted}, before a completed at {completed}"
    );
    let _ = std::fs::remove_dir_all(&marks);
    env.delete_namespace(&ns).await;
}
