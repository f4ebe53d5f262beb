//! The operator SIGKILLed in the middle of creating sandboxes and restarted: every sandbox still
//! becomes Ready, with exactly one pod, the pods made before the kill are kept, and the restarted
//! operator's token key still opens their agents (nothing is created twice).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::gateway::Caller;
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

/// Name -> UID of the pods in `pods`' namespace.
async fn pod_uids(pods: &Api<Pod>) -> BTreeMap<String, String> {
    pods.list(&ListParams::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn a_killed_operator_resumes_without_duplicates() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("restart").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..12).map(|i| format!("r{i}")).collect();
    for name in &names[..6] {
        api.create(
            &PostParams::default(),
            &sandbox(name, json!({"image": "busybox"})),
        )
        .await
        .expect("create");
    }
    // Kill the operator while it is working on the first half, create the rest while it is down.
    tokio::time::sleep(Duration::from_millis(150)).await;
    env.operator().kill();
    for name in &names[6..] {
        api.create(
            &PostParams::default(),
            &sandbox(name, json!({"image": "busybox"})),
        )
        .await
        .expect("create");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pods_before = pod_uids(&pods).await;
    env.operator().restart().await.expect("operator restarts");
    for name in &names {
        wait::until(
            &api,
            name,
            "Ready after restart",
            Duration::from_secs(90),
            is_ready,
        )
        .await;
    }
    let pods_after = pod_uids(&pods).await;
    let pod_names: Vec<String> = pods_after.keys().cloned().collect();
    assert_eq!(
        pod_names.len(),
        names.len(),
        "exactly one pod per sandbox: {pod_names:?}"
    );
    let admin = Caller::user(env, "admin");
    for name in &names {
        assert!(pod_names.contains(name), "pod for {name}");
        if let Some(before) = pods_before.get(name) {
            assert_eq!(
                pods_after.get(name),
                Some(before),
                "the pod of {name} made before the kill was kept"
            );
        }
        // Through the gateway: the restarted operator derives the pod's token with the same key.
        let answer = admin.exec(&ns, name, json!({"argv": ["true"]})).await;
        assert_eq!(answer.status, 200, "{name}: {answer:?}");
    }
    env.delete_namespace(&ns).await;
}
