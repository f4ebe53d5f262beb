//! The install manifests, for real: the Helm chart and the kustomize bases are rendered and applied to
//! a local cluster of their own, and the operator then runs under the chart's own ServiceAccount token
//! (not as admin) until a sample Sandbox is Ready, answers an exec through the gateway and through its
//! agent, and is deleted, the gateway creates, heartbeats and deletes objects, a sandbox expires, and
//! the RolloutGroup sample completes. That proves the chart's RBAC is sufficient (`manifests_rbac.rs`
//! proves it has no wildcards and that the chart and kustomize grant exactly the same rules); the API
//! server's audit log then shows every write the operator sent was granted. Both install modes run:
//! all namespaces (chart, kustomize) and one watched namespace (chart `watchNamespace`), where the
//! operator has no rights outside that namespace and leaves a Sandbox there alone.
//!
//! The kustomize test's cluster also checks the committed Kubernetes schemas kubeconform uses against
//! its live kube-apiserver (regenerate them with `make schemas`; the test never writes them).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use orchard_operator::api::{RolloutGroup, Sandbox, SandboxSnapshot, SnapshotPhase};
use orchard_testcluster::binaries::{operator_bin, workspace_root};
use orchard_testcluster::env::{EnvOptions, TestEnv};
use orchard_testcluster::operator_process::{OperatorProcess, metric_sum};
use orchard_testcluster::test_support::manifests::{
    RELEASE_NAMESPACE, container, documents, env_map, grants_to, helm_default, helm_full,
    helm_template, kustomize, operator_deployment, operator_flags, service_account_of, strings,
};
use orchard_testcluster::test_support::sandboxes::{is_ready, token_of};
use orchard_testcluster::wait;
use serde_json::{Value, json};
use xtask::k8s_schemas;

const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// The pod name the test gives the operator process (POD_NAME, its identity in the Lease).
const IDENTITY: &str = "orchard-operator-e2e-0";

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write stdin");
    }
    drop(child.stdin.take());
    let output = child.wait_with_output().expect("kubectl finishes");
    assert!(
        output.status.success(),
        "kubectl {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// Server-side apply, as `docs/INSTALL.md` tells users to.
fn apply(env: &TestEnv, manifests: &str, dry_run: bool) -> String {
    let mut args = vec![
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=orchard-install-e2e",
        "-f",
        "-",
    ];
    if dry_run {
        args.push("--dry-run=server");
    }
    kubectl(&env.control_plane.kubeconfig, &args, Some(manifests))
}

async fn create_namespace(env: &TestEnv, name: &str) {
    let api: Api<Namespace> = Api::all(env.client().await);
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    match api.create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_already_exists() => {}
        Err(err) => panic!("cannot create namespace {name}: {err}"),
    }
}

/// A token of `namespace/service_account` from the TokenRequest API (what the kubelet mounts into pods).
async fn service_account_token(env: &TestEnv, namespace: &str, service_account: &str) -> String {
    let api: Api<ServiceAccount> = Api::namespaced(env.client().await, namespace);
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}
    }))
    .expect("TokenRequest JSON");
    let issued = api
        .create_token_request(service_account, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{service_account}: {e}"));
    serde_json::to_value(&issued).expect("JSON")["status"]["token"]
        .as_str()
        .expect("issued token")
        .to_string()
}

/// The operator's flags from a rendered Deployment's environment, as the container would see it
/// (downward API values filled in). Flags the harness sets itself (listen addresses, agent image, log
/// format) are left out.
fn flags_from_deployment(deployment: &Value) -> Vec<String> {
    let flags = operator_flags();
    let container = container(deployment);
    let set_by_harness = [
        "ORCHARD_GATEWAY_LISTEN",
        "ORCHARD_METRICS_LISTEN",
        "ORCHARD_AGENT_IMAGE",
        "ORCHARD_LOG_FORMAT",
        // The hollow node enforces no NetworkPolicy: OperatorProcess turns the wait off.
        "ORCHARD_AWAIT_POLICY_ENFORCEMENT",
    ];
    let mut args = Vec::new();
    for (name, value) in env_map(container) {
        let value = match value.as_str() {
            "valueFrom:metadata.namespace" => RELEASE_NAMESPACE.to_string(),
            "valueFrom:metadata.name" => IDENTITY.to_string(),
            other => other.to_string(),
        };
        if set_by_harness.contains(&name.as_str()) {
            continue;
        }
        let Some((flag, takes_value)) = flags.get(&name) else {
            continue;
        };
        if *takes_value {
            args.push(format!("{flag}={value}"));
        } else if value == "true" {
            args.push(flag.clone());
        }
    }
    args.extend(strings(&container["args"]));
    args
}

/// Runs the operator under the ServiceAccount token and proves a sample Sandbox goes through its life
/// in `namespace` (created here), plus the gateway's writes (create, heartbeat, delete of a Sandbox and
/// a RolloutGroup) and an expiry; then checks every write the operator sent against the rendered
/// rules (the API server's audit log). Returns the operator, still running.
async fn operator_under_service_account_runs_a_sandbox(
    env: &TestEnv,
    rendered: &[Value],
    sample: &str,
    sandbox_name: &str,
    namespace: &str,
) -> OperatorProcess {
    let service_account = service_account_of(operator_deployment(rendered));
    let token = service_account_token(env, RELEASE_NAMESPACE, &service_account).await;
    let kubeconfig = env.dir.join(format!("kubeconfig-{service_account}"));
    env.control_plane
        .write_token_kubeconfig(&token, &kubeconfig)
        .expect("write kubeconfig");
    // Sanity: the token is not admin.
    let cannot = Command::new("kubectl")
        .args(["auth", "can-i", "list", "configmaps", "--all-namespaces"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .expect("kubectl auth can-i");
    assert_eq!(
        String::from_utf8_lossy(&cannot.stdout).trim(),
        "no",
        "the ServiceAccount must not read ConfigMaps"
    );

    let args = flags_from_deployment(operator_deployment(rendered));
    let log = env
        .dir
        .join(format!("logs/orchard-operator-{service_account}.log"));
    let operator = OperatorProcess::start(
        &operator_bin().expect("operator binary"),
        &kubeconfig,
        &log,
        &args,
    )
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the operator did not become ready under the {service_account} token ({e}); log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });

    let deployment_env = env_map(container(operator_deployment(rendered)));
    if deployment_env["ORCHARD_LEADER_ELECTION"] == "true" {
        // Leader election under the chart's RBAC: the Role in the release namespace lets it take the Lease.
        let leases: Api<Lease> = Api::namespaced(env.client().await, RELEASE_NAMESPACE);
        let lease_name = deployment_env["ORCHARD_LEASE_NAME"].clone();
        wait::poll(
            "the operator holds its Lease",
            Duration::from_secs(30),
            || {
                let leases = leases.clone();
                let lease_name = lease_name.clone();
                async move {
                    let lease = leases.get_opt(&lease_name).await.ok().flatten()?;
                    (lease.spec?.holder_identity? == IDENTITY).then_some(())
                }
            },
        )
        .await;
    }

    let namespace = namespace.to_string();
    create_namespace(env, &namespace).await;
    let sample_text = std::fs::read_to_string(workspace_root().join("config/samples").join(sample))
        .expect("sample");
    kubectl(
        &env.control_plane.kubeconfig,
        &["apply", "-n", &namespace, "-f", "-"],
        Some(&sample_text),
    );
    let client = env.client().await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &namespace);
    let ready = wait::until(
        &sandboxes,
        sandbox_name,
        "Ready under the chart's RBAC",
        READY_TIMEOUT,
        is_ready,
    )
    .await;
    let endpoint = ready
        .status
        .and_then(|s| s.agent_endpoint)
        .expect("agent endpoint");

    // Exec straight at the agent with the sandbox's own token...
    let agent_token = token_of(&client, &namespace, sandbox_name).await;
    let http = reqwest::Client::new();
    let direct: Value = http
        .post(format!("{endpoint}/v1/exec"))
        .bearer_auth(&agent_token)
        .json(&json!({"argv": ["/bin/sh", "-c", "echo direct $ORCHARD_SANDBOX"]}))
        .send()
        .await
        .expect("agent exec")
        .json()
        .await
        .expect("agent JSON");
    assert_eq!(
        direct["stdout"],
        format!("direct {sandbox_name}\n"),
        "{direct}"
    );

    // ...and through the gateway, which authenticates the caller (TokenReview) and authorizes the call
    // (SubjectAccessReview) with the operator's ServiceAccount: both must be allowed by the chart's RBAC.
    let admin_token = env.control_plane.tokens["admin"].clone();
    let through_gateway = http
        .post(format!(
            "{}/v1/namespaces/{namespace}/sandboxes/{sandbox_name}/exec",
            operator.gateway_url()
        ))
        .bearer_auth(&admin_token)
        .json(&json!({"argv": ["/bin/sh", "-c", "echo gateway $ORCHARD_SANDBOX"]}))
        .send()
        .await
        .expect("gateway exec");
    let status = through_gateway.status();
    let body = through_gateway.text().await.unwrap_or_default();
    assert_eq!(status, 200, "gateway exec: {body}");
    assert!(
        body.contains(&format!("gateway {sandbox_name}")),
        "gateway exec: {body}"
    );
    gateway_writes(env, &operator, &namespace).await;

    // Delete: the operator's children go with the Sandbox.
    sandboxes
        .delete(sandbox_name, &DeleteParams::default())
        .await
        .expect("delete");
    wait::deleted(&sandboxes, sandbox_name, Duration::from_secs(60)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    wait::deleted(&pods, sandbox_name, Duration::from_secs(60)).await;

    // The RolloutGroup sample: its runner script writes a JSON result the operator records, and BAR
    // assembles the group; the RolloutGroup controller creates trajectory Sandboxes and writes the
    // group's status under the same RBAC.
    let group_text =
        std::fs::read_to_string(workspace_root().join("config/samples/rolloutgroup.yaml"))
            .expect("rolloutgroup sample");
    kubectl(
        &env.control_plane.kubeconfig,
        &["apply", "-n", &namespace, "-f", "-"],
        Some(&group_text),
    );
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &namespace);
    let complete = |g: Option<&RolloutGroup>| {
        g.and_then(|g| g.status.as_ref()).is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        })
    };
    let group = wait::until(
        &groups,
        "prompt-0042",
        "Complete",
        Duration::from_secs(120),
        complete,
    )
    .await;
    let status = group.status.expect("group status");
    // The sample's rewards are a checksum of each trajectory's name: strides 0 and 1 (prompt-0042-0..7)
    // hold 4 positives, inside [ceil(0.375 x 8), floor(0.625 x 8)] = [3, 5], so BAR records a
    // Balanced group of 8 after two strides.
    assert_eq!(
        serde_json::to_value(status.selection).expect("JSON"),
        json!("Balanced"),
        "{status:?}"
    );
    assert_eq!(status.group.len(), 8, "{status:?}");
    assert_eq!(status.positives, Some(4), "{status:?}");
    assert!(
        status.trajectories.iter().all(|t| t.status.is_some()),
        "every launched trajectory recorded an outcome: {:?}",
        status.trajectories
    );

    // The SandboxPool sample: the pool starts its members and writes its status, and the Sandbox
    // naming it claims one (a patch of the member Pod) under the same RBAC.
    let pool_text =
        std::fs::read_to_string(workspace_root().join("config/samples/sandbox_pool.yaml"))
            .expect("sandbox_pool sample");
    kubectl(
        &env.control_plane.kubeconfig,
        &["apply", "-n", &namespace, "-f", "-"],
        Some(&pool_text),
    );
    let claimed = wait::until(
        &sandboxes,
        "from-pool",
        "Ready from the pool",
        READY_TIMEOUT,
        is_ready,
    )
    .await;
    let member = claimed.status.and_then(|s| s.pod_name).unwrap_or_default();
    assert!(
        member.starts_with("busybox-warm-"),
        "the sample claims a member: {member}"
    );

    let metrics = operator.metrics().await.expect("metrics");
    assert_eq!(
        metric_sum(
            &metrics,
            "orchard_reconcile_errors_total",
            &[("error", "forbidden")]
        ),
        0.0,
        "the operator hit RBAC denials; log: {}",
        log.display()
    );
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !log_text.contains("is forbidden"),
        "RBAC denial in the operator log:\n{log_text}"
    );
    // Every granted write is one the code sends: all are seen here, but the Lease's without leader
    // election.
    let unseen = writes_are_granted(env, rendered, &service_account);
    let lease_only = unseen
        .iter()
        .all(|(group, _, _)| group == "coordination.k8s.io");
    assert!(
        unseen.is_empty() || (deployment_env["ORCHARD_LEADER_ELECTION"] != "true" && lease_only),
        "granted writes the operator never sent: {unseen:?}"
    );
    env.delete_namespace(&namespace).await;
    operator
}

/// The gateway's own writes with the operator's identity: a Sandbox created through it (heartbeat
/// timeout: the heartbeat patches it; TTL 3 s: the operator expires and deletes it), a SandboxSnapshot
/// and a RolloutGroup created and deleted through it.
async fn gateway_writes(env: &TestEnv, operator: &OperatorProcess, namespace: &str) {
    let http = orchard_testcluster::gateway_http();
    let admin_token = env.control_plane.tokens["admin"].clone();
    let base = format!("{}/v1/namespaces/{namespace}", operator.gateway_url());
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let request = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(&admin_token);
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        async move {
            let response = request.send().await.expect("gateway call");
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
    };
    let (status, body) = call(
        reqwest::Method::POST,
        "/sandboxes",
        Some(json!({"name": "short-lived", "image": "busybox", "ttlSeconds": 4, "heartbeatTimeoutSeconds": 60})),
    )
    .await;
    assert_eq!(status, 201, "gateway create sandbox: {body}");
    let sandboxes: Api<Sandbox> = Api::namespaced(env.client().await, namespace);
    wait::until(&sandboxes, "short-lived", "Ready", READY_TIMEOUT, is_ready).await;
    let (status, body) = call(
        reqwest::Method::POST,
        "/sandboxes/short-lived/heartbeat",
        None,
    )
    .await;
    assert_eq!(status, 200, "gateway heartbeat: {body}");
    // Expired at its TTL: the operator deletes it.
    wait::deleted(&sandboxes, "short-lived", Duration::from_secs(60)).await;

    let (status, body) = call(
        reqwest::Method::POST,
        "/sandboxes",
        Some(json!({"name": "deleted-by-gateway", "image": "busybox"})),
    )
    .await;
    assert_eq!(status, 201, "gateway create sandbox: {body}");
    let (status, body) = call(
        reqwest::Method::DELETE,
        "/sandboxes/deleted-by-gateway",
        None,
    )
    .await;
    assert_eq!(status, 200, "gateway delete sandbox: {body}");

    // A sandbox whose egress changes from AllowAll to Deny: the operator creates, then deletes its
    // egress policy.
    let (status, body) = call(
        reqwest::Method::POST,
        "/sandboxes",
        Some(json!({"name": "egress-change", "spec": {"image": "busybox", "network": {"egress": "AllowAll"}}})),
    )
    .await;
    assert_eq!(status, 201, "gateway create sandbox: {body}");
    wait::until(
        &sandboxes,
        "egress-change",
        "Ready",
        READY_TIMEOUT,
        is_ready,
    )
    .await;
    let policies: Api<NetworkPolicy> = Api::namespaced(env.client().await, namespace);
    assert!(
        policies
            .get_opt("egress-change-egress")
            .await
            .expect("get policy")
            .is_some(),
        "an AllowAll sandbox has its own egress policy"
    );
    sandboxes
        .patch(
            "egress-change",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"network": {"egress": "Deny"}}})),
        )
        .await
        .expect("patch the sandbox's egress");
    wait::deleted(&policies, "egress-change-egress", Duration::from_secs(60)).await;

    // A snapshot of that sandbox through the gateway: snapshots are off in these installs (no
    // registry), so the operator patches its finalizer on and fails it `SnapshotsDisabled` (a status
    // patch); the gateway deletes it and the operator patches the finalizer off.
    let (status, body) = call(
        reqwest::Method::POST,
        "/sandboxsnapshots",
        Some(json!({"name": "snap-via-gateway", "sandbox": "egress-change"})),
    )
    .await;
    assert_eq!(status, 201, "gateway create snapshot: {body}");
    let snapshots: Api<SandboxSnapshot> = Api::namespaced(env.client().await, namespace);
    let failed = wait::until(
        &snapshots,
        "snap-via-gateway",
        "Failed",
        Duration::from_secs(60),
        |s: Option<&SandboxSnapshot>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.phase == Some(SnapshotPhase::Failed))
        },
    )
    .await;
    let reason = failed
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.reason.clone());
    assert_eq!(reason.as_deref(), Some("SnapshotsDisabled"), "{failed:?}");
    let (status, body) = call(
        reqwest::Method::DELETE,
        "/sandboxsnapshots/snap-via-gateway",
        None,
    )
    .await;
    assert_eq!(status, 200, "gateway delete snapshot: {body}");
    wait::deleted(&snapshots, "snap-via-gateway", Duration::from_secs(60)).await;

    // A RolloutGroup whose trajectories outlive their 2 s TTL: the operator deletes their pods (the
    // group then removes the sandboxes), and the gateway deletes the group.
    let group = json!({"name": "via-gateway", "groupSize": 2, "maxTrajectories": 2, "stride": 2,
        "positiveFraction": {"min": 0.5, "max": 0.5},
        "template": {"spec": {"image": "busybox", "lifecycle": {"ttlSeconds": 2},
            "run": {"command": ["/bin/sh", "-c", "sleep 60"], "timeoutSeconds": 60, "resultPath": "r.json"}}}});
    let (status, body) = call(reqwest::Method::POST, "/rolloutgroups", Some(group)).await;
    assert_eq!(status, 201, "gateway create group: {body}");
    let groups: Api<RolloutGroup> = Api::namespaced(env.client().await, namespace);
    let complete = |g: Option<&RolloutGroup>| {
        g.and_then(|g| g.status.as_ref()).is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        })
    };
    wait::until(
        &groups,
        "via-gateway",
        "Complete",
        Duration::from_secs(90),
        complete,
    )
    .await;
    let (status, body) = call(reqwest::Method::DELETE, "/rolloutgroups/via-gateway", None).await;
    assert_eq!(status, 200, "gateway delete group: {body}");
}

/// Every write (create, update, patch, delete) the operator's ServiceAccount sent, from the API
/// server's audit log: each is granted by the rendered rules and none was refused. Returns the granted
/// writes never seen (reads are not audited by the harness' policy).
fn writes_are_granted(
    env: &TestEnv,
    rendered: &[Value],
    service_account: &str,
) -> std::collections::BTreeSet<(String, String, String)> {
    let user = format!("system:serviceaccount:{RELEASE_NAMESPACE}:{service_account}");
    let path = env
        .control_plane
        .audit_log()
        .expect("the install tests run with the audit log");
    let text = std::fs::read_to_string(&path).expect("audit log");
    let granted = granted_writes(rendered, service_account);
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        // The test's own `kubectl auth can-i` under the same token is not the operator.
        let kubectl = event["userAgent"]
            .as_str()
            .is_some_and(|agent| agent.starts_with("kubectl"));
        if event["user"]["username"] != user.as_str() || kubectl {
            continue;
        }
        let object = &event["objectRef"];
        let mut resource = object["resource"].as_str().unwrap_or_default().to_string();
        if let Some(sub) = object["subresource"].as_str().filter(|s| !s.is_empty()) {
            resource = format!("{resource}/{sub}");
        }
        let write = (
            object["apiGroup"].as_str().unwrap_or_default().to_string(),
            resource,
            event["verb"].as_str().unwrap_or_default().to_string(),
        );
        assert_ne!(
            event["responseStatus"]["code"], 403,
            "the operator was refused {write:?}: {event}"
        );
        assert!(
            granted.contains(&write),
            "the operator sent {write:?}, which the rendered rules do not grant: {event}"
        );
        seen.insert(write);
    }
    assert!(!seen.is_empty(), "no write of {user} in {}", path.display());
    let unseen: std::collections::BTreeSet<_> = granted.difference(&seen).cloned().collect();
    eprintln!("writes seen: {seen:?}\ngranted writes not exercised here: {unseen:?}");
    unseen
}

/// The (apiGroup, resource, verb) write permissions the rendered Roles and ClusterRoles bound to the
/// operator's ServiceAccount grant it (not the egress proxy's).
fn granted_writes(
    rendered: &[Value],
    service_account: &str,
) -> std::collections::BTreeSet<(String, String, String)> {
    grants_to(rendered, RELEASE_NAMESPACE, service_account)
        .into_iter()
        .filter(|(.., verb)| ["create", "update", "patch", "delete"].contains(&verb.as_str()))
        .map(|(_, _, _, group, resource, _, verb)| (group, resource, verb))
        .collect()
}

/// Stops this test's node and control plane only: `TestEnv::stop` also kills every process this test
/// binary started, which would take down the other test's cluster running in parallel.
async fn stop_own_cluster(env: &TestEnv) {
    env.node.hollow().shutdown().await;
    env.control_plane.stop();
}

#[tokio::test]
async fn helm_chart_installs_and_its_service_account_runs_the_operator() {
    let env = TestEnv::start(
        "install-helm",
        EnvOptions {
            operator: false,
            audit_log: true,
            ..EnvOptions::default()
        },
    )
    .await
    .expect("local cluster");
    create_namespace(&env, RELEASE_NAMESPACE).await;
    let manifests = helm_default();
    apply(&env, &manifests, false);
    let rendered = documents(&manifests);

    // The fully customised render and the samples are accepted by the real API server too (dry run;
    // ServiceMonitor has no CRD here, the full render's watched namespace is created first).
    create_namespace(&env, "rl-sandboxes").await;
    create_namespace(&env, "monitoring").await;
    let full: Vec<String> = documents(&helm_full())
        .into_iter()
        .filter(|d| d["kind"] != "ServiceMonitor")
        .map(|d| serde_yaml::to_string(&d).expect("YAML"))
        .collect();
    apply(&env, &full.join("---\n"), true);
    let samples = kustomize("samples");
    kubectl(
        &env.control_plane.kubeconfig,
        &["apply", "--dry-run=server", "-n", "rl-sandboxes", "-f", "-"],
        Some(&samples),
    );

    operator_under_service_account_runs_a_sandbox(
        &env,
        &rendered,
        "sandbox_minimal.yaml",
        "minimal",
        "install-minimal",
    )
    .await
    .kill();
    stop_own_cluster(&env).await;
}

#[tokio::test]
async fn kustomize_default_installs_and_its_service_account_runs_the_operator() {
    let env = TestEnv::start(
        "install-kustomize",
        EnvOptions {
            operator: false,
            audit_log: true,
            ..EnvOptions::default()
        },
    )
    .await
    .expect("local cluster");
    apply(&env, &kustomize("default"), false);
    // Then the HA overlay on top (two replicas, leader election, a PodDisruptionBudget), as a user
    // moving to HA would; the operator runs with the HA Deployment's flags, so the Lease RBAC is
    // exercised too.
    let manifests = kustomize("overlays/ha");
    apply(&env, &manifests, false);
    let rendered = documents(&manifests);
    // The AllowList sample also makes the operator create a per-sandbox egress NetworkPolicy.
    operator_under_service_account_runs_a_sandbox(
        &env,
        &rendered,
        "sandbox_allowlist.yaml",
        "allowlist",
        "install-allowlist",
    )
    .await
    .kill();

    committed_schemas_match_the_live_api_server(&env).await;
    stop_own_cluster(&env).await;
}

/// `kubectl auth can-i <verb> <resource> -n <namespace> --as <user>` (the admin impersonates).
fn can_i(env: &TestEnv, user: &str, verb: &str, resource: &str, namespace: &str) -> bool {
    let output = Command::new("kubectl")
        .args([
            "auth", "can-i", verb, resource, "-n", namespace, "--as", user,
        ])
        .env("KUBECONFIG", &env.control_plane.kubeconfig)
        .output()
        .expect("kubectl auth can-i");
    String::from_utf8_lossy(&output.stdout).trim() == "yes"
}

/// The namespaced install mode: the chart with `watchNamespace` grants the controllers' rules by a
/// Role in that namespace only. The operator under that ServiceAccount runs a Sandbox there to Ready
/// (and the gateway, expiry and RolloutGroup scenario), has no rights on pods, secrets or sandboxes in
/// another namespace (nor on Secrets in the watched one), and leaves a Sandbox created there alone. (`manifests_rbac.rs` shows the
/// kustomize overlay config/overlays/namespaced grants the same rules; it is applied here too.)
#[tokio::test]
async fn helm_chart_with_watch_namespace_confines_the_operator_to_that_namespace() {
    const WATCHED: &str = "orchard-sandboxes";
    const ELSEWHERE: &str = "not-watched";
    let env = TestEnv::start(
        "install-helm-ns",
        EnvOptions {
            operator: false,
            audit_log: true,
            ..EnvOptions::default()
        },
    )
    .await
    .expect("local cluster");
    create_namespace(&env, RELEASE_NAMESPACE).await;
    create_namespace(&env, WATCHED).await;
    create_namespace(&env, ELSEWHERE).await;
    let manifests = helm_template(&["--set", &format!("watchNamespace={WATCHED}")]);
    apply(&env, &manifests, false);
    apply(&env, &kustomize("overlays/namespaced"), true);
    let rendered = documents(&manifests);
    let service_account = service_account_of(operator_deployment(&rendered));
    let user = format!("system:serviceaccount:{RELEASE_NAMESPACE}:{service_account}");
    for (verb, resource) in [
        ("create", "pods"),
        ("list", "pods"),
        ("create", "networkpolicies.networking.k8s.io"),
        ("create", "sandboxes.orchard.dev"),
        ("patch", "sandboxes.orchard.dev/status"),
    ] {
        assert!(
            can_i(&env, &user, verb, resource, WATCHED),
            "{user} cannot {verb} {resource} in the watched namespace"
        );
        assert!(
            !can_i(&env, &user, verb, resource, ELSEWHERE),
            "{user} can {verb} {resource} outside the watched namespace"
        );
    }
    assert!(!can_i(&env, &user, "list", "pods", "default"));
    // Agent tokens are derived, not stored: no Secret of a sandbox namespace is readable.
    for verb in ["get", "list", "create"] {
        assert!(
            !can_i(&env, &user, verb, "secrets", WATCHED),
            "{user} can {verb} secrets in the watched namespace"
        );
    }

    let operator = operator_under_service_account_runs_a_sandbox(
        &env,
        &rendered,
        "sandbox_minimal.yaml",
        "minimal",
        WATCHED,
    )
    .await;

    // A Sandbox outside the watched namespace is not the operator's: no status, no children.
    let client = env.client().await;
    let elsewhere: Api<Sandbox> = Api::namespaced(client.clone(), ELSEWHERE);
    let text =
        std::fs::read_to_string(workspace_root().join("config/samples/sandbox_minimal.yaml"))
            .expect("sample");
    kubectl(
        &env.control_plane.kubeconfig,
        &["apply", "-n", ELSEWHERE, "-f", "-"],
        Some(&text),
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let untouched = elsewhere.get("minimal").await.expect("the sandbox exists");
    assert!(untouched.status.is_none(), "{:?}", untouched.status);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ELSEWHERE);
    assert!(pods.get_opt("minimal").await.expect("get pod").is_none());
    // The log up to the watched namespace's deletion was checked for denials above. Since then that
    // namespace is being deleted, and with it the Role that grants the operator its rights there: the
    // namespace controller may remove the Role before the pool and sandboxes, so a write into it can be
    // refused by RBAC as well as "because it is being terminated". Any other denial (the namespace
    // not watched, or the cluster scope) is the operator reaching beyond its namespace.
    let watched_namespace = format!("in the namespace \\\"{WATCHED}\\\"");
    let log_text = std::fs::read_to_string(&operator.log).unwrap_or_default();
    let denials: Vec<&str> = log_text
        .lines()
        .filter(|l| {
            l.contains("is forbidden")
                && !l.contains("because it is being terminated")
                && !l.contains(&watched_namespace)
        })
        .collect();
    assert!(
        denials.is_empty(),
        "RBAC denial in the operator log:\n{}",
        denials.join("\n")
    );
    operator.kill();
    stop_own_cluster(&env).await;
}

/// e2e/packaging-tools/schemas/kubernetes-v1.36.3 is what openapi2schema makes of this cluster's
/// /openapi/v2 (the real kube-apiserver v1.36.3), for the kinds in kinds.txt: the generator of
/// `make schemas`, compared with the committed files.
async fn committed_schemas_match_the_live_api_server(env: &TestEnv) {
    let generated = k8s_schemas::generate(&env.client().await, &env.dir.join("schemas"))
        .await
        .unwrap_or_else(|e| panic!("generating the schemas from the live kube-apiserver: {e}"));
    if let Err(drift) = k8s_schemas::check(&generated, &k8s_schemas::committed_dir()) {
        panic!("{drift}");
    }
}
