//! Standalone Sandboxes with `spec.retry` on the local node: a sandbox whose pod is evicted because
//! the node was low on memory gets a new pod, `<sandbox>-attempt-2`, with twice the memory, becomes
//! Ready again and answers through the gateway (the new pod's token is bound to its own name); when
//! its last attempt's pod is deleted under it, it fails as a sandbox without `retry` does, with that
//! attempt's reason. A `maxMemory` below the operator's default memory (which the API server cannot
//! see) fails the sandbox `InvalidSpec` before any pod exists.
//!
//! The local node cannot OOM-kill a task container (its processes have no memory cgroup of their
//! own): `e2e/tests/rollout_retry.rs` checks that on the real node.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use orchard_operator::api::{ATTEMPT_LABEL, Sandbox, SandboxPhase};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::gateway::Caller;
use orchard_testcluster::test_support::sandboxes::is_failed;
use orchard_testcluster::wait;
use serde_json::json;

/// Whether `sandbox` is Ready on attempt `attempt`.
fn ready_on(sandbox: &Sandbox, attempt: i32) -> bool {
    sandbox.status.as_ref().is_some_and(|s| {
        s.attempts == attempt
            && s.phase == Some(SandboxPhase::Ready)
            && s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

fn memory_limit(pod: &Pod) -> Option<String> {
    let container = pod.spec.as_ref()?.containers.first()?;
    let limits = container.resources.as_ref()?.limits.as_ref()?;
    Some(limits.get("memory")?.0.clone())
}

#[tokio::test]
async fn a_sandbox_evicted_for_memory_gets_a_new_pod_with_twice_the_memory_then_fails_on_its_last()
{
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("sbx-retry").await;
    let admin = Caller::user(env, "admin");
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let name = admin
        .create_sandbox(
            &ns,
            json!({
                "name": "phoenix", "image": "busybox", "memory": "64Mi",
                "retry": {
                    "maxAttempts": 2, "onEviction": true,
                    "onOOM": {"memoryFactor": 2, "maxMemory": "256Mi"},
                },
            }),
        )
        .await;
    admin.wait_ready(&ns, &name).await;
    let first = admin.exec(&ns, &name, json!({"argv": ["true"]})).await;
    assert_eq!(first.status, 200, "{first:?}");

    assert!(env.node.hollow().evict(&ns, &name), "the node runs the pod");
    let retried = wait::until(
        &sandboxes,
        &name,
        "Ready on attempt 2",
        Duration::from_secs(60),
        |s: Option<&Sandbox>| s.is_some_and(|s| ready_on(s, 2)),
    )
    .await;
    let status = retried.status.clone().expect("status");
    assert_eq!(status.pod_name.as_deref(), Some("phoenix-attempt-2"));
    let [evicted] = status.previous_attempts.as_slice() else {
        panic!("one earlier attempt: {status:?}");
    };
    assert_eq!(evicted.reason, "Evicted", "{evicted:?}");
    assert_eq!(
        evicted.memory.as_ref().map(|q| q.0.as_str()),
        Some("64Mi"),
        "{evicted:?}"
    );
    let pod = pods.get("phoenix-attempt-2").await.expect("the new pod");
    assert_eq!(
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ATTEMPT_LABEL))
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(memory_limit(&pod).as_deref(), Some("128Mi"), "twice 64Mi");
    assert_eq!(
        retried
            .spec
            .resources
            .as_ref()
            .and_then(|r| r.memory.clone())
            .map(|q| q.0),
        Some("64Mi".to_string()),
        "the spec stays as the user wrote it"
    );
    let again = admin.exec(&ns, &name, json!({"argv": ["true"]})).await;
    assert_eq!(again.status, 200, "the new pod answers: {again:?}");
    wait::deleted(&pods, "phoenix", Duration::from_secs(30)).await;

    // The last attempt's pod deleted under it: no attempt is left, the sandbox fails with its reason.
    pods.delete("phoenix-attempt-2", &DeleteParams::default())
        .await
        .expect("delete the pod");
    let failed = wait::until(
        &sandboxes,
        &name,
        "Failed",
        Duration::from_secs(60),
        is_failed,
    )
    .await;
    let status = failed.status.clone().expect("status");
    assert_eq!(status.reason.as_deref(), Some("PodDeleted"), "{status:?}");
    assert_eq!(status.attempts, 2);
    assert_eq!(status.previous_attempts.len(), 1, "{status:?}");

    let metrics = env.operator().metrics().await.expect("metrics");
    assert!(
        orchard_testcluster::operator_process::metric_sum(
            &metrics,
            "orchard_retries_total",
            &[("kind", "sandbox"), ("reason", "Evicted")]
        ) >= 1.0,
        "the retry is counted"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_max_memory_below_the_operators_default_fails_the_sandbox_before_any_pod() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("sbx-retry-bad").await;
    let admin = Caller::user(env, "admin");
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let name = admin
        .create_sandbox(
            &ns,
            json!({
                "name": "tiny", "image": "busybox",
                "retry": {"onOOM": {"memoryFactor": 2, "maxMemory": "1Mi"}},
            }),
        )
        .await;
    let failed = wait::until(
        &sandboxes,
        &name,
        "Failed",
        Duration::from_secs(30),
        is_failed,
    )
    .await;
    let status = failed.status.clone().expect("status");
    assert_eq!(status.reason.as_deref(), Some("InvalidSpec"), "{status:?}");
    let message = status.message.unwrap_or_default();
    assert!(message.contains("maxMemory"), "{message}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(
        pods.get_opt(&name).await.expect("get").is_none(),
        "no pod was created"
    );
    env.delete_namespace(&ns).await;
}
