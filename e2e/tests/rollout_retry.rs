//! RolloutGroup retries with resource escalation on the real node, where a memory limit is a cgroup
//! limit and the kernel's OOM killer ends what goes over it: a task allocating 96 MiB under 64 MiB
//! is OOM-killed (its run `aborted/OOMKilled`, the message naming the limit) and succeeds on its
//! second attempt at 128 MiB, created under the same name with the attempt label; a task that always
//! runs out of memory stops at `maxAttempts`, recorded aborted `OOMKilled` with every earlier
//! attempt and the memory it had.
//!
//! A retry whose escalated memory no node has waits, and its trajectory's record says why
//! (`waiting`, the scheduler's words).
//!
//! A standalone Sandbox's `spec.retry` is not tested here: its agent makes every command the OOM
//! killer's first choice, so only memory no kill gives back (a full `/dev/shm`) ends its task
//! container, and a container in that state may thrash on its page cache for minutes before the
//! kernel kills anything (one of two runs of such a test waited over 120 s). The retry it would check is
//! the same code as a trajectory's (`operator/src/retry`), and `hollow_shared/sandbox_retries.rs`
//! checks a standalone sandbox evicted for memory.
//!
//! The hollow node cannot OOM-kill a command (its task processes have no memory cgroup of their
//! own); `hollow_shared/retries.rs` and `hollow_shared/sandbox_retries.rs` cover evictions and lost
//! pods there.

use std::time::Duration;

use kube::api::{Api, PostParams};
use orchard_operator::api::{ATTEMPT_LABEL, RolloutGroup, Sandbox, TrajectoryStatus};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::rollouts::{GROUP_TIMEOUT, group, is_complete};
use orchard_testcluster::wait;
use serde_json::json;

fn env() -> &'static TestEnv {
    TestEnv::shared_real()
}

/// A group of one trajectory (no filter: its one member is the group) whose run allocates
/// `allocate_mib` MiB in python3 and then writes reward 1, starting at 64Mi and retried on OOM with
/// memory doubled up to `max_memory`, at most `max_attempts` times.
fn allocating(
    name: &str,
    image: &str,
    allocate_mib: u32,
    max_attempts: i32,
    max_memory: &str,
) -> RolloutGroup {
    let program = format!(
        "b = bytearray({allocate_mib} * 1024 * 1024)\n\
         open('/tmp/result.json', 'w').write('{{\"reward\": 1.0, \"length\": %d}}' % (len(b) >> 20))\n"
    );
    group(
        name,
        json!({
            "groupSize": 1, "maxTrajectories": 1,
            "filter": {"enabled": false},
            "template": {"spec": {
                "image": image,
                "resources": {"memory": "64Mi"},
                "run": {"command": ["python3", "-c", program], "timeoutSeconds": 120, "resultPath": "/tmp/result.json"},
            }},
            "cleanup": "Keep",
            "retry": {"maxAttempts": max_attempts, "onOOM": {"memoryFactor": 2, "maxMemory": max_memory}},
        }),
    )
}

fn memory_of(sandbox: &Sandbox) -> Option<String> {
    Some(sandbox.spec.resources.as_ref()?.memory.as_ref()?.0.clone())
}

#[tokio::test]
async fn a_task_over_its_memory_succeeds_on_its_second_attempt_with_twice_the_memory() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("retry-grow").await;
    let image = env.node.real().image("debian-python");
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    groups
        .create(
            &PostParams::default(),
            &allocating("grow", &image, 96, 3, "256Mi"),
        )
        .await
        .expect("create group");
    let done = wait::until(&groups, "grow", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    println!("status: {status:?}");
    assert_eq!(
        status.trajectories_launched, 1,
        "a retry is not a new trajectory"
    );
    let [trajectory] = status.trajectories.as_slice() else {
        panic!("one trajectory: {status:?}");
    };
    assert_eq!(trajectory.attempts, 2, "{trajectory:?}");
    assert_eq!(
        trajectory.status,
        Some(TrajectoryStatus::Completed),
        "{trajectory:?}"
    );
    assert_eq!(trajectory.reward, Some(1.0));
    assert_eq!(
        trajectory.length,
        Some(96),
        "the second attempt allocated its 96 MiB"
    );
    let [first] = trajectory.previous_attempts.as_slice() else {
        panic!("one earlier attempt: {trajectory:?}");
    };
    assert_eq!(first.reason, "OOMKilled");
    assert_eq!(first.memory.as_ref().map(|q| q.0.as_str()), Some("64Mi"));
    let message = first.message.clone().unwrap_or_default();
    assert!(
        message.contains("out-of-memory killer") && message.contains("memory limit of 64Mi"),
        "{message}"
    );
    assert_eq!(status.group.len(), 1);
    assert_eq!(status.group[0].name, "grow-0");

    let sandbox = sandboxes.get("grow-0").await.expect("grow-0");
    assert_eq!(
        sandbox
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ATTEMPT_LABEL))
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(memory_of(&sandbox).as_deref(), Some("128Mi"));
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_task_that_always_runs_out_of_memory_stops_at_max_attempts_aborted_oom_killed() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("retry-spent").await;
    let image = env.node.real().image("debian-python");
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    // 1 GiB never fits: 64Mi, 128Mi and 256Mi are tried, then the attempts are spent (the cap, 1Gi,
    // is never reached).
    groups
        .create(
            &PostParams::default(),
            &allocating("hog", &image, 1024, 3, "1Gi"),
        )
        .await
        .expect("create group");
    let done = wait::until(&groups, "hog", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    println!("status: {status:?}");
    let [trajectory] = status.trajectories.as_slice() else {
        panic!("one trajectory: {status:?}");
    };
    assert_eq!(trajectory.attempts, 3, "{trajectory:?}");
    assert_eq!(
        trajectory.status,
        Some(TrajectoryStatus::Aborted),
        "{trajectory:?}"
    );
    assert_eq!(
        trajectory.reason.as_deref(),
        Some("OOMKilled"),
        "{trajectory:?}"
    );
    assert_eq!(
        trajectory
            .previous_attempts
            .iter()
            .map(|a| (
                a.reason.as_str(),
                a.memory.as_ref().map(|q| q.0.as_str()).unwrap_or_default()
            ))
            .collect::<Vec<_>>(),
        [("OOMKilled", "64Mi"), ("OOMKilled", "128Mi")]
    );
    assert_eq!(status.backfill_trajectories, 1);
    let sandbox = sandboxes.get("hog-0").await.expect("hog-0");
    assert_eq!(
        memory_of(&sandbox).as_deref(),
        Some("256Mi"),
        "the last attempt"
    );
    let result = sandbox.status.as_ref().and_then(|s| s.result.as_ref());
    assert_eq!(
        result.and_then(|r| r.reason.as_deref()),
        Some("OOMKilled"),
        "{result:?}"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_retry_that_no_node_can_fit_says_so_in_its_trajectorys_record() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("retry-nofit").await;
    let image = env.node.real().image("debian-python");
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    // 96 MiB under 64Mi is OOM-killed; the retry asks 64Mi x 1024 = 64Gi, more than the node has.
    let mut nofit = allocating("nofit", &image, 96, 3, "64Gi");
    if let Some(retry) = nofit.spec.retry.as_mut()
        && let Some(on_oom) = retry.on_oom.as_mut()
    {
        on_oom.memory_factor = 1024.0;
    }
    groups
        .create(&PostParams::default(), &nofit)
        .await
        .expect("create group");
    let waiting = wait::until(
        &groups,
        "nofit",
        "attempt 2 waiting for a node",
        Duration::from_secs(120),
        |g: Option<&RolloutGroup>| {
            g.and_then(|g| g.status.as_ref())
                .and_then(|s| s.trajectories.first())
                .is_some_and(|t| t.waiting.is_some())
        },
    )
    .await;
    let status = waiting.status.clone().expect("status");
    println!("status: {status:?}");
    let trajectory = &status.trajectories[0];
    assert_eq!(trajectory.attempts, 2, "{trajectory:?}");
    assert_eq!(trajectory.status, None, "it waits, it has not failed");
    assert_eq!(trajectory.previous_attempts[0].reason, "OOMKilled");
    let why = trajectory.waiting.clone().unwrap_or_default();
    assert!(
        why.starts_with("Unschedulable: ") && why.contains("Insufficient memory"),
        "{why}"
    );
    env.delete_namespace(&ns).await;
}
