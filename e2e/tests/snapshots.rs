//! SandboxSnapshots on the real node (issue 40): a Ready sandbox's filesystem committed through the
//! node's containerd while its processes are paused, pushed to the node's registry, and forked.
//!
//! One test walks a snapshot's whole life, in order (its phases share the prepared sandbox):
//! - a sandbox (the Debian image) writes files (an executable, a few MB of data, a deleted image file)
//!   and a checksum manifest, builds a Debian package with `dpkg-deb --build` and installs it with
//!   `dpkg -i` (no network: `orchard-hello` 1.0, one executable in `/usr/bin`), and keeps a writer
//!   running that appends to a log and bumps two counters, one after the other: in any instant's
//!   filesystem `log lines - 1 <= b <= a <= log lines` and `a - b <= 1`;
//! - its snapshot is Ready with a digest-pinned image on the sandbox's image, and the sandbox kept
//!   running (its writer went on);
//! - 8 forks start from it: each sees the files, the manifest verifies, the deleted file stays
//!   deleted, dpkg reports the package installed (`install ok installed 1.0`) and its executable
//!   runs, the counters satisfy the invariant (the layer is one instant's filesystem), no writer runs
//!   in them (memory is not kept), and what each writes later is its own;
//! - a snapshot with `spec.paths` `/usr/bin` and `/var/lib/dpkg` keeps the package (a fork of it has
//!   it installed and runs it) and nothing else: its layer is smaller, and the fork has neither
//!   `/work` nor `/usr/local/bin`'s tool, and has the image's `/etc/issue` back;
//! - a RolloutGroup whose template names the snapshot completes, every trajectory verifying the
//!   manifest and the package; a SandboxPool whose template names it builds its member from the
//!   snapshot's image, and a Sandbox of the pool claims that member (files and package there);
//! - a snapshot of a sandbox that is not Ready fails `SandboxNotReady`; a sandbox from a failed
//!   snapshot fails `SnapshotFailed`;
//! - the gateway's snapshot routes answer under RBAC (403 without `create sandboxsnapshots`), and the
//!   Python SDK's `sbx.fork(2)` starts two forks that verify the manifest and the package;
//! - the snapshot's deletion waits while forks use it (`InUse`), and completes once they are gone;
//! - with a registry that refuses the push, the snapshot fails `PushRefused` with crane's words and
//!   the sandbox keeps running (it was resumed).
//!
//! The environment runs no operator of its own: each part runs under an operator scoped to its
//! namespace, one with the node's registry and one with a registry nobody listens on.
//! `bench_fork_against_recreate` (ignored: `cargo test --test snapshots -- --ignored --nocapture`)
//! measures the costs docs/SNAPSHOTS.md reports.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use orchard_operator::api::{
    RolloutGroup, SNAPSHOT_BYTES_QUOTA, Sandbox, SandboxPhase, SandboxPool, SandboxSnapshot,
    SnapshotPhase,
};
use orchard_testcluster::env::{
    EnvOptions, NodeKind, REAL_NODE_DEFAULT_CPU, REAL_NODE_DEFAULT_MEMORY, TestEnv, snapshot_flags,
};
use orchard_testcluster::operator_process::OperatorProcess;
use orchard_testcluster::test_support::gateway::{Caller, scoped_operator};
use orchard_testcluster::test_support::rollouts::{GROUP_TIMEOUT, group, is_complete};
use orchard_testcluster::test_support::sandboxes::{is_failed, is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::{Value, json};

const READY: Duration = Duration::from_secs(180);
const COMMITTED: Duration = Duration::from_secs(240);
const FORKS: usize = 8;

fn env() -> &'static TestEnv {
    static ENV: std::sync::OnceLock<TestEnv> = std::sync::OnceLock::new();
    ENV.get_or_init(|| {
        TestEnv::start_named_on_own_thread(
            "snapshots",
            EnvOptions {
                operator: false,
                node: NodeKind::Real,
                ..EnvOptions::default()
            },
        )
    })
}

/// An operator for `namespace` only, committing through the node's containerd; `registry` replaces
/// the node's registry when given.
async fn operator(env: &TestEnv, namespace: &str, registry: Option<&str>) -> OperatorProcess {
    let node = env.node.real();
    let mut args = vec![
        format!("--agent-image={}", node.image("orchard-agent")),
        format!("--default-cpu={REAL_NODE_DEFAULT_CPU}"),
        format!("--default-memory={REAL_NODE_DEFAULT_MEMORY}"),
    ];
    for (flag, value) in snapshot_flags(node) {
        let value = match (flag, registry) {
            ("--snapshot-registry", Some(registry)) => registry.to_string(),
            _ => value,
        };
        args.push(format!("{flag}={value}"));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    scoped_operator(env, namespace, namespace, &args).await
}

fn caller(env: &TestEnv, operator: &OperatorProcess) -> Caller {
    Caller::at(
        &operator.gateway_url(),
        Some(&env.control_plane.tokens["admin"]),
    )
}

fn snapshot(name: &str, sandbox: &str, paths: &[&str]) -> SandboxSnapshot {
    serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxSnapshot",
        "metadata": {"name": name},
        "spec": {"sandbox": sandbox, "paths": paths},
    }))
    .expect("valid snapshot JSON")
}

fn settled(s: Option<&SandboxSnapshot>) -> bool {
    s.and_then(|s| s.status.as_ref())
        .is_some_and(|st| matches!(st.phase, Some(SnapshotPhase::Ready | SnapshotPhase::Failed)))
}

/// The `Ready` condition's (status, reason, message) of a snapshot.
fn ready_condition(s: &SandboxSnapshot) -> (String, String, String) {
    s.status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

async fn sh(caller: &Caller, ns: &str, name: &str, script: &str) -> String {
    let answer = caller
        .exec(
            ns,
            name,
            json!({"argv": ["/bin/bash", "-c", script], "timeoutSeconds": 120}),
        )
        .await;
    assert_eq!(answer.status, 200, "exec in {name}: {answer:?}");
    assert_eq!(
        answer.body["exitCode"], 0,
        "`{script}` in {name}: {}",
        answer.body
    );
    answer.body["stdout"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn create_ready(api: &Api<Sandbox>, name: &str, spec: Value) -> Sandbox {
    api.create(&PostParams::default(), &sandbox(name, spec))
        .await
        .expect("create sandbox");
    wait::until(api, name, "Ready", READY, is_ready).await
}

/// The prepared state: an executable, a few MB of data, a file of the image deleted, and the
/// manifest of what must come back.
const PREPARE: &str = r#"set -e
mkdir -p /work/data
head -c 3000000 /dev/urandom > /work/data/blob.bin
for i in $(seq 1 50); do head -c 20000 /dev/urandom > /work/data/part-$i.bin; done
printf '#!/bin/sh\necho "prepared tool $1"\n' > /usr/local/bin/prepared-tool
chmod 755 /usr/local/bin/prepared-tool
rm /etc/issue
cd / && sha256sum usr/local/bin/prepared-tool work/data/* > /work/MANIFEST.sha256
du -sb /work | cut -f1
"#;

/// The writer a snapshot is taken under: appends a line, then bumps `a`, then `b` (each replaced
/// atomically), as fast as it can.
const WRITER: &str = r#"i=0; while :; do i=$((i+1)); echo "line-$i" >> /work/log.txt; echo $i > /work/a.tmp; mv /work/a.tmp /work/a; echo $i > /work/b.tmp; mv /work/b.tmp /work/b; done"#;

/// What a fork checks of the state it started from: the manifest, the tool, the deleted file, and
/// the writer's invariant; prints `lines a b`.
const CHECK: &str = r#"set -e
cd / && sha256sum --quiet -c /work/MANIFEST.sha256
test "$(prepared-tool x)" = "prepared tool x"
test ! -e /etc/issue
lines=$(wc -l < /work/log.txt)
tail -c 1 /work/log.txt | od -c | grep -q '\\n'
awk '{ if ($0 != "line-" NR) { print "torn or missing line " NR ": " $0; exit 1 } }' /work/log.txt
echo "$lines $(cat /work/a) $(cat /work/b)"
"#;

/// What the package's executable prints.
const HELLO: &str = "hello from orchard-hello 1.0";

/// What `dpkg-query -W -f='${Status} ${Version}' orchard-hello` prints once the package is installed.
const INSTALLED: &str = "install ok installed 1.0";

/// Builds the Debian package `orchard-hello` 1.0 (one executable, `/usr/bin/orchard-hello`, printing
/// [`HELLO`]) with `dpkg-deb --build` and installs it with `dpkg -i`, from a file: pod traffic never
/// leaves the machine, so nothing comes from a package repository. dpkg wants root's PATH (it looks
/// for `ldconfig` and `start-stop-daemon`) and a control directory of mode 0755..0775 (the umask).
fn install_package() -> String {
    format!(
        r#"set -e
umask 022
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
build=/tmp/orchard-hello
rm -rf $build && mkdir -p $build/DEBIAN $build/usr/bin
cat > $build/DEBIAN/control <<'EOF'
Package: orchard-hello
Version: 1.0
Architecture: all
Maintainer: Orchard tests <tests@orchard.invalid>
Section: misc
Priority: optional
Description: prints one fixed line
 Built and installed inside a sandbox by e2e/tests/snapshots.rs, then snapshotted and forked.
EOF
printf '#!/bin/sh\necho "{HELLO}"\n' > $build/usr/bin/orchard-hello
chmod 755 $build/usr/bin/orchard-hello
dpkg-deb --root-owner-group --build $build /tmp/orchard-hello_1.0_all.deb > /dev/null
dpkg -i /tmp/orchard-hello_1.0_all.deb > /dev/null
rm -rf $build /tmp/orchard-hello_1.0_all.deb
"#
    )
}

/// What dpkg says of the package, then what its executable prints: two lines.
const PACKAGE_CHECK: &str = r#"set -e
dpkg-query -W -f='${Status} ${Version}' orchard-hello
echo
orchard-hello
"#;

/// The package is installed in sandbox `name`, as dpkg sees it, and its executable runs.
async fn assert_package(caller: &Caller, ns: &str, name: &str) {
    let out = sh(caller, ns, name, PACKAGE_CHECK).await;
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [INSTALLED, HELLO],
        "{name}: what dpkg records of orchard-hello, and what it prints"
    );
}

/// Which of the prepared files outside `/usr/bin` and `/var/lib/dpkg` a sandbox has.
const OUTSIDE_PATHS: &str = r#"for f in /work/MANIFEST.sha256 /usr/local/bin/prepared-tool /etc/issue; do
  if [ -e $f ]; then echo "$f present"; else echo "$f absent"; fi
done
"#;

/// `lines a b` of [`CHECK`]'s output satisfy the writer's invariant.
fn consistent(name: &str, out: &str) -> (u64, u64, u64) {
    let numbers: Vec<u64> = out
        .split_whitespace()
        .map(|n| n.parse().unwrap_or_else(|_| panic!("{name}: `{out}`")))
        .collect();
    let [lines, a, b] = numbers[..] else {
        panic!("{name}: `{out}`");
    };
    assert!(
        lines >= 1 && lines - 1 <= b && b <= a && a <= lines && a - b <= 1,
        "{name}: the layer is not one instant's filesystem: {lines} log lines, a={a}, b={b}"
    );
    (lines, a, b)
}

/// Deletes every snapshot of `api`'s namespace and waits until they are gone (nothing may name them).
async fn delete_all_snapshots(api: &Api<SandboxSnapshot>) {
    let names: Vec<String> = api
        .list(&Default::default())
        .await
        .expect("list snapshots")
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    for name in &names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    for name in &names {
        wait::deleted(api, name, Duration::from_secs(120)).await;
    }
}

#[tokio::test]
async fn a_prepared_sandbox_is_snapshotted_under_load_and_forked() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("snap").await;
    let op = operator(env, &ns, None).await;
    let admin = caller(env, &op);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let snapshots: Api<SandboxSnapshot> = Api::namespaced(client.clone(), &ns);
    let image = env.node.real().image("debian-python");

    // The prepared sandbox, its state, and a writer that keeps going.
    create_ready(
        &sandboxes,
        "prep",
        json!({"image": image, "resources": {"memory": "256Mi"}}),
    )
    .await;
    admin.wait_ready(&ns, "prep").await;
    let size = sh(&admin, &ns, "prep", PREPARE).await;
    println!("prepared /work: {} bytes", size.trim());
    sh(&admin, &ns, "prep", &install_package()).await;
    assert_package(&admin, &ns, "prep").await;
    let started = admin
        .post(
            &format!("/v1/namespaces/{ns}/sandboxes/prep/processes"),
            json!({"id": "writer", "argv": ["/bin/bash", "-c", WRITER]}),
        )
        .await;
    assert_eq!(started.status, 201, "{started:?}");
    sh(
        &admin,
        &ns,
        "prep",
        "until [ -s /work/b ]; do sleep 0.1; done",
    )
    .await;

    // The snapshot, under load.
    let asked = Instant::now();
    snapshots
        .create(&PostParams::default(), &snapshot("prepared", "prep", &[]))
        .await
        .expect("create snapshot");
    let done = wait::until(
        &snapshots,
        "prepared",
        "Ready or Failed",
        COMMITTED,
        settled,
    )
    .await;
    let took = asked.elapsed();
    let status = done.status.clone().expect("status");
    assert_eq!(
        status.phase,
        Some(SnapshotPhase::Ready),
        "{:?}",
        ready_condition(&done)
    );
    let pushed = status.image.clone().expect("image");
    println!(
        "snapshot Ready in {:.1}s: {pushed}, {:?} bytes, paused {:?} ms",
        took.as_secs_f64(),
        status.size_bytes,
        status.paused_milliseconds
    );
    assert!(
        pushed.starts_with(&format!(
            "localhost:5000/orchard-snapshots/{ns}/prepared@sha256:"
        )),
        "{pushed}"
    );
    assert!(
        status
            .base_image
            .as_deref()
            .is_some_and(|b| b.contains("debian-python@sha256:")),
        "the base is the digest the node runs: {status:?}"
    );
    assert!(
        status.size_bytes.is_some_and(|s| s > 4_000_000),
        "the layer holds the prepared files: {status:?}"
    );
    assert!(status.paused_milliseconds.is_some());
    assert_eq!(status.node_name.as_deref(), Some(env.node.real().name()));
    // The sandbox was resumed: Ready again, its writer still writing.
    let before = sh(&admin, &ns, "prep", "cat /work/a").await;
    wait::until(
        &sandboxes,
        "prep",
        "Ready after the snapshot",
        READY,
        is_ready,
    )
    .await;
    let after = sh(&admin, &ns, "prep", "sleep 1; cat /work/a").await;
    assert!(
        after.trim().parse::<u64>().unwrap_or(0) > before.trim().parse::<u64>().unwrap_or(u64::MAX),
        "the writer runs on after the snapshot: {before} then {after}"
    );
    let stopped = admin
        .delete(&format!(
            "/v1/namespaces/{ns}/sandboxes/prep/processes/writer"
        ))
        .await;
    assert_eq!(stopped.status, 200, "{stopped:?}");

    // Forks: the state is there, consistent, and each fork's later writes are its own.
    let forked = Instant::now();
    for i in 0..FORKS {
        sandboxes
            .create(
                &PostParams::default(),
                &sandbox(&format!("fork-{i}"), json!({"fromSnapshot": "prepared"})),
            )
            .await
            .expect("create fork");
    }
    for i in 0..FORKS {
        let name = format!("fork-{i}");
        let fork = wait::until(&sandboxes, &name, "Ready", READY, is_ready).await;
        admin.wait_ready(&ns, &name).await;
        assert_eq!(fork.spec.image, "", "the spec keeps fromSnapshot only");
    }
    println!(
        "{FORKS} forks Ready {:.1}s after they were created",
        forked.elapsed().as_secs_f64()
    );
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let fork_pod = pods.get("fork-0").await.expect("fork-0's pod");
    assert_eq!(
        fork_pod.spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some(pushed.as_str()),
        "a fork runs the snapshot's digest"
    );
    let mut seen = None;
    for i in 0..FORKS {
        let name = format!("fork-{i}");
        let out = sh(&admin, &ns, &name, CHECK).await;
        let state = consistent(&name, out.trim());
        assert!(
            seen.is_none_or(|s| s == state),
            "every fork starts from the same instant: {seen:?} and {state:?}"
        );
        seen = Some(state);
        assert_package(&admin, &ns, &name).await;
        // Memory is not kept: no writer runs in a fork.
        let still = sh(&admin, &ns, &name, "sleep 0.5; wc -l < /work/log.txt").await;
        assert_eq!(still.trim().parse::<u64>().ok(), Some(state.0), "{name}");
        sh(&admin, &ns, &name, &format!("echo {name} > /work/mine")).await;
    }
    for i in 0..FORKS {
        let name = format!("fork-{i}");
        let mine = sh(&admin, &ns, &name, "cat /work/mine").await;
        assert_eq!(mine.trim(), name, "each fork's writes are its own");
    }
    let original = sh(
        &admin,
        &ns,
        "prep",
        "test -e /work/mine && echo yes || echo no",
    )
    .await;
    assert_eq!(
        original.trim(),
        "no",
        "the forks' writes are not the original's"
    );

    // A snapshot of only the paths dpkg wrote: the package comes back installed, nothing else does.
    snapshots
        .create(
            &PostParams::default(),
            &snapshot("packaged", "prep", &["/usr/bin", "/var/lib/dpkg"]),
        )
        .await
        .expect("create snapshot");
    let packaged = wait::until(
        &snapshots,
        "packaged",
        "Ready or Failed",
        COMMITTED,
        settled,
    )
    .await;
    let packaged_status = packaged.status.clone().expect("status");
    assert_eq!(
        packaged_status.phase,
        Some(SnapshotPhase::Ready),
        "{:?}",
        ready_condition(&packaged)
    );
    println!(
        "snapshot of /usr/bin and /var/lib/dpkg: {:?} bytes (the whole filesystem's: {:?})",
        packaged_status.size_bytes, status.size_bytes
    );
    assert!(
        packaged_status
            .size_bytes
            .zip(status.size_bytes)
            .is_some_and(|(paths, whole)| paths < 3_000_000 && paths < whole),
        "the paths' layer leaves /work's 3 MB blob out: {packaged_status:?}"
    );
    create_ready(&sandboxes, "pkg-fork", json!({"fromSnapshot": "packaged"})).await;
    admin.wait_ready(&ns, "pkg-fork").await;
    assert_package(&admin, &ns, "pkg-fork").await;
    let outside = sh(&admin, &ns, "pkg-fork", OUTSIDE_PATHS).await;
    assert_eq!(
        outside.lines().collect::<Vec<_>>(),
        [
            "/work/MANIFEST.sha256 absent",
            "/usr/local/bin/prepared-tool absent",
            "/etc/issue present",
        ],
        "changes outside the snapshot's paths are not kept (nor the deletion of /etc/issue)"
    );
    sandboxes
        .delete("pkg-fork", &DeleteParams::default())
        .await
        .expect("delete pkg-fork");

    // A RolloutGroup whose template names the snapshot.
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let run = format!(
        "cd / && sha256sum --quiet -c /work/MANIFEST.sha256 && prepared-tool ok > /tmp/tool && test \"$(dpkg-query -W -f='${{Status}} ${{Version}}' orchard-hello)\" = '{INSTALLED}' && test \"$(orchard-hello)\" = '{HELLO}' && echo '{{\"reward\": 1.0, \"length\": 1}}' > /tmp/result.json"
    );
    groups
        .create(
            &PostParams::default(),
            &group(
                "from-snapshot",
                json!({
                    "groupSize": 2, "maxTrajectories": 2,
                    "filter": {"enabled": false},
                    "template": {"spec": {
                        "fromSnapshot": "prepared",
                        "run": {"command": ["/bin/sh", "-c", run], "timeoutSeconds": 120, "resultPath": "/tmp/result.json"},
                    }},
                    "cleanup": "Keep",
                }),
            ),
        )
        .await
        .expect("create group");
    let complete = wait::until(
        &groups,
        "from-snapshot",
        "Complete",
        GROUP_TIMEOUT,
        is_complete,
    )
    .await;
    let recorded = complete.status.expect("group status");
    assert_eq!(recorded.trajectories.len(), 2, "{recorded:?}");
    for trajectory in &recorded.trajectories {
        assert_eq!(trajectory.reward, Some(1.0), "{trajectory:?}");
    }

    // A SandboxPool whose template names the snapshot: its member runs the snapshot's image, and a
    // Sandbox of the pool claims it.
    let pools: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
    let warm: SandboxPool = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool",
        "metadata": {"name": "warm"},
        "spec": {"replicas": 1, "template": {"fromSnapshot": "prepared"}},
    }))
    .expect("pool JSON");
    pools
        .create(&PostParams::default(), &warm)
        .await
        .expect("create pool");
    wait::until(
        &pools,
        "warm",
        "a Ready member",
        READY,
        |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.ready_replicas >= 1)
        },
    )
    .await;
    let claimer = create_ready(
        &sandboxes,
        "claimer",
        json!({"pool": "warm", "whenPoolEmpty": "Wait"}),
    )
    .await;
    let member = claimer
        .status
        .and_then(|s| s.pod_name)
        .expect("the claimer's pod");
    assert!(member.starts_with("warm-"), "a claimed member: {member}");
    let member_pod = pods.get(&member).await.expect("the member");
    assert_eq!(
        member_pod.spec.as_ref().unwrap().containers[0]
            .image
            .as_deref(),
        Some(pushed.as_str()),
        "the pool built its member from the snapshot's image"
    );
    admin.wait_ready(&ns, "claimer").await;
    consistent("claimer", sh(&admin, &ns, "claimer", CHECK).await.trim());
    assert_package(&admin, &ns, "claimer").await;

    // A snapshot of a sandbox that is not Ready fails at once, saying so.
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox(
                "unpullable",
                json!({"image": "localhost:5000/no-such-image:1"}),
            ),
        )
        .await
        .expect("create sandbox");
    // Through the gateway this time: RBAC on sandboxsnapshots, then the watch-driven wait.
    let bob = Caller::at(&op.gateway_url(), Some(&env.control_plane.tokens["bob"]));
    let body = json!({"name": "too-early", "sandbox": "unpullable"});
    let denied = bob
        .post(
            &format!("/v1/namespaces/{ns}/sandboxsnapshots"),
            body.clone(),
        )
        .await;
    assert_eq!(denied.status, 403, "{denied:?}");
    assert!(denied.message().contains("sandboxsnapshots"), "{denied:?}");
    let created = admin
        .post(&format!("/v1/namespaces/{ns}/sandboxsnapshots"), body)
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let waited = admin
        .get(&format!(
            "/v1/namespaces/{ns}/sandboxsnapshots/too-early/wait?timeoutSeconds=120"
        ))
        .await;
    assert_eq!(waited.status, 200, "{waited:?}");
    assert_eq!(waited.body["status"]["phase"], "Failed", "{waited:?}");
    let early = snapshots.get("too-early").await.expect("too-early");
    let (status, reason, message) = ready_condition(&early);
    assert_eq!(
        early.status.as_ref().and_then(|s| s.phase),
        Some(SnapshotPhase::Failed)
    );
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "SandboxNotReady")
    );
    assert!(
        message.contains("Sandbox unpullable is not Ready"),
        "{message}"
    );
    // A sandbox from a failed snapshot fails too.
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("from-failed", json!({"fromSnapshot": "too-early"})),
        )
        .await
        .expect("create sandbox");
    let failed = wait::until(&sandboxes, "from-failed", "Failed", READY, is_failed).await;
    let failed_status = failed.status.expect("status");
    assert_eq!(failed_status.reason.as_deref(), Some("SnapshotFailed"));
    assert!(
        failed_status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("too-early failed (SandboxNotReady")),
        "{failed_status:?}"
    );

    // The SDK: fork the prepared sandbox twice (a snapshot of its own, then two forks).
    let script = format!(
        r#"
from orchard_env import SandboxClient
with SandboxClient("{url}", "{token}", namespace="{ns}") as client:
    prep = client.connect("prep")
    forks = prep.fork(2)
    for fork in forks:
        check = fork.exec(["/bin/sh", "-c", "cd / && sha256sum --quiet -c /work/MANIFEST.sha256 && prepared-tool sdk && dpkg-query -W -f='${{Status}} ${{Version}}' orchard-hello && echo && orchard-hello"])
        print(fork.name, check.exit_code, check.stdout.strip().replace('\n', ' | '))
    snapshot = client.list_snapshots()
    print("snapshots", sorted(s.name for s in snapshot if s.phase == "Ready"))
    for fork in forks:
        fork.close()
    prep.close()
"#,
        url = op.gateway_url(),
        token = env.control_plane.tokens["admin"],
    );
    let sdk = std::process::Command::new(orchard_testcluster::test_support::sdk::sdk_python())
        .arg("-c")
        .arg(&script)
        .env(
            "PYTHONPATH",
            orchard_testcluster::binaries::workspace_root().join("sdk/python/src"),
        )
        .output()
        .expect("run the SDK");
    let out = String::from_utf8_lossy(&sdk.stdout).to_string();
    assert!(
        sdk.status.success(),
        "the SDK's fork: {out}{}",
        String::from_utf8_lossy(&sdk.stderr)
    );
    println!("SDK: {out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    for line in &lines[..2] {
        assert!(
            line.starts_with("prep-fork-")
                && line.ends_with(&format!(" 0 prepared tool sdk | {INSTALLED} | {HELLO}")),
            "{out}"
        );
    }
    assert!(
        lines[2].contains("prep-fork-"),
        "the fork's own snapshot: {out}"
    );

    // Deleting the snapshot waits while something starts from it.
    snapshots
        .delete("prepared", &DeleteParams::default())
        .await
        .expect("delete snapshot");
    let held = wait::until(
        &snapshots,
        "prepared",
        "InUse",
        READY,
        |s: Option<&SandboxSnapshot>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                st.conditions
                    .iter()
                    .any(|c| c.type_ == "InUse" && c.reason == "DeletionWaits")
            })
        },
    )
    .await;
    assert!(held.metadata.deletion_timestamp.is_some());
    let in_use = held
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "InUse"))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(
        in_use.contains("Sandbox fork-0") && in_use.contains("more"),
        "{in_use}"
    );
    let referrers = held
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    println!("while in use: {referrers:?}");
    for i in 0..FORKS {
        let _ = sandboxes
            .delete(&format!("fork-{i}"), &DeleteParams::default())
            .await;
    }
    let _ = sandboxes.delete("claimer", &DeleteParams::default()).await;
    let _ = pools.delete("warm", &DeleteParams::default()).await;
    let _ = groups
        .delete("from-snapshot", &DeleteParams::default())
        .await;
    wait::deleted(&snapshots, "prepared", Duration::from_secs(120)).await;
    let prep = sandboxes.get("prep").await.expect("prep");
    assert_eq!(
        prep.status.and_then(|s| s.phase),
        Some(SandboxPhase::Ready),
        "the original is untouched by its snapshot's deletion"
    );
    // The others go too while their operator runs (their finalizers are its to remove).
    delete_all_snapshots(&snapshots).await;
    drop(op);

    // A registry that refuses the push: the snapshot fails with crane's words, the sandbox runs on.
    let refused_ns = env.namespace("snap-refused").await;
    let refusing = operator(env, &refused_ns, Some("localhost:5999/nowhere")).await;
    let admin = caller(env, &refusing);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &refused_ns);
    let snapshots: Api<SandboxSnapshot> = Api::namespaced(client.clone(), &refused_ns);
    create_ready(&sandboxes, "victim", json!({"image": image})).await;
    admin.wait_ready(&refused_ns, "victim").await;
    sh(&admin, &refused_ns, "victim", "echo kept > /root/state").await;
    snapshots
        .create(
            &PostParams::default(),
            &snapshot("refused", "victim", &["/root"]),
        )
        .await
        .expect("create snapshot");
    let refused = wait::until(&snapshots, "refused", "Failed", COMMITTED, settled).await;
    let (status, reason, message) = ready_condition(&refused);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "PushRefused"),
        "{message}"
    );
    assert!(
        message.contains("localhost:5999") && message.contains("refused"),
        "the registry's answer: {message}"
    );
    let alive = sh(&admin, &refused_ns, "victim", "cat /root/state").await;
    assert_eq!(alive.trim(), "kept", "the sandbox was resumed");
    wait::until(&sandboxes, "victim", "Ready", READY, is_ready).await;
    delete_all_snapshots(&snapshots).await;
    drop(refusing);
    env.delete_namespace(&ns).await;
    env.delete_namespace(&refused_ns).await;
}

/// Creates a snapshot of `sandbox` through the gateway, as the SDK does; the gateway's answer.
async fn snapshot_through_gateway(
    caller: &Caller,
    ns: &str,
    name: &str,
    sandbox: &str,
) -> orchard_testcluster::test_support::gateway::Answer {
    caller
        .post(
            &format!("/v1/namespaces/{ns}/sandboxsnapshots"),
            json!({"name": name, "sandbox": sandbox, "paths": ["/work"]}),
        )
        .await
}

/// Per-namespace quotas on snapshots, in one ResourceQuota: their number
/// (`count/sandboxsnapshots.orchard.dev`, the API server's own) and their total size
/// (`orchard.dev/snapshot-bytes`, the operator's). A layer bigger than the room left is not pushed,
/// a full namespace commits nothing (its sandbox is never paused), the sandbox runs on either way,
/// and the create beyond the count gets the gateway's 403 `QuotaExceeded` naming the quota.
#[tokio::test]
async fn snapshot_count_and_size_are_limited_per_namespace() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("snap-quota").await;
    let op = operator(env, &ns, None).await;
    let admin = caller(env, &op);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let snapshots: Api<SandboxSnapshot> = Api::namespaced(client.clone(), &ns);
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &ns);
    let image = env.node.real().image("debian-python");
    quotas
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "snapshots"},
                "spec": {"hard": {
                    "count/sandboxsnapshots.orchard.dev": "3",
                    SNAPSHOT_BYTES_QUOTA: "512Ki",
                }},
            }))
            .expect("quota JSON"),
        )
        .await
        .expect("the API server takes a ResourceQuota naming orchard.dev/snapshot-bytes");
    create_ready(&sandboxes, "prep", json!({"image": image})).await;
    admin.wait_ready(&ns, "prep").await;

    // A small layer fits.
    sh(
        &admin,
        &ns,
        "prep",
        "mkdir -p /work && head -c 20000 /dev/urandom > /work/small",
    )
    .await;
    let answer = snapshot_through_gateway(&admin, &ns, "small", "prep").await;
    assert_eq!(answer.status, 201, "{answer:?}");
    let small = wait::until(&snapshots, "small", "settled", COMMITTED, settled).await;
    assert_eq!(
        small.status.as_ref().and_then(|s| s.phase),
        Some(SnapshotPhase::Ready),
        "{:?}",
        ready_condition(&small)
    );
    let small_bytes = small
        .status
        .as_ref()
        .and_then(|s| s.size_bytes)
        .expect("sizeBytes");
    assert!((20_000..512 * 1024).contains(&small_bytes), "{small_bytes}");

    // A layer bigger than the room left is refused before the push; the sandbox runs on.
    sh(
        &admin,
        &ns,
        "prep",
        "head -c 1000000 /dev/urandom > /work/big",
    )
    .await;
    let answer = snapshot_through_gateway(&admin, &ns, "big", "prep").await;
    assert_eq!(answer.status, 201, "{answer:?}");
    let big = wait::until(&snapshots, "big", "settled", COMMITTED, settled).await;
    let (status, reason, message) = ready_condition(&big);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "QuotaExceeded"),
        "{message}"
    );
    let room = 512 * 1024 - small_bytes;
    assert!(
        message.contains(&format!("more than the {room} bytes"))
            && message.contains("ResourceQuota snapshots")
            && message.contains("nothing was pushed"),
        "{message}"
    );
    assert_eq!(big.status.as_ref().and_then(|s| s.image.clone()), None);
    assert_eq!(
        sh(&admin, &ns, "prep", "wc -c < /work/big").await.trim(),
        "1000000",
        "the sandbox runs on with its files"
    );

    // A namespace whose quota is used up commits nothing: no committer, no pause.
    quotas
        .patch(
            "snapshots",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"hard": {SNAPSHOT_BYTES_QUOTA: small_bytes.to_string()}}}),
            ),
        )
        .await
        .expect("lower the size quota");
    let answer = snapshot_through_gateway(&admin, &ns, "full", "prep").await;
    assert_eq!(answer.status, 201, "{answer:?}");
    let full = wait::until(&snapshots, "full", "settled", COMMITTED, settled).await;
    let (_, reason, message) = ready_condition(&full);
    assert_eq!(reason, "QuotaExceeded", "{message}");
    assert!(
        message.contains(&format!(
            "no room for another snapshot: {small_bytes} of {small_bytes} bytes"
        )),
        "{message}"
    );
    assert_eq!(
        full.status.as_ref().and_then(|s| s.paused_milliseconds),
        None,
        "never paused: {:?}",
        full.status
    );

    // The fourth snapshot object is refused by the API server's count quota, named by the gateway.
    let answer = snapshot_through_gateway(&admin, &ns, "fourth", "prep").await;
    assert_eq!(answer.status, 403, "{answer:?}");
    assert_eq!(answer.code(), "QuotaExceeded", "{answer:?}");
    let said = answer.body["message"].as_str().unwrap_or_default();
    assert!(
        said.contains("exceeded quota: snapshots")
            && said.contains("count/sandboxsnapshots.orchard.dev"),
        "{said}"
    );
    assert!(!answer.body["retryable"].as_bool().unwrap_or(true));

    // Deleting one makes room for the next, once the quota controller has counted the deletion.
    snapshots
        .delete("big", &DeleteParams::default())
        .await
        .expect("delete");
    wait::deleted(&snapshots, "big", Duration::from_secs(120)).await;
    let counted = Instant::now();
    let answer = loop {
        let answer = snapshot_through_gateway(&admin, &ns, "fourth", "prep").await;
        if answer.status != 403 || counted.elapsed() > Duration::from_secs(60) {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(answer.status, 201, "{answer:?}");
    delete_all_snapshots(&snapshots).await;
    drop(op);
    env.delete_namespace(&ns).await;
}

/// The prepared state of the benchmark, about 200 MB: a copy of the image's Python standard library
/// compiled to bytecode (installing and compiling dependencies), a git repository of generated
/// sources with its history (a checkout), and 130 MB of incompressible data (model weights, datasets).
const BENCH_PREPARE: &str = r#"set -e
mkdir -p /work/env
cp -a /usr/lib/python3.* /work/env/lib
python3 -m compileall -f -q /work/env/lib > /dev/null 2>&1 || true
cd /work && git init -q repo && cd repo
for i in $(seq 1 300); do head -c 60000 /dev/urandom | base64 > src-$i.txt; done
git add -A && git -c user.email=bench@orchard -c user.name=bench commit -qm prepared
head -c 130000000 /dev/urandom > /work/env/weights.bin
du -sb /work | cut -f1
"#;

/// Seconds since `from`.
fn seconds(from: Instant) -> f64 {
    from.elapsed().as_secs_f64()
}

/// The costs docs/SNAPSHOTS.md reports, on the real node, rounds in one run: preparing a ~200 MB state
/// in a fresh sandbox (create -> Ready, then the commands), against snapshotting it (request -> image
/// pushed) and starting from it (one fork, then four at once: create -> Ready, image pull included).
/// `cargo test -p orchard-e2e --test snapshots -- --ignored --nocapture bench_fork_against_recreate`.
#[tokio::test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
async fn bench_fork_against_recreate() {
    let rounds: usize = std::env::var("SNAPSHOT_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(2);
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("snap-bench").await;
    let op = operator(env, &ns, None).await;
    let admin = caller(env, &op);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let snapshots: Api<SandboxSnapshot> = Api::namespaced(client.clone(), &ns);
    let image = env.node.real().image("debian-python");
    let spec = json!({"image": image, "resources": {"memory": "1Gi"}});
    let mut rows = Vec::new();
    for round in 0..rounds {
        // Recreating the state: a fresh sandbox and the commands.
        let fresh = format!("fresh-{round}");
        let started = Instant::now();
        create_ready(&sandboxes, &fresh, spec.clone()).await;
        admin.wait_ready(&ns, &fresh).await;
        let ready = seconds(started);
        let prepared = Instant::now();
        let size = sh(&admin, &ns, &fresh, BENCH_PREPARE).await;
        let prepare = seconds(prepared);
        let total_recreate = seconds(started);

        // Snapshotting it.
        let name = format!("bench-{round}");
        let asked = Instant::now();
        snapshots
            .create(&PostParams::default(), &snapshot(&name, &fresh, &[]))
            .await
            .expect("create snapshot");
        let done = wait::until(&snapshots, &name, "Ready", COMMITTED, settled).await;
        let commit = seconds(asked);
        let status = done.status.expect("status");
        assert_eq!(status.phase, Some(SnapshotPhase::Ready), "{status:?}");

        // Starting from it: one fork (the image pulled), then four at once.
        let forked = Instant::now();
        create_ready(
            &sandboxes,
            &format!("one-{round}"),
            json!({"fromSnapshot": name, "resources": {"memory": "256Mi"}}),
        )
        .await;
        let one = seconds(forked);
        let forked = Instant::now();
        for i in 0..4 {
            sandboxes
                .create(
                    &PostParams::default(),
                    &sandbox(
                        &format!("four-{round}-{i}"),
                        json!({"fromSnapshot": name, "resources": {"memory": "256Mi"}}),
                    ),
                )
                .await
                .expect("create fork");
        }
        for i in 0..4 {
            wait::until(
                &sandboxes,
                &format!("four-{round}-{i}"),
                "Ready",
                READY,
                is_ready,
            )
            .await;
        }
        let four = seconds(forked);
        let check = sh(
            &admin,
            &ns,
            &format!("four-{round}-3"),
            "du -sb /work | cut -f1; git -C /work/repo log --oneline | wc -l",
        )
        .await;
        println!("round {round}: forked state {}", check.replace('\n', " "));
        rows.push((
            size.trim().to_string(),
            ready,
            prepare,
            total_recreate,
            commit,
            status.paused_milliseconds.unwrap_or(-1),
            status.size_bytes.unwrap_or(-1),
            one,
            four,
        ));
        for name in [fresh]
            .into_iter()
            .chain(std::iter::once(format!("one-{round}")))
            .chain((0..4).map(|i| format!("four-{round}-{i}")))
        {
            let _ = sandboxes.delete(&name, &DeleteParams::default()).await;
        }
    }
    println!(
        "| round | prepared bytes | fresh sandbox create -> Ready (s) | prepare commands (s) | recreate total (s) | snapshot request -> pushed (s) | paused (ms) | layer bytes | 1 fork create -> Ready (s) | 4 forks at once -> all Ready (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (round, r) in rows.iter().enumerate() {
        println!(
            "| {round} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {:.1} | {:.1} |",
            r.0, r.1, r.2, r.3, r.4, r.5, r.6, r.7, r.8
        );
    }
    delete_all_snapshots(&snapshots).await;
    drop(op);
    env.delete_namespace(&ns).await;
}

/// Waits until no pod is left in `ns` (the previous round's forks and members are gone).
async fn no_pods_left(client: &kube::Client, ns: &str) {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let left = pods
            .list(&Default::default())
            .await
            .expect("list pods")
            .items;
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} pods still there after 180 s",
            left.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether `fork(count=N)` should go through a SandboxPool for a large N: N forks created at once
/// (what the SDK's `fork` does, one Sandbox each) against a SandboxPool of N members from the
/// snapshot plus N Sandboxes claiming them, each timed from its first create to all N Ready; rounds
/// alternate which goes first, the snapshot's image already on the node.
/// `SNAPSHOT_POOL_BENCH_FORKS=16 cargo test -p orchard-e2e --test snapshots -- --ignored --nocapture bench_fork_direct_against_pool`.
#[tokio::test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
async fn bench_fork_direct_against_pool() {
    let forks: usize = std::env::var("SNAPSHOT_POOL_BENCH_FORKS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(16);
    let rounds: usize = std::env::var("SNAPSHOT_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("snap-pool-bench").await;
    let op = operator(env, &ns, None).await;
    let admin = caller(env, &op);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let snapshots: Api<SandboxSnapshot> = Api::namespaced(client.clone(), &ns);
    let pools: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
    let image = env.node.real().image("debian-python");
    create_ready(&sandboxes, "prep", json!({"image": image})).await;
    admin.wait_ready(&ns, "prep").await;
    sh(&admin, &ns, "prep", PREPARE).await;
    snapshots
        .create(&PostParams::default(), &snapshot("base", "prep", &[]))
        .await
        .expect("create snapshot");
    let done = wait::until(&snapshots, "base", "Ready", COMMITTED, settled).await;
    assert_eq!(
        done.status.as_ref().and_then(|s| s.phase),
        Some(SnapshotPhase::Ready)
    );
    let _ = sandboxes.delete("prep", &DeleteParams::default()).await;
    // The image onto the node once, so that neither side pays the pull.
    create_ready(&sandboxes, "warmup", json!({"fromSnapshot": "base"})).await;
    let _ = sandboxes.delete("warmup", &DeleteParams::default()).await;
    no_pods_left(&client, &ns).await;

    let fork_spec = json!({"fromSnapshot": "base", "resources": {"memory": "64Mi", "cpu": "50m"}});
    let mut rows = Vec::new();
    for round in 0..rounds {
        let mut direct = 0.0;
        let mut pooled = 0.0;
        let order = if round % 2 == 0 {
            ["direct", "pool"]
        } else {
            ["pool", "direct"]
        };
        for way in order {
            let names: Vec<String> = (0..forks).map(|i| format!("{way}-{round}-{i}")).collect();
            let started = Instant::now();
            if way == "pool" {
                let pool: SandboxPool = serde_json::from_value(json!({
                    "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool",
                    "metadata": {"name": format!("forks-{round}")},
                    "spec": {"replicas": forks, "template": fork_spec},
                }))
                .expect("pool JSON");
                pools
                    .create(&PostParams::default(), &pool)
                    .await
                    .expect("create pool");
            }
            let spec = if way == "pool" {
                json!({"pool": format!("forks-{round}"), "whenPoolEmpty": "Wait"})
            } else {
                fork_spec.clone()
            };
            let creates = names.iter().map(|name| {
                let (sandboxes, spec) = (sandboxes.clone(), spec.clone());
                async move {
                    sandboxes
                        .create(&PostParams::default(), &sandbox(name, spec))
                        .await
                        .expect("create fork")
                }
            });
            futures::future::join_all(creates).await;
            for name in &names {
                wait::until(&sandboxes, name, "Ready", READY, is_ready).await;
            }
            let took = seconds(started);
            if way == "pool" {
                pooled = took;
                // The pool would refill: gone with the claims.
                let _ = pools
                    .delete(&format!("forks-{round}"), &DeleteParams::default())
                    .await;
            } else {
                direct = took;
            }
            for name in &names {
                let _ = sandboxes.delete(name, &DeleteParams::default()).await;
            }
            no_pods_left(&client, &ns).await;
        }
        println!("round {round}: {forks} direct forks {direct:.2} s, pool + claims {pooled:.2} s");
        rows.push((direct, pooled));
    }
    println!(
        "| round | {forks} forks created at once -> all Ready (s) | pool of {forks} + {forks} claims -> all Ready (s) |"
    );
    println!("|---|---|---|");
    for (round, (direct, pooled)) in rows.iter().enumerate() {
        println!("| {round} | {direct:.2} | {pooled:.2} |");
    }
    delete_all_snapshots(&snapshots).await;
    drop(op);
    env.delete_namespace(&ns).await;
}
