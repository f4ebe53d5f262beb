//! Faults on the local node: an evicted pod, an unpullable image and a killed agent each end in a
//! `Failed` sandbox with a reason a user can act on; the failed pod's resources are released. A pod
//! whose token cannot be derived any more gets a clear 409 from the gateway. A pod marked not ready by
//! someone else (the node-lifecycle controller, after an API server restart) is reported ready again
//! by its node, as a kubelet's status manager does.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::gateway::Caller;
use orchard_testcluster::test_support::nodes::pod_ready;
use orchard_testcluster::test_support::sandboxes::{is_failed, is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

fn reason(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.reason.clone())
        .unwrap_or_default()
}

fn message(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.message.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn an_evicted_pod_fails_the_sandbox_with_reason_evicted() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("evict").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &sandbox("victim", json!({"image": "busybox"})),
    )
    .await
    .expect("create");
    wait::until(&api, "victim", "Ready", Duration::from_secs(60), is_ready).await;
    assert!(
        env.node.hollow().evict(&ns, "victim"),
        "the node runs the pod"
    );
    let failed = wait::until(&api, "victim", "Failed", Duration::from_secs(30), is_failed).await;
    assert_eq!(reason(&failed), "Evicted");
    assert!(
        message(&failed).contains("low on resource"),
        "{}",
        message(&failed)
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait::deleted(&pods, "victim", Duration::from_secs(30)).await;
    let later = api
        .get("victim")
        .await
        .expect("the failed sandbox stays for inspection");
    assert_eq!(reason(&later), "Evicted");
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn an_unpullable_image_fails_the_sandbox_naming_the_image() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("pull").await;
    env.node.hollow().set_unpullable(Some("registry.invalid/*"));
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &sandbox(
            "broken",
            json!({"image": "registry.invalid/no-such-image:1"}),
        ),
    )
    .await
    .expect("create");
    let failed = wait::until(&api, "broken", "Failed", Duration::from_secs(60), is_failed).await;
    let reason = reason(&failed);
    assert!(
        reason == "ErrImagePull" || reason == "ImagePullBackOff",
        "reason {reason}"
    );
    let message = message(&failed);
    assert!(
        message.contains("image pull failed for `registry.invalid/no-such-image:1`"),
        "{message}"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_pod_marked_not_ready_by_someone_else_is_reported_ready_again() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("resync").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &sandbox("steady", json!({"image": "busybox"})),
    )
    .await
    .expect("create");
    wait::until(&api, "steady", "Ready", Duration::from_secs(60), is_ready).await;
    // What the node-lifecycle controller writes for the pods of a node it thinks NotReady.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let marked = json!({"status": {"conditions": [{
        "type": "Ready", "status": "False", "reason": "NodeNotReady",
        "message": "marked not ready by the test, as the node-lifecycle controller does",
    }]}});
    pods.patch_status(
        "steady",
        &PatchParams::default(),
        &Patch::Strategic(&marked),
    )
    .await
    .expect("mark the pod not ready");
    let pod = wait::until(
        &pods,
        "steady",
        "Ready again",
        Duration::from_secs(15),
        |p: Option<&Pod>| p.is_some_and(pod_ready),
    )
    .await;
    assert!(pod_ready(&pod));
    wait::until(
        &api,
        "steady",
        "Ready again",
        Duration::from_secs(30),
        is_ready,
    )
    .await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_killed_agent_is_detected() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("kill").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &sandbox("fragile", json!({"image": "busybox"})),
    )
    .await
    .expect("create");
    wait::until(&api, "fragile", "Ready", Duration::from_secs(60), is_ready).await;
    let pid = env
        .node
        .hollow()
        .agent_pid(&ns, "fragile")
        .expect("agent runs");
    assert!(env.node.hollow().kill_agent(&ns, "fragile"));
    let failed = wait::until(
        &api,
        "fragile",
        "Failed",
        Duration::from_secs(30),
        is_failed,
    )
    .await;
    assert_eq!(reason(&failed), "AgentExited");
    assert!(
        message(&failed).contains("signal 9"),
        "{}",
        message(&failed)
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "agent process is gone"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_pod_stripped_of_its_token_nonce_gets_a_clear_answer_not_a_wrong_token() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("token").await;
    let admin = Caller::user(env, "admin");
    let name = admin
        .create_sandbox(&ns, json!({"name": "keyless", "image": "busybox"}))
        .await;
    admin.wait_ready(&ns, &name).await;
    let ok = admin.exec(&ns, &name, json!({"argv": ["true"]})).await;
    assert_eq!(ok.status, 200, "{ok:?}");
    // Whoever may patch pods removes the annotation the token is derived from.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"orchard.dev/agent-token-nonce": null}}}),
        ),
    )
    .await
    .expect("strip the nonce");
    let answer = wait::poll("the gateway sees the edit", Duration::from_secs(30), || {
        let admin = &admin;
        let (ns, name) = (&ns, &name);
        async move {
            let answer = admin.exec(ns, name, json!({"argv": ["true"]})).await;
            (answer.status != 200).then_some(answer)
        }
    })
    .await;
    assert_eq!(
        (answer.status, answer.code()),
        (409, "Conflict"),
        "{answer:?}"
    );
    assert!(
        answer.message().contains("create it again"),
        "{}",
        answer.message()
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_failed_sandbox_is_kept_for_inspection_until_its_ttl_then_deleted() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("failttl").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &sandbox(
            "brief",
            json!({"image": "busybox", "lifecycle": {"ttlSeconds": 6}}),
        ),
    )
    .await
    .expect("create");
    let ready = wait::until(&api, "brief", "Ready", Duration::from_secs(60), is_ready).await;
    let ready_at = ready
        .status
        .as_ref()
        .and_then(|s| s.ready_time.as_ref())
        .map(|t| t.0)
        .expect("readyTime");
    assert!(env.node.hollow().kill_agent(&ns, "brief"));
    let failed = wait::until(&api, "brief", "Failed", Duration::from_secs(30), is_failed).await;
    assert_eq!(reason(&failed), "AgentExited");
    // Kept while its TTL runs (the status says why it failed)...
    assert!(api.get_opt("brief").await.expect("get").is_some());
    // ...and deleted when it ends (6 s after Ready), not kept forever.
    wait::deleted(&api, "brief", Duration::from_secs(30)).await;
    let gone_after = k8s_openapi::jiff::Timestamp::now().duration_since(ready_at);
    assert!(
        gone_after >= k8s_openapi::jiff::SignedDuration::from_secs(5),
        "deleted {gone_after:?} after Ready, before its 6 s TTL"
    );
    env.delete_namespace(&ns).await;
}
