//! Pod placement allow-lists (operator/src/pod/placement.rs) on the local cluster: with the
//! operator's defaults, a Sandbox that tolerates the control-plane taint or names a PriorityClass fails
//! with reason `PlacementRefused`, a message naming the field, the value and the setting that would
//! allow it, and nothing is created for it (no Pod, no egress policy); a RolloutGroup
//! whose template is refused ends with every trajectory aborted instead of looping, and a SandboxPool
//! whose template is refused starts no member (`Stalled`, reason `PlacementRefused`). Restarted with
//! `--allow-control-plane-placement` and `--allowed-priority-classes`, the operator lets the same specs
//! become Ready.
//!
//! GPUs (operator/src/pod/gpu.rs): the hollow node is made a GPU node as a device plugin and GPU
//! feature discovery would (Node status `nvidia.com/gpu: 2`, label `nvidia.com/gpu.product=FAKE-H100`,
//! taint `nvidia.com/gpu=present:NoSchedule`), the operator knows types `h100` and `a100`. A sandbox
//! asking for one GPU of type `H100` or `a100` is Ready with the GPU request and limit, the toleration
//! and one node-affinity term per type; one asking for `a100` only, or for 3 GPUs, or for a GPU the
//! node no longer has free, stays Pending, `Unschedulable`, with a message naming the GPUs, until a
//! GPU is given back; `v100` fails `PlacementRefused` naming it, the known types and `--gpu-type`;
//! with `--gpu-toleration=false` the taint keeps a GPU sandbox off the node.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use orchard_operator::api::{RolloutGroup, RolloutPhase, Sandbox, SandboxPool, TrajectoryStatus};
use orchard_testcluster::binaries::operator_bin;
use orchard_testcluster::env::{EnvOptions, TestEnv};
use orchard_testcluster::operator_process::OperatorProcess;
use orchard_testcluster::test_support::rollouts::{group, template};
use orchard_testcluster::test_support::sandboxes::{is_failed, is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(60);
const PRIORITY_CLASS: &str = "sandbox-high";

fn control_plane_toleration() -> Value {
    json!({"image": "busybox", "tolerations": [
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
    ]})
}

fn priority_class() -> Value {
    json!({"image": "busybox", "priorityClassName": PRIORITY_CLASS})
}

/// The spec's Sandbox `name` in `ns` fails with `PlacementRefused`, its message contains every one of
/// `mentions`, and none of its children exists.
async fn assert_refused(env: &TestEnv, ns: &str, name: &str, spec: Value, mentions: &[&str]) {
    let client = env.client().await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    sandboxes
        .create(&PostParams::default(), &sandbox(name, spec))
        .await
        .expect("create the sandbox");
    let failed = wait::until(&sandboxes, name, "Failed", TIMEOUT, is_failed).await;
    let status = failed.status.clone().unwrap_or_default();
    assert_eq!(
        status.reason.as_deref(),
        Some("PlacementRefused"),
        "{status:?}"
    );
    let message = status.message.unwrap_or_default();
    for mention in mentions {
        assert!(message.contains(mention), "{mention:?} not in {message:?}");
    }
    // Give a wrong operator time to create something, then look.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    assert!(
        pods.get_opt(name).await.expect("get pod").is_none(),
        "a refused sandbox has a Pod"
    );
    let policies: Api<NetworkPolicy> = Api::namespaced(client, ns);
    assert!(
        policies
            .get_opt(&format!("{name}-egress"))
            .await
            .expect("get policy")
            .is_none(),
        "a refused sandbox has an egress policy"
    );
}

async fn operator_with(env: &TestEnv, label: &str, args: &[&str]) -> OperatorProcess {
    let log = env.dir.join(format!("logs/orchard-operator-{label}.log"));
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    OperatorProcess::start(
        &operator_bin().expect("operator binary"),
        &env.control_plane.kubeconfig,
        &log,
        &args,
    )
    .await
    .unwrap_or_else(|e| panic!("operator ({label}) did not start: {e}"))
}

#[tokio::test]
async fn refused_placement_fails_the_sandbox_and_the_operator_setting_allows_it() {
    let env = TestEnv::start(
        "placement",
        EnvOptions {
            operator: false,
            ..EnvOptions::default()
        },
    )
    .await
    .expect("local cluster");
    let client = env.client().await;
    let priority_classes: Api<PriorityClass> = Api::all(client.clone());
    let class: PriorityClass = serde_json::from_value(json!({
        "metadata": {"name": PRIORITY_CLASS}, "value": 1000000
    }))
    .expect("PriorityClass JSON");
    priority_classes
        .create(&PostParams::default(), &class)
        .await
        .expect("create the PriorityClass");
    let ns = env.namespace("placement").await;

    // The operator's defaults.
    let strict = operator_with(&env, "defaults", &[]).await;
    assert_refused(
        &env,
        &ns,
        "control-plane",
        control_plane_toleration(),
        &[
            "spec.tolerations[0]",
            "node-role.kubernetes.io/control-plane",
            "--allow-control-plane-placement",
        ],
    )
    .await;
    assert_refused(
        &env,
        &ns,
        "priority",
        priority_class(),
        &[
            "spec.priorityClassName",
            PRIORITY_CLASS,
            "--allowed-priority-classes",
        ],
    )
    .await;

    // A RolloutGroup whose template is refused: every trajectory fails (aborted with the reason) and the
    // group reaches an end instead of relaunching forever.
    let mut refused_template = template("echo never", 30);
    refused_template["spec"]["tolerations"] = control_plane_toleration()["tolerations"].clone();
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    groups
        .create(
            &PostParams::default(),
            &group(
                "refused",
                json!({
                    "groupSize": 2, "maxTrajectories": 4, "stride": 2,
                    "positiveFraction": {"min": 0.5, "max": 0.5},
                    "template": refused_template,
                }),
            ),
        )
        .await
        .expect("create the group");
    let ended = |g: Option<&RolloutGroup>| {
        g.and_then(|g| g.status.as_ref())
            .is_some_and(|s| matches!(s.phase, Some(RolloutPhase::Complete | RolloutPhase::Failed)))
    };
    let finished = wait::until(&groups, "refused", "Complete or Failed", TIMEOUT, ended).await;
    let status = finished.status.expect("group status");
    assert!(!status.trajectories.is_empty(), "{status:?}");
    // The trajectory sandboxes failed with PlacementRefused, which aborts them (reason SandboxFailed);
    // the group then deletes them.
    for record in &status.trajectories {
        assert_eq!(record.status, Some(TrajectoryStatus::Aborted), "{record:?}");
        assert_eq!(
            record.reason.as_deref(),
            Some("SandboxFailed"),
            "{record:?}"
        );
    }
    eprintln!(
        "refused group: phase {:?}, {} trajectories, conditions {:?}",
        status.phase,
        status.trajectories.len(),
        status.conditions
    );
    // A SandboxPool whose template is refused gets no members: whoever may create pools cannot
    // place sandboxes where Sandboxes may not go.
    let pools: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
    let pool: SandboxPool = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool", "metadata": {"name": "refused"},
        "spec": {"replicas": 2, "template": control_plane_toleration()},
    }))
    .expect("pool JSON");
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create the pool");
    let stalled = wait::until(
        &pools,
        "refused",
        "Stalled",
        TIMEOUT,
        |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Stalled" && c.status == "True" && c.reason == "PlacementRefused"
                })
            })
        },
    )
    .await;
    let status = stalled.status.expect("pool status");
    assert_eq!(status.replicas, 0, "{status:?}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    assert!(
        pods.list(&ListParams::default())
            .await
            .expect("list pods")
            .items
            .is_empty(),
        "refused sandboxes and pools have pods"
    );
    strict.kill();

    // The settings that allow them.
    let allowing = operator_with(
        &env,
        "allowing",
        &[
            "--allow-control-plane-placement",
            &format!("--allowed-priority-classes=low,{PRIORITY_CLASS}"),
        ],
    )
    .await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    for (name, spec) in [
        ("control-plane-allowed", control_plane_toleration()),
        ("priority-allowed", priority_class()),
    ] {
        sandboxes
            .create(&PostParams::default(), &sandbox(name, spec))
            .await
            .expect("create the sandbox");
    }
    for name in ["control-plane-allowed", "priority-allowed"] {
        wait::until(&sandboxes, name, "Ready", TIMEOUT, is_ready).await;
    }
    let pod = pods
        .get("priority-allowed")
        .await
        .expect("the allowed sandbox's pod");
    assert_eq!(
        pod.spec.and_then(|s| s.priority_class_name).as_deref(),
        Some(PRIORITY_CLASS)
    );
    // A refused sandbox stays Failed (terminal) under the laxer operator.
    let still = sandboxes.get("control-plane").await.expect("get");
    assert!(is_failed(Some(&still)), "{:?}", still.status);
    allowing.kill();
    env.node.hollow().shutdown().await;
    env.control_plane.stop();
}

fn gpu_sandbox(gpu: Value) -> Value {
    json!({"image": "busybox", "resources": {"cpu": "100m", "gpu": gpu}})
}

/// Waits until sandbox `name` is Pending with `Scheduled` and `Ready` False for reason
/// `Unschedulable`, and returns the Ready condition's message.
async fn unschedulable(sandboxes: &Api<Sandbox>, name: &str) -> String {
    let pending = wait::until(
        sandboxes,
        name,
        "Pending, Unschedulable",
        TIMEOUT,
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                st.conditions.iter().any(|c| {
                    c.type_ == "Scheduled" && c.status == "False" && c.reason == "Unschedulable"
                })
            })
        },
    )
    .await;
    let status = pending.status.expect("status");
    assert_eq!(
        status.phase,
        Some(orchard_operator::api::SandboxPhase::Pending),
        "{status:?}"
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "Unschedulable"),
        "{status:?}"
    );
    eprintln!("{name}: {}", ready.message);
    ready.message.clone()
}

#[tokio::test]
async fn gpu_sandboxes_get_their_gpus_on_a_node_of_a_listed_type() {
    let env = TestEnv::start(
        "placement-gpu",
        EnvOptions {
            operator: false,
            ..EnvOptions::default()
        },
    )
    .await
    .expect("local cluster");
    let client = env.client().await;
    // The hollow node becomes a GPU node the way a device plugin (status), GPU feature discovery
    // (label) and a managed GPU pool (taint) make one.
    let nodes: Api<Node> = Api::all(client.clone());
    let node_name = env.node.hollow().name().to_string();
    nodes
        .patch(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"nvidia.com/gpu.product": "FAKE-H100"}},
                "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
            })),
        )
        .await
        .expect("label and taint the node");
    nodes
        .patch_status(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"},
            }})),
        )
        .await
        .expect("advertise two GPUs");
    // The node's scheduler reads its Node object through a watch: wait until it sees all three.
    let hollow = env.node.hollow().clone();
    wait::poll(
        "the hollow node sees its GPUs, label and taint",
        TIMEOUT,
        || {
            let offer = hollow.offer();
            async move {
                let gpus = offer.extended.get("nvidia.com/gpu") == Some(&2);
                let label = offer
                    .labels
                    .get("nvidia.com/gpu.product")
                    .map(String::as_str)
                    == Some("FAKE-H100");
                (gpus && label && !offer.taints.is_empty()).then_some(())
            }
        },
    )
    .await;
    let ns = env.namespace("gpu").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let operator = operator_with(
        &env,
        "gpu",
        &[
            "--gpu-type",
            "h100=nvidia.com/gpu.product=FAKE-H100",
            "--gpu-type",
            "a100=nvidia.com/gpu.product=FAKE-A100",
        ],
    )
    .await;

    // Any of two types, one of which the node has.
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox(
                "gpu-any-of",
                gpu_sandbox(json!({"count": 1, "types": ["H100", "a100"]})),
            ),
        )
        .await
        .expect("create the sandbox");
    wait::until(&sandboxes, "gpu-any-of", "Ready", TIMEOUT, is_ready).await;
    let pod = pods.get("gpu-any-of").await.expect("its pod");
    let spec = serde_json::to_value(pod.spec.expect("pod spec")).expect("JSON");
    let task = &spec["containers"][0]["resources"];
    assert_eq!(task["requests"]["nvidia.com/gpu"], json!("1"), "{task}");
    assert_eq!(task["limits"]["nvidia.com/gpu"], json!("1"), "{task}");
    // The API server's DefaultTolerationSeconds adds the not-ready and unreachable ones after it.
    assert_eq!(
        spec["tolerations"][0],
        json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}),
        "{}",
        spec["tolerations"]
    );
    assert_eq!(
        spec["affinity"],
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["FAKE-A100"]}]},
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["FAKE-H100"]}]}
        ]}}})
    );
    assert_eq!(spec["nodeName"], json!(node_name));

    // A type the node does not have: not scheduled, and the sandbox says which GPUs it waits for.
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox(
                "gpu-a100",
                gpu_sandbox(json!({"count": 1, "types": ["a100"]})),
            ),
        )
        .await
        .expect("create the sandbox");
    let message = unschedulable(&sandboxes, "gpu-a100").await;
    assert!(
        message.contains("didn't match Pod's node affinity/selector")
            && message.contains("1 GPU on one node of GPU type a100"),
        "{message}"
    );

    // More GPUs than the node has.
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("gpu-three", gpu_sandbox(json!({"count": 3}))),
        )
        .await
        .expect("create the sandbox");
    let message = unschedulable(&sandboxes, "gpu-three").await;
    assert!(
        message.contains("Insufficient nvidia.com/gpu") && message.contains("3 GPUs on one node"),
        "{message}"
    );

    // The node's second GPU, then none left.
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("gpu-second", gpu_sandbox(json!({"count": 1}))),
        )
        .await
        .expect("create the sandbox");
    wait::until(&sandboxes, "gpu-second", "Ready", TIMEOUT, is_ready).await;
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox(
                "gpu-third",
                gpu_sandbox(json!({"count": 1, "types": ["h100"]})),
            ),
        )
        .await
        .expect("create the sandbox");
    let message = unschedulable(&sandboxes, "gpu-third").await;
    assert!(
        message.contains("Insufficient nvidia.com/gpu") && message.contains("GPU type h100"),
        "{message}"
    );

    // A type the operator does not know.
    assert_refused(
        &env,
        &ns,
        "gpu-v100",
        gpu_sandbox(json!({"count": 1, "types": ["v100"]})),
        &["\"v100\"", "known: a100, h100", "--gpu-type", "gpu.types"],
    )
    .await;

    // A GPU given back goes to the sandbox waiting for one.
    sandboxes
        .delete("gpu-second", &Default::default())
        .await
        .expect("delete a GPU sandbox");
    wait::until(&sandboxes, "gpu-third", "Ready", TIMEOUT, is_ready).await;
    operator.kill();

    // Without the toleration the GPU pool's taint keeps GPU sandboxes off (a GPU is freed first, so
    // the taint is the only reason).
    sandboxes
        .delete("gpu-third", &Default::default())
        .await
        .expect("delete a GPU sandbox");
    wait::deleted(&pods, "gpu-third", TIMEOUT).await;
    let untolerating = operator_with(&env, "gpu-no-toleration", &["--gpu-toleration=false"]).await;
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("gpu-untolerated", gpu_sandbox(json!({"count": 1}))),
        )
        .await
        .expect("create the sandbox");
    let message = unschedulable(&sandboxes, "gpu-untolerated").await;
    assert!(
        message.contains("untolerated taint {nvidia.com/gpu: present}")
            && !message.contains("Insufficient"),
        "{message}"
    );
    let pod = pods.get("gpu-untolerated").await.expect("its pod");
    let tolerations = pod.spec.and_then(|s| s.tolerations).unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .all(|t| t.key.as_deref() != Some("nvidia.com/gpu")),
        "{tolerations:?}"
    );
    untolerating.kill();
    env.node.hollow().shutdown().await;
    env.control_plane.stop();
}
