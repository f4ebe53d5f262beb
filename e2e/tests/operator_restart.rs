//! The operator SIGKILLed in the middle of creating sandboxes and restarted: every sandbox still
//! becomes Ready, with exactly one pod and its original token (nothing is created twice).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use orchard_e2e::env::TestEnv;
use orchard_e2e::test_support::sandboxes::{is_ready, sandbox, token_of};
use orchard_e2e::wait;
use orchard_operator::api::Sandbox;
use serde_json::json;

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
    let tokens_before: BTreeMap<String, String> = {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
        secrets
            .list(&ListParams::default())
            .await
            .expect("list secrets")
            .items
            .into_iter()
            .map(|s| {
                (
                    s.name_any(),
                    String::from_utf8_lossy(&s.data.unwrap_or_default()["token"].0).to_string(),
                )
            })
            .collect()
    };
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
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod_names: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(
        pod_names.len(),
        names.len(),
        "exactly one pod per sandbox: {pod_names:?}"
    );
    for name in &names {
        assert!(pod_names.contains(name), "pod for {name}");
        let token = token_of(&client, &ns, name).await;
        if let Some(before) = tokens_before.get(&format!("{name}-agent-token")) {
            assert_eq!(&token, before, "the token of {name} was not regenerated");
        }
    }
    env.delete_namespace(&ns).await;
}
