//! A run on the real node leaves nothing behind on this machine, even when it is interrupted: the
//! harness is SIGKILLed while a sandbox runs (no cleanup code runs at all), and afterwards there is no
//! process, mount, network device, route, iptables rule or container of it left; its cgroups, the only
//! thing the kernel keeps, are removed by the next run's sweep. The same for a run of two real nodes
//! with a sandbox on each (their own link, both cgroups).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use orchard_testcluster::binaries::target_dir;
use orchard_testcluster::real_node::layout::cgroup_root;
use orchard_testcluster::real_node::namespaces::{remove_cgroups, stale_cgroup_roots};
use orchard_testcluster::real_node::node_name;
use serde_json::Value;

/// What `program args` prints; fails the test if it does not run or exits non-zero (an empty
/// snapshot before and after would hide any leak). An empty ruleset prints nothing, so only the
/// snapshots that always hold something (links: `lo`; routes: the local table) must be non-empty.
fn text(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// [`text`], which must not be empty.
fn nonempty_text(program: &str, args: &[&str]) -> String {
    let stdout = text(program, args);
    assert!(
        !stdout.trim().is_empty(),
        "{program} {args:?} printed nothing"
    );
    stdout
}

/// What this machine's networking looks like outside any test's namespaces.
fn host_network() -> (String, String, String) {
    (
        nonempty_text("ip", &["-o", "link", "show"]),
        nonempty_text("ip", &["route", "show", "table", "all"]),
        text("iptables-save", &[])
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(" [").next().unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

fn processes_of(pid: u32) -> Vec<String> {
    let marker = format!("ORCHARD_E2E_RUN={pid}.");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|b| *b == 0)
            .any(|var| var.starts_with(marker.as_bytes()))
        {
            found.push(entry.file_name().to_string_lossy().to_string());
        }
    }
    found
}

fn wait_for(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        match check() {
            None => return,
            Some(left) => last = left,
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("after {timeout:?}, {what}: {last}");
}

/// The runs compare the host's networking before and after: one at a time.
static ONE_RUN: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn an_interrupted_real_node_run_leaves_nothing_behind() {
    let _alone = ONE_RUN.lock().unwrap_or_else(|p| p.into_inner());
    interrupted_run_leaves_nothing(1);
}

#[test]
fn an_interrupted_run_of_two_real_nodes_leaves_nothing_behind() {
    let _alone = ONE_RUN.lock().unwrap_or_else(|p| p.into_inner());
    interrupted_run_leaves_nothing(2);
}

/// Starts `orchard-local-cluster` with `nodes` real nodes and a sandbox on each, SIGKILLs it, and
/// checks what is left.
fn interrupted_run_leaves_nothing(nodes: u8) {
    // A real node of the previous test binary may still be going away (its links vanish with its
    // namespaces a moment after its process exited).
    wait_for(
        "an earlier run's node links",
        Duration::from_secs(30),
        || {
            let links = text("ip", &["-o", "link", "show"]);
            links.contains(": orh").then_some(links)
        },
    );
    let before = host_network();
    let info = std::env::temp_dir().join(format!("orchard-cleanup-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&info);
    let binary: PathBuf = target_dir().join("debug/orchard-local-cluster");
    let mut cluster = Command::new(&binary)
        .args(["--real-nodes", &nodes.to_string(), "--info-file"])
        .arg(&info)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (make e2e builds it)", binary.display()));
    let pid = cluster.id();
    let deadline = Instant::now() + Duration::from_secs(180);
    let started: Value = loop {
        if let Ok(text) = std::fs::read_to_string(&info)
            && let Ok(value) = serde_json::from_str(&text)
        {
            break value;
        }
        if let Ok(Some(status)) = cluster.try_wait() {
            panic!("orchard-local-cluster --real-node exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "the real node did not start in 180 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let kubeconfig = started["kubeconfig"]
        .as_str()
        .expect("kubeconfig")
        .to_string();
    let image = started["node"]["images"]["busybox"]
        .as_str()
        .expect("busybox image")
        .to_string();
    let run_dir = PathBuf::from(started["logs"].as_str().expect("logs"))
        .parent()
        .expect("run directory")
        .to_path_buf();

    // A running sandbox on each node: a real container, a pod network namespace, overlay mounts.
    for ordinal in 0..nodes {
        let node = node_name(ordinal);
        let victim = format!("victim-{}", ordinal + 1);
        let manifest = format!(
            "apiVersion: orchard.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: {victim}, namespace: default}}\nspec: {{image: \"{image}\", nodeSelector: {{kubernetes.io/hostname: {node}}}}}\n"
        );
        let mut apply = Command::new("kubectl")
            .args(["apply", "-f", "-"])
            .env("KUBECONFIG", &kubeconfig)
            .stdin(Stdio::piped())
            .spawn()
            .expect("kubectl");
        if let Some(stdin) = apply.stdin.as_mut() {
            use std::io::Write;
            stdin.write_all(manifest.as_bytes()).expect("manifest");
        }
        assert!(apply.wait().expect("kubectl").success());
        let waited = Command::new("kubectl")
            .args([
                "wait",
                "--for=condition=Ready",
                &format!("sandbox/{victim}"),
                "--timeout=120s",
            ])
            .env("KUBECONFIG", &kubeconfig)
            .output()
            .expect("kubectl wait");
        assert!(
            waited.status.success(),
            "{victim} on {node}: {}",
            String::from_utf8_lossy(&waited.stderr)
        );
    }
    let mounts_during = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    assert!(
        !mounts_during.contains(run_dir.to_string_lossy().as_ref()),
        "the node's mounts are not even visible on the host while it runs"
    );
    assert!(
        !processes_of(pid).is_empty(),
        "the run's processes are marked"
    );

    // Interrupted: no cleanup code runs.
    cluster.kill().expect("SIGKILL");
    let _ = cluster.wait();

    wait_for("processes of the run left", Duration::from_secs(30), || {
        let left = processes_of(pid);
        (!left.is_empty()).then(|| format!("{left:?}"))
    });
    wait_for("host networking changed", Duration::from_secs(30), || {
        let after = host_network();
        (after != before).then(|| {
            format!(
                "links, routes or iptables differ:\nlinks before:\n{}\nlinks after:\n{}\nroutes after:\n{}",
                before.0, after.0, after.1
            )
        })
    });
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    assert!(
        !mounts.contains(run_dir.to_string_lossy().as_ref()),
        "no mount of the run is left on the host"
    );
    // The kernel keeps empty cgroups, one per node; the next run's sweep removes those of dead runs.
    for ordinal in 0..nodes {
        let root = cgroup_root(pid, ordinal);
        assert!(
            stale_cgroup_roots().contains(&root),
            "the dead run's cgroup {root} is found"
        );
        remove_cgroups(&root, Duration::from_secs(10));
        assert!(!stale_cgroup_roots().contains(&root), "and {root} removed");
    }
    let _ = std::fs::remove_file(&info);
}
