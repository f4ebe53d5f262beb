//! Where the binaries the local cluster runs live: the upstream control plane (built once from Go
//! modules by `e2e/k8s-tools/build.sh` into `$HOME/.cache`), and this workspace's operator and agent.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{E2eError, Result};

/// The workspace root (parent of the `e2e` crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Cargo's target directory, found from the running executable (`<target>/<profile>/...`), or
/// `CARGO_TARGET_DIR`, or `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    if let Ok(exe) = std::env::current_exe() {
        for ancestor in exe.ancestors() {
            if ancestor.join("CACHEDIR.TAG").exists() {
                return ancestor.to_path_buf();
            }
        }
    }
    workspace_root().join("target")
}

/// Directory holding the upstream Kubernetes binaries (`kube-apiserver`, `kube-controller-manager`,
/// `etcd`; `kubelet`, `kube-scheduler`, `kube-proxy` for the real node); builds them on first use (a
/// cold build takes about 15 minutes on 2 cores; later calls return at once).
pub fn kubernetes_bin_dir() -> Result<PathBuf> {
    tool_dir("ORCHARD_K8S_BIN_DIR", "e2e/k8s-tools/build.sh", "kubelet")
}

/// Directory holding `containerd`, `containerd-shim-runc-v2`, `ctr` and `crane` for the real node
/// (built once from Go modules by `e2e/node-tools/build.sh`).
pub fn node_tools_dir() -> Result<PathBuf> {
    tool_dir(
        "ORCHARD_NODE_BIN_DIR",
        "e2e/node-tools/build.sh",
        "containerd",
    )
}

/// Directory holding `helm`, `kubeconform` and `openapi2schema` (built once from Go modules by
/// `e2e/packaging-tools/build.sh`).
pub fn packaging_tools_dir() -> Result<PathBuf> {
    tool_dir(
        "ORCHARD_PACKAGING_TOOLS_DIR",
        "e2e/packaging-tools/build.sh",
        "helm",
    )
}

/// A GitOps / observability check tool built once from the pinned Go modules under `e2e/tools` by
/// `e2e/tools/build.sh` (`kstatus`, `luahealth`, `promtool`, `dashlint`; `make obs-tools` builds all
/// four): only the named tool is built when missing (kstatus ~70 s cold, luahealth ~20 s).
pub fn observability_tool(name: &str) -> Result<PathBuf> {
    let script = "e2e/tools/build.sh";
    let stdout = run_script(&workspace_root().join(script), &[name.to_string()])?;
    let dir = stdout
        .lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| E2eError::Setup(format!("{script} printed no directory")))?;
    first_existing(
        &[dir.join(name)],
        name,
        "build it with `make obs-tools` (e2e/tools/build.sh)",
    )
}

/// The directory `script` prints last (it builds what is missing), or `env`'s directory if it holds
/// `probe`.
fn tool_dir(env: &str, script: &str, probe: &str) -> Result<PathBuf> {
    if let Ok(dir) = std::env::var(env) {
        let dir = PathBuf::from(dir);
        if dir.join(probe).exists() {
            return Ok(dir);
        }
    }
    let stdout = run_script(&workspace_root().join(script), &[])?;
    stdout
        .lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| E2eError::Setup(format!("{script} printed no directory")))
}

/// Runs one of the repository's scripts and returns its standard output.
pub fn run_script(script: &Path, args: &[String]) -> Result<String> {
    let output = Command::new(script)
        .args(args)
        .output()
        .map_err(|e| E2eError::Setup(format!("cannot run {}: {e}", script.display())))?;
    if !output.status.success() {
        return Err(E2eError::Setup(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).to_string())
}

/// A static binary of the `orchard-node-bins` crate (`orchard-pause`, `orchard-probe`), built by
/// `make node-bins`.
pub fn node_bin(name: &str) -> Result<PathBuf> {
    first_existing(
        &[target_dir().join(format!("x86_64-unknown-linux-gnu/agent/{name}"))],
        name,
        "build it with `make node-bins`",
    )
}

fn first_existing(candidates: &[PathBuf], what: &str, hint: &str) -> Result<PathBuf> {
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            E2eError::Setup(format!(
                "{what} not found (looked at {}); {hint}",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

/// The `orchard-operator` binary (`ORCHARD_OPERATOR_BIN` or the debug/release build).
pub fn operator_bin() -> Result<PathBuf> {
    let target = target_dir();
    let mut candidates: Vec<PathBuf> = std::env::var("ORCHARD_OPERATOR_BIN")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.push(target.join("debug/orchard-operator"));
    candidates.push(target.join("release/orchard-operator"));
    first_existing(
        &candidates,
        "orchard-operator",
        "build it with `cargo build -p orchard-operator` (make e2e does)",
    )
}

/// The static (glibc crt-static) release operator that goes into the operator image, built by
/// `make operator-image`; `None` when it has not been built.
pub fn static_operator_bin() -> Option<PathBuf> {
    let path = target_dir().join("x86_64-unknown-linux-gnu/release/orchard-operator");
    path.is_file().then_some(path)
}

/// The static `orchard-agent` binary (`ORCHARD_AGENT_BIN`, `make agent`'s output, or a debug build).
pub fn agent_bin() -> Result<PathBuf> {
    let target = target_dir();
    let mut candidates: Vec<PathBuf> = std::env::var("ORCHARD_AGENT_BIN")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.push(target.join("x86_64-unknown-linux-gnu/agent/orchard-agent"));
    candidates.push(target.join("debug/orchard-agent"));
    first_existing(&candidates, "orchard-agent", "build it with `make agent`")
}

/// The `kubectl-orchard` plugin (`ORCHARD_KUBECTL_PLUGIN_BIN`, or the debug/release build).
pub fn kubectl_orchard_bin() -> Result<PathBuf> {
    let target = target_dir();
    let mut candidates: Vec<PathBuf> = std::env::var("ORCHARD_KUBECTL_PLUGIN_BIN")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.push(target.join("debug/kubectl-orchard"));
    candidates.push(target.join("release/kubectl-orchard"));
    first_existing(
        &candidates,
        "kubectl-orchard",
        "build it with `cargo build -p kubectl-orchard` (make e2e does)",
    )
}
