//! The exact requests one Sandbox reconcile sends, against a scripted API server
//! (`plumbing::mock_api`), for the main cases: a new sandbox, its pod turning Ready, its TTL passed, an
//! egress switch to `Deny`.

use crate::plumbing::cached_pod::CachedPod;

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Resource;
use serde_json::{Value, json};

use super::reconcile;
use super::status::{Observed, desired_status};
use crate::plumbing::mock_api::{
    Expect, Scripted, TestCaches, cache, default_settings, scripted, test_token_key,
};
use crate::pod::cluster_ranges::ClusterRanges;
use crate::pod::context::PodCtx;
use crate::pod::policy::{baseline_policy, desired_egress_policy};
use crate::pod::spec::desired_pod;
use crate::sandbox::context::SandboxCtx;
use orchard_api::Lifecycle;
use orchard_api::{
    EgressPolicy, LifecycleSpec, NetworkSpec, Sandbox, SandboxPhase, SandboxSpec, SandboxStatus,
};

const NS: &str = "team";
const SANDBOXES: &str = "/apis/orchard.dev/v1alpha1/namespaces/team/sandboxes";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/team/events";

fn sandbox(created_ago_seconds: i64) -> Sandbox {
    let mut s = Sandbox::new(
        "s1",
        SandboxSpec {
            image: "busybox".into(),
            ..SandboxSpec::default()
        },
    );
    s.metadata.namespace = Some(NS.into());
    s.metadata.uid = Some("uid-s1".into());
    s.metadata.generation = Some(1);
    s.metadata.resource_version = Some("10".into());
    let created = Timestamp::now() - SignedDuration::from_secs(created_ago_seconds);
    s.metadata.creation_timestamp = Some(Time(created));
    s
}

fn ready_pod(s: &Sandbox) -> Pod {
    let settings = default_settings();
    let owner = s.controller_owner_ref(&()).expect("owner");
    let credentials = crate::pod::token::credentials(&test_token_key(), NS, "s1", "00");
    let mut pod = desired_pod(
        s,
        &owner,
        &settings.pod.pod,
        &credentials,
        &test_token_key(),
    );
    pod.metadata.uid = Some("uid-pod".into());
    pod.spec.get_or_insert_default().node_name = Some("node-1".into());
    pod.status = Some(PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("10.0.0.7".into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    });
    pod
}

/// A Ready pod somebody planted under the sandbox's pod name: everything its own pod carries (labels,
/// token annotations, a controller reference to the sandbox's UID) but the operator's seal.
fn planted_pod(s: &Sandbox) -> Pod {
    let mut pod = ready_pod(s);
    pod.metadata.uid = Some("uid-planted".into());
    pod.metadata
        .annotations
        .as_mut()
        .expect("annotations")
        .remove(orchard_api::SEAL_ANNOTATION);
    pod
}

/// Caches as the watches show them once the sandbox's baseline exists.
fn caches_with_children(s: &Sandbox, pod: Option<Pod>) -> TestCaches {
    let settings = default_settings();
    let mut caches = TestCaches::default();
    cache(&mut caches.sandboxes, s.clone());
    cache(
        &mut caches.policies,
        baseline_policy(NS, &settings.pod.policy),
    );
    if let Some(pod) = pod {
        cache(&mut caches.pods, CachedPod::from(&pod));
    }
    caches
}

fn status_patch_sets(field: &'static str, value: Value) -> impl Fn(&Value) + Send {
    move |patch: &Value| {
        let ops = patch.as_array().expect("a JSON patch");
        assert_eq!(
            ops.first(),
            Some(&json!({"op": "test", "path": "/metadata/uid", "value": "uid-s1"})),
            "the status write is guarded by the sandbox's UID: {patch}"
        );
        assert!(
            ops.iter().any(
                |op| op["path"] == format!("/status/{field}") && op["value"] == value
                    || op["path"] == "/status" && op["value"][field] == value
            ),
            "the patch sets {field} = {value}: {patch}"
        );
    }
}

/// The sandbox with the status a reconcile would have written for `pod` (nothing left to write).
fn settled(mut s: Sandbox, pod: &Pod, ready_seconds_ago: i64) -> Sandbox {
    let settings = default_settings();
    let key = test_token_key();
    let ready = Timestamp::now() - SignedDuration::from_secs(ready_seconds_ago);
    let pod = CachedPod::from(pod);
    let observed = Observed {
        pod: Some(&pod),
        pod_gone: None,
        now: ready,
        lifecycle: Lifecycle::of(
            &s.spec,
            settings.sandbox.default_ttl_seconds,
            settings.sandbox.default_heartbeat_timeout_seconds,
        ),
        startup_timeout_seconds: settings.sandbox.startup_timeout_seconds,
        agent_port: settings.pod.pod.agent_port,
        blocked: None,
        key: &key,
        enforcement: &crate::sandbox::enforcement::Verdict::Unknown,
        egress_proxy: false,
        retry: None,
    };
    s.status = Some(desired_status(&s, &observed));
    s
}

fn with_status(mut s: Sandbox, phase: SandboxPhase) -> Sandbox {
    s.status = Some(SandboxStatus {
        phase: Some(phase),
        pod_name: Some("s1".into()),
        ..SandboxStatus::default()
    });
    s
}

/// One reconcile of `s` deletes it by UID and publishes `Expired`, nothing else.
async fn expect_deleted_at_its_deadline(s: Sandbox, caches: &TestCaches) {
    let script = scripted(
        caches,
        vec![
            Expect::delete(format!("{SANDBOXES}/s1"))
                .body(|delete| assert_eq!(delete["preconditions"]["uid"], "uid-s1")),
            Expect::create(EVENTS, "uid-event")
                .body(|event| assert_eq!(event["reason"], "Expired")),
        ],
    );
    reconcile(Arc::new(s), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

/// The Sandbox controller's context on a script, with the default settings.
fn ctx(script: &Scripted) -> Arc<SandboxCtx> {
    let settings = default_settings();
    let ranges = tokio::sync::watch::channel(ClusterRanges::default()).1;
    Arc::new(SandboxCtx::new(
        script.kube.clone(),
        Arc::new(PodCtx::new(settings.pod.clone(), ranges)),
        settings.sandbox,
        Arc::default(),
    ))
}

#[tokio::test]
async fn a_new_sandbox_gets_its_baseline_pod_and_first_status_at_once() {
    let s = sandbox(0);
    let mut caches = TestCaches::default();
    cache(&mut caches.sandboxes, s.clone());
    let mut written = s.clone();
    written.metadata.resource_version = Some("11".into());
    let script = scripted(
        &caches,
        vec![
            Expect::new(
                "PATCH",
                "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies/orchard-sandbox-baseline",
                200,
                Value::Null,
            )
            .query("fieldManager=orchard-operator")
            .echo(200),
            Expect::create("/api/v1/namespaces/team/pods", "uid-pod").body(|pod| {
                assert_eq!(pod["metadata"]["name"], "s1");
                assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], "uid-s1");
                // The token's derivation inputs, not the token: no Secret is written for it.
                assert_eq!(
                    pod["metadata"]["annotations"]["orchard.dev/agent-token-key"],
                    test_token_key().id()
                );
                // Sealed for the sandbox: only such a pod is ever its own.
                assert_eq!(
                    pod["metadata"]["annotations"]["orchard.dev/seal"],
                    test_token_key().seal("Pod", NS, "s1", "uid-s1")
                );
            }),
            Expect::new(
                "PATCH",
                format!("{SANDBOXES}/s1/status"),
                200,
                serde_json::to_value(&written).expect("json"),
            )
            .body(|patch| {
                    status_patch_sets("phase", json!("Pending"))(patch);
                    let text = patch.to_string();
                    assert!(
                        text.contains("\"Reconciling\"") && text.contains("\"observedGeneration\""),
                        "the first status says Reconciling, with observedGeneration: {patch}"
                    );
                }),
        ],
    );
    reconcile(Arc::new(s), ctx(&script))
        .await
        .expect("reconcile");
    // The first status is written at once (kstatus reads a new object as Current until then); later
    // transient phases of a young sandbox are coalesced.
    assert_eq!(script.finish().await.len(), 3);
}

#[tokio::test]
async fn a_new_sandbox_created_through_the_gateway_waits_for_its_first_status() {
    let mut s = sandbox(0);
    s.metadata.annotations = Some(std::collections::BTreeMap::from([(
        orchard_api::CREATED_BY_ANNOTATION.to_string(),
        "alice".to_string(),
    )]));
    let mut caches = TestCaches::default();
    cache(&mut caches.sandboxes, s.clone());
    let script = scripted(
        &caches,
        vec![
            Expect::new(
                "PATCH",
                "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies/orchard-sandbox-baseline",
                200,
                Value::Null,
            )
            .query("fieldManager=orchard-operator")
            .echo(200),
            Expect::create("/api/v1/namespaces/team/pods", "uid-pod"),
        ],
    );
    let action = reconcile(Arc::new(s), ctx(&script))
        .await
        .expect("reconcile");
    // No status yet: it comes with Ready, or once the coalescing window has passed.
    assert_eq!(script.finish().await.len(), 2);
    assert_ne!(action, kube::runtime::controller::Action::await_change());
}

#[tokio::test]
async fn a_ready_pod_costs_one_status_write() {
    let s = with_status(sandbox(2), SandboxPhase::Starting);
    let caches = caches_with_children(&s, Some(ready_pod(&s)));
    let mut written = s.clone();
    written.metadata.resource_version = Some("11".into());
    let script = scripted(
        &caches,
        vec![
            Expect::new(
                "PATCH",
                format!("{SANDBOXES}/s1/status"),
                200,
                serde_json::to_value(&written).expect("json"),
            )
            .body(status_patch_sets("phase", json!("Ready"))),
        ],
    );
    reconcile(Arc::new(s), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_sandbox_past_its_ttl_is_deleted_by_uid() {
    let mut s = sandbox(120);
    s.spec.lifecycle = Some(LifecycleSpec {
        ttl_seconds: Some(60),
        ..LifecycleSpec::default()
    });
    let s = settled(s.clone(), &ready_pod(&s), 100);
    assert_eq!(
        s.status.as_ref().and_then(|st| st.phase),
        Some(SandboxPhase::Ready)
    );
    let caches = caches_with_children(&s, Some(ready_pod(&s)));
    expect_deleted_at_its_deadline(s, &caches).await;
}

#[tokio::test]
async fn switching_egress_to_deny_deletes_the_sandbox_policy_only() {
    let mut s = with_status(sandbox(30), SandboxPhase::Ready);
    s.spec.network = Some(NetworkSpec {
        egress: EgressPolicy::AllowAll,
        ..NetworkSpec::default()
    });
    let settings = default_settings();
    let owner = s.controller_owner_ref(&()).expect("owner");
    let mut policy = desired_egress_policy(&s, &owner, &settings.pod.policy, &test_token_key())
        .expect("AllowAll has one");
    policy.metadata.uid = Some("uid-egress".into());
    s.spec.network = None;
    s.metadata.generation = Some(2);
    let mut caches = caches_with_children(&s, Some(ready_pod(&s)));
    cache(&mut caches.policies, policy);
    let mut written = s.clone();
    written.metadata.resource_version = Some("11".into());
    let script = scripted(
        &caches,
        vec![
            Expect::delete("/apis/networking.k8s.io/v1/namespaces/team/networkpolicies/s1-egress")
                .body(|delete| assert_eq!(delete["preconditions"]["uid"], "uid-egress")),
            // The new generation is observed.
            Expect::new(
                "PATCH",
                format!("{SANDBOXES}/s1/status"),
                200,
                serde_json::to_value(&written).expect("json"),
            )
            .body(status_patch_sets("observedGeneration", json!(2))),
        ],
    );
    reconcile(Arc::new(s), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_failed_sandbox_is_deleted_by_uid_when_its_ttl_ends() {
    let mut s = with_status(sandbox(120), SandboxPhase::Failed);
    s.spec.lifecycle = Some(LifecycleSpec {
        ttl_seconds: Some(60),
        ..LifecycleSpec::default()
    });
    // Never Ready: the TTL counts from creation (120 s ago); its pod is gone already.
    let caches = caches_with_children(&s, None);
    expect_deleted_at_its_deadline(s, &caches).await;
}

#[tokio::test]
async fn a_failed_sandbox_within_its_ttl_is_kept_and_nothing_is_written() {
    let s = with_status(sandbox(10), SandboxPhase::Failed);
    let caches = caches_with_children(&s, None);
    let script = scripted(&caches, vec![]);
    reconcile(Arc::new(s), ctx(&script))
        .await
        .expect("reconcile");
    assert!(script.finish().await.is_empty());
}

#[tokio::test]
async fn a_planted_pod_under_the_sandbox_name_is_never_its_pod() {
    let s = sandbox(0);
    let caches = caches_with_children(&s, Some(planted_pod(&s)));
    let mut written = s.clone();
    written.metadata.resource_version = Some("11".into());
    // Not Ready through somebody else's agent: failed at once, and the pod is neither used nor
    // deleted (no request touches it).
    let script = scripted(
        &caches,
        vec![
            Expect::new(
                "PATCH",
                format!("{SANDBOXES}/s1/status"),
                200,
                serde_json::to_value(&written).expect("json"),
            )
            .body(|patch| {
                status_patch_sets("phase", json!("Failed"))(patch);
                status_patch_sets("reason", json!("NameConflict"))(patch);
                assert!(patch.to_string().contains("no valid seal"), "{patch}");
            }),
            Expect::create(EVENTS, "uid-event")
                .body(|event| assert_eq!(event["reason"], "NameConflict")),
        ],
    );
    reconcile(Arc::new(s), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_failed_sandbox_never_deletes_a_pod_planted_under_its_name() {
    let s = with_status(sandbox(10), SandboxPhase::Failed);
    let caches = caches_with_children(&s, Some(planted_pod(&s)));
    let script = scripted(&caches, vec![]);
    reconcile(Arc::new(s), ctx(&script))
        .await
        .expect("reconcile");
    assert!(script.finish().await.is_empty());
}

/// `pod` as the taint-eviction controller leaves it on a node that stopped answering: not Ready (the
/// node controller's doing), a `DisruptionTarget` condition, and a deletion that the node's kubelet
/// will never finish.
fn lost_with_its_node(mut pod: Pod) -> Pod {
    pod.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    pod.status.get_or_insert_default().conditions = Some(vec![
        PodCondition {
            type_: "Ready".into(),
            status: "False".into(),
            ..PodCondition::default()
        },
        PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("DeletionByTaintManager".into()),
            message: Some("Taint manager: deleting due to NoExecute taint".into()),
            ..PodCondition::default()
        },
    ]);
    pod
}

#[tokio::test]
async fn a_failed_sandbox_removes_its_pod_stuck_on_a_lost_node_with_grace_period_zero() {
    let s = with_status(sandbox(10), SandboxPhase::Failed);
    let caches = caches_with_children(&s, Some(lost_with_its_node(ready_pod(&s))));
    let script = scripted(
        &caches,
        vec![
            Expect::delete(format!("/api/v1/namespaces/{NS}/pods/s1")).body(|delete| {
                assert_eq!(delete["preconditions"]["uid"], "uid-pod");
                assert_eq!(delete["gracePeriodSeconds"], 0);
            }),
            Expect::create(EVENTS, "uid-event")
                .body(|event| assert_eq!(event["reason"], "LostNodePodRemoved")),
        ],
    );
    reconcile(Arc::new(s), ctx(&script))
        .await
        .expect("reconcile");
    script.finish().await;
}

#[tokio::test]
async fn a_pod_planted_under_the_name_is_never_removed_even_on_a_lost_node() {
    let s = with_status(sandbox(10), SandboxPhase::Failed);
    let caches = caches_with_children(&s, Some(lost_with_its_node(planted_pod(&s))));
    let script = scripted(&caches, vec![]);
    reconcile(Arc::new(s), ctx(&script))
        .await
        .expect("reconcile");
    assert!(script.finish().await.is_empty());
}

/// A Ready sandbox whose Pod a live read finds gone: `NodeLost` when its node is gone too (the Node
/// list by name comes back empty), `PodDeleted` when the node is Ready.
async fn gone_pod_reason(nodes: Value) -> String {
    let mut s = with_status(sandbox(10), SandboxPhase::Ready);
    s.status.as_mut().expect("status").node_name = Some("node-2".into());
    let caches = caches_with_children(&s, None);
    let mut written = s.clone();
    written.metadata.resource_version = Some("11".into());
    let reason = Arc::new(std::sync::Mutex::new(String::new()));
    let seen = reason.clone();
    let script = scripted(
        &caches,
        vec![
            Expect::not_found("GET", format!("/api/v1/namespaces/{NS}/pods/s1")),
            Expect::new("GET", "/api/v1/nodes", 200, nodes).query("metadata.name%3Dnode-2"),
            Expect::new(
                "PATCH",
                format!("{SANDBOXES}/s1/status"),
                200,
                serde_json::to_value(&written).expect("json"),
            )
            .body(move |patch| {
                let ops = patch.as_array().expect("a JSON patch");
                let set = ops
                    .iter()
                    .find_map(|op| match op["path"].as_str() {
                        Some("/status/reason") => op["value"].as_str(),
                        Some("/status") => op["value"]["reason"].as_str(),
                        _ => None,
                    })
                    .unwrap_or_default();
                *seen.lock().expect("lock") = set.to_string();
            }),
            Expect::create(EVENTS, "uid-event"),
        ],
    );
    let _ = reconcile(Arc::new(s), ctx(&script)).await;
    script.finish().await;
    reason.lock().expect("lock").clone()
}

#[tokio::test]
async fn a_pod_gone_with_its_node_fails_the_sandbox_node_lost() {
    let none = json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": []});
    assert_eq!(gone_pod_reason(none).await, "NodeLost");
    let ready = json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [{
        "metadata": {"name": "node-2"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }]});
    assert_eq!(gone_pod_reason(ready).await, "PodDeleted");
}
