//! RolloutGroups on the local cluster: trajectory Sandboxes run a seeded reward script through the
//! operator's runner, and the group the controller records must be exactly what the pure BAR engine
//! decides when replayed stride by stride over the recorded outcomes.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use orchard_operator::api::{RolloutGroup, RolloutPhase, Selection, TrajectoryStatus};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::rollouts::{
    GROUP_TIMEOUT, Recorded, assert_matches_engine, assert_recorded, check_outcomes, children,
    group, is_complete, reward_script, template,
};
use orchard_testcluster::wait;
use serde_json::json;

#[tokio::test]
async fn a_group_with_a_seeded_pass_rate_completes_balanced() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("balanced").await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let (seed, pass) = (20_240_601, 50);
    groups
        .create(
            &PostParams::default(),
            &group(
                "prompt-1",
                json!({
                    "groupSize": 4, "maxTrajectories": 8, "stride": 4,
                    "template": template(&reward_script(seed, pass, None, None), 60),
                    "cleanup": "Keep",
                }),
            ),
        )
        .await
        .expect("create group");
    let out = std::process::Command::new("kubectl")
        .args([
            "wait",
            "-n",
            &ns,
            "--for=condition=Complete",
            "rolloutgroup/prompt-1",
            "--timeout=180s",
        ])
        .env("KUBECONFIG", &env.control_plane.kubeconfig)
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = groups.get("prompt-1").await.expect("group");
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(RolloutPhase::Complete));
    assert_eq!(status.selection, Some(Selection::Balanced), "{status:?}");
    assert_eq!(status.group.len(), 4, "exactly N members");
    let positives = status.positives.expect("positives");
    assert!(
        (2..=2).contains(&positives),
        "n+ within [ceil(0.375x4), floor(0.625x4)] = [2, 2]: {positives}"
    );
    check_outcomes(&status, seed, pass, |_| false);
    assert_matches_engine(&done);
    // Recorded from a run of this test for its fixed seed (`Recorded`): a change means BAR's choice changed.
    assert_recorded(
        &done,
        &Recorded {
            selection: Selection::Balanced,
            positives: 2,
            members: &["prompt-1-0", "prompt-1-2", "prompt-1-4", "prompt-1-3"],
        },
    );
    // Cleanup Keep: the children stay, one per launched trajectory, each with its result.
    let kids = children(&client, &ns, "prompt-1").await;
    assert_eq!(
        kids.len(),
        usize::try_from(status.trajectories_launched).expect("count")
    );
    assert!(
        kids.iter()
            .all(|k| k.status.as_ref().is_some_and(|s| s.result.is_some()))
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_group_where_every_trajectory_fails_is_dropped() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("dropped").await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    groups
        .create(
            &PostParams::default(),
            &group(
                "hopeless",
                json!({
                    "groupSize": 4, "maxTrajectories": 8, "stride": 4,
                    "template": template(&reward_script(7, 0, None, None), 60),
                }),
            ),
        )
        .await
        .expect("create group");
    let done = wait::until(&groups, "hopeless", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.selection, Some(Selection::Dropped));
    assert_eq!(status.drop_reason.as_deref(), Some("ZeroVariance"));
    assert!(status.group.is_empty());
    assert_eq!(
        status.trajectories_launched, 8,
        "the whole budget was spent first"
    );
    assert_eq!(status.negative_trajectories, 8);
    assert_matches_engine(&done);
    assert_recorded(
        &done,
        &Recorded {
            selection: Selection::Dropped,
            positives: 0,
            members: &[],
        },
    );
    // cleanup: Delete (the default) removes the trajectory sandboxes; the status keeps the outcomes.
    wait::poll("children deleted", Duration::from_secs(60), || async {
        children(&client, &ns, "hopeless")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn aborting_runners_are_backfill() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("backfill").await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let (seed, pass) = (99, 50);
    groups
        .create(
            &PostParams::default(),
            &group(
                "flaky",
                json!({
                    "groupSize": 4, "maxTrajectories": 8, "stride": 4,
                    "template": template(&reward_script(seed, pass, Some("i % 3 == 1"), None), 60),
                    "cleanup": "Keep",
                }),
            ),
        )
        .await
        .expect("create group");
    let done = wait::until(&groups, "flaky", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    check_outcomes(&status, seed, pass, |i| i % 3 == 1);
    let aborted = status
        .trajectories
        .iter()
        .filter(|t| t.status == Some(TrajectoryStatus::Aborted))
        .count();
    assert_eq!(
        usize::try_from(status.backfill_trajectories).expect("count"),
        aborted
    );
    assert!(aborted >= 1, "some runners aborted: {status:?}");
    // Aborted trajectories never count as positives or negatives.
    assert_eq!(
        status.positive_trajectories + status.negative_trajectories + status.backfill_trajectories,
        status.trajectories_launched
    );
    assert_matches_engine(&done);
    // Recorded from a run of this test for its fixed seed (`Recorded`): a change means BAR's choice changed.
    assert_recorded(
        &done,
        &Recorded {
            selection: Selection::Balanced,
            positives: 2,
            members: &["flaky-0", "flaky-2", "flaky-3", "flaky-6"],
        },
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_run_over_its_timeout_is_aborted_time_exceeded() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("timeout").await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    groups
        .create(
            &PostParams::default(),
            &group(
                "slow",
                json!({
                    "groupSize": 2, "maxTrajectories": 2,
                    "template": template(&reward_script(1, 50, None, Some(60)), 600),
                    "trajectoryTimeoutSeconds": 2,
                }),
            ),
        )
        .await
        .expect("create group");
    let done = wait::until(&groups, "slow", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    for record in &status.trajectories {
        assert_eq!(record.status, Some(TrajectoryStatus::Aborted), "{record:?}");
        assert_eq!(record.reason.as_deref(), Some("TimeExceeded"), "{record:?}");
    }
    // Only backfill is left: TopRanked takes it, and the filter drops a group without usable variance.
    assert_eq!(status.selection, Some(Selection::Dropped));
    assert_eq!(status.drop_reason.as_deref(), Some("ZeroVariance"));
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn eager_groups_stop_early_and_delete_running_trajectories() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("eager").await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    // Odd indices never finish within the test: a balanced group must come from the fast ones.
    let script = "i=${ORCHARD_SANDBOX##*-}\nif [ $(( i % 2 )) -eq 1 ]; then sleep 600; fi\n\
                  r=$(( (i / 2) % 2 ))\nprintf '{\"reward\": %d, \"length\": %d}' \"$r\" \"$(( 100 + i ))\" > result.json\n";
    groups
        .create(
            &PostParams::default(),
            &group(
                "eager",
                json!({
                    "groupSize": 2, "maxTrajectories": 8, "stride": 8, "earlyStop": "Eager",
                    "template": template(script, 600), "cleanup": "Keep",
                }),
            ),
        )
        .await
        .expect("create group");
    let done = wait::until(
        &groups,
        "eager",
        "Complete",
        Duration::from_secs(90),
        is_complete,
    )
    .await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.selection, Some(Selection::Balanced));
    assert_eq!(status.group.len(), 2);
    let cancelled: BTreeSet<String> = status
        .trajectories
        .iter()
        .filter(|t| t.reason.as_deref() == Some("Cancelled"))
        .map(|t| t.name.clone())
        .collect();
    assert!(
        !cancelled.is_empty(),
        "some trajectories were still running: {status:?}"
    );
    wait::poll(
        "cancelled trajectories deleted",
        Duration::from_secs(60),
        || async {
            let left: BTreeSet<String> = children(&client, &ns, "eager")
                .await
                .iter()
                .map(|c| c.name_any())
                .collect();
            left.is_disjoint(&cancelled).then_some(())
        },
    )
    .await;
    env.delete_namespace(&ns).await;
}

/// `launchJitterSeconds` 3 over a stride of 8: one trajectory starts at once, the other seven carry
/// `orchard.dev/launch-after` times 375 ms apart (k/8 of the jitter in the group's order, all from the
/// same launch instant), and no Pod is created before its trajectory's time (compared in whole
/// seconds, the resolution of a creationTimestamp); the group completes as usual.
#[tokio::test]
async fn a_jittered_stride_creates_each_pod_no_earlier_than_its_start() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("jitter").await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    groups
        .create(
            &PostParams::default(),
            &group(
                "spread",
                json!({
                    "groupSize": 4, "maxTrajectories": 8, "stride": 8,
                    "launchJitterSeconds": 3,
                    "template": template(&reward_script(7, 50, None, None), 60),
                    "cleanup": "Keep",
                }),
            ),
        )
        .await
        .expect("create group");
    wait::until(&groups, "spread", "Complete", GROUP_TIMEOUT, is_complete).await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let mut starts = Vec::new();
    for kid in children(&client, &ns, "spread").await {
        let annotation = kid
            .annotations()
            .get(orchard_operator::api::LAUNCH_AFTER_ANNOTATION)
            .cloned();
        let Some(text) = annotation else {
            continue;
        };
        let at: k8s_openapi::jiff::Timestamp = text.parse().expect("an RFC 3339 time");
        let pod = pods
            .get(&kid.name_any())
            .await
            .expect("the trajectory's pod");
        let created = pod.metadata.creation_timestamp.expect("created").0;
        assert!(
            created.as_second() >= at.as_second(),
            "{}: pod created at {created}, before its start {at}",
            kid.name_any()
        );
        starts.push(at);
    }
    starts.sort();
    assert_eq!(
        starts.len(),
        7,
        "every trajectory but the first waits: {starts:?}"
    );
    let gaps: Vec<i64> = starts
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_millis() as i64)
        .collect();
    assert!(
        gaps.iter().all(|g| *g == 375),
        "starts 375 ms apart: {gaps:?}"
    );
    env.delete_namespace(&ns).await;
}
