//! kube-apiserver restarted under the operator and the node: their watches recover, so sandboxes
//! created afterwards become Ready, and deadlines set before the restart still fire.

use std::time::Duration;

use kube::api::{Api, PostParams};
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

#[tokio::test]
async fn watches_recover_after_an_apiserver_restart() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("apiserver").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &sandbox(
            "before",
            json!({"image": "busybox", "lifecycle": {"heartbeatTimeoutSeconds": 12}}),
        ),
    )
    .await
    .expect("create");
    wait::until(&api, "before", "Ready", Duration::from_secs(60), is_ready).await;

    env.control_plane
        .restart_apiserver()
        .await
        .expect("apiserver restarts");
    let client = env.client().await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &sandbox("after", json!({"image": "busybox"})),
    )
    .await
    .expect("create after restart");
    wait::until(
        &api,
        "after",
        "Ready after the restart",
        Duration::from_secs(90),
        is_ready,
    )
    .await;
    // The deadline requeued before the restart still deletes the first sandbox.
    wait::deleted(&api, "before", Duration::from_secs(60)).await;
    env.delete_namespace(&ns).await;
}
