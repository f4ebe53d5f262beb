//! A paused node (a hung kubelet: agents frozen, no heartbeats): the controller manager's
//! node-lifecycle controller marks its pods not ready and the operator stops reporting the sandboxes
//! Ready; after the node resumes they are Ready again. Own binary: pausing freezes every agent.

use std::time::Duration;

use kube::api::{Api, PostParams};
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

#[tokio::test]
async fn sandboxes_on_a_paused_node_are_not_reported_ready() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("pause").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    for name in ["p0", "p1"] {
        api.create(
            &PostParams::default(),
            &sandbox(name, json!({"image": "busybox"})),
        )
        .await
        .expect("create");
    }
    for name in ["p0", "p1"] {
        wait::until(&api, name, "Ready", Duration::from_secs(60), is_ready).await;
    }
    let node = env.node.hollow().clone();
    env.on_env_runtime(async move { node.pause().await })
        .await
        .expect("pause");
    let paused = std::time::Instant::now();
    for name in ["p0", "p1"] {
        let not_ready = wait::until(
            &api,
            name,
            "not Ready while the node is paused",
            Duration::from_secs(30),
            |s: Option<&Sandbox>| !is_ready(s),
        )
        .await;
        let ready = not_ready
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .expect("Ready condition");
        assert_eq!(ready.reason, "AgentNotResponding", "{ready:?}");
    }
    println!(
        "sandboxes not Ready {:.1} s after the node paused",
        paused.elapsed().as_secs_f64()
    );
    let node = env.node.hollow().clone();
    env.on_env_runtime(async move { node.resume().await })
        .await
        .expect("resume");
    for name in ["p0", "p1"] {
        wait::until(
            &api,
            name,
            "Ready again after resume",
            Duration::from_secs(30),
            is_ready,
        )
        .await;
    }
    env.delete_namespace(&ns).await;
}
