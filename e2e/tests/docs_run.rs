//! The quick start (`docs/QUICKSTART.md`) runs as written, block by block, on the real node with a
//! NetworkPolicy enforcer and no operator: its shell blocks install the chart, create a sandbox with
//! `kubectl`, a trainer identity, a port-forward to the gateway and the SDK; its Python blocks create
//! a sandbox and a RolloutGroup through the gateway. What the test provides is what a reader
//! provides: `REGISTRY` (the node's registry, which also mirrors the public images the docs name:
//! docs/TESTING.md, "The real node"), a kubeconfig, `helm` and `pip` on `PATH` (pip in a fresh venv,
//! offline from the wheels `make sdk-venv` keeps), and a cluster without the CRDs (the harness's are
//! deleted first). The shell blocks share their exported variables, as one terminal would; every
//! block must exit 0.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use orchard_testcluster::binaries::{packaging_tools_dir, workspace_root};
use orchard_testcluster::doc_blocks::{Block, blocks};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::real_node::layout::IMAGE_HOST;

fn env() -> &'static TestEnv {
    TestEnv::shared_in_cluster()
}

/// The process groups the blocks started (background port-forwards), killed when the test ends.
struct Groups(Vec<i32>);

impl Drop for Groups {
    fn drop(&mut self) {
        for group in &self.0 {
            // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
            unsafe {
                libc::kill(-group, libc::SIGTERM);
            }
        }
    }
}

/// Runs shell block `block` in bash with the variables `state` holds (an `export -p` of the blocks
/// before), in its own process group; returns its output and the new state.
fn run_shell(
    block: &Block,
    state: &Path,
    envs: &[(String, String)],
    groups: &mut Groups,
) -> String {
    let script = format!(
        "set -euo pipefail\nsource {state}\n{text}\nexport -p > {state}.next\n",
        state = state.display(),
        text = block.text
    );
    // The output goes to a file, not a pipe: a process the block leaves in the background (a
    // port-forward) keeps its output open, and a pipe would never end.
    let log_path = format!("{}.block-{}.log", state.display(), block.line);
    let log = std::fs::File::create(&log_path).expect("log");
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(&script)
        .current_dir(workspace_root())
        .envs(envs.iter().cloned())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut child = command.spawn().expect("bash runs");
    groups.0.push(i32::try_from(child.id()).unwrap_or(0));
    let status = child.wait().expect("bash finishes");
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        status.success(),
        "docs/QUICKSTART.md:{} failed ({status}):\n{}\n--- output ---\n{text}",
        block.line,
        block.text
    );
    std::fs::rename(format!("{}.next", state.display()), state).expect("state");
    text
}

/// The exported variables of a state file (`declare -x NAME="value"` lines of simple values).
fn exported(state: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(state).unwrap_or_default();
    text.lines()
        .filter_map(|line| line.strip_prefix("declare -x "))
        .filter_map(|rest| {
            let (name, value) = rest.split_once('=')?;
            let value = value.strip_prefix('"')?.strip_suffix('"')?;
            Some((
                name.to_string(),
                value.replace("\\\"", "\"").replace("\\$", "$"),
            ))
        })
        .filter(|(name, _)| name.starts_with("ORCHARD_") || name == "PATH")
        .collect()
}

/// Waits until something listens on `127.0.0.1:port` (a port-forward a block started).
fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listens on 127.0.0.1:{port}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A fresh venv whose pip installs offline from the wheels `make sdk-venv` keeps.
fn fresh_venv(dir: &Path) -> (PathBuf, Vec<(String, String)>) {
    let venv = dir.join("venv");
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3 -m venv");
    assert!(status.success(), "python3 -m venv: {status}");
    let wheels = orchard_testcluster::test_support::sdk::wheelhouse();
    let envs = vec![
        ("PIP_NO_INDEX".to_string(), "1".to_string()),
        ("PIP_FIND_LINKS".to_string(), wheels.display().to_string()),
        ("PIP_DISABLE_PIP_VERSION_CHECK".to_string(), "1".to_string()),
    ];
    (venv.join("bin"), envs)
}

#[test]
fn the_quick_start_runs_as_written() {
    let env = env();
    let doc = std::fs::read_to_string(workspace_root().join("docs/QUICKSTART.md"))
        .expect("docs/QUICKSTART.md");
    let all = blocks(&doc);
    assert!(
        all.iter().filter(|b| b.is_code()).count() >= 8,
        "the quick start lost its blocks"
    );
    let dir = tempfile_dir(&env.dir);
    let (venv_bin, pip_envs) = fresh_venv(&dir);
    let helm = packaging_tools_dir().expect("helm");
    let path = format!(
        "{}:{}:{}",
        venv_bin.display(),
        helm.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut envs = vec![
        (
            "KUBECONFIG".to_string(),
            env.control_plane.kubeconfig.display().to_string(),
        ),
        ("REGISTRY".to_string(), IMAGE_HOST.to_string()),
        ("PATH".to_string(), path),
        (
            "HOME".to_string(),
            std::env::var("HOME").unwrap_or_default(),
        ),
    ];
    envs.extend(pip_envs);
    // A cluster from nothing: the harness installs the CRDs with every control plane; the quick start
    // installs them itself, with the chart.
    let removed = Command::new("kubectl")
        .args([
            "delete",
            "crd",
            "sandboxes.orchard.dev",
            "rolloutgroups.orchard.dev",
            "rolloutqueues.orchard.dev",
            "sandboxpools.orchard.dev",
            "sandboxsnapshots.orchard.dev",
            "--wait",
        ])
        .env("KUBECONFIG", &env.control_plane.kubeconfig)
        .status()
        .expect("kubectl");
    assert!(removed.success(), "kubectl delete crd: {removed}");
    let state = dir.join("exports");
    std::fs::write(&state, "").expect("state");
    let mut groups = Groups(Vec::new());
    for block in all.iter().filter(|b| b.is_code()) {
        if block.is_shell() {
            let output = run_shell(block, &state, &envs, &mut groups);
            eprintln!("docs/QUICKSTART.md:{}: ok\n{output}", block.line);
            if block.text.contains("port-forward") {
                wait_listening(8080);
            }
        } else if block.is_python() {
            let mut command = Command::new(venv_bin.join("python"));
            command
                .arg("-c")
                .arg(&block.text)
                .current_dir(&dir)
                .env_clear()
                .envs(envs.iter().cloned())
                .envs(exported(&state));
            let output = command.output().expect("python runs");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            assert!(
                output.status.success(),
                "docs/QUICKSTART.md:{} failed ({}):\n{}\n--- output ---\n{text}",
                block.line,
                output.status,
                block.text
            );
            eprintln!("docs/QUICKSTART.md:{}: ok\n{text}", block.line);
            if block.text.contains("create_rollout_group") {
                assert!(
                    text.starts_with("Balanced "),
                    "the group's selection: {text}"
                );
            } else {
                assert!(text.starts_with("0 42\n"), "the sandbox's answer: {text}");
            }
        } else {
            panic!(
                "docs/QUICKSTART.md:{}: a {} block this test cannot run",
                block.line, block.lang
            );
        }
    }
    drop(groups);
}

/// A directory of this test under the environment's.
fn tempfile_dir(root: &Path) -> PathBuf {
    let dir = root.join("docs-run");
    std::fs::create_dir_all(&dir).expect("dir");
    dir
}
