//! Two real nodes (`orchard-node`, `orchard-node-2`: two kubelets, each with its own containerd,
//! registry, kube-proxy, kube-router and network namespace on this machine, pod traffic between them
//! over a link of their own) with the operator installed by its chart and NetworkPolicies enforced,
//! so that multi-node behaviour is tested rather than assumed. One test, in phases that build on each
//! other (it drains and then loses a node): sandboxes placed on each node, NetworkPolicies enforced
//! across nodes (egress on the source node, ingress on the destination node), a SandboxPool spread
//! over both, a drain, and a spot reclaim (the node's every process killed). The chart turns
//! SandboxSnapshots on (the first node's registry, committer image and containerd socket; no commit
//! runs): a snapshot of the reclaimed node's sandbox, created through the gateway, fails
//! `SandboxNotReady` while the sandbox is not Ready, and `NodeGone` once its Node is deleted and the
//! sandbox failed `NodeLost`; neither starts a committer Pod.
//!
//! An `AllowList` cannot name a pod address (the operator leaves the cluster's pod ranges out of
//! it), so a sandbox reaches a pod on another node by `AllowAll` (a namespace selector), and a
//! NetworkPolicy of the server's own names which sandbox it admits.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use orchard_operator::api::{
    SANDBOX_LABEL, SNAPSHOT_UID_LABEL, Sandbox, SandboxPhase, SandboxPool, SandboxSnapshot,
    SnapshotPhase,
};
use orchard_testcluster::chart_install::{ChartRelease, ReleaseOptions, split_reference};
use orchard_testcluster::control_plane::SNAPSHOT_NAMESPACE;
use orchard_testcluster::env::{TestEnv, snapshot_flags};
use orchard_testcluster::real_node::drain::{cordon, drain};
use orchard_testcluster::test_support::gateway::Caller;
use orchard_testcluster::test_support::nodes::{
    FIRST, HOSTNAME, SECOND, create_pool, members_ready, node_of, pod_ready, two_real_nodes,
};
use orchard_testcluster::wait;
use serde_json::{Value, json};

/// The host's IPv4 forwarding settings (they must not change: the nodes route between themselves)
/// and its TCP orphan retries (a reclaimed node sets its own).
fn host_forwarding() -> (String, String, String) {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    (
        read("/proc/sys/net/ipv4/ip_forward"),
        read("/proc/sys/net/ipv4/conf/all/forwarding"),
        read("/proc/sys/net/ipv4/tcp_orphan_retries"),
    )
}

fn env() -> &'static TestEnv {
    static ENV: OnceLock<TestEnv> = OnceLock::new();
    ENV.get_or_init(|| two_real_nodes("multi_node"))
}

fn admin_at(env: &TestEnv, base: String) -> Caller {
    Caller {
        base,
        token: Some(env.control_plane.tokens["admin"].clone()),
        http: orchard_testcluster::gateway_http(),
    }
}

/// The chart values turning SandboxSnapshots on: [`snapshot_flags`] of the first node (its registry,
/// committer image and containerd socket). No committer runs in this test (no snapshot here is of a
/// Ready sandbox), so one node's settings serve both.
fn snapshot_values(env: &TestEnv) -> Vec<(String, String)> {
    let mut values = Vec::new();
    for (flag, value) in snapshot_flags(env.node.real()) {
        match flag {
            "--snapshot-registry" => values.push(("snapshots.registry".into(), value)),
            "--snapshot-committer-image" => {
                let (repository, tag) = split_reference(&value);
                values.push((
                    "snapshots.committerImage.repository".into(),
                    repository.into(),
                ));
                values.push(("snapshots.committerImage.tag".into(), tag.into()));
            }
            "--snapshot-containerd-socket" => {
                values.push(("snapshots.containerdSocket".into(), value))
            }
            other => panic!("no chart value for the operator flag {other}"),
        }
    }
    values
}

/// Creates SandboxSnapshot `name` of sandbox `sandbox` through the gateway (as a user would), waits
/// through the gateway until it settles, and returns it as the API server has it. Asserts it
/// `Failed` without a committer: its status names no node or pod (the operator records them when it
/// creates a committer), and no Pod in the snapshot namespace carries its UID.
async fn failed_snapshot(
    caller: &Caller,
    client: &kube::Client,
    ns: &str,
    name: &str,
    sandbox: &str,
) -> SandboxSnapshot {
    let created = caller
        .post(
            &format!("/v1/namespaces/{ns}/sandboxsnapshots"),
            json!({"name": name, "sandbox": sandbox}),
        )
        .await;
    assert_eq!(created.status, 201, "create snapshot {name}: {created:?}");
    let waited = caller
        .get(&format!(
            "/v1/namespaces/{ns}/sandboxsnapshots/{name}/wait?timeoutSeconds=60"
        ))
        .await;
    assert_eq!(waited.status, 200, "wait for snapshot {name}: {waited:?}");
    let snapshot = Api::<SandboxSnapshot>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("the snapshot");
    let status = snapshot.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        Some(SnapshotPhase::Failed),
        "snapshot {name}: {status:?}"
    );
    assert_eq!(
        (status.node_name.as_deref(), status.pod_uid.as_deref()),
        (None, None),
        "snapshot {name} recorded a commit target (a committer was started): {status:?}"
    );
    let uid = snapshot.metadata.uid.clone().expect("a UID");
    let committers = Api::<Pod>::namespaced(client.clone(), SNAPSHOT_NAMESPACE)
        .list(&ListParams::default().labels(&format!("{SNAPSHOT_UID_LABEL}={uid}")))
        .await
        .expect("list committer pods");
    assert!(
        committers.items.is_empty(),
        "a committer pod for snapshot {name}: {:?}",
        committers
            .items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>()
    );
    snapshot
}

/// The `Ready` condition's (status, reason, message) of a snapshot.
fn snapshot_condition(snapshot: &SandboxSnapshot) -> (String, String, String) {
    snapshot
        .status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

/// Prints a phase with the time since the test started.
fn phase(started: Instant, what: &str) {
    eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());
}

fn is_ready(conditions: Option<&Vec<k8s_openapi::api::core::v1::NodeCondition>>) -> bool {
    conditions.is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn node_ready(node: Option<&Node>) -> bool {
    is_ready(node.and_then(|n| n.status.as_ref()?.conditions.as_ref()))
}

/// The sandbox's phase, reason and message, as one line.
fn sandbox_state(sandbox: Option<&Sandbox>) -> String {
    let Some(status) = sandbox.and_then(|s| s.status.as_ref()) else {
        return "no status".into();
    };
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| format!("Ready={} ({}: {})", c.status, c.reason, c.message))
        .unwrap_or_default();
    format!(
        "phase {:?}, reason {:?}, {ready}",
        status.phase,
        status.reason.as_deref().unwrap_or_default()
    )
}

/// A Python one-liner: TCP connect to `ip:port` within 3 s; prints `open` or `closed <error>`.
fn tcp_probe(ip: &str, port: u16) -> Vec<String> {
    let code = format!(
        "import socket\ntry:\n    socket.create_connection(('{ip}', {port}), 3).close(); print('open')\nexcept OSError as e:\n    print('closed', type(e).__name__)"
    );
    vec!["python3".into(), "-c".into(), code]
}

/// A Python program accepting (and closing) connections on ports 8080 and 8081.
const TWO_PORTS: &str = "import socket, threading\ndef serve(port):\n    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n    s.bind(('0.0.0.0', port)); s.listen(64)\n    while True:\n        c, _ = s.accept(); c.close()\nfor port in (8080, 8081):\n    threading.Thread(target=serve, args=(port,)).start()";

/// Runs `argv` in sandbox `name` through the gateway and returns its stdout, trimmed.
async fn run_in(caller: &Caller, ns: &str, name: &str, argv: Vec<String>) -> String {
    let answer = caller
        .exec(ns, name, json!({"argv": argv, "timeoutSeconds": 20}))
        .await;
    assert_eq!(answer.status, 200, "exec in {name}: {answer:?}");
    answer.body["stdout"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// A plain Pod (no sandbox) of the Debian image on node `node` running `command`; waits until it runs
/// and returns its IP.
async fn plain_pod(env: &TestEnv, ns: &str, name: &str, node: &str, command: &str) -> String {
    let api: Api<Pod> = Api::namespaced(env.client().await, ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {HOSTNAME: node},
            "containers": [{
                "name": "main", "image": env.node.real().image("debian-python"),
                "command": ["python3", "-c", command],
                "resources": {"requests": {"cpu": "5m", "memory": "32Mi"}},
            }],
        },
    }))
    .expect("pod JSON");
    api.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let running = wait::until(
        &api,
        name,
        "Running",
        Duration::from_secs(120),
        |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.phase.as_deref() == Some("Running") && s.pod_ip.is_some())
        },
    )
    .await;
    assert_eq!(node_of(&running), node, "{name} placed by its nodeSelector");
    running.status.and_then(|s| s.pod_ip).expect("pod IP")
}

/// Creates sandboxes `(name, node, spec)` through the gateway, each pinned to its node by
/// `nodeSelector`, and waits until all are Ready; returns each one's pod IP.
async fn sandboxes_on(
    caller: &Caller,
    client: &kube::Client,
    ns: &str,
    specs: &[(&str, &str, Value)],
) -> BTreeMap<String, String> {
    for (name, node, spec) in specs {
        let mut body = spec.clone();
        body["name"] = json!(name);
        body["nodeSelector"] = json!({HOSTNAME: node});
        caller.create_sandbox(ns, body).await;
    }
    let api: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let mut ips = BTreeMap::new();
    for (name, node, _) in specs {
        caller.wait_ready(ns, name).await;
        let sandbox = api.get(name).await.expect("sandbox");
        let status = sandbox.status.unwrap_or_default();
        assert_eq!(
            status.node_name.as_deref(),
            Some(*node),
            "{name} runs on the node its nodeSelector names"
        );
        ips.insert(
            name.to_string(),
            status.pod_ip.expect("a Ready sandbox has a pod IP"),
        );
    }
    ips
}

/// Name -> (node, uid) of the pods on `node` (all namespaces).
async fn pods_on(client: &kube::Client, node: &str) -> BTreeMap<String, (String, String)> {
    Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .map(|p| {
            (
                format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
                (node_of(&p), p.uid().unwrap_or_default()),
            )
        })
        .collect()
}

#[tokio::test]
async fn two_nodes_place_enforce_drain_and_lose_a_node() {
    let forwarding_before = host_forwarding();
    let started = Instant::now();
    let env = env();
    phase(started, "two real nodes Ready");
    let client = env.client().await;
    let nodes: Api<Node> = Api::all(client.clone());

    // Two Nodes, each with its own pod range; the host forwards nothing for them.
    let names: Vec<&str> = env.node.reals().iter().map(|n| n.name()).collect();
    assert_eq!(names, [FIRST, SECOND]);
    let mut ranges = BTreeSet::new();
    for name in [FIRST, SECOND] {
        let node = nodes.get(name).await.expect("Node");
        assert!(node_ready(Some(&node)), "{name} Ready");
        let range = node.spec.and_then(|s| s.pod_cidr).expect("a pod range");
        assert!(
            ranges.insert(range.clone()),
            "{name} has a range of its own"
        );
    }
    assert_eq!(
        host_forwarding(),
        forwarding_before,
        "the host's forwarding settings are untouched"
    );
    let host_links = std::fs::read_dir("/sys/class/net")
        .expect("links")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("orp"))
        .collect::<Vec<_>>();
    assert!(
        host_links.is_empty(),
        "the nodes' own link is not on the host: {host_links:?}"
    );

    // The chart: one operator replica per node (a topology spread), a PodDisruptionBudget keeping one,
    // SandboxSnapshots on.
    let release = env
        .on_env_runtime(async {
            let mut values = snapshot_values(env);
            values.extend([
                ("podDisruptionBudget.enabled".into(), "true".into()),
                (
                    "topologySpreadConstraints[0].maxSkew".into(),
                    "1".into(),
                ),
                (
                    "topologySpreadConstraints[0].topologyKey".into(),
                    HOSTNAME.into(),
                ),
                (
                    "topologySpreadConstraints[0].whenUnsatisfiable".into(),
                    "ScheduleAnyway".into(),
                ),
                (
                    "topologySpreadConstraints[0].labelSelector.matchLabels.app\\.kubernetes\\.io/name"
                        .into(),
                    "orchard-operator".into(),
                ),
            ]);
            let options = ReleaseOptions {
                values,
                ..ReleaseOptions::default()
            };
            ChartRelease::install(env, &options)
                .await
                .unwrap_or_else(|e| panic!("helm install: {e}"))
        })
        .await;
    let operators = release.pods(&client).await.expect("operator pods");
    let operator_nodes: BTreeSet<String> = operators.iter().map(node_of).collect();
    phase(
        started,
        &format!("chart installed, operator pods on {operator_nodes:?}"),
    );
    assert_eq!(
        operator_nodes,
        BTreeSet::from([FIRST.to_string(), SECOND.to_string()]),
        "one replica per node (the topology spread)"
    );
    let caller = admin_at(env, release.gateway_url(&client).await.expect("url"));
    let ns = env.namespace("multi").await;
    let debian = env.node.real().image("debian-python");

    // Scheduling across nodes: a sandbox pinned to each, both Ready, each agent answering exec
    // through the gateway (whichever replica serves it reaches both nodes' agents).
    let ips = sandboxes_on(
        &caller,
        &client,
        &ns,
        &[
            ("on-first", FIRST, json!({"image": debian})),
            ("on-second", SECOND, json!({"image": debian})),
        ],
    )
    .await;
    for (name, node) in [("on-first", FIRST), ("on-second", SECOND)] {
        let hostname = run_in(&caller, &ns, name, vec!["hostname".into()]).await;
        assert_eq!(hostname, name, "{name}'s own container on {node}");
        for _ in 0..4 {
            assert_eq!(run_in(&caller, &ns, name, vec!["true".into()]).await, "");
        }
    }
    phase(
        started,
        "a sandbox Ready on each node, exec through the gateway",
    );

    // NetworkPolicies across nodes, on real packets. A server pod on each node (ports 8080 and
    // 8081); the one on the second node admits, by an ingress policy, only the sandbox `open-first`
    // and only on 8080. Sandboxes on each node with each egress mode. Ingress is enforced by the
    // destination node's kube-router, which must know the source pod on the other node; egress by the
    // source node's.
    let server_first = plain_pod(env, &ns, "server-first", FIRST, TWO_PORTS).await;
    let server_second = plain_pod(env, &ns, "server-second", SECOND, TWO_PORTS).await;
    let policy: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "server-second-ingress"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "server-second"}},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": {SANDBOX_LABEL: "open-first"}}}],
                "ports": [{"protocol": "TCP", "port": 8080}],
            }],
        },
    }))
    .expect("policy JSON");
    Api::<NetworkPolicy>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the server's ingress policy");
    let allow_all = json!({"image": debian, "network": {"egress": "AllowAll"}});
    sandboxes_on(
        &caller,
        &client,
        &ns,
        &[
            ("open-first", FIRST, allow_all.clone()),
            ("other-first", FIRST, allow_all.clone()),
            ("open-second", SECOND, allow_all.clone()),
            ("closed-second", SECOND, json!({"image": debian})),
            (
                "listed-second",
                SECOND,
                json!({"image": debian, "network": {"egress": "AllowList", "allow": [
                    {"cidr": format!("{server_first}/32"), "ports": [{"port": 8080}]},
                ]}}),
            ),
        ],
    )
    .await;
    let probe = |from: &'static str, ip: &str, port: u16| {
        let caller = &caller;
        let ns = &ns;
        let ip = ip.to_string();
        async move { run_in(caller, ns, from, tcp_probe(&ip, port)).await }
    };
    // Ingress on the destination node.
    assert_eq!(
        probe("open-first", &server_second, 8080).await,
        "open",
        "the sandbox the server's policy admits reaches it across nodes"
    );
    for (from, port, why) in [
        (
            "open-first",
            8081,
            "a port the server's ingress policy does not admit",
        ),
        (
            "other-first",
            8080,
            "a sandbox the server's ingress policy does not name",
        ),
    ] {
        let answer = probe(from, &server_second, port).await;
        assert!(
            answer.starts_with("closed"),
            "{from} -> server-second:{port} ({why}) got through: {answer}"
        );
    }
    let agent = probe("open-first", &ips["on-second"], 9090).await;
    assert!(
        agent.starts_with("closed"),
        "AllowAll egress, but the agent's ingress baseline on the other node admits only operator pods: {agent}"
    );
    // Egress on the source node.
    assert_eq!(
        probe("open-second", &server_first, 8080).await,
        "open",
        "AllowAll reaches a pod on the other node"
    );
    for (from, why) in [
        ("closed-second", "Deny"),
        (
            "listed-second",
            "an AllowList naming a pod address (the operator leaves the cluster's pod ranges out)",
        ),
    ] {
        let answer = probe(from, &server_first, 8080).await;
        assert!(
            answer.starts_with("closed"),
            "{from} ({why}) reaches the other node's server: {answer}"
        );
    }
    phase(started, "NetworkPolicies enforced across nodes");

    // A SandboxPool over both nodes: 4 members of 300m CPU each, spread by the scheduler's default
    // scoring (least allocated: each member goes to the node with more CPU left).
    let busybox = env.node.real().image("busybox");
    let pools: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
    create_pool(&pools, "spread", 4, &busybox, ("300m", "64Mi")).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let member_nodes = members_ready(
        &pods,
        "spread",
        4,
        &[FIRST, SECOND],
        Duration::from_secs(120),
    )
    .await;
    phase(started, &format!("pool members on {member_nodes:?}"));
    assert!(
        member_nodes.iter().any(|n| n == FIRST) && member_nodes.iter().any(|n| n == SECOND),
        "pool members on both nodes: {member_nodes:?}"
    );

    // A drain of the second node (cordon, evictions through the Eviction API, honouring the
    // operator's PodDisruptionBudget): the first node's pods stay as they are; the pool refills
    // there; the sandbox pinned to the drained node is failed, not moved (a sandbox is one pod).
    let first_before = pods_on(&client, FIRST).await;
    let evicted = drain(&client, SECOND, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("drain: {e}"));
    phase(started, &format!("{SECOND} drained: evicted {evicted:?}"));
    let first_after = pods_on(&client, FIRST).await;
    for (pod, before) in &first_before {
        assert_eq!(
            first_after.get(pod),
            Some(before),
            "{pod} on {FIRST} untouched by the drain of {SECOND}"
        );
    }
    assert!(
        pods_on(&client, SECOND).await.is_empty(),
        "nothing left on the drained node"
    );
    let refilled = members_ready(&pods, "spread", 4, &[FIRST], Duration::from_secs(120)).await;
    phase(started, &format!("pool refilled on {refilled:?}"));
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let drained = wait::until(
        &sandboxes,
        "on-second",
        "the drained node's sandbox Failed",
        Duration::from_secs(60),
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.phase == Some(SandboxPhase::Failed))
        },
    )
    .await;
    eprintln!(
        "on-second after the drain: {}",
        sandbox_state(Some(&drained))
    );
    assert_eq!(
        drained.status.as_ref().and_then(|s| s.reason.as_deref()),
        Some("Evicted"),
        "the pod's DisruptionTarget condition names the cause, not the agent's exit on SIGTERM"
    );
    let operators = wait::poll(
        "two operator replicas Ready again",
        Duration::from_secs(90),
        || async {
            let pods = release.pods(&client).await.ok()?;
            (pods.len() == 2 && pods.iter().all(pod_ready)).then_some(pods)
        },
    )
    .await;
    assert!(
        operators.iter().all(|p| node_of(p) == FIRST),
        "the evicted operator replica moved to {FIRST}"
    );
    assert_eq!(
        run_in(&caller, &ns, "on-first", vec!["true".into()]).await,
        ""
    );

    // A spot reclaim of the second node: back in service, a sandbox on it, then its every process
    // killed (kubelet, containerd, the containers). The Node goes NotReady within the node-monitor
    // grace period (5 s here); the operator reports the sandbox not Ready at once. The cloud deletes
    // the Node of a reclaimed machine. Whichever comes first (the taint-eviction controller once the
    // pod's 30 s toleration of the unreachable taint runs out, the pod garbage collector once the
    // Node is gone) deletes the pod, and the sandbox fails `NodeLost` (`spot_eviction.rs` has the
    // rest: retries, backfills, pools). A snapshot of it fails at once, without a committer (which
    // would go to the lost node): `SandboxNotReady` while it is not Ready, `NodeGone` once it failed
    // `NodeLost`.
    cordon(&client, SECOND, false).await.expect("uncordon");
    sandboxes_on(
        &caller,
        &client,
        &ns,
        &[("doomed", SECOND, json!({"image": busybox}))],
    )
    .await;
    let reclaimed = Instant::now();
    env.on_env_runtime(async {
        crate::env()
            .node
            .real_named(SECOND)
            .reclaim()
            .await
            .unwrap_or_else(|e| panic!("reclaim: {e}"))
    })
    .await;
    phase(started, &format!("{SECOND} reclaimed"));
    wait::until(
        &nodes,
        SECOND,
        "the reclaimed Node NotReady",
        Duration::from_secs(60),
        |n: Option<&Node>| !node_ready(n),
    )
    .await;
    let not_ready_after = reclaimed.elapsed();
    let unready = wait::until(
        &sandboxes,
        "doomed",
        "the reclaimed node's sandbox not Ready",
        Duration::from_secs(60),
        |s: Option<&Sandbox>| {
            !s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                st.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        },
    )
    .await;
    let sandbox_unready_after = reclaimed.elapsed();
    eprintln!(
        "Node NotReady {:.1} s after the reclaim; doomed not Ready after {:.1} s: {}",
        not_ready_after.as_secs_f64(),
        sandbox_unready_after.as_secs_f64(),
        sandbox_state(Some(&unready))
    );
    let early = failed_snapshot(&caller, &client, &ns, "doomed-early", "doomed").await;
    let (status, reason, message) = snapshot_condition(&early);
    eprintln!("snapshot of doomed while it is not Ready: {reason}: {message}");
    let sandbox_phase = unready
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .map_or("Pending", SandboxPhase::as_str);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SandboxNotReady"),
        "{message}"
    );
    assert!(
        message.starts_with(&format!("Sandbox doomed is not Ready ({sandbox_phase}"))
            && message.contains("AgentNotResponding"),
        "the message names the sandbox's phase ({sandbox_phase}) and why: {message}"
    );
    let exec = caller
        .exec(
            &ns,
            "doomed",
            json!({"argv": ["true"], "timeoutSeconds": 5}),
        )
        .await;
    eprintln!(
        "exec in doomed after the reclaim: {} {}",
        exec.status, exec.body
    );
    let reason = unready
        .status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.reason.clone())
        .unwrap_or_default();
    assert_eq!(
        reason, "AgentNotResponding",
        "the node-lifecycle controller marked the pod not ready"
    );
    assert_eq!(
        (exec.status, exec.code()),
        (409, "NotReady"),
        "the gateway refuses calls to a sandbox of a lost node: {exec:?}"
    );
    assert_eq!(
        run_in(&caller, &ns, "on-first", vec!["true".into()]).await,
        "",
        "the surviving node's sandbox still answers"
    );
    nodes
        .delete(SECOND, &DeleteParams::default())
        .await
        .expect("delete the reclaimed Node");
    let failed = wait::until(
        &sandboxes,
        "doomed",
        "the reclaimed node's sandbox Failed once its Node is deleted",
        Duration::from_secs(120),
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.phase == Some(SandboxPhase::Failed))
        },
    )
    .await;
    phase(
        started,
        &format!(
            "doomed after its Node's deletion ({:.1} s after the reclaim): {}",
            reclaimed.elapsed().as_secs_f64(),
            sandbox_state(Some(&failed))
        ),
    );
    assert_eq!(
        failed.status.as_ref().and_then(|s| s.reason.as_deref()),
        Some("NodeLost"),
        "the reclaimed node's sandbox failed NodeLost"
    );
    let late = failed_snapshot(&caller, &client, &ns, "doomed-late", "doomed").await;
    let (status, reason, message) = snapshot_condition(&late);
    eprintln!("snapshot of doomed after NodeLost: {reason}: {message}");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NodeGone"),
        "{message}"
    );
    assert!(
        message.starts_with("Sandbox doomed lost its node") && message.contains(SECOND),
        "the message names the lost node {SECOND}: {message}"
    );
    assert_eq!(
        snapshot_condition(
            &Api::<SandboxSnapshot>::namespaced(client.clone(), &ns)
                .get("doomed-early")
                .await
                .expect("doomed-early")
        )
        .1,
        "SandboxNotReady",
        "a failed snapshot stays failed as it was"
    );
    let _ = pools
        .patch(
            "spread",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await;
    assert_eq!(
        host_forwarding(),
        forwarding_before,
        "the host's settings are untouched after the reclaim"
    );
    env.delete_namespace(&ns).await;
    phase(started, "done");
}
