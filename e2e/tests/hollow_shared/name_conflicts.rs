//! Names taken by somebody else's objects: the operator uses or deletes an object only when it carries
//! the operator's seal for the owner's UID (annotation `orchard.dev/seal`), whatever its owner
//! references say. A Pod or egress policy under a sandbox's names, or a Sandbox under a RolloutGroup's
//! trajectory name, fails the owner with `NameConflict`, and the foreign object is left exactly as it
//! was (same UID, same content) — also when whoever made it wrote a controller owner reference to the
//! owner into it, which Kubernetes lets anyone do who may create the object.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use orchard_operator::api::{
    RolloutGroup, RolloutPhase, RolloutQueue, SEAL_ANNOTATION, Sandbox, SandboxPool,
};
use orchard_operator::pool::template::template_hash;
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::rollouts::{group, template};
use orchard_testcluster::test_support::sandboxes::{is_failed, sandbox, token_key};
use orchard_testcluster::wait;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn reason(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.reason.clone())
        .unwrap_or_default()
}

fn object<K: DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).expect("valid object JSON")
}

/// Creates `foreign` in `ns`, then a Sandbox `name` whose child it collides with; checks the sandbox
/// fails with `NameConflict` and `foreign` is untouched.
async fn collide<K>(env: &TestEnv, ns: &str, name: &str, foreign: K)
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + DeserializeOwned
        + std::fmt::Debug
        + PartialEq,
{
    let client = env.client().await;
    let children: Api<K> = Api::namespaced(client.clone(), ns);
    let before = children
        .create(&PostParams::default(), &foreign)
        .await
        .expect("create the foreign object");
    let sandboxes: Api<Sandbox> = Api::namespaced(client, ns);
    let egress = json!({"image": "busybox", "network": {"egress": "AllowAll"}});
    sandboxes
        .create(&PostParams::default(), &sandbox(name, egress))
        .await
        .expect("create the sandbox");
    let failed = wait::until(
        &sandboxes,
        name,
        "Failed",
        Duration::from_secs(60),
        is_failed,
    )
    .await;
    assert_eq!(reason(&failed), "NameConflict", "{:?}", failed.status);
    let message = failed
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    assert!(message.contains("already exists"), "{message}");
    // Give a wrong operator time to touch it, then compare.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = children
        .get_opt(&before.name_any())
        .await
        .expect("get")
        .expect("the foreign object still exists");
    assert_eq!(after.uid(), before.uid(), "the foreign object was replaced");
    assert_eq!(
        after.meta().resource_version,
        before.meta().resource_version,
        "the foreign object was modified"
    );
    assert!(
        after.owner_references().is_empty(),
        "the foreign object was adopted"
    );
}

#[tokio::test]
async fn a_foreign_pod_under_the_sandbox_name_is_never_touched() {
    let env = TestEnv::shared();
    let ns = env.namespace("conflict-pod").await;
    let pod: Pod = object(json!({
        "metadata": {"name": "taken-pod"},
        "spec": {"containers": [{"name": "app", "image": "busybox"}], "nodeName": "not-a-node"},
    }));
    collide(env, &ns, "taken-pod", pod).await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_foreign_policy_under_the_egress_name_is_never_touched() {
    let env = TestEnv::shared();
    let ns = env.namespace("conflict-policy").await;
    let policy: NetworkPolicy = object(json!({
        "metadata": {"name": "taken-policy-egress", "labels": {"app.kubernetes.io/managed-by": "orchard-operator"}},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"]},
    }));
    collide(env, &ns, "taken-policy", policy).await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_sandbox_preseeded_under_a_trajectory_name_fails_the_group_and_keeps_its_reward() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("conflict-group").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    // Somebody's own sandbox named like trajectory 0 of group `prompt`.
    let seeded = sandboxes
        .create(
            &PostParams::default(),
            &sandbox("prompt-0", json!({"image": "busybox"})),
        )
        .await
        .expect("create the pre-seeded sandbox");
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let spec = json!({"groupSize": 2, "maxTrajectories": 2, "stride": 2,
        "template": template("echo '{\"reward\": 1.0, \"status\": \"completed\"}' > result.json", 60)});
    groups
        .create(&PostParams::default(), &group("prompt", spec))
        .await
        .expect("create the group");
    let failed = wait::until(
        &groups,
        "prompt",
        "Failed",
        Duration::from_secs(60),
        |g: Option<&RolloutGroup>| {
            g.and_then(|g| g.status.as_ref())
                .is_some_and(|s| s.phase == Some(RolloutPhase::Failed))
        },
    )
    .await;
    let status = failed.status.clone().unwrap_or_default();
    let complete = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Complete")
        .expect("a Complete condition");
    assert_eq!(
        (complete.status.as_str(), complete.reason.as_str()),
        ("False", "NameConflict"),
        "{status:?}"
    );
    let after = sandboxes
        .get("prompt-0")
        .await
        .expect("the pre-seeded sandbox still exists");
    assert_eq!(after.uid(), seeded.uid(), "it was replaced");
    assert!(
        after.owner_references().is_empty(),
        "the group adopted somebody else's sandbox"
    );
    assert!(
        status.trajectories.iter().all(|t| t.reward.is_none()),
        "no reward was taken from the pre-seeded sandbox: {:?}",
        status.trajectories
    );
    env.delete_namespace(&ns).await;
}

/// A controller owner reference to `kind` `name` with `uid`, as anyone may write one.
fn forged_controller(kind: &str, name: &str, uid: &str) -> Value {
    json!([{"apiVersion": "orchard.dev/v1alpha1", "kind": kind, "name": name, "uid": uid,
        "controller": true}])
}

#[tokio::test]
async fn a_sandbox_forging_a_groups_owner_reference_under_a_trajectory_name_is_never_adopted() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("forged-trajectory").await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    // Alice's group; its stride waits for a queue that does not exist yet, so nothing is launched
    // until the test creates it.
    let spec = json!({"groupSize": 2, "maxTrajectories": 2, "stride": 2, "queue": "later",
        "template": template("echo '{\"reward\": 0.0, \"status\": \"completed\"}' > result.json", 60)});
    let alice = groups
        .create(&PostParams::default(), &group("prompt", spec))
        .await
        .expect("create the group");
    let group_uid = alice.uid().expect("the group's UID");
    // Bob's own Sandbox under trajectory 1's name, created after the group, with a controller
    // reference to Alice's group and a run of his own that reports reward 1.
    let forged: Sandbox = object(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": "prompt-1",
            "labels": {"orchard.dev/rollout-group": "prompt", "orchard.dev/stride": "0"},
            "ownerReferences": forged_controller("RolloutGroup", "prompt", &group_uid)},
        "spec": {"image": "busybox:1.36", "run": {"command": ["/bin/sh", "-c",
            "echo '{\"reward\": 1.0, \"status\": \"completed\"}' > result.json"],
            "timeoutSeconds": 60, "resultPath": "result.json"}},
    }));
    let bob = sandboxes
        .create(&PostParams::default(), &forged)
        .await
        .expect("create the forged trajectory");
    let rewarded = wait::until(
        &sandboxes,
        "prompt-1",
        "its own run recorded a result",
        Duration::from_secs(60),
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.result.is_some())
        },
    )
    .await;
    let reward = rewarded
        .status
        .as_ref()
        .and_then(|s| s.result.as_ref())
        .and_then(|r| r.reward);
    assert_eq!(reward, Some(1.0), "{:?}", rewarded.status);
    // Admit the stride: trajectory 0 is created, trajectory 1's name is Bob's.
    let queues: Api<RolloutQueue> = Api::namespaced(client.clone(), &ns);
    let queue: RolloutQueue = object(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutQueue", "metadata": {"name": "later"},
        "spec": {"maxRunningTrajectories": 4, "admission": "FIFO"},
    }));
    queues
        .create(&PostParams::default(), &queue)
        .await
        .expect("create the queue");
    let decided = wait::until(
        &groups,
        "prompt",
        "Failed or Complete",
        Duration::from_secs(60),
        |g: Option<&RolloutGroup>| {
            g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
                matches!(s.phase, Some(RolloutPhase::Failed | RolloutPhase::Complete))
            })
        },
    )
    .await;
    let status = decided.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        Some(RolloutPhase::Failed),
        "the group must not complete with Bob's sandbox: {status:?}"
    );
    let complete = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Complete")
        .expect("a Complete condition");
    assert_eq!(
        (complete.status.as_str(), complete.reason.as_str()),
        ("False", "NameConflict"),
        "{status:?}"
    );
    assert!(
        complete.message.contains("prompt-1") && complete.message.contains("no valid seal"),
        "{}",
        complete.message
    );
    assert!(
        status
            .trajectories
            .iter()
            .all(|t| t.name != "prompt-1" && t.reward.is_none()),
        "Bob's sandbox is not a trajectory and no reward came from it: {:?}",
        status.trajectories
    );
    // Bob's sandbox is as he made it: not replaced, not deleted by the group, not re-owned.
    let after = sandboxes
        .get("prompt-1")
        .await
        .expect("the forged sandbox still exists");
    assert_eq!(after.uid(), bob.uid(), "it was replaced");
    assert_eq!(after.owner_references(), bob.owner_references());
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_pod_planted_under_a_pending_sandboxs_pod_name_is_never_its_pod() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("planted-pod").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    // A sandbox that waits for a pool that does not exist: Pending, with no pod of its own yet.
    let waiting = sandboxes
        .create(
            &PostParams::default(),
            &sandbox(
                "victim",
                json!({"image": "busybox:1.36", "pool": "absent", "whenPoolEmpty": "Wait"}),
            ),
        )
        .await
        .expect("create the sandbox");
    wait::until(
        &sandboxes,
        "victim",
        "waiting for its pool",
        Duration::from_secs(60),
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.conditions.iter().any(|c| c.reason == "PoolNotFound"))
        },
    )
    .await;
    // A pod under its pod name carrying everything its own pod would (the sandbox labels, the current
    // key's id, a nonce, a controller reference to the sandbox's UID) but the operator's seal.
    let key_id = token_key(&client)
        .await
        .map(|key| key.id().to_string())
        .unwrap_or_default();
    let planted: Pod = object(json!({
        "metadata": {"name": "victim",
            "labels": {"orchard.dev/sandbox": "victim", "orchard.dev/sandbox-pod": "true",
                "app.kubernetes.io/managed-by": "orchard-operator"},
            "annotations": {"orchard.dev/agent-token-key": key_id,
                "orchard.dev/agent-token-nonce": "00112233445566778899aabbccddeeff"},
            "ownerReferences": forged_controller("Sandbox", "victim",
                &waiting.uid().expect("the sandbox's UID"))},
        "spec": {"containers": [{"name": "sandbox", "image": "busybox"}], "nodeName": "not-a-node"},
    }));
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let before = pods
        .create(&PostParams::default(), &planted)
        .await
        .expect("plant the pod");
    let failed = wait::until(
        &sandboxes,
        "victim",
        "Failed",
        Duration::from_secs(60),
        is_failed,
    )
    .await;
    assert_eq!(reason(&failed), "NameConflict", "{:?}", failed.status);
    let message = failed
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains("Pod victim") && message.contains("no valid seal"),
        "{message}"
    );
    // Never used: the status names no pod of the sandbox's.
    let status = failed.status.clone().unwrap_or_default();
    assert_eq!(status.pod_name, None, "{status:?}");
    // Untouched: same object, same version, the owner reference as planted.
    let after = pods
        .get_opt("victim")
        .await
        .expect("get")
        .expect("the planted pod still exists");
    assert_eq!(after.uid(), before.uid(), "the planted pod was replaced");
    assert_eq!(
        after.resource_version(),
        before.resource_version(),
        "the planted pod was modified"
    );
    assert_eq!(after.owner_references(), before.owner_references());
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_pod_planted_as_a_pool_member_is_never_claimed_and_a_real_member_is_resealed() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("planted-member").await;
    let pools: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
    // An empty pool: no member of its own yet.
    let pool: SandboxPool = object(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool", "metadata": {"name": "py"},
        "spec": {"replicas": 0, "template": {"image": "busybox:1.36"}},
    }));
    let pool = pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create the pool");
    let key = token_key(&client).await.expect("the operator's key");
    // A Ready-looking Pod with everything a member carries (pool label, template hash, token
    // annotations, a controller reference to the pool) but the operator's seal.
    let planted: Pod = object(json!({
        "metadata": {"name": "py-fake1",
            "labels": {"orchard.dev/pool": "py", "orchard.dev/sandbox": "py-fake1",
                "orchard.dev/sandbox-pod": "true", "app.kubernetes.io/managed-by": "orchard-operator"},
            "annotations": {"orchard.dev/pool-template-hash": template_hash(&pool.spec.template),
                "orchard.dev/agent-token-key": key.id(),
                "orchard.dev/agent-token-nonce": "00112233445566778899aabbccddeeff"},
            "ownerReferences": forged_controller("SandboxPool", "py",
                &pool.uid().expect("the pool's UID"))},
        "spec": {"containers": [{"name": "sandbox", "image": "busybox"}], "nodeName": "not-a-node"},
    }));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.create(&PostParams::default(), &planted)
        .await
        .expect("plant the member");
    let ready = json!({"status": {"phase": "Running", "podIP": "10.255.0.9",
        "conditions": [{"type": "Ready", "status": "True"}]}});
    let before = pods
        .patch_status("py-fake1", &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .expect("make the planted member look Ready");
    // A sandbox that waits for a member of the pool: it finds none to claim.
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("task", json!({"pool": "py", "whenPoolEmpty": "Wait"})),
        )
        .await
        .expect("create the sandbox");
    let waiting_for_member = |s: Option<&Sandbox>| {
        s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.reason == "WaitingForPoolMember")
        })
    };
    wait::until(
        &sandboxes,
        "task",
        "waiting for a pool member",
        Duration::from_secs(60),
        waiting_for_member,
    )
    .await;
    let untouched = |after: &Pod| {
        assert_eq!(after.uid(), before.uid(), "the planted pod was replaced");
        assert_eq!(
            after.resource_version(),
            before.resource_version(),
            "the planted pod was claimed, relabelled or otherwise modified"
        );
        assert_eq!(after.owner_references(), before.owner_references());
    };
    untouched(&pods.get("py-fake1").await.expect("the planted pod exists"));
    // A real member: the sandbox claims it, and the claim seals it for the sandbox.
    pools
        .patch(
            "py",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 1}})),
        )
        .await
        .expect("scale the pool");
    let claimed = wait::until(
        &sandboxes,
        "task",
        "Ready",
        Duration::from_secs(120),
        orchard_testcluster::test_support::sandboxes::is_ready,
    )
    .await;
    let member = claimed
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .expect("the status names the claimed member");
    assert!(
        member.starts_with("py-") && member != "py-fake1",
        "{member}"
    );
    let pod = pods.get(&member).await.expect("the claimed member");
    let sandbox_uid = claimed.uid().expect("the sandbox's UID");
    assert_eq!(
        pod.owner_references()
            .iter()
            .filter(|r| r.controller == Some(true))
            .map(|r| r.uid.as_str())
            .collect::<Vec<_>>(),
        [sandbox_uid.as_str()]
    );
    assert_eq!(
        pod.annotations().get(SEAL_ANNOTATION),
        Some(&key.seal("Pod", &ns, &member, &sandbox_uid)),
        "the claim re-sealed the member for the sandbox"
    );
    untouched(&pods.get("py-fake1").await.expect("the planted pod exists"));
    env.delete_namespace(&ns).await;
}
