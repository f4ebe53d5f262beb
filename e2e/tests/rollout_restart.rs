//! The operator SIGKILLed in the middle of a RolloutGroup and restarted: the group still completes
//! with exactly the engine's group, no trajectory is launched twice, and no result is lost.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use orchard_operator::api::{RolloutGroup, Selection};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::rollouts::{
    GROUP_TIMEOUT, Recorded, assert_each_trajectory_once, assert_matches_engine, assert_recorded,
    check_outcomes, children, group, is_complete, reward_script, template,
};
use orchard_testcluster::wait;
use serde_json::json;

#[tokio::test]
async fn a_group_survives_an_operator_crash_without_duplicate_trajectories() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("rg-restart").await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let (seed, pass) = (4242, 30);
    groups
        .create(
            &PostParams::default(),
            &group(
                "crashy",
                json!({
                    "groupSize": 4, "maxTrajectories": 12, "stride": 4,
                    "template": template(&reward_script(seed, pass, None, Some(2)), 60),
                    "cleanup": "Keep",
                }),
            ),
        )
        .await
        .expect("create group");
    // Kill the operator while the first stride runs, then once more while a later stride may run.
    wait::poll("first stride launched", Duration::from_secs(60), || async {
        (children(&client, &ns, "crashy").await.len() >= 4).then_some(())
    })
    .await;
    env.operator().kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    env.operator().restart().await.expect("restart");
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.operator().kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    env.operator().restart().await.expect("restart");

    let done = wait::until(&groups, "crashy", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    let names = assert_each_trajectory_once(&status);
    assert_eq!(
        status.trajectories_launched,
        status.strides_launched * 4,
        "whole strides only"
    );
    let kids = children(&client, &ns, "crashy").await;
    let kid_names: BTreeSet<String> = kids.iter().map(|k| k.name_any()).collect();
    assert_eq!(
        kid_names.len(),
        names.len(),
        "one sandbox per launched trajectory: {kid_names:?}"
    );
    check_outcomes(&status, seed, pass, |_| false);
    assert_matches_engine(&done);
    // Recorded from a run of this test for its fixed seed (`Recorded`): a change means BAR's choice changed.
    assert_recorded(
        &done,
        &Recorded {
            selection: Selection::Balanced,
            positives: 2,
            members: &["crashy-7", "crashy-0", "crashy-2", "crashy-4"],
        },
    );
    env.delete_namespace(&ns).await;
}
