//! Sandboxes on the real node: kubelet, containerd, runc and a CNI bridge, images built here and pulled
//! from the node's own registry. Every sandbox is a real container, and the agent gets into it only
//! through the init container and the `emptyDir`, whatever the image holds: a Debian root filesystem,
//! a static busybox, or one static binary with no shell and no libc.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use orchard_operator::api::{
    RolloutGroup, RolloutPhase, RolloutQueue, Sandbox, SandboxPhase, Selection, TrajectoryStatus,
};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::gateway::{Caller, sandbox_path};
use orchard_testcluster::test_support::rollouts::{
    GROUP_TIMEOUT, Recorded, assert_matches_engine, assert_recorded, check_outcomes, group,
    is_complete, reward_script, wait_queue_idle, watch_pod_peak,
};
use orchard_testcluster::wait;
use serde_json::{Value, json};

const READY: Duration = Duration::from_secs(120);

fn env() -> &'static TestEnv {
    TestEnv::shared_real()
}

fn sandbox(name: &str, spec: Value) -> Sandbox {
    serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("valid sandbox JSON")
}

fn ready(s: Option<&Sandbox>) -> bool {
    s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Creates a sandbox from `image` (plus `extra` spec fields) and waits until it is Ready, also in the
/// gateway's cache (the calls that follow go through the gateway).
async fn ready_sandbox(ns: &str, name: &str, image: &str, extra: Value) -> Sandbox {
    let client = env().client().await;
    let api: Api<Sandbox> = Api::namespaced(client, ns);
    let mut spec = json!({"image": image});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    api.create(&PostParams::default(), &sandbox(name, spec))
        .await
        .expect("create sandbox");
    let ready = wait::until(&api, name, "Ready", READY, ready).await;
    Caller::user(env(), "admin").wait_ready(ns, name).await;
    ready
}

/// Waits until containerd runs no process of the containers labelled `label` (at once), and then
/// holds no record of them (the kubelet's container garbage collection runs once a minute).
async fn gone_from_containerd(
    node: &orchard_testcluster::real_node::RealNode,
    label: (&str, &str),
) {
    let ids = node.containers(Some(label)).expect("ctr containers");
    wait::poll("their processes gone", Duration::from_secs(30), || async {
        let tasks = node.tasks().ok()?;
        (!ids.iter().any(|id| tasks.contains(id))).then_some(())
    })
    .await;
    wait::poll(
        "their containers removed",
        Duration::from_secs(100),
        || async { node.containers(Some(label)).ok()?.is_empty().then_some(()) },
    )
    .await;
}

async fn exec(caller: &Caller, ns: &str, name: &str, request: Value) -> Value {
    let answer = caller.exec(ns, name, request).await;
    assert_eq!(answer.status, 200, "exec: {answer:?}");
    answer.body
}

async fn sh(caller: &Caller, ns: &str, name: &str, script: &str) -> Value {
    exec(caller, ns, name, json!({"argv": ["/bin/sh", "-c", script]})).await
}

fn stdout(answer: &Value) -> &str {
    answer["stdout"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_debian_image_runs_as_its_own_root_filesystem() {
    let env = env();
    let ns = env.namespace("real-debian").await;
    let image = env.node.real().image("debian-python");
    let admin = Caller::user(env, "admin");
    ready_sandbox(&ns, "deb", &image, json!({})).await;

    let release = sh(&admin, &ns, "deb", "cat /etc/os-release").await;
    assert!(
        stdout(&release).contains("VERSION_CODENAME=trixie"),
        "the image's os-release (Debian 13): {release}"
    );
    let host = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    assert_ne!(stdout(&release), host, "not the host's os-release");
    let inside = sh(
        &admin,
        &ns,
        "deb",
        "uname -n; python3 -c 'import sys; print(sys.version_info[0])'; git --version; test -e /work && echo host-filesystem || echo own-root",
    )
    .await;
    let lines: Vec<&str> = stdout(&inside).lines().collect();
    assert_eq!(lines.first(), Some(&"deb"), "its own hostname: {inside}");
    assert_eq!(lines.get(1), Some(&"3"), "python3 from the image: {inside}");
    assert!(
        lines.get(2).is_some_and(|l| l.starts_with("git version")),
        "{inside}"
    );
    assert_eq!(lines.get(3), Some(&"own-root"), "{inside}");
    // kube-proxy gives pods the `kubernetes` Service (the API server on the host's side of the node).
    let service = sh(
        &admin,
        &ns,
        "deb",
        "python3 -c \"import os, socket; socket.create_connection((os.environ['KUBERNETES_SERVICE_HOST'], 443), 5); print('connected')\"",
    )
    .await;
    assert_eq!(stdout(&service), "connected\n", "{service}");

    // Files and patches through the gateway.
    let put = admin
        .send(
            admin
                .request(
                    reqwest::Method::PUT,
                    &sandbox_path(&ns, "deb", "/files?path=/srv/app/greet.py"),
                )
                .body("print('hello')\n"),
        )
        .await;
    assert!(put.status == 201 || put.status == 200, "upload: {put:?}");
    let patch = "--- a/app/greet.py\n+++ b/app/greet.py\n@@ -1 +1 @@\n-print('hello')\n+print('hello from the patch')\n";
    let patched = admin
        .post(
            &sandbox_path(&ns, "deb", "/patch"),
            json!({"patch": patch, "cwd": "/srv", "strip": 1}),
        )
        .await;
    assert_eq!(patched.status, 200, "patch: {patched:?}");
    let run = exec(
        &admin,
        &ns,
        "deb",
        json!({"argv": ["python3", "/srv/app/greet.py"]}),
    )
    .await;
    assert_eq!(stdout(&run), "hello from the patch\n", "{run}");
    let got = admin
        .get(&sandbox_path(&ns, "deb", "/files?path=/srv/app/greet.py"))
        .await;
    assert_eq!(got.bytes, b"print('hello from the patch')\n");

    // Streaming exec: NDJSON events, the last one the exit.
    let stream = admin
        .send(
            admin
                .request(
                    reqwest::Method::POST,
                    &sandbox_path(&ns, "deb", "/exec/stream"),
                )
                .json(&json!({"argv": ["/bin/sh", "-c", "echo one; sleep 0.2; echo two"]})),
        )
        .await;
    assert_eq!(stream.status, 200, "{stream:?}");
    let text = String::from_utf8_lossy(&stream.bytes);
    assert!(text.contains("one") && text.contains("two"), "{text}");
    assert!(text.lines().count() >= 3, "several events: {text}");
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_busybox_image_runs_with_the_agent_as_pid_1() {
    let env = env();
    let ns = env.namespace("real-busybox").await;
    let image = env.node.real().image("busybox");
    let admin = Caller::user(env, "admin");
    ready_sandbox(&ns, "bb", &image, json!({})).await;

    let init = sh(&admin, &ns, "bb", "tr '\\0' ' ' < /proc/1/cmdline").await;
    assert!(
        stdout(&init).starts_with("/opt/orchard/orchard-agent serve"),
        "the agent is PID 1 of the task container: {init}"
    );
    // Orphans are re-parented to PID 1, which must reap them: each orphan's /proc entry goes away
    // (a zombie keeps it until it is reaped), and then no zombie is left.
    let orphans = sh(
        &admin,
        &ns,
        "bb",
        "for i in 1 2 3 4 5; do (sleep 0.1 & echo $!) ; done",
    )
    .await;
    let orphans = stdout(&orphans)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(orphans.split(' ').count(), 5, "five orphans: {orphans}");
    let still_there = format!("for p in {orphans}; do [ -e /proc/$p ] && echo $p; done; true");
    wait::poll("the orphans reaped", Duration::from_secs(15), || async {
        let left = sh(&admin, &ns, "bb", &still_there).await;
        stdout(&left).trim().is_empty().then_some(())
    })
    .await;
    let zombies = sh(
        &admin,
        &ns,
        "bb",
        "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l",
    )
    .await;
    assert_eq!(stdout(&zombies).trim(), "0", "orphans reaped: {zombies}");

    // A time-out kills the command's whole process group, background children included: the
    // `sleep 300` left in the background is gone within seconds, long before it would end by itself.
    let timed_out = exec(
        &admin,
        &ns,
        "bb",
        json!({"argv": ["/bin/sh", "-c", "sleep 300 & sleep 301"], "timeoutSeconds": 1}),
    )
    .await;
    assert_eq!(timed_out["timedOut"], true, "{timed_out}");
    wait::poll("no sleep survives", Duration::from_secs(15), || async {
        let left = sh(
            &admin,
            &ns,
            "bb",
            "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c 'sleep 30[01]' || true",
        )
        .await;
        (stdout(&left).trim() == "0").then_some(())
    })
    .await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn an_image_with_one_static_binary_and_no_shell_serves_argv_exec() {
    let env = env();
    let ns = env.namespace("real-probe").await;
    let image = env.node.real().image("probe");
    let admin = Caller::user(env, "admin");
    ready_sandbox(&ns, "bare", &image, json!({})).await;

    let echo = exec(
        &admin,
        &ns,
        "bare",
        json!({"argv": ["/orchard-probe", "echo", "no", "shell", "needed"]}),
    )
    .await;
    assert_eq!(echo["exitCode"], 0, "{echo}");
    assert_eq!(stdout(&echo), "no shell needed\n");
    let root = exec(
        &admin,
        &ns,
        "bare",
        json!({"argv": ["/orchard-probe", "ls", "/"]}),
    )
    .await;
    let entries: Vec<&str> = stdout(&root).lines().collect();
    assert!(entries.contains(&"orchard-probe"), "{root}");
    assert!(
        !entries.contains(&"bin") && !entries.contains(&"lib"),
        "nothing else in the image: {root}"
    );
    // There is no shell to run: the agent answers like a shell would, 127 and why.
    let shell = exec(
        &admin,
        &ns,
        "bare",
        json!({"argv": ["/bin/sh", "-c", "true"]}),
    )
    .await;
    assert_eq!(shell["exitCode"], 127, "{shell}");
    assert!(
        shell["error"]
            .as_str()
            .unwrap_or_default()
            .contains("/bin/sh"),
        "{shell}"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_memory_limit_is_enforced_by_the_cgroup() {
    let env = env();
    let ns = env.namespace("real-memory").await;
    let image = env.node.real().image("debian-python");
    let admin = Caller::user(env, "admin");
    ready_sandbox(
        &ns,
        "small",
        &image,
        json!({"resources": {"memory": "64Mi"}}),
    )
    .await;
    let limit = sh(
        &admin,
        &ns,
        "small",
        "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
    )
    .await;
    assert_eq!(stdout(&limit).trim(), (64u64 << 20).to_string(), "{limit}");
    let hog = admin
        .exec(
            &ns,
            "small",
            json!({"argv": ["python3", "-c", "b = bytearray(128 << 20); print(len(b))"], "timeoutSeconds": 60}),
        )
        .await;
    println!("allocating twice the limit: {hog:?}");
    assert_eq!(hog.status, 200, "{hog:?}");
    assert_eq!(
        hog.body["signal"], 9,
        "the allocation is OOM-killed: {hog:?}"
    );
    assert_eq!(hog.body["oomKilled"], true, "and says so: {hog:?}");
    assert_eq!(stdout(&hog.body), "", "{hog:?}");
    // The sandbox itself survives its command's OOM kill.
    let after = sh(&admin, &ns, "small", "echo alive").await;
    assert_eq!(stdout(&after), "alive\n");
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn an_image_missing_from_the_registry_fails_with_its_name() {
    let env = env();
    let ns = env.namespace("real-missing").await;
    let client = env.client().await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let image = env.node.real().image("no-such-image");
    api.create(
        &PostParams::default(),
        &sandbox("ghost", json!({"image": image})),
    )
    .await
    .expect("create");
    let failed = wait::until(&api, "ghost", "Failed", READY, |s: Option<&Sandbox>| {
        s.and_then(|s| s.status.as_ref())
            .is_some_and(|st| st.phase == Some(SandboxPhase::Failed))
    })
    .await;
    let status = failed.status.expect("status");
    let reason = status.reason.clone().unwrap_or_default();
    assert!(
        reason == "ErrImagePull" || reason == "ImagePullBackOff",
        "{status:?}"
    );
    assert!(
        status.message.clone().unwrap_or_default().contains(&image),
        "the message names the image: {status:?}"
    );
    // Failed frees the pod; deleting the Sandbox removes the rest; containerd keeps nothing of it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait::deleted(&pods, "ghost", Duration::from_secs(60)).await;
    api.delete("ghost", &DeleteParams::default())
        .await
        .expect("delete");
    wait::deleted(&api, "ghost", Duration::from_secs(30)).await;
    gone_from_containerd(env.node.real(), ("io.kubernetes.pod.namespace", &ns)).await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_rollout_group_completes_on_real_containers() {
    let env = env();
    let ns = env.namespace("real-group").await;
    let client = env.client().await;
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let image = env.node.real().image("busybox");
    let mut template = orchard_testcluster::test_support::rollouts::template(
        &reward_script(7, 50, None, None),
        60,
    );
    template["spec"]["image"] = json!(image);
    groups
        .create(
            &PostParams::default(),
            &group(
                "prompt-1",
                json!({"groupSize": 2, "maxTrajectories": 6, "stride": 2, "template": template}),
            ),
        )
        .await
        .expect("create group");
    let done = wait::until(&groups, "prompt-1", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.expect("status");
    assert_eq!(status.phase, Some(RolloutPhase::Complete), "{status:?}");
    assert_eq!(status.group.len(), 2, "{status:?}");
    let recorded = groups.get("prompt-1").await.expect("group");
    assert_matches_engine(&recorded);
    // Recorded from a run of this test for its fixed seed (`Recorded`).
    assert_recorded(
        &recorded,
        &Recorded {
            selection: Selection::Balanced,
            positives: 1,
            members: &["prompt-1-0", "prompt-1-1"],
        },
    );
    env.delete_namespace(&ns).await;
}

/// A RolloutQueue of two slots shared by three groups of real containers: the slots are counted from
/// the trajectory pods, whose real start and Terminating time the hollow node does not have, so at
/// most two run at once, every group still completes with its own group and nothing is aborted.
#[tokio::test]
async fn a_rollout_queue_shares_two_slots_between_groups_of_real_containers() {
    let env = env();
    let ns = env.namespace("real-queue").await;
    let client = env.client().await;
    let queues: Api<RolloutQueue> = Api::namespaced(client.clone(), &ns);
    let queue: RolloutQueue = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutQueue",
        "metadata": {"name": "shared"},
        "spec": {"maxRunningTrajectories": 2, "admission": "Fair"},
    }))
    .expect("valid RolloutQueue JSON");
    queues
        .create(&PostParams::default(), &queue)
        .await
        .expect("create queue");
    let pods = watch_pod_peak(&client, &ns, "orchard.dev/rollout-queue=shared");
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let image = env.node.real().image("busybox");
    let (seeds, pass) = ([31_u64, 32, 33], 50);
    for (g, seed) in seeds.iter().enumerate() {
        let mut spec = orchard_testcluster::test_support::rollouts::template(
            &reward_script(*seed, pass, None, None),
            60,
        );
        spec["spec"]["image"] = json!(image);
        groups
            .create(
                &PostParams::default(),
                &group(
                    &format!("q{g}"),
                    json!({"groupSize": 2, "maxTrajectories": 4, "stride": 2,
                           "queue": "shared", "template": spec}),
                ),
            )
            .await
            .expect("create group");
    }
    for (g, seed) in seeds.iter().enumerate() {
        let name = format!("q{g}");
        let done = wait::until(&groups, &name, "Complete", GROUP_TIMEOUT, is_complete).await;
        let status = done.status.clone().expect("status");
        check_outcomes(&status, *seed, pass, |_| false);
        assert_matches_engine(&done);
        // Recorded from a run of this test for its fixed seeds (`Recorded`): a change means BAR's
        // choice changed.
        assert_recorded(
            &done,
            &Recorded {
                selection: Selection::Balanced,
                positives: 1,
                members: &[&format!("{name}-0"), &format!("{name}-1")],
            },
        );
        assert!(
            status
                .trajectories
                .iter()
                .all(|t| t.status != Some(TrajectoryStatus::Aborted)),
            "waiting for the queue aborts nothing: {status:?}"
        );
    }
    let most = pods.lock().unwrap_or_else(|p| p.into_inner()).most;
    assert!(most <= 2, "at most 2 trajectory pods at once, saw {most}");
    assert!(most >= 1, "the watch saw the pods ({most})");
    wait_queue_idle(&queues, "shared").await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn heartbeat_expiry_removes_the_container_and_its_network_namespace() {
    let env = env();
    let ns = env.namespace("real-expiry").await;
    let node = env.node.real();
    let image = node.image("busybox");
    let client = env.client().await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    ready_sandbox(
        &ns,
        "brief",
        &image,
        json!({"lifecycle": {"heartbeatTimeoutSeconds": 3}}),
    )
    .await;
    let pod_uid = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("brief")
        .await
        .expect("pod")
        .uid()
        .expect("pod uid");
    assert!(
        node.containers(Some(("io.kubernetes.pod.uid", &pod_uid)))
            .expect("ctr")
            .len()
            >= 2,
        "the sandbox runs (pause and task containers)"
    );
    let netns = node
        .pod_network_namespace(&pod_uid)
        .expect("ctr")
        .expect("the pod has a network namespace");
    assert!(netns.exists(), "{}", netns.display());
    wait::deleted(&api, "brief", Duration::from_secs(30)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    wait::deleted(&pods, "brief", Duration::from_secs(60)).await;
    wait::poll(
        "the pod's network namespace gone",
        Duration::from_secs(30),
        || async { (!netns.exists()).then_some(()) },
    )
    .await;
    gone_from_containerd(node, ("io.kubernetes.pod.uid", &pod_uid)).await;
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn kubectl_exec_logs_and_port_forward_reach_a_sandbox_pod() {
    let env = env();
    let ns = env.namespace("real-kubectl").await;
    let image = env.node.real().image("busybox");
    ready_sandbox(&ns, "kc", &image, json!({})).await;
    let kubectl = |args: &[&str]| {
        std::process::Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &env.control_plane.kubeconfig)
            .output()
            .expect("kubectl runs")
    };
    let exec = kubectl(&["exec", "-n", &ns, "kc", "--", "/bin/busybox", "uname", "-n"]);
    assert!(
        exec.status.success(),
        "kubectl exec: {}",
        String::from_utf8_lossy(&exec.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&exec.stdout).trim(), "kc");
    let logs = kubectl(&["logs", "-n", &ns, "kc", "-c", "sandbox"]);
    assert!(
        logs.status.success(),
        "kubectl logs: {}",
        String::from_utf8_lossy(&logs.stderr)
    );
    assert!(!logs.stdout.is_empty(), "the agent logs at start");

    let forward = orchard_testcluster::port_forward::PortForward::start(
        &env.control_plane.kubeconfig,
        &ns,
        "pod/kc",
        9090,
    )
    .await
    .expect("kubectl port-forward");
    let address = format!("127.0.0.1:{}", forward.local_port);
    let answer = wait::poll("port-forward answers", Duration::from_secs(30), || async {
        let (status, _) = orchard_testcluster::http_get(&address, "/healthz")
            .await
            .ok()?;
        (status == 200).then_some(status)
    })
    .await;
    forward.stop().await;
    assert_eq!(answer, 200);
    env.delete_namespace(&ns).await;
}

/// A fresh namespace whose Pod Security admission enforces `level`.
async fn namespace_enforcing(prefix: &str, level: &str) -> String {
    let env = env();
    let ns = env.namespace(prefix).await;
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client().await);
    api.patch(
        &ns,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": level,
            "pod-security.kubernetes.io/enforce-version": "latest",
        }}})),
    )
    .await
    .expect("label the namespace");
    ns
}

/// `/proc/self/status` fields of a command run in the sandbox.
async fn process_security(caller: &Caller, ns: &str, name: &str) -> String {
    let answer = sh(
        caller,
        ns,
        name,
        "id -u; id -g; grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status",
    )
    .await;
    stdout(&answer).to_string()
}

#[tokio::test]
async fn pod_security_baseline_admits_default_sandboxes() {
    let env = env();
    let ns = namespace_enforcing("psa-baseline", "baseline").await;
    let admin = Caller::user(env, "admin");
    let image = env.node.real().image("debian-python");
    ready_sandbox(&ns, "plain", &image, json!({})).await;
    let seen = process_security(&admin, &ns, "plain").await;
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines.first(), Some(&"0"), "the image's user (root): {seen}");
    assert!(seen.contains("NoNewPrivs:\t1"), "{seen}");
    assert!(
        seen.contains("Seccomp:\t2"),
        "RuntimeDefault seccomp filter: {seen}"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn pod_security_restricted_admits_only_the_restricted_profile() {
    let env = env();
    let ns = namespace_enforcing("psa-restricted", "restricted").await;
    let client = env.client().await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let admin = Caller::user(env, "admin");
    let image = env.node.real().image("debian-python");

    // The default profile is refused by admission: the sandbox fails at once, saying why.
    api.create(
        &PostParams::default(),
        &sandbox("lax", json!({"image": image})),
    )
    .await
    .expect("create");
    let failed = wait::until(&api, "lax", "Failed", READY, |s: Option<&Sandbox>| {
        s.and_then(|s| s.status.as_ref())
            .is_some_and(|st| st.phase == Some(SandboxPhase::Failed))
    })
    .await;
    let status = failed.status.expect("status");
    assert_eq!(status.reason.as_deref(), Some("PodRejected"), "{status:?}");
    let message = status.message.unwrap_or_default();
    assert!(
        message.contains("violates PodSecurity") && message.contains("Restricted"),
        "{message}"
    );

    // Restricted, as a uid of our choosing: admitted, runs, and has no privileges at all.
    ready_sandbox(
        &ns,
        "strict",
        &image,
        json!({"security": {"profile": "Restricted", "runAsUser": 1000}}),
    )
    .await;
    let seen = process_security(&admin, &ns, "strict").await;
    let lines: Vec<&str> = seen.lines().collect();
    assert_eq!(lines.first(), Some(&"1000"), "runs as uid 1000: {seen}");
    assert_eq!(lines.get(1), Some(&"1000"), "and its group: {seen}");
    assert!(
        seen.contains("CapEff:\t0000000000000000"),
        "no capabilities: {seen}"
    );
    assert!(
        seen.contains("CapBnd:\t0000000000000000"),
        "none to regain: {seen}"
    );
    assert!(seen.contains("NoNewPrivs:\t1"), "{seen}");
    assert!(seen.contains("Seccomp:\t2"), "{seen}");
    // The agent works as non-root: files and Python (its token is out of reach: see
    // task_code_cannot_find_the_agent_token).
    let work = sh(
        &admin,
        &ns,
        "strict",
        "echo hi > /tmp/f && cat /tmp/f; python3 -c 'print(6*7)'",
    )
    .await;
    assert_eq!(stdout(&work), "hi\n42\n", "{work}");

    // Restricted without a uid: the nonroot default, also for an image with no user database.
    ready_sandbox(
        &ns,
        "bare",
        &env.node.real().image("probe"),
        json!({"security": {"profile": "Restricted"}}),
    )
    .await;
    let id = exec(
        &admin,
        &ns,
        "bare",
        json!({"argv": ["/orchard-probe", "id"]}),
    )
    .await;
    assert!(
        stdout(&id).starts_with("uid=65532 gid=65532"),
        "the default non-root uid: {id}"
    );
    env.delete_namespace(&ns).await;
}

/// What a command in the sandbox finds of the agent's token: files under `/var/run/orchard` (where
/// earlier versions handed a token over), whether the agent's (PID 1) environment, memory and mappings
/// are readable, read-only mounts under `/var/run/orchard*` (a Secret volume is one), and every file
/// under the likely paths that holds the token's text. The pod carries only the token's SHA-256.
async fn token_traces(caller: &Caller, ns: &str, name: &str, token: &str) -> String {
    // The token goes in as two halves, so that the command's own argv never holds it whole.
    let script = format!(
        "echo files=$(find /var/run/orchard -type f | wc -l); \
         cat /proc/1/environ >/dev/null 2>&1 && echo environ=readable || echo environ=denied; \
         ( exec 3</proc/1/mem ) 2>/dev/null && echo mem=readable || echo mem=denied; \
         cat /proc/1/maps >/dev/null 2>&1 && echo maps=readable || echo maps=denied; \
         echo secret-mounts=$(awk '$5 ~ /run[/]orchard/ && $6 ~ /^ro/' /proc/self/mountinfo | wc -l); \
         printf '%s' '{first}' > /tmp/needle-a; printf '%s' '{rest}' > /tmp/needle-b; \
         needle=$(cat /tmp/needle-a /tmp/needle-b); rm -f /tmp/needle-a /tmp/needle-b; \
         grep -rlsF \"$needle\" /var/run /opt/orchard /tmp /etc /proc/1/environ /proc/1/cmdline; echo done",
        first = &token[..token.len() / 2],
        rest = &token[token.len() / 2..],
    );
    let answer = sh(caller, ns, name, &script).await;
    stdout(&answer).to_string()
}

#[tokio::test]
async fn task_code_cannot_find_the_agent_token() {
    let env = env();
    let ns = env.namespace("token-reach").await;
    let admin = Caller::user(env, "admin");
    let image = env.node.real().image("debian-python");
    // As the image's root (the Default profile) and as a non-root uid (Restricted).
    for (name, extra) in [
        ("as-root", json!({})),
        (
            "as-user",
            json!({"security": {"profile": "Restricted", "runAsUser": 1000}}),
        ),
    ] {
        ready_sandbox(&ns, name, &image, extra).await;
        let token =
            orchard_testcluster::test_support::sandboxes::token_of(&env.client().await, &ns, name)
                .await;
        let seen = token_traces(&admin, &ns, name, &token).await;
        assert_eq!(
            seen, "files=0\nenviron=denied\nmem=denied\nmaps=denied\nsecret-mounts=0\ndone\n",
            "{name}: no token file, the agent's process is not readable, no Secret is mounted, and \
             the token is nowhere to be found"
        );
        // The agent still answers to the token (the gateway's calls above used it).
    }
    env.delete_namespace(&ns).await;
}

/// The mini-swe-agent example (`examples/minisweagent_rollout.py`) on real containers of the Debian
/// image: a trainer-driven RolloutGroup (N=4, Nmax=8, stride 4) whose episodes run mini-swe-agent's
/// agent loop with scripted models in the sandboxes through the gateway, rewarded trainer-side by
/// running the held-out tests; the script exits 0 only when the group is recorded Balanced with the
/// expected members.
#[tokio::test]
async fn mini_swe_agent_drives_a_balanced_group_on_real_containers() {
    let env = env();
    let ns = env.namespace("swe").await;
    let python = orchard_testcluster::test_support::sdk::sdk_python();
    let script =
        orchard_testcluster::binaries::workspace_root().join("examples/minisweagent_rollout.py");
    let run = tokio::process::Command::new(python)
        .arg(&script)
        .arg(env.operator().gateway_url())
        .arg(&env.control_plane.tokens["admin"])
        .arg(&ns)
        .arg(env.node.real().image("debian-python"))
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("the example finished within 10 minutes")
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    assert!(
        output.status.success(),
        "the group is not the expected balanced one ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    env.delete_namespace(&ns).await;
}

/// The GUI setup: `examples/playwright_gui.py` runs Chromium headless in a sandbox of the
/// `debian-chromium` image and drives it from this machine with Playwright for Python
/// (`connect_over_cdp`) through the SDK's port forward: it opens a page the sandbox serves, types,
/// clicks, reads the DOM and takes a screenshot, and prints them as one JSON line.
#[tokio::test]
async fn playwright_drives_chromium_in_a_sandbox_through_the_port_forward() {
    let env = env();
    let ns = env.namespace("gui").await;
    let python = orchard_testcluster::test_support::sdk::sdk_python();
    let root = orchard_testcluster::binaries::workspace_root();
    let run = tokio::process::Command::new(python)
        .arg(root.join("examples/playwright_gui.py"))
        // This checkout's SDK, whichever checkout the shared venv's editable install points at.
        .env("PYTHONPATH", root.join("sdk/python/src"))
        .arg(env.operator().gateway_url())
        .arg(&env.control_plane.tokens["admin"])
        .arg(&ns)
        .arg(env.node.real().image("debian-chromium"))
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the example finished within 5 minutes")
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    assert!(
        output.status.success(),
        "the example failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    let result: Value = stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str(line).ok())
        .unwrap_or_else(|| panic!("no JSON line in the output:\n{stdout}\n{stderr}"));
    assert_eq!(result["out"], "hello from the trainer", "{result}");
    assert!(
        result["screenshot_bytes"]
            .as_u64()
            .is_some_and(|n| n > 1000),
        "{result}"
    );
    assert_eq!(
        (result["width"].as_u64(), result["height"].as_u64()),
        (Some(1024), Some(640)),
        "the screenshot is not the viewport: {result}"
    );
    env.delete_namespace(&ns).await;
}

/// A root task in a Default sandbox tries to sniff its pod's traffic with a raw packet socket while
/// the gateway calls its agent: it prints how opening the socket went, then how many captured packets
/// held the agent's token (the token goes in as two halves, so its own request never holds it whole).
fn sniffer(token: &str) -> String {
    format!(
        r#"import socket, sys, time
needle = ('{first}' + '{rest}').encode()
try:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
except OSError as e:
    print('socket: refused', e.errno)
    print('matches=0')
    sys.exit(0)
print('socket: open')
s.settimeout(0.2)
end, matches, packets = time.time() + 4, 0, 0
while time.time() < end:
    try:
        data = s.recv(65535)
    except socket.timeout:
        continue
    packets += 1
    matches += needle in data
print('packets=%d' % packets)
print('matches=%d' % matches)
"#,
        first = &token[..token.len() / 2],
        rest = &token[token.len() / 2..],
    )
}

#[tokio::test]
async fn root_task_code_cannot_open_raw_sockets_to_sniff_the_agent_token() {
    let env = env();
    let ns = env.namespace("sniff").await;
    let admin = Caller::user(env, "admin");
    let image = env.node.real().image("debian-python");
    ready_sandbox(&ns, "as-root", &image, json!({})).await;
    let token =
        orchard_testcluster::test_support::sandboxes::token_of(&env.client().await, &ns, "as-root")
            .await;
    // The Default profile's bounding set leaves out CAP_NET_RAW (bit 13).
    let status = sh(&admin, &ns, "as-root", "grep CapBnd /proc/self/status").await;
    let bounding = stdout(&status)
        .split_whitespace()
        .nth(1)
        .and_then(|hex| u64::from_str_radix(hex, 16).ok())
        .expect("CapBnd");
    assert_eq!(bounding & (1 << 13), 0, "CAP_NET_RAW in {status}");
    // The sniffer runs for 4 s while the gateway keeps calling the agent with the token.
    let capture = {
        let (admin, ns, script) = (admin.clone(), ns.clone(), sniffer(&token));
        tokio::spawn(async move {
            exec(
                &admin,
                &ns,
                "as-root",
                json!({"argv": ["python3", "-c", script]}),
            )
            .await
        })
    };
    let mut calls = 0;
    while !capture.is_finished() {
        exec(&admin, &ns, "as-root", json!({"argv": ["true"]})).await;
        calls += 1;
    }
    let capture = capture.await.expect("sniffer");
    let out = stdout(&capture);
    eprintln!("{calls} gateway calls during the capture; sniffer: {out}");
    assert!(calls > 0);
    assert!(
        out.starts_with("socket: refused 1\n"),
        "root task code opened a raw packet socket (EPERM expected): {capture}"
    );
    assert!(out.contains("matches=0"), "{capture}");
    env.delete_namespace(&ns).await;
}

/// The harness routes in real containers, through the gateway: a shell session (state carried over,
/// a prompt answered, a run interrupted at its timeout) in the image's own shell (busybox `sh`, Debian
/// `bash`), a command as another uid, a port tunnel to a server bound to the container's 127.0.0.1,
/// and the container's usage.
#[tokio::test]
async fn sessions_users_tunnels_and_metrics_work_in_real_containers() {
    use orchard_testcluster::test_support::gateway::{Tunnel, get_through};
    let env = env();
    let ns = env.namespace("harness").await;
    let admin = Caller::user(env, "admin");
    let images = [
        (
            "busybox",
            "/bin/sh",
            "mkdir -p /tmp/www && echo served > /tmp/www/index.html && exec httpd -f -p 127.0.0.1:8080 -h /tmp/www",
        ),
        (
            "debian-python",
            "/bin/bash",
            "mkdir -p /tmp/www && echo served > /tmp/www/index.html && exec python3 -m http.server --bind 127.0.0.1 --directory /tmp/www 8080",
        ),
    ];
    for (index, (image, shell, server)) in images.into_iter().enumerate() {
        let name = format!("harness-{index}");
        ready_sandbox(&ns, &name, &env.node.real().image(image), json!({})).await;
        let at = |rest: &str| sandbox_path(&ns, &name, rest);

        let session = admin.post(&at("/sessions"), json!({})).await;
        assert_eq!(session.status, 201, "{image}: {session:?}");
        assert_eq!(
            session.body["shell"], shell,
            "{image}: the image's own shell"
        );
        let id = session.body["id"].as_str().expect("session id").to_string();
        let run = |command: &str, timeout_ms: u64| {
            let (admin, path) = (admin.clone(), at(&format!("/sessions/{id}/run")));
            let body = json!({"command": command, "timeoutMs": timeout_ms});
            async move { admin.post(&path, body).await }
        };
        assert_eq!(
            run("mkdir -p /tmp && cd /tmp && export X=42", 30_000)
                .await
                .status,
            200
        );
        let carried = run("pwd; echo $X", 30_000).await;
        assert_eq!(carried.body["output"], "/tmp\n42\n", "{image}: {carried:?}");
        let answer_prompt = async {
            let read = admin
                .post(
                    &at(&format!("/sessions/{id}/read")),
                    json!({"until": "name? ", "timeoutMs": 30_000}),
                )
                .await;
            assert_eq!(read.body["matched"], true, "{image}: {read:?}");
            let input = admin
                .post(
                    &at(&format!("/sessions/{id}/input")),
                    json!({"text": "bob\n"}),
                )
                .await;
            assert_eq!(input.status, 200, "{image}: {input:?}");
        };
        let (prompted, ()) = tokio::join!(
            run("printf 'name? '; read -r n; echo got:$n", 60_000),
            answer_prompt
        );
        assert_eq!(
            prompted.body["output"], "name? got:bob\n",
            "{image}: {prompted:?}"
        );
        let slow = run("sleep 1000", 1_000).await;
        assert_eq!(
            (&slow.body["timedOut"], &slow.body["exitCode"]),
            (&json!(true), &json!(130)),
            "{image}: {slow:?}"
        );
        assert_eq!(
            run("echo ok; pwd", 30_000).await.body["output"],
            "ok\n/tmp\n"
        );

        let other = exec(
            &admin,
            &ns,
            &name,
            json!({"argv": ["id", "-u"], "user": "65534"}),
        )
        .await;
        assert_eq!(stdout(&other), "65534\n", "{image}: {other}");

        let started = admin
            .post(
                &at("/processes"),
                json!({"argv": ["/bin/sh", "-c", server]}),
            )
            .await;
        assert_eq!(started.status, 201, "{image}: {started:?}");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let page = loop {
            match admin.tunnel(&ns, &name, "8080").await {
                Tunnel::Open(stream) => break get_through(stream, "/index.html").await,
                Tunnel::Refused(answer)
                    if answer.status == 502 && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Tunnel::Refused(answer) => panic!("{image}: the server never came up: {answer:?}"),
            }
        };
        assert!(
            page.contains(" 200 ") && page.ends_with("served\n"),
            "{image}: {page}"
        );

        // A directory out as a tar stream and back in elsewhere (mode and symlink kept), stat, rename.
        let made = sh(
            &admin,
            &ns,
            &name,
            "mkdir -p /tmp/d/e && echo hi > /tmp/d/e/run.sh && chmod 0755 /tmp/d/e/run.sh && ln -s e/run.sh /tmp/d/link",
        )
        .await;
        assert_eq!(made["exitCode"], 0, "{image}: {made}");
        let tar = admin
            .request(reqwest::Method::GET, &at("/files/tar?path=/tmp/d"))
            .send()
            .await
            .expect("tar download");
        assert_eq!(tar.status(), 200, "{image}");
        let tar = tar.bytes().await.expect("tar bytes");
        let extracted = admin
            .send(
                admin
                    .request(reqwest::Method::PUT, &at("/files/tar?path=/tmp/copy"))
                    .body(tar),
            )
            .await;
        assert_eq!(extracted.status, 201, "{image}: {extracted:?}");
        let script = admin.get(&at("/files/stat?path=/tmp/copy/e/run.sh")).await;
        let link = admin.get(&at("/files/stat?path=/tmp/copy/link")).await;
        assert_eq!(script.body["mode"], json!(0o755), "{image}: {script:?}");
        assert_eq!(
            (&link.body["type"], &link.body["target"]),
            (&json!("symlink"), &json!("e/run.sh")),
            "{image}: {link:?}"
        );
        let renamed = admin
            .post(
                &at("/files/rename"),
                json!({"from": "/tmp/copy/e/run.sh", "to": "/tmp/copy/moved.sh"}),
            )
            .await;
        assert_eq!(renamed.status, 200, "{image}: {renamed:?}");
        let moved = sh(&admin, &ns, &name, "cat /tmp/copy/moved.sh").await;
        assert_eq!(stdout(&moved), "hi\n", "{image}: {moved}");

        // The lifetime, set from now.
        let extended = admin
            .post(&at("/timeout"), json!({"timeoutSeconds": 900}))
            .await;
        assert_eq!(extended.status, 200, "{image}: {extended:?}");
        assert!(
            extended.body["ttlEndsAt"].is_string(),
            "{image}: {extended:?}"
        );

        let usage = admin.get(&at("/metrics")).await;
        assert_eq!(usage.status, 200, "{image}: {usage:?}");
        assert!(
            usage.body["memoryBytes"]
                .as_u64()
                .is_some_and(|bytes| bytes > 0),
            "{image}: {usage:?}"
        );
    }
    env.delete_namespace(&ns).await;
}
