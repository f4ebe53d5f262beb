//! The operator SIGKILLed while groups wait on a RolloutQueue and others run: after the restart the
//! queue's accounting is rebuilt from the Sandboxes and Pods alone (its status matches the pods that
//! exist), nothing is admitted twice (never more pods than slots, seen by a watch), and every group
//! completes with the group BAR decides over its own outcomes.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use orchard_operator::api::{RolloutGroup, RolloutQueue, Selection};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::rollouts::{
    GROUP_TIMEOUT, Recorded, assert_each_trajectory_once, assert_matches_engine, assert_recorded,
    check_outcomes, group, is_complete, reward_script, template, watch_pod_peak,
};
use orchard_testcluster::wait;
use serde_json::json;

const LABEL: &str = "orchard.dev/rollout-queue=slots";

#[tokio::test]
async fn queued_and_running_groups_survive_an_operator_crash() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("rq-restart").await;
    let queues: Api<RolloutQueue> = Api::namespaced(client.clone(), &ns);
    let queue: RolloutQueue = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutQueue",
        "metadata": {"name": "slots"},
        "spec": {"maxRunningTrajectories": 8, "admission": "FIFO"},
    }))
    .expect("queue JSON");
    queues
        .create(&PostParams::default(), &queue)
        .await
        .expect("create queue");
    // The most pods of the queue that existed at once, from a watch.
    let most = watch_pod_peak(&client, &ns, LABEL);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let pass = 50;
    let seeds: Vec<u64> = (0..4).map(|g| 500 + g * 13).collect();
    // Recorded from a run of this test for these seeds (`Recorded`): a change means BAR's choice
    // changed.
    let recorded: [&[&str]; 4] = [
        &["r0-0", "r0-2", "r0-4", "r0-3"],
        &["r1-0", "r1-2", "r1-1", "r1-3"],
        &["r2-0", "r2-2", "r2-1", "r2-3"],
        &["r3-0", "r3-2", "r3-1", "r3-3"],
    ];
    for (g, seed) in seeds.iter().enumerate() {
        groups
            .create(
                &PostParams::default(),
                &group(
                    &format!("r{g}"),
                    json!({
                        "groupSize": 4, "maxTrajectories": 8, "stride": 4,
                        "queue": "slots",
                        // Long runs: the kill lands while two groups run and two wait.
                        "template": template(&reward_script(*seed, pass, None, Some(12)), 60),
                    }),
                ),
            )
            .await
            .expect("create group");
    }
    let running_before = wait::poll("eight trajectory pods", Duration::from_secs(60), || async {
        let list = pods.list(&ListParams::default().labels(LABEL)).await.ok()?;
        (list.items.len() == 8).then(|| pod_names(&list.items))
    })
    .await;
    env.operator().kill();
    // While no operator runs, the queue's status is made to say nothing runs and nothing waits: the
    // values the restarted operator writes can then only come from a recount, not from the status the
    // killed operator wrote before the kill.
    queues
        .patch_status(
            "slots",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "runningTrajectories": 0, "waitingGroups": 0, "waitingTrajectories": 0,
                "waiting": null, "oldestWaitingSince": null}})),
        )
        .await
        .expect("clear the queue's status");
    env.operator().restart().await.expect("restart");

    // The restarted operator recounts: its status shows the 8 pods that exist and the 2 groups that
    // wait, while the trajectories that ran before the kill still run (the same 8 pods).
    let recounted = wait::until(
        &queues,
        "slots",
        "recounted",
        Duration::from_secs(30),
        |q: Option<&RolloutQueue>| {
            q.and_then(|q| q.status.as_ref())
                .is_some_and(|s| s.running_trajectories == 8 && s.waiting_groups == 2)
        },
    )
    .await;
    let live = pods
        .list(&ListParams::default().labels(LABEL))
        .await
        .expect("list pods")
        .items;
    assert_eq!(
        pod_names(&live),
        running_before,
        "recounted while the first strides ran: {:?}",
        recounted.status
    );

    for (g, seed) in seeds.iter().enumerate() {
        let name = format!("r{g}");
        let done = wait::until(&groups, &name, "Complete", GROUP_TIMEOUT, is_complete).await;
        let status = done.status.clone().expect("status");
        assert_each_trajectory_once(&status);
        check_outcomes(&status, *seed, pass, |_| false);
        assert_matches_engine(&done);
        assert_recorded(
            &done,
            &Recorded {
                selection: Selection::Balanced,
                positives: 2,
                members: recorded[g],
            },
        );
    }
    let seen = most.lock().expect("lock").most;
    assert!(
        seen <= 8,
        "never more than 8 pods of the queue at once, saw {seen}"
    );
    env.delete_namespace(&ns).await;
}

fn pod_names(pods: &[Pod]) -> Vec<String> {
    let mut names: Vec<String> = pods.iter().map(|p| p.name_any()).collect();
    names.sort();
    names
}
