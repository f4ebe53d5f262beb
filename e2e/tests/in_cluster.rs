//! The operator installed on the real node from the release `make dist` writes, as docs/INSTALL.md
//! tells users: the images' tarballs pushed into the node's registry with `crane push`, the packaged
//! chart (`dist/orchard-env-<version>.tgz`) installed with image repositories only, so every test here
//! runs the release artifacts. Two replicas, the chart's securityContext, RBAC, probes and leader
//! election as shipped. The gateway is
//! used through its Service (kube-proxy) and through `kubectl port-forward`, and the leader pod is
//! killed in the middle of a RolloutGroup; the Python SDK's tests run against the in-cluster gateway;
//! NetworkPolicies are enforced (kube-router) and checked on real packets, from a sandbox's first
//! moment of Ready on. This release injects the agent through an image volume
//! (`agentImage.injection=image-volume`): no init container, so sandboxes are Ready soonest.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use orchard_operator::api::{RolloutGroup, RolloutPhase, Sandbox, SandboxPool};
use orchard_testcluster::chart_install::{
    ChartRelease, DistRelease, ReleaseOptions, ReleaseSource,
};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::gateway::{Caller, grant};
use orchard_testcluster::test_support::rollouts::{
    GROUP_TIMEOUT, expected, group, is_complete, reward_script,
};
use orchard_testcluster::wait;
use serde_json::{Value, json};
use tokio::sync::{OnceCell, RwLock};

fn env() -> &'static TestEnv {
    TestEnv::shared_in_cluster()
}

/// The chart, installed once for the whole binary.
async fn release() -> &'static ChartRelease {
    static RELEASE: OnceCell<ChartRelease> = OnceCell::const_new();
    RELEASE
        .get_or_init(|| async {
            let env = env();
            env.on_env_runtime(async {
                // The in-cluster release gets the agent from an image volume; the other real-node
                // tests (real_node.rs) run the operator with the default init container.
                let options = ReleaseOptions {
                    source: ReleaseSource::Dist(DistRelease::of_workspace()),
                    values: vec![("agentImage.injection".into(), "image-volume".into())],
                    ..ReleaseOptions::default()
                };
                ChartRelease::install(env, &options)
                    .await
                    .unwrap_or_else(|e| panic!("helm install: {e}"))
            })
            .await
        })
        .await
}

/// Tests that use the gateway hold this shared; the test that kills an operator pod holds it alone
/// (its Service loses an endpoint meanwhile).
static OPERATOR_PODS: RwLock<()> = RwLock::const_new(());

fn admin_at(env: &TestEnv, base: String) -> Caller {
    Caller {
        base,
        token: Some(env.control_plane.tokens["admin"].clone()),
        http: orchard_testcluster::gateway_http(),
    }
}

#[tokio::test]
async fn the_chart_runs_two_replicas_as_non_root_with_one_leader() {
    let _shared = OPERATOR_PODS.read().await;
    let env = env();
    let release = release().await;
    let client = env.client().await;
    let pods = release.pods(&client).await.expect("operator pods");
    assert_eq!(pods.len(), 2, "two replicas");
    for pod in &pods {
        assert!(
            pod_is_ready(pod),
            "{} Ready (its /readyz probe)",
            pod.name_any()
        );
        let image = pod.spec.as_ref().map(|s| s.containers[0].image.clone());
        assert_eq!(
            image.flatten().as_deref(),
            Some(release.operator_image.as_str()),
            "the release's image, its tag the chart's appVersion"
        );
    }
    let leader = wait::poll("a Lease holder", Duration::from_secs(30), || async {
        release.leader(&client).await.ok().flatten()
    })
    .await;
    assert!(
        pods.iter().any(|p| p.name_any() == leader),
        "the leader {leader} is one of the pods"
    );
    let uids: Vec<u32> = env
        .node
        .real()
        .processes(&["/orchard-operator"], true)
        .into_iter()
        .map(|(_, uid)| uid)
        .collect();
    assert_eq!(
        uids.len(),
        2,
        "two operator processes on the node: {uids:?}"
    );
    assert!(
        uids.iter().all(|&uid| uid == 65532),
        "the chart's runAsUser, not root: {uids:?}"
    );
    // The egress proxy: the same image in its own mode, non-root too.
    let egress = wait::poll(
        "the egress proxy's process",
        Duration::from_secs(60),
        || async {
            let found = env
                .node
                .real()
                .processes(&["/orchard-operator", "egress-proxy"], false);
            (!found.is_empty()).then_some(found)
        },
    )
    .await;
    assert_eq!(egress.len(), 1, "one egress proxy: {egress:?}");
    assert_eq!(egress[0].1, 65532, "the chart's runAsUser: {egress:?}");
}

#[tokio::test]
async fn the_gateway_answers_through_its_service_and_a_port_forward() {
    let _shared = OPERATOR_PODS.read().await;
    let env = env();
    let release = release().await;
    let client = env.client().await;
    let ns = env.namespace("incluster-gw").await;
    let image = env.node.real().image("debian-python");
    let service = admin_at(env, release.gateway_url(&client).await.expect("url"));
    service
        .create_sandbox(&ns, json!({"image": image, "name": "svc"}))
        .await;
    service.wait_ready(&ns, "svc").await;
    let answer = service
        .exec(&ns, "svc", json!({"argv": ["cat", "/etc/os-release"]}))
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body["stdout"]
            .as_str()
            .is_some_and(|s| s.contains("trixie")),
        "{answer:?}"
    );

    let forward = release.port_forward_gateway().await.expect("port-forward");
    let forwarded = admin_at(env, forward.url());
    let answer = forwarded
        .exec(&ns, "svc", json!({"argv": ["uname", "-n"]}))
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["stdout"], "svc\n", "{answer:?}");
    // RBAC through the in-cluster gateway: bob has no rights here.
    let bob = Caller {
        token: Some(env.control_plane.tokens["bob"].clone()),
        ..forwarded.clone()
    };
    let denied = bob.exec(&ns, "svc", json!({"argv": ["true"]})).await;
    assert_eq!(denied.status, 403, "{denied:?}");
    forward.stop().await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn the_standby_finishes_a_rollout_group_when_the_leader_pod_is_killed() {
    let _alone = OPERATOR_PODS.write().await;
    let env = env();
    let release = release().await;
    let client = env.client().await;
    let ns = env.namespace("incluster-failover").await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);

    // Every incarnation of every trajectory name: a name launched twice shows two UIDs.
    let launched = std::sync::Arc::new(std::sync::Mutex::new(
        BTreeMap::<String, BTreeSet<String>>::new(),
    ));
    let recorder = {
        let launched = launched.clone();
        let stream = watcher(sandboxes.clone(), watcher::Config::default());
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let objects = match event {
                    Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => vec![s],
                    _ => continue,
                };
                let mut seen = launched.lock().unwrap_or_else(|p| p.into_inner());
                for s in objects {
                    seen.entry(s.name_any())
                        .or_default()
                        .insert(s.uid().unwrap_or_default());
                }
            }
        })
    };

    // Seed 1: trajectories 0 and 1 both pass, so the first stride cannot make a balanced group and
    // the second stride is launched by whoever leads after the kill.
    let (seed, pass) = (1, 50);
    let mut template = orchard_testcluster::test_support::rollouts::template(
        &reward_script(seed, pass, None, Some(3)),
        60,
    );
    template["spec"]["image"] = json!(env.node.real().image("busybox"));
    groups
        .create(
            &PostParams::default(),
            &group(
                "failover",
                json!({"groupSize": 2, "maxTrajectories": 8, "stride": 2, "template": template}),
            ),
        )
        .await
        .expect("create group");
    // Kill the leader while the first stride runs (its runners sleep 3 s before the result).
    wait::poll(
        "the first stride launched",
        Duration::from_secs(60),
        || async {
            let n = launched.lock().unwrap_or_else(|p| p.into_inner()).len();
            (n >= 2).then_some(())
        },
    )
    .await;
    let leader = release
        .leader(&client)
        .await
        .expect("lease")
        .expect("a leader");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &release.namespace);
    pods.delete(
        &leader,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .expect("kill the leader pod");
    let next = wait::poll("another Lease holder", Duration::from_secs(60), || async {
        release
            .leader(&client)
            .await
            .ok()
            .flatten()
            .filter(|holder| *holder != leader)
    })
    .await;
    println!("leader {leader} killed; {next} took over");

    let done = wait::until(&groups, "failover", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    assert_eq!(status.phase, Some(RolloutPhase::Complete), "{status:?}");
    orchard_testcluster::test_support::rollouts::assert_matches_engine(&done);
    // Recorded from a run of this test for its fixed seed (`Recorded`): a change means BAR's choice
    // changed.
    orchard_testcluster::test_support::rollouts::assert_recorded(
        &done,
        &orchard_testcluster::test_support::rollouts::Recorded {
            selection: orchard_operator::api::Selection::Balanced,
            positives: 1,
            members: &["failover-0", "failover-3"],
        },
    );
    for record in &status.trajectories {
        let index = record
            .name
            .rsplit('-')
            .next()
            .and_then(|i| i.parse::<u64>().ok())
            .expect("trajectory index");
        if let Some(reward) = record.reward {
            assert_eq!(
                reward,
                expected(seed, pass, index).0,
                "{} recorded its own reward",
                record.name
            );
        }
    }
    recorder.abort();
    let seen = launched.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let twice: Vec<_> = seen.iter().filter(|(_, uids)| uids.len() > 1).collect();
    assert!(twice.is_empty(), "launched twice: {twice:?}");
    assert!(
        status.strides_launched >= 2,
        "a stride was launched after the takeover: {status:?}"
    );
    assert_eq!(
        seen.len(),
        usize::try_from(status.trajectories_launched).unwrap_or_default(),
        "every launched trajectory is recorded once"
    );
    println!(
        "{} trajectories launched once each; group {:?}",
        seen.len(),
        status.group
    );
    // The Deployment replaces the killed pod; the next tests want two replicas again.
    wait::poll(
        "two Ready operator pods",
        Duration::from_secs(120),
        || async {
            let pods = release.pods(&client).await.ok()?;
            let ready = pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_is_ready(p))
                .count();
            (ready == 2).then_some(())
        },
    )
    .await;
    env.delete_namespace(&ns).await;
}

// ---------------------------------------------------------------------------------------------------
// NetworkPolicies, enforced by kube-router on the node: real packets from real containers.

/// A TCP listener on `ip` (a port of its own) that accepts and closes every connection.
async fn listener_on(ip: std::net::Ipv4Addr) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .unwrap_or_else(|e| panic!("bind a listener on {ip}: {e}"));
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    address
}

/// A listener on the node's "outside" host address (a host address of this machine that is neither
/// the API server's nor the node's).
async fn outside_listener(env: &TestEnv) -> std::net::SocketAddr {
    listener_on(env.node.real().namespaces.layout.outside_ip).await
}

/// Whether `pod` is Ready (its readiness probe passes).
fn pod_is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A Python one-liner: TCP connect to `ip:port` within 3 s; prints `open` or `closed <error>`.
fn tcp_probe(ip: &str, port: u16) -> Vec<String> {
    let code = format!(
        "import socket\ntry:\n    socket.create_connection(('{ip}', {port}), 3).close(); print('open')\nexcept OSError as e:\n    print('closed', type(e).__name__)"
    );
    vec!["python3".into(), "-c".into(), code]
}

/// A Python one-liner: one UDP datagram to `ip:port`, an echo expected within 3 s; prints
/// `answered` or `silent <error>`.
fn udp_probe(ip: &str, port: u16) -> Vec<String> {
    let code = format!(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)\ntry:\n    s.sendto(b'ping', ('{ip}', {port})); s.recvfrom(64); print('answered')\nexcept OSError as e:\n    print('silent', type(e).__name__)"
    );
    vec!["python3".into(), "-c".into(), code]
}

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

/// Runs `script` with `/bin/sh -c` in sandbox `name` (see [`run_in`]).
async fn sh_in(caller: &Caller, ns: &str, name: &str, script: &str) -> String {
    run_in(
        caller,
        ns,
        name,
        vec!["/bin/sh".into(), "-c".into(), script.into()],
    )
    .await
}

/// Creates sandboxes `(name, network)` from the Debian image and waits until all are Ready.
async fn network_sandboxes(env: &TestEnv, caller: &Caller, ns: &str, specs: &[(&str, Value)]) {
    let image = env.node.real().image("debian-python");
    for (name, network) in specs {
        caller
            .create_sandbox(
                ns,
                json!({"name": name, "image": image, "network": network}),
            )
            .await;
    }
    for (name, _) in specs {
        caller.wait_ready(ns, name).await;
    }
}

/// The pod IP of sandbox `name`.
async fn pod_ip(client: &kube::Client, ns: &str, name: &str) -> String {
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("sandbox pod");
    pod.status
        .and_then(|s| s.pod_ip)
        .expect("the pod has an IP")
}

/// A plain Pod (not a sandbox) from the Debian image running `command`, labelled `labels`; waits
/// until it runs and returns its IP.
async fn plain_pod(env: &TestEnv, ns: &str, name: &str, labels: Value, command: &str) -> String {
    let client = env.client().await;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
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
    running.status.and_then(|s| s.pod_ip).expect("pod IP")
}

/// A Python program that answers every UDP datagram on port 53 with the same bytes.
const UDP_ECHO_53: &str = "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('0.0.0.0', 53))\nwhile True:\n    data, peer = s.recvfrom(512); s.sendto(data, peer)";

/// A Python program that tries `ip:port` once a second and prints one line per attempt.
fn tcp_loop(ip: &str, port: u16) -> String {
    format!(
        "import socket, time\nwhile True:\n    try:\n        socket.create_connection(('{ip}', {port}), 2).close(); print('open', flush=True)\n    except OSError as e:\n        print('closed', type(e).__name__, flush=True)\n    time.sleep(1)"
    )
}

/// The last line a pod printed (`kubectl logs`).
async fn last_log_line(env: &TestEnv, ns: &str, name: &str) -> String {
    let api: Api<Pod> = Api::namespaced(env.client().await, ns);
    let logs = api
        .logs(name, &kube::api::LogParams::default())
        .await
        .unwrap_or_default();
    logs.lines().last().unwrap_or_default().to_string()
}

/// Polls until pod `name`'s latest line starts with `prefix` (the attempts run once a second).
async fn pod_reports(env: &TestEnv, ns: &str, name: &str, prefix: &str) -> String {
    wait::poll(
        &format!("{name} to report `{prefix}`"),
        Duration::from_secs(30),
        || async {
            let line = last_log_line(env, ns, name).await;
            line.starts_with(prefix).then_some(line)
        },
    )
    .await
}

#[tokio::test]
async fn the_agent_comes_from_a_read_only_image_volume_without_an_init_container() {
    let _shared = OPERATOR_PODS.read().await;
    let env = env();
    let release = release().await;
    let client = env.client().await;
    let ns = env.namespace("image-volume").await;
    let caller = admin_at(env, release.gateway_url(&client).await.expect("url"));
    network_sandboxes(env, &caller, &ns, &[("iv", json!({"egress": "Deny"}))]).await;
    let pod = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("iv")
        .await
        .expect("the sandbox's pod");
    let spec = pod.spec.expect("pod spec");
    assert_eq!(spec.init_containers, None, "no init container");
    let image = spec.volumes.iter().flatten().find_map(|v| v.image.clone());
    assert_eq!(
        image.and_then(|i| i.reference).as_deref(),
        Some(release.agent_image.as_str()),
        "the release's agent image is the volume"
    );
    let mount = sh_in(&caller, &ns, "iv", "grep ' /opt/orchard ' /proc/mounts").await;
    assert!(
        mount
            .split_whitespace()
            .nth(3)
            .is_some_and(|o| o.split(',').any(|f| f == "ro")),
        "mounted read-only: {mount}"
    );
    let write = sh_in(
        &caller,
        &ns,
        "iv",
        "echo x > /opt/orchard/orchard-agent 2>/dev/null && echo written || echo refused",
    )
    .await;
    assert_eq!(write, "refused", "task code cannot replace the agent");
    env.delete_namespace(&ns).await;
}

/// kube-router programs a new pod's rules some time after the pod's network is up; a sandbox is
/// Ready only after that (`sandboxEgress.awaitEnforcement`, on by default): its agent served nothing
/// until its egress to the API server was refused. Several sandboxes at once, each probed outside the
/// moment it is Ready.
#[tokio::test]
async fn a_sandbox_is_ready_only_once_its_policies_are_enforced() {
    let _shared = OPERATOR_PODS.read().await;
    let env = env();
    let release = release().await;
    let client = env.client().await;
    let ns = env.namespace("np-first").await;
    let caller = admin_at(env, release.gateway_url(&client).await.expect("url"));
    let outside = outside_listener(env).await;
    let (ip, port) = (outside.ip().to_string(), outside.port());
    let image = env.node.real().image("debian-python");
    let names: Vec<String> = (0..4).map(|i| format!("first-{i}")).collect();
    for name in &names {
        caller
            .create_sandbox(
                &ns,
                json!({"name": name, "image": image, "network": {"egress": "Deny"}}),
            )
            .await;
    }
    let probes = names.iter().map(|name| {
        let (caller, ns, ip) = (&caller, &ns, &ip);
        async move {
            caller.wait_ready(ns, name).await;
            (name, run_in(caller, ns, name, tcp_probe(ip, port)).await)
        }
    });
    for (name, answer) in futures::future::join_all(probes).await {
        assert!(
            answer.starts_with("closed"),
            "{name} reached the outside host on its first exec after Ready: {answer}"
        );
    }
    // Each agent waited for the enforcer, and says so.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let params = kube::api::LogParams {
        container: Some("sandbox".into()),
        ..kube::api::LogParams::default()
    };
    for name in &names {
        let logs = pods.logs(name, &params).await.expect("agent logs");
        let line = logs
            .lines()
            .find(|l| l.contains("network policy enforced"))
            .unwrap_or_else(|| panic!("{name}'s agent did not wait for its policies:\n{logs}"));
        eprintln!("{name}: {line}");
    }
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn deny_blocks_every_connection_and_only_the_operator_reaches_agents() {
    let _shared = OPERATOR_PODS.read().await;
    let env = env();
    let release = release().await;
    let client = env.client().await;
    let ns = env.namespace("np-deny").await;
    let caller = admin_at(env, release.gateway_url(&client).await.expect("url"));
    let outside = outside_listener(env).await;
    let (ip, port) = (outside.ip().to_string(), outside.port());
    network_sandboxes(
        env,
        &caller,
        &ns,
        &[
            ("closed", json!({"egress": "Deny"})),
            ("open", json!({"egress": "AllowAll"})),
            ("peer", json!({"egress": "Deny"})),
        ],
    )
    .await;
    // Positive control: the listener is reachable from a pod that may go out.
    assert_eq!(
        run_in(&caller, &ns, "open", tcp_probe(&ip, port)).await,
        "open"
    );
    let denied = run_in(&caller, &ns, "closed", tcp_probe(&ip, port)).await;
    assert!(
        denied.starts_with("closed"),
        "Deny reaches outside: {denied}"
    );

    // Agents: the gateway (an operator pod) reaches the peer's agent; no sandbox does.
    let peer = pod_ip(&client, &ns, "peer").await;
    assert_eq!(run_in(&caller, &ns, "peer", vec!["true".into()]).await, "");
    for from in ["closed", "open"] {
        let answer = run_in(&caller, &ns, from, tcp_probe(&peer, 9090)).await;
        assert!(
            answer.starts_with("closed"),
            "sandbox {from} reaches another sandbox's agent: {answer}"
        );
    }
    // Another pod of the namespace (no sandbox, no policy of its own) reaches the outside host but not
    // the agent port.
    plain_pod(
        env,
        &ns,
        "bystander-out",
        json!({"app": "bystander"}),
        &tcp_loop(&ip, port),
    )
    .await;
    pod_reports(env, &ns, "bystander-out", "open").await;
    plain_pod(
        env,
        &ns,
        "bystander-agent",
        json!({"app": "bystander"}),
        &tcp_loop(&peer, 9090),
    )
    .await;
    // Several attempts, none open.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let logs = api
        .logs("bystander-agent", &kube::api::LogParams::default())
        .await
        .expect("logs");
    assert!(
        logs.lines().count() >= 1 && logs.lines().all(|l| l.starts_with("closed")),
        "a bystander pod reached a sandbox's agent port:\n{logs}"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn allow_list_reaches_exactly_its_destination_and_the_cluster_resolver() {
    let _shared = OPERATOR_PODS.read().await;
    let env = env();
    let release = release().await;
    let client = env.client().await;
    let ns = env.namespace("np-allow").await;
    let caller = admin_at(env, release.gateway_url(&client).await.expect("url"));
    let allowed = outside_listener(env).await;
    let other_port = outside_listener(env).await;
    let ip = allowed.ip().to_string();

    // The cluster resolver (what the operator's `--dns-*` flags select: kube-system, k8s-app=kube-dns)
    // and an impostor with the same program in the test namespace.
    let resolver = plain_pod(
        env,
        "kube-system",
        &format!("resolver-{ns}"),
        json!({"k8s-app": "kube-dns"}),
        UDP_ECHO_53,
    )
    .await;
    let impostor = plain_pod(
        env,
        &ns,
        "impostor",
        json!({"app": "impostor"}),
        UDP_ECHO_53,
    )
    .await;

    network_sandboxes(
        env,
        &caller,
        &ns,
        &[
            (
                "listed",
                json!({"egress": "AllowList", "allow": [
                    {"cidr": format!("{ip}/32"), "ports": [{"port": allowed.port()}]}
                ]}),
            ),
            ("closed", json!({"egress": "Deny"})),
        ],
    )
    .await;
    assert_eq!(
        run_in(&caller, &ns, "listed", tcp_probe(&ip, allowed.port())).await,
        "open",
        "the listed CIDR and port"
    );
    let wrong_port = run_in(&caller, &ns, "listed", tcp_probe(&ip, other_port.port())).await;
    assert!(
        wrong_port.starts_with("closed"),
        "another port: {wrong_port}"
    );
    let api_server = env.node.real().namespaces.layout.host_ip.to_string();
    let other_host = run_in(
        &caller,
        &ns,
        "listed",
        tcp_probe(&api_server, allowed.port()),
    )
    .await;
    assert!(
        other_host.starts_with("closed"),
        "another address: {other_host}"
    );

    // DNS: the cluster resolver only, and only under AllowList.
    assert_eq!(
        run_in(&caller, &ns, "listed", udp_probe(&resolver, 53)).await,
        "answered",
        "AllowList reaches the cluster resolver"
    );
    let impostor_answer = run_in(&caller, &ns, "listed", udp_probe(&impostor, 53)).await;
    assert!(
        impostor_answer.starts_with("silent"),
        "AllowList reaches a non-resolver on port 53: {impostor_answer}"
    );
    let denied_dns = run_in(&caller, &ns, "closed", udp_probe(&resolver, 53)).await;
    assert!(
        denied_dns.starts_with("silent"),
        "Deny reaches the resolver: {denied_dns}"
    );
    let _ = Api::<Pod>::namespaced(client.clone(), "kube-system")
        .delete(&format!("resolver-{ns}"), &DeleteParams::default())
        .await;
    env.delete_namespace(&ns).await;
}

/// Runs `probe` in sandbox `name` until it prints `open`, for up to 15 s (a claimed pool member is
/// relabelled into its sandbox's egress policy at the claim; the enforcer applies the policy to it when
/// it next syncs, the namespace's default-deny baseline until then). Returns the last answer.
async fn open_within(caller: &Caller, ns: &str, name: &str, probe: Vec<String>) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let answer = run_in(caller, ns, name, probe.clone()).await;
        if answer == "open" || tokio::time::Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn a_claimed_pool_member_gets_its_sandboxs_egress_policy_not_the_pools() {
    let _shared = OPERATOR_PODS.read().await;
    let env = env();
    let release = release().await;
    let client = env.client().await;
    let ns = env.namespace("np-pool").await;
    let caller = admin_at(env, release.gateway_url(&client).await.expect("url"));
    let allowed = outside_listener(env).await;
    let other = outside_listener(env).await;
    let ip = allowed.ip().to_string();
    let image = env.node.real().image("debian-python");
    // The template's network is a default for claimers; the members themselves have no egress.
    let pool: SandboxPool = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool", "metadata": {"name": "py"},
        "spec": {"replicas": 1, "template": {"image": image, "network": {"egress": "AllowAll"}}},
    }))
    .expect("pool JSON");
    let pools: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create pool");
    let member_ready = |p: Option<&SandboxPool>| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.ready_replicas == 1)
    };
    wait::until(
        &pools,
        "py",
        "a Ready member",
        Duration::from_secs(180),
        member_ready,
    )
    .await;

    // Its own allow-list: the listed port opens, the template's AllowAll does not apply.
    caller
        .create_sandbox(
            &ns,
            json!({"name": "listed", "pool": "py", "network": {"egress": "AllowList", "allow": [
                {"cidr": format!("{ip}/32"), "ports": [{"port": allowed.port()}]}]}}),
        )
        .await;
    let ready = caller.wait_ready(&ns, "listed").await;
    let member = ready["status"]["podName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(member.starts_with("py-"), "a claimed member: {ready}");
    assert_eq!(
        open_within(&caller, &ns, "listed", tcp_probe(&ip, allowed.port())).await,
        "open",
        "the sandbox's own allow-list applies to the claimed member"
    );
    let elsewhere = run_in(&caller, &ns, "listed", tcp_probe(&ip, other.port())).await;
    assert!(
        elsewhere.starts_with("closed"),
        "nothing of the pool template's AllowAll: {elsewhere}"
    );

    // A claimer that leaves `network` unset gets the template's default.
    wait::until(
        &pools,
        "py",
        "refilled",
        Duration::from_secs(180),
        member_ready,
    )
    .await;
    // `Wait`: the pool's status can still show the member "listed" claimed as Ready; the claimer waits
    // for the refill instead of starting cold.
    caller
        .create_sandbox(
            &ns,
            json!({"name": "defaulted", "pool": "py", "whenPoolEmpty": "Wait"}),
        )
        .await;
    let ready = caller.wait_ready(&ns, "defaulted").await;
    assert!(
        ready["status"]["podName"]
            .as_str()
            .unwrap_or_default()
            .starts_with("py-"),
        "{ready}"
    );
    assert_eq!(
        open_within(&caller, &ns, "defaulted", tcp_probe(&ip, other.port())).await,
        "open",
        "the template's AllowAll"
    );
    env.delete_namespace(&ns).await;
}

/// A Python program that tries every `ip:port` of `targets` each second and prints one JSON object
/// per round: `{"ip:port": "open" | "closed"}`.
fn tcp_rounds(targets: &[(String, u16)]) -> String {
    let list: Vec<String> = targets
        .iter()
        .map(|(ip, port)| format!("('{ip}', {port})"))
        .collect();
    format!(
        "import json, socket, time\ntargets = [{}]\nwhile True:\n    seen = {{}}\n    for ip, port in targets:\n        try:\n            socket.create_connection((ip, port), 2).close(); seen[f'{{ip}}:{{port}}'] = 'open'\n        except OSError:\n            seen[f'{{ip}}:{{port}}'] = 'closed'\n    print(json.dumps(seen), flush=True)\n    time.sleep(1)",
        list.join(", ")
    )
}

#[tokio::test]
async fn allow_all_and_allow_list_never_reach_protected_addresses_the_api_server_or_the_operator() {
    let _shared = OPERATOR_PODS.read().await;
    let env = env();
    let release = release().await;
    let client = env.client().await;
    let ns = env.namespace("np-protected").await;
    let caller = admin_at(env, release.gateway_url(&client).await.expect("url"));
    let layout = &env.node.real().namespaces.layout;

    // Listeners: an ordinary outside host and the one the chart was told to protect (a stand-in for
    // 169.254.169.254, which this machine must keep for itself).
    let outside = outside_listener(env).await;
    let protected = listener_on(layout.protected_ip).await;
    let api_port: u16 = env
        .control_plane
        .server
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("API server port");
    let api_server = (layout.host_ip.to_string(), api_port);
    let operator_pod = release
        .pods(&client)
        .await
        .expect("operator pods")
        .into_iter()
        .find_map(|p| p.status.and_then(|s| s.pod_ip))
        .expect("an operator pod IP");
    // A pod in another namespace that serves TCP: AllowAll reaches pods outside the operator's.
    let server_ns = env.namespace("np-server").await;
    let server = plain_pod(
        env,
        &server_ns,
        "server",
        json!({"app": "server"}),
        "import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('0.0.0.0', 8000)); s.listen()\nwhile True:\n    c, _ = s.accept(); c.close()",
    )
    .await;

    let targets = vec![
        (outside.ip().to_string(), outside.port()),
        (protected.ip().to_string(), protected.port()),
        api_server.clone(),
        (operator_pod.clone(), 8080),
        (server.clone(), 8000),
    ];
    // Positive control: a pod with no policy reaches every target.
    plain_pod(
        env,
        &ns,
        "bystander",
        json!({"app": "bystander"}),
        &tcp_rounds(&targets),
    )
    .await;
    // The chart's own NetworkPolicy admits the bystander to the gateway only once the enforcer has
    // put the new pod's address into the policy's peers (kube-router syncs on pod events): its first
    // rounds may still be refused. The control is that it reaches every target once programmed.
    let all_open = |line: &str| {
        serde_json::from_str::<Value>(line).is_ok_and(|seen| {
            targets
                .iter()
                .all(|(ip, port)| seen[format!("{ip}:{port}")] == "open")
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut refused = Vec::new();
    loop {
        let line = last_log_line(env, &ns, "bystander").await;
        if all_open(&line) {
            eprintln!("control: every target open; rounds before: {refused:?}");
            break;
        }
        if line.starts_with('{') && refused.last() != Some(&line) {
            refused.push(line.clone());
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "control: a pod without policy reaches every target within 30 s; last round: {line}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let (outside_cidr, api_cidr) = (layout.outside_cidr(), format!("{}/32", layout.host_ip));
    network_sandboxes(
        env,
        &caller,
        &ns,
        &[
            ("wide", json!({"egress": "AllowAll"})),
            (
                "listed",
                json!({"egress": "AllowList", "allow": [{"cidr": outside_cidr}, {"cidr": api_cidr}]}),
            ),
        ],
    )
    .await;
    let probe = |ip: &str, port: u16| tcp_probe(ip, port);
    let wide = |ip: String, port: u16| {
        let caller = caller.clone();
        let ns = ns.clone();
        async move { run_in(&caller, &ns, "wide", probe(&ip, port)).await }
    };
    assert_eq!(wide(outside.ip().to_string(), outside.port()).await, "open");
    assert_eq!(wide(server.clone(), 8000).await, "open", "pods elsewhere");
    for (ip, port, what) in [
        (
            protected.ip().to_string(),
            protected.port(),
            "a protected CIDR",
        ),
        (api_server.0.clone(), api_server.1, "the API server"),
        (operator_pod.clone(), 8080, "the operator's gateway pod"),
    ] {
        let answer = wide(ip.clone(), port).await;
        assert!(
            answer.starts_with("closed"),
            "AllowAll reaches {what} {ip}:{port}: {answer}"
        );
    }
    let service = run_in(
        &caller,
        &ns,
        "wide",
        vec![
            "python3".into(),
            "-c".into(),
            "import os, socket\ntry:\n    socket.create_connection((os.environ['KUBERNETES_SERVICE_HOST'], 443), 3).close(); print('open')\nexcept OSError as e:\n    print('closed', type(e).__name__)".into(),
        ],
    )
    .await;
    assert!(
        service.starts_with("closed"),
        "AllowAll reaches the kubernetes Service: {service}"
    );

    // AllowList: the listed /30 minus the protected address inside it; the API server's address is
    // refused outright, with an event saying so.
    let listed = |ip: String, port: u16| {
        let caller = caller.clone();
        let ns = ns.clone();
        async move { run_in(&caller, &ns, "listed", tcp_probe(&ip, port)).await }
    };
    assert_eq!(
        listed(outside.ip().to_string(), outside.port()).await,
        "open"
    );
    let answer = listed(protected.ip().to_string(), protected.port()).await;
    assert!(
        answer.starts_with("closed"),
        "AllowList reaches the protected address: {answer}"
    );
    let answer = listed(api_server.0.clone(), api_server.1).await;
    assert!(
        answer.starts_with("closed"),
        "AllowList reaches the API server: {answer}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let refused = wait::poll(
        "an EgressRuleRefused event",
        Duration::from_secs(30),
        || async {
            events
                .list(&kube::api::ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("EgressRuleRefused"))
        },
    )
    .await;
    let note = refused.note.unwrap_or_default();
    assert!(note.contains(&format!("{}/32", layout.host_ip)), "{note}");
    env.delete_namespace(&server_ns).await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn python_sdk_tests_pass_against_the_in_cluster_gateway() {
    let _shared = OPERATOR_PODS.read().await;
    let env = env();
    let release = release().await;
    let client = env.client().await;
    let image = env.node.real().image("debian-python");
    let target = orchard_testcluster::test_support::sdk::SdkTarget {
        gateway: release.gateway_url(&client).await.expect("gateway URL"),
        metrics: format!(
            "{}/metrics",
            release
                .service_url(&client, "metrics")
                .await
                .expect("metrics URL")
        ),
        image: image.clone(),
        python_image: image,
        // Only the operator's pods reach agents here: this process is not one of them.
        direct: false,
    };
    let run = orchard_testcluster::test_support::sdk::run_sdk_tests(env, &target).await;
    if let Some(status) = run.failure {
        panic!(
            "pytest failed ({status}); operator logs:\n{}",
            release.logs(40).await
        );
    }
    let skipped: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.starts_with("SKIPPED"))
        .collect();
    assert_eq!(skipped.len(), 1, "only direct mode is skipped: {skipped:?}");
    assert!(
        skipped[0].contains("test_lifecycle.py")
            && skipped[0].contains("only from the operator's pods"),
        "only direct mode is skipped: {skipped:?}"
    );
}

/// Whether `result` is the chart's admission policy refusing `orchard.dev/` labels.
fn refused_by_label_policy<T: std::fmt::Debug>(result: &Result<T, kube::Error>) -> bool {
    match result {
        Err(kube::Error::Api(status)) => status
            .message
            .contains("labels under orchard.dev/ are set by the Orchard Env operator only"),
        _ => false,
    }
}

#[tokio::test]
async fn only_the_operator_sets_orchard_labels_on_pods() {
    let _operator_pods = OPERATOR_PODS.read().await;
    let env = env();
    release().await;
    let ns = env.namespace("labels").await;
    let admin = admin_at(
        env,
        release()
            .await
            .gateway_url(&env.client().await)
            .await
            .expect("url"),
    );
    // bob may create and change pods in the namespace (but not NetworkPolicies).
    grant(
        env,
        &ns,
        "bob",
        "pod-author",
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "create", "patch"]}]),
    )
    .await;
    let bob = env
        .control_plane
        .client_with_token(&env.control_plane.tokens["bob"])
        .await
        .expect("bob's client");
    let pods: Api<Pod> = Api::namespaced(bob, &ns);
    let pod = |name: &str, labels: Value| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "main", "image": env.node.real().image("busybox"),
                                     "command": ["sleep", "3600"]}]},
        }))
        .expect("pod JSON")
    };
    // A sandbox whose egress bob would like to borrow, and whose pod he would take out of the
    // default-deny baseline.
    let created = admin
        .create_sandbox(
            &ns,
            json!({"name": "victim", "image": env.node.real().image("busybox"),
                                    "network": {"egress": "AllowAll"}}),
        )
        .await;
    admin.wait_ready(&ns, &created).await;

    let borrow = pods
        .create(
            &PostParams::default(),
            &pod("borrower", json!({"orchard.dev/sandbox": "victim"})),
        )
        .await;
    assert!(refused_by_label_policy(&borrow), "{borrow:?}");
    let plain = pods
        .create(
            &PostParams::default(),
            &pod("plain", json!({"app": "plain"})),
        )
        .await;
    assert!(
        plain.is_ok(),
        "a pod without orchard.dev/ labels is admitted: {plain:?}"
    );
    let relabel = pods
        .patch(
            "plain",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {"orchard.dev/sandbox": "victim"}}}),
            ),
        )
        .await;
    assert!(refused_by_label_policy(&relabel), "{relabel:?}");
    let escape = pods
        .patch(
            "victim",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {"orchard.dev/sandbox-pod": null}}}),
            ),
        )
        .await;
    assert!(refused_by_label_policy(&escape), "{escape:?}");
    let unrelated = pods
        .patch(
            "victim",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"team": "rl"}}})),
        )
        .await;
    assert!(unrelated.is_ok(), "other labels stay free: {unrelated:?}");
    env.delete_namespace(&ns).await;
}
