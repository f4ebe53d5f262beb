//! API writes one sandbox costs from create to delete, counted by the operator itself
//! (`orchard_api_writes_total`) over a batch of sandboxes in an otherwise idle cluster. The number is
//! reported in docs/CONTROLLER.md; the assertion guards against regressions.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use orchard_e2e::env::TestEnv;
use orchard_e2e::operator_process::metric_sum;
use orchard_e2e::test_support::sandboxes::{is_ready, sandbox};
use orchard_e2e::wait;
use orchard_operator::api::Sandbox;
use serde_json::json;

const SANDBOXES: usize = 10;

#[tokio::test]
async fn a_sandbox_lifecycle_costs_a_handful_of_writes() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("writes").await;
    // The namespace baseline policy is a once-per-namespace cost: create it before measuring.
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &sandbox("warmup", json!({"image": "busybox"})),
    )
    .await
    .expect("create");
    wait::until(&api, "warmup", "Ready", Duration::from_secs(60), is_ready).await;
    // Its Ready event is published right after the status write: let it land before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let before = env.operator().metrics().await.expect("metrics");
    for i in 0..SANDBOXES {
        api.create(
            &PostParams::default(),
            &sandbox(&format!("w{i}"), json!({"image": "busybox"})),
        )
        .await
        .expect("create");
    }
    for i in 0..SANDBOXES {
        wait::until(
            &api,
            &format!("w{i}"),
            "Ready",
            Duration::from_secs(60),
            is_ready,
        )
        .await;
    }
    for i in 0..SANDBOXES {
        api.delete(&format!("w{i}"), &DeleteParams::default())
            .await
            .expect("delete");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait::poll(
        "pods garbage-collected",
        Duration::from_secs(60),
        || async {
            let left = pods.list(&ListParams::default()).await.ok()?.items.len();
            (left == 1).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = env.operator().metrics().await.expect("metrics");

    let delta = |labels: &[(&str, &str)]| {
        metric_sum(&after, "orchard_api_writes_total", labels)
            - metric_sum(&before, "orchard_api_writes_total", labels)
    };
    let total = delta(&[]);
    let per_sandbox = total / SANDBOXES as f64;
    println!("operator API writes per sandbox (create -> Ready -> delete): {per_sandbox:.2}");
    for (resource, verb) in [
        ("secrets", "create"),
        ("pods", "create"),
        ("sandboxes/status", "patch"),
        ("events", "create"),
        ("networkpolicies", "apply"),
        ("pods", "delete"),
        ("sandboxes", "delete"),
    ] {
        println!(
            "  {resource:<18} {verb:<7} {:.2}",
            delta(&[("resource", resource), ("verb", verb)]) / SANDBOXES as f64
        );
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let mut reasons = std::collections::BTreeMap::<String, i32>::new();
    for event in events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
    {
        *reasons.entry(event.reason.unwrap_or_default()).or_default() +=
            event.series.map_or(1, |s| s.count);
    }
    println!("  events by reason: {reasons:?}");
    // Secret, Pod, two status writes (the first at once, for kstatus; later transient phases are
    // coalesced into the Ready write) and the Ready event.
    assert!(
        per_sandbox <= 5.0,
        "a sandbox lifecycle costs {per_sandbox:.2} operator writes (budget: 5)"
    );
    env.delete_namespace(&ns).await;
}
