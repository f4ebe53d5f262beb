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

/// Directory holding `kube-apiserver`, `kube-controller-manager` and `etcd`; builds them on first use
/// (a cold build takes about 11 minutes on 2 cores; later calls return at once).
pub fn kubernetes_bin_dir() -> Result<PathBuf> {
    if let Ok(dir) = std::env::var("ORCHARD_K8S_BIN_DIR") {
        let dir = PathBuf::from(dir);
        if dir.join("kube-apiserver").exists() {
            return Ok(dir);
        }
    }
    let script = workspace_root().join("e2e/k8s-tools/build.sh");
    let output = Command::new(&script)
        .output()
        .map_err(|e| E2eError::Setup(format!("cannot run {}: {e}", script.display())))?;
    if !output.status.success() {
        return Err(E2eError::Setup(format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout
        .lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| E2eError::Setup("build.sh printed no directory".into()))?;
    Ok(dir)
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
