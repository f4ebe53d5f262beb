//! Sandbox lifecycle on the local cluster with the real operator: apply -> Ready (also through
//! `kubectl wait`), exec through the agent at the pod IP with the sandbox's token (401 without it),
//! a file round trip, and delete -> Pod, Secret and policies garbage-collected. Also the CRDs' CEL
//! rules as the API server enforces them, the printer columns, and the NetworkPolicies per egress mode.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use orchard_operator::api::{RolloutGroup, Sandbox, SandboxPhase};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox, token_of};
use orchard_testcluster::wait;
use serde_json::json;

const READY_TIMEOUT: Duration = Duration::from_secs(60);

fn kubectl(env: &TestEnv, args: &[&str]) -> std::process::Output {
    std::process::Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", &env.control_plane.kubeconfig)
        .output()
        .expect("kubectl runs")
}

#[tokio::test]
async fn sandbox_becomes_ready_runs_commands_and_is_garbage_collected() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("lifecycle").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("s1", json!({"image": "python:3.11"})),
        )
        .await
        .expect("sandbox accepted");

    let ready = wait::until(&sandboxes, "s1", "Ready", READY_TIMEOUT, is_ready).await;
    let status = ready.status.expect("status");
    assert_eq!(status.phase, Some(SandboxPhase::Ready));
    let endpoint = status.agent_endpoint.expect("agent endpoint");
    assert!(
        endpoint.starts_with("http://127."),
        "pod IP is a loopback address: {endpoint}"
    );
    assert!(status.expires_at.is_some(), "TTL deadline set");

    let out = kubectl(
        env,
        &[
            "wait",
            "-n",
            &ns,
            "--for=condition=Ready",
            "sandbox/s1",
            "--timeout=30s",
        ],
    );
    assert!(
        out.status.success(),
        "kubectl wait: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let token = token_of(&client, &ns, "s1").await;
    let http = reqwest::Client::new();
    let exec = http
        .post(format!("{endpoint}/v1/exec"))
        .bearer_auth(&token)
        .json(&json!({"argv": ["/bin/sh", "-c", "echo hello from $ORCHARD_SANDBOX"]}))
        .send()
        .await
        .expect("exec request");
    assert_eq!(exec.status(), 200);
    let body: serde_json::Value = exec.json().await.expect("exec JSON");
    assert_eq!(body["exitCode"], 0);
    assert_eq!(body["stdout"], "hello from s1\n");

    let unauthenticated = http
        .post(format!("{endpoint}/v1/exec"))
        .json(&json!({"argv": ["true"]}))
        .send()
        .await
        .expect("request");
    assert_eq!(unauthenticated.status(), 401);
    let wrong_token = http
        .post(format!("{endpoint}/v1/exec"))
        .bearer_auth("not-the-token")
        .json(&json!({"argv": ["true"]}))
        .send()
        .await
        .expect("request");
    assert_eq!(wrong_token.status(), 401);

    let payload = b"round trip \x00\xff bytes".to_vec();
    let put = http
        .put(format!("{endpoint}/v1/files?path=data/in.bin"))
        .bearer_auth(&token)
        .body(payload.clone())
        .send()
        .await
        .expect("upload");
    assert!(put.status().is_success(), "upload: {}", put.status());
    let got = http
        .get(format!("{endpoint}/v1/files?path=data/in.bin"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("download");
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.expect("body").to_vec(), payload);

    // Delete: the pod and policies go with it (garbage collector).
    sandboxes
        .delete("s1", &DeleteParams::default())
        .await
        .expect("delete");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait::deleted(&sandboxes, "s1", Duration::from_secs(30)).await;
    wait::deleted(&pods, "s1", Duration::from_secs(60)).await;
    wait::poll("agent process gone", Duration::from_secs(30), || async {
        env.node
            .hollow()
            .agent_pid(&ns, "s1")
            .is_none()
            .then_some(())
    })
    .await;
    let exec_after = http
        .post(format!("{endpoint}/v1/exec"))
        .bearer_auth(&token)
        .json(&json!({"argv": ["true"]}))
        .send()
        .await;
    assert!(
        exec_after.is_err(),
        "the agent no longer listens after deletion"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn network_policies_follow_the_egress_mode() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("netpol").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let specs = [
        ("deny", json!({"image": "busybox"})),
        (
            "all",
            json!({"image": "busybox", "network": {"egress": "AllowAll"}}),
        ),
        (
            "list",
            json!({"image": "busybox", "network": {"egress": "AllowList", "allow": [{"cidr": "203.0.113.0/24", "ports": [{"port": 443}]}]}}),
        ),
    ];
    for (name, spec) in &specs {
        sandboxes
            .create(&PostParams::default(), &sandbox(name, spec.clone()))
            .await
            .expect("create");
    }
    for (name, _) in &specs {
        wait::until(&sandboxes, name, "Ready", READY_TIMEOUT, is_ready).await;
    }
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let list = policies
        .list(&ListParams::default())
        .await
        .expect("list policies");
    let names: Vec<String> = list
        .items
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(
        names
            .iter()
            .filter(|n| n.as_str() == "orchard-sandbox-baseline")
            .count(),
        1,
        "one baseline per namespace: {names:?}"
    );
    assert!(
        !names.contains(&"deny-egress".to_string()),
        "Deny adds no policy: {names:?}"
    );

    let baseline = policies
        .get("orchard-sandbox-baseline")
        .await
        .expect("baseline");
    let spec = baseline.spec.expect("spec");
    assert_eq!(
        spec.pod_selector.unwrap().match_labels.unwrap()["orchard.dev/sandbox-pod"],
        "true"
    );
    assert_eq!(
        spec.egress.unwrap_or_default().len(),
        0,
        "baseline denies all egress"
    );
    assert_eq!(
        spec.ingress.unwrap().len(),
        1,
        "ingress only from the operator"
    );

    let all = policies
        .get("all-egress")
        .await
        .expect("AllowAll policy")
        .spec
        .expect("spec");
    assert_eq!(
        all.pod_selector.unwrap().match_labels.unwrap()["orchard.dev/sandbox"],
        "all"
    );
    // Every address but the protected ranges, pods outside the operator's namespace, DNS.
    let all_rules = all.egress.unwrap();
    assert_eq!(all_rules.len(), 3, "{all_rules:?}");
    let everywhere = all_rules[0].to.as_ref().unwrap()[0]
        .ip_block
        .clone()
        .expect("an IP block");
    assert_eq!(everywhere.cidr, "0.0.0.0/0");
    assert!(
        everywhere
            .except
            .unwrap_or_default()
            .contains(&"169.254.169.254/32".to_string()),
        "the metadata address is excepted"
    );

    let listed = policies
        .get("list-egress")
        .await
        .expect("AllowList policy")
        .spec
        .expect("spec");
    assert_eq!(
        listed.pod_selector.unwrap().match_labels.unwrap()["orchard.dev/sandbox"],
        "list"
    );
    let egress = listed.egress.unwrap();
    assert_eq!(egress.len(), 2, "one rule per destination plus DNS");
    assert_eq!(
        egress[0].to.as_ref().unwrap()[0]
            .ip_block
            .as_ref()
            .unwrap()
            .cidr,
        "203.0.113.0/24"
    );

    // The sandbox pods carry the labels the policies select on.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = pods.get("list").await.expect("pod");
    let labels = pod.metadata.labels.unwrap();
    assert_eq!(labels["orchard.dev/sandbox"], "list");
    assert_eq!(labels["orchard.dev/sandbox-pod"], "true");

    // Switching egress back to Deny removes the sandbox's own policy.
    sandboxes
        .patch(
            "all",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"network": {"egress": "Deny"}}})),
        )
        .await
        .expect("patch egress");
    wait::deleted(&policies, "all-egress", Duration::from_secs(30)).await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn invalid_specs_are_rejected_by_the_api_server_with_readable_messages() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("cel").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let err = sandboxes
        .create(&PostParams::default(), &sandbox("bad", json!({"image": "x", "network": {"egress": "Deny", "allow": [{"cidr": "10.0.0.0/8"}]}})))
        .await
        .expect_err("allow-list without AllowList is rejected");
    assert!(
        err.to_string()
            .contains("network.allow may only be set when network.egress is AllowList"),
        "{err}"
    );
    let err = sandboxes
        .create(
            &PostParams::default(),
            &sandbox("bad", json!({"image": "x", "lifecycle": {"ttlSeconds": 0}})),
        )
        .await
        .expect_err("zero TTL is rejected");
    assert!(
        err.to_string()
            .contains("lifecycle.ttlSeconds must be positive"),
        "{err}"
    );

    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let group: RolloutGroup = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutGroup", "metadata": {"name": "bad"},
        "spec": {"groupSize": 8, "maxTrajectories": 16, "stride": 5, "template": {"spec": {"image": "x"}}}
    }))
    .expect("valid JSON");
    let err = groups
        .create(&PostParams::default(), &group)
        .await
        .expect_err("stride 5 is rejected");
    assert!(
        err.to_string()
            .contains("stride must divide maxTrajectories"),
        "{err}"
    );
    let group: RolloutGroup = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutGroup", "metadata": {"name": "bad"},
        "spec": {"groupSize": 8, "maxTrajectories": 16, "positiveFraction": {"min": 0.8, "max": 0.2}, "template": {"spec": {"image": "x"}}}
    }))
    .expect("valid JSON");
    let err = groups
        .create(&PostParams::default(), &group)
        .await
        .expect_err("min > max is rejected");
    assert!(
        err.to_string()
            .contains("positiveFraction.min must not exceed positiveFraction.max"),
        "{err}"
    );

    // Immutability is enforced on update.
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("fixed", json!({"image": "a"})),
        )
        .await
        .expect("create");
    let err = sandboxes
        .patch(
            "fixed",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"image": "b"}})),
        )
        .await
        .expect_err("image change rejected");
    assert!(err.to_string().contains("spec.image is immutable"), "{err}");
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn kubectl_get_orchard_shows_both_kinds_with_printer_columns() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("columns").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("shown", json!({"image": "python:3.11"})),
        )
        .await
        .expect("create");
    wait::until(&sandboxes, "shown", "Ready", READY_TIMEOUT, is_ready).await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let group: RolloutGroup = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutGroup", "metadata": {"name": "g"},
        "spec": {"groupSize": 2, "maxTrajectories": 2, "template": {"spec": {"image": "python:3.11"}}}
    }))
    .expect("valid JSON");
    groups
        .create(&PostParams::default(), &group)
        .await
        .expect("create group");
    let out = kubectl(env, &["get", "orchard", "-n", &ns]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for column in [
        "PHASE",
        "READY",
        "IP",
        "EXPIRES",
        "AGE",
        "SELECTION",
        "POSITIVES",
        "LAUNCHED",
    ] {
        assert!(text.contains(column), "column {column} missing in:\n{text}");
    }
    assert!(
        text.contains("sandbox.orchard.dev/shown") && text.contains("Ready"),
        "{text}"
    );
    assert!(
        text.contains("REASON") && text.contains("SandboxReady"),
        "{text}"
    );
    assert!(text.contains("rolloutgroup.orchard.dev/g"), "{text}");
    // `-o wide` adds where the sandbox runs.
    let wide = kubectl(env, &["get", "sbx", "-n", &ns, "-o", "wide"]);
    let wide = String::from_utf8_lossy(&wide.stdout);
    for column in ["NODE", "POD", "POOL"] {
        assert!(wide.contains(column), "column {column} missing in:\n{wide}");
    }
    assert!(wide.contains("shown"), "{wide}");
    env.delete_namespace(&ns).await;
}
