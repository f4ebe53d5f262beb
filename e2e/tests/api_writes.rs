//! API writes one sandbox costs from create to delete, counted by the operator itself
//! (`orchard_api_writes_total`) over batches of sandboxes (applied with the API, and created through
//! the gateway) in an otherwise idle cluster. The test holds each to a bound that leaves room for
//! one status write more than the design's three (a sandbox slower to become Ready than the
//! coalescing window writes its Pending phase too); the measured figure is `make bench-lifecycle`'s
//! (docs/BENCHMARKS.md, docs/CONTROLLER.md).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::operator_process::metric_sum;
use orchard_testcluster::test_support::gateway::Caller;
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

const SANDBOXES: usize = 10;
/// More writes than this per sandbox lifecycle is a regression, not noise: the Pod, at most two
/// status writes (three with a slow start) and, through the gateway, the Sandbox itself.
const WRITE_BOUND: f64 = 4.0;

/// Creates `SANDBOXES` sandboxes (through the gateway with `gateway`, else with kubectl's API calls),
/// waits until all are Ready, deletes them and waits for their pods to go; answers the operator's API
/// writes per sandbox, printing them by resource and verb.
async fn writes_per_sandbox(env: &TestEnv, ns: &str, prefix: &str, gateway: bool) -> f64 {
    let client = env.client().await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let admin = Caller::user(env, "admin");
    let before = env.operator().metrics().await.expect("metrics");
    let names: Vec<String> = (0..SANDBOXES).map(|i| format!("{prefix}{i}")).collect();
    for name in &names {
        if gateway {
            admin
                .create_sandbox(ns, json!({"name": name, "image": "busybox"}))
                .await;
        } else {
            api.create(
                &PostParams::default(),
                &sandbox(name, json!({"image": "busybox"})),
            )
            .await
            .expect("create");
        }
    }
    for name in &names {
        wait::until(&api, name, "Ready", Duration::from_secs(60), is_ready).await;
    }
    for name in &names {
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
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
    let per_sandbox = delta(&[]) / SANDBOXES as f64;
    let how = if gateway {
        "through the gateway"
    } else {
        "with the API"
    };
    println!(
        "operator API writes per sandbox created {how} (create -> Ready -> delete): {per_sandbox:.2}"
    );
    for (resource, verb) in [
        ("sandboxes", "create"),
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
    per_sandbox
}

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

    // Applied like kubectl or GitOps would: the Pod and two status writes (the first at once, for
    // kstatus; later transient phases are coalesced into the Ready write).
    let applied = writes_per_sandbox(env, &ns, "w", false).await;
    // Created through the gateway: the create itself (the gateway is the operator's process), the Pod
    // and the Ready status.
    let through_gateway = writes_per_sandbox(env, &ns, "g", true).await;

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
    assert!(
        reasons.is_empty(),
        "no event for a sandbox that simply worked: {reasons:?}"
    );
    assert!(
        applied <= WRITE_BOUND,
        "a sandbox lifecycle costs {applied:.2} operator writes (bound: {WRITE_BOUND})"
    );
    assert!(
        through_gateway <= WRITE_BOUND,
        "a gateway sandbox's lifecycle costs {through_gateway:.2} operator writes (bound: {WRITE_BOUND})"
    );
    env.delete_namespace(&ns).await;
}
