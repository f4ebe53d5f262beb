//! Security properties on the local cluster with the real operator:
//! - one sandbox's agent token does not open another sandbox's agent (and no or a wrong token opens
//!   none);
//! - the files and patch APIs, reached through the gateway, cannot replace or delete the agent's
//!   executable, and no token file is handed to the agent;
//! - a sandbox with `Deny` egress is selected by no NetworkPolicy that allows egress, even with an
//!   `AllowAll` and an `AllowList` sandbox beside it in the namespace.
//!
//! Covered elsewhere: a forged `status.agentEndpoint` or Ready status never steers the gateway
//! (`forged_status.rs`, on a gateway replica that does not reconcile, so the forgery cannot be
//! corrected before the call); gateway callers without or with a wrong token get 401 and a user allowed in
//! namespace A cannot exec in B (`gateway_api.rs`); no wildcard verbs or resources in the operator's
//! RBAC (`manifests_rbac.rs`); the agent's own HTTP-level auth and path tests (`agent/tests`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams, PostParams};
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::gateway::{Caller, sandbox_path};
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox, token_of};
use orchard_testcluster::wait;
use serde_json::json;

const READY_TIMEOUT: Duration = Duration::from_secs(60);

async fn create_ready(env: &TestEnv, ns: &str, name: &str, spec: serde_json::Value) -> String {
    let api: Api<Sandbox> = Api::namespaced(env.client().await, ns);
    api.create(&PostParams::default(), &sandbox(name, spec))
        .await
        .expect("sandbox accepted");
    let ready = wait::until(&api, name, "Ready", READY_TIMEOUT, is_ready).await;
    ready
        .status
        .and_then(|s| s.agent_endpoint)
        .expect("a Ready sandbox has an agent endpoint")
}

async fn exec_status(endpoint: &str, token: Option<&str>) -> u16 {
    let request = reqwest::Client::new()
        .post(format!("{endpoint}/v1/exec"))
        .json(&json!({"argv": ["true"]}));
    let request = match token {
        Some(token) => request.bearer_auth(token),
        None => request,
    };
    request
        .send()
        .await
        .expect("agent answers")
        .status()
        .as_u16()
}

#[tokio::test]
async fn one_sandboxs_token_does_not_open_another() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("sec-tokens").await;
    let first = create_ready(env, &ns, "first", json!({"image": "busybox"})).await;
    let second = create_ready(env, &ns, "second", json!({"image": "busybox"})).await;
    assert_ne!(first, second, "each sandbox has its own pod IP");
    let first_token = token_of(&client, &ns, "first").await;
    let second_token = token_of(&client, &ns, "second").await;
    assert_ne!(first_token, second_token, "tokens are per sandbox");
    assert!(
        first_token.len() >= 32,
        "tokens are long enough not to be guessed"
    );

    assert_eq!(exec_status(&first, Some(&first_token)).await, 200);
    assert_eq!(exec_status(&second, Some(&second_token)).await, 200);
    assert_eq!(exec_status(&second, Some(&first_token)).await, 401);
    assert_eq!(exec_status(&first, Some(&second_token)).await, 401);
    assert_eq!(exec_status(&first, None).await, 401);
    assert_eq!(exec_status(&first, Some("")).await, 401);
    // A prefix of the right token is still wrong.
    assert_eq!(
        exec_status(&first, Some(&first_token[..first_token.len() - 1])).await,
        401
    );
    env.delete_namespace(&ns).await;
}

/// The value of `key` in the environment of process `pid`.
fn environ_of(pid: u32, key: &str) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    raw.split(|b| *b == 0).find_map(|entry| {
        let entry = String::from_utf8_lossy(entry);
        entry.strip_prefix(&format!("{key}=")).map(str::to_string)
    })
}

#[tokio::test]
async fn file_apis_cannot_touch_the_agents_executable() {
    let env = TestEnv::shared();
    let ns = env.namespace("sec-paths").await;
    create_ready(env, &ns, "target", json!({"image": "busybox"})).await;
    let admin = Caller::user(env, "admin");

    // Where the local node put the agent executable for this pod (the container path
    // /opt/orchard/orchard-agent, mapped onto the host). The pod holds no token at all (only its hash,
    // in the agent's wiped environment), so there is no token file to protect.
    let pid = env
        .node
        .hollow()
        .agent_pid(&ns, "target")
        .expect("agent pid");
    assert_eq!(
        environ_of(pid, "ORCHARD_AGENT_TOKEN_FILE"),
        None,
        "no token file is handed to the agent"
    );
    assert_eq!(
        environ_of(pid, "ORCHARD_AGENT_TOKEN_SHA256").filter(|v| !v.trim_matches('\0').is_empty()),
        None,
        "the agent wiped the token's hash from its environment"
    );
    let executable = std::fs::read_link(format!("/proc/{pid}/exe")).expect("agent executable");
    let executable_before = std::fs::read(&executable).expect("agent executable readable");

    // The same calls on an ordinary file work (the refusals below are not a broken route).
    let put = admin
        .send(
            admin
                .request(
                    reqwest::Method::PUT,
                    &sandbox_path(&ns, "target", "/files?path=notes/plan.txt"),
                )
                .body("mine"),
        )
        .await;
    assert!(put.status < 300, "{put:?}");
    let got = admin
        .get(&sandbox_path(&ns, "target", "/files?path=notes/plan.txt"))
        .await;
    assert_eq!(
        (got.status, got.bytes.as_slice()),
        (200, b"mine".as_slice())
    );

    let exe = executable.display().to_string();
    for method in [reqwest::Method::PUT, reqwest::Method::DELETE] {
        let answer = admin
            .send(
                admin
                    .request(
                        method.clone(),
                        &sandbox_path(&ns, "target", &format!("/files?path={}", urlencode(&exe))),
                    )
                    .body("#!/bin/sh\necho owned\n"),
            )
            .await;
        assert_eq!(
            (answer.status, answer.code()),
            (403, "Forbidden"),
            "{method} {exe}: {answer:?}"
        );
    }

    let patch = format!("--- a{exe}\n+++ b{exe}\n@@ -1 +1 @@\n-x\n+y\n");
    let patched = admin
        .post(
            &sandbox_path(&ns, "target", "/patch"),
            json!({"patch": patch, "cwd": "/"}),
        )
        .await;
    assert_eq!(patched.status, 403, "{patched:?}");

    assert_eq!(
        std::fs::read(&executable).expect("executable still there"),
        executable_before
    );
    let still_works = admin
        .exec(&ns, "target", json!({"argv": ["echo", "still mine"]}))
        .await;
    assert_eq!(still_works.status, 200, "{still_works:?}");
    assert_eq!(still_works.body["stdout"], "still mine\n");
    env.delete_namespace(&ns).await;
}

/// Percent-encodes a path for a query string.
fn urlencode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Whether `selector` selects an object with `labels` (matchLabels and matchExpressions, as the API
/// defines them; an empty selector selects everything).
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_match = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => panic!("unknown selector operator {other}"),
        }
    });
    labels_match && expressions_match
}

/// Whether `policy` lets the pods it selects send anything: a policy restricts egress only when its
/// policyTypes include Egress, and then allows exactly its egress rules.
fn allows_egress(policy: &NetworkPolicy) -> bool {
    let spec = policy.spec.as_ref().expect("policy spec");
    let types = spec.policy_types.clone().unwrap_or_default();
    let egress_rules = spec.egress.as_ref().map_or(0, Vec::len);
    types.iter().any(|t| t == "Egress") && egress_rules > 0
}

#[tokio::test]
async fn deny_egress_sandboxes_have_no_policy_that_allows_egress() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("sec-egress").await;
    create_ready(env, &ns, "sealed", json!({"image": "busybox"})).await;
    create_ready(
        env,
        &ns,
        "open",
        json!({"image": "busybox", "network": {"egress": "AllowAll"}}),
    )
    .await;
    create_ready(
        env,
        &ns,
        "listed",
        json!({"image": "busybox", "network": {"egress": "AllowList", "allow": [{"cidr": "203.0.113.0/24"}]}}),
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client, &ns);
    let labels_of = |pod: &Pod| pod.metadata.labels.clone().unwrap_or_default();
    let pod_list = pods.list(&ListParams::default()).await.expect("pods");
    let sealed = pod_list
        .items
        .iter()
        .find(|p| labels_of(p).get("orchard.dev/sandbox").map(String::as_str) == Some("sealed"))
        .expect("the Deny sandbox's pod");
    let policy_list = wait::poll(
        "the AllowAll and AllowList policies",
        Duration::from_secs(30),
        || async {
            let list = policies.list(&ListParams::default()).await.ok()?;
            let egress_policies = list.items.iter().filter(|p| allows_egress(p)).count();
            (egress_policies >= 2).then_some(list)
        },
    )
    .await;

    let selecting: Vec<&NetworkPolicy> = policy_list
        .items
        .iter()
        .filter(|p| {
            let selector = p.spec.as_ref().and_then(|s| s.pod_selector.clone());
            selects(&selector.unwrap_or_default(), &labels_of(sealed))
        })
        .collect();
    let names: Vec<String> = selecting
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert!(
        !selecting.is_empty(),
        "the baseline must select the Deny sandbox's pod"
    );
    assert!(
        selecting.iter().any(|p| p
            .spec
            .as_ref()
            .and_then(|s| s.policy_types.clone())
            .unwrap_or_default()
            .contains(&"Egress".to_string())),
        "some policy restricts the Deny pod's egress: {names:?}"
    );
    let allowing: Vec<&String> = selecting
        .iter()
        .filter(|p| allows_egress(p))
        .filter_map(|p| p.metadata.name.as_ref())
        .collect();
    assert!(
        allowing.is_empty(),
        "policies allowing egress select the Deny sandbox's pod: {allowing:?}"
    );

    // The other two are selected by their own egress policies (the test would be vacuous otherwise).
    for name in ["open", "listed"] {
        let pod = pod_list
            .items
            .iter()
            .find(|p| labels_of(p).get("orchard.dev/sandbox").map(String::as_str) == Some(name))
            .expect("sandbox pod");
        assert!(
            policy_list.items.iter().any(|p| allows_egress(p)
                && selects(
                    &p.spec
                        .as_ref()
                        .and_then(|s| s.pod_selector.clone())
                        .unwrap_or_default(),
                    &labels_of(pod)
                )),
            "sandbox {name} has an egress policy"
        );
    }
    env.delete_namespace(&ns).await;
}
