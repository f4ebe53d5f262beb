//! Names taken by somebody else's objects: the operator uses or deletes an object only when its
//! controller owner reference carries the owner's UID. A Pod or egress policy under a sandbox's
//! names, or a Sandbox under a RolloutGroup's trajectory name, fails the owner with
//! `NameConflict`, and the foreign object is left exactly as it was (same UID, same content).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use orchard_e2e::env::TestEnv;
use orchard_e2e::test_support::rollouts::{group, template};
use orchard_e2e::test_support::sandboxes::{is_failed, sandbox};
use orchard_e2e::wait;
use orchard_operator::api::{RolloutGroup, RolloutPhase, Sandbox};
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
