//! The Kubernetes JSON schemas kubeconform validates the install manifests against
//! (`e2e/packaging-tools/schemas/kubernetes-v1.36.3`): what `openapi2schema openapi` makes of
//! `/openapi/v2` of the local cluster's kube-apiserver (the real v1.36.3), for the kinds listed in
//! `kinds.txt`. One implementation for both users: `make schemas` (`gen-schemas`) writes them, and
//! `tests/manifests_install.rs` fails when the committed files differ from what a live server gives.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use kube::Client;

use orchard_testcluster::binaries::{packaging_tools_dir, workspace_root};
use orchard_testcluster::error::{E2eError, Result};

/// The schema directory, relative to the workspace root (holds `kinds.txt`).
pub const SCHEMAS_DIR: &str = "e2e/packaging-tools/schemas";
/// The committed schemas, relative to [`SCHEMAS_DIR`].
pub const KUBERNETES_VERSION_DIR: &str = "kubernetes-v1.36.3";
/// The make target that regenerates them.
pub const MAKE_TARGET: &str = "make schemas";

/// Where the committed schemas live.
pub fn committed_dir() -> PathBuf {
    workspace_root()
        .join(SCHEMAS_DIR)
        .join(KUBERNETES_VERSION_DIR)
}

/// Fetches `/openapi/v2` through `client` and turns it into schemas of the kinds in `kinds.txt` with
/// `openapi2schema`, under `work` (created); returns the directory of the generated schemas.
pub async fn generate(client: &Client, work: &Path) -> Result<PathBuf> {
    let request = http::Request::get("/openapi/v2")
        .body(Vec::new())
        .map_err(|e| E2eError::Setup(format!("GET /openapi/v2 request: {e}")))?;
    let openapi = client.request_text(request).await?;
    std::fs::create_dir_all(work)?;
    let document = work.join("openapi-v2.json");
    std::fs::write(&document, openapi)?;
    let generated = work.join("kubernetes");
    let mut command = Command::new(packaging_tools_dir()?.join("openapi2schema"));
    command
        .arg("openapi")
        .arg("-in")
        .arg(&document)
        .arg("-out")
        .arg(&generated)
        .arg("-only")
        .arg(workspace_root().join(SCHEMAS_DIR).join("kinds.txt"));
    let output = command
        .output()
        .map_err(|e| E2eError::Setup(format!("cannot run {command:?}: {e}")))?;
    if !output.status.success() {
        return Err(E2eError::Setup(format!(
            "{command:?} failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(generated)
}

/// File names in `dir` (empty when it does not exist).
fn listing(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether `committed` holds exactly the files of `generated`, byte for byte; the error names the
/// first difference and the make target that fixes it.
pub fn check(generated: &Path, committed: &Path) -> std::result::Result<(), String> {
    for name in listing(generated) {
        let fresh = std::fs::read(generated.join(&name))
            .map_err(|e| format!("generated schema {name}: {e}"))?;
        let old = std::fs::read(committed.join(&name)).unwrap_or_default();
        if old != fresh {
            return Err(format!(
                "{name} differs from what the live kube-apiserver serves: run `{MAKE_TARGET}`"
            ));
        }
    }
    let (committed_files, generated_files) = (listing(committed), listing(generated));
    if committed_files != generated_files {
        return Err(format!(
            "committed schema files differ from kinds.txt (run `{MAKE_TARGET}`):\n  committed: {committed_files:?}\n  generated: {generated_files:?}"
        ));
    }
    Ok(())
}

/// Replaces the schemas in `committed` with those in `generated`.
pub fn write(generated: &Path, committed: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(committed);
    std::fs::create_dir_all(committed)?;
    for name in listing(generated) {
        std::fs::copy(generated.join(&name), committed.join(&name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_the_first_difference_and_write_makes_the_directories_equal() {
        let root = std::env::temp_dir().join(format!("orchard-k8s-schemas-{}", std::process::id()));
        let (generated, committed) = (root.join("generated"), root.join("committed"));
        std::fs::create_dir_all(&generated).expect("generated dir");
        std::fs::write(generated.join("pod-v1.json"), "{}").expect("schema");
        std::fs::write(generated.join("service-v1.json"), "{\"a\":1}").expect("schema");

        let missing = check(&generated, &committed).unwrap_err();
        assert!(missing.starts_with("pod-v1.json differs"), "{missing}");
        assert!(missing.contains("make schemas"), "{missing}");

        write(&generated, &committed).expect("write");
        assert_eq!(check(&generated, &committed), Ok(()));

        std::fs::write(committed.join("secret-v1.json"), "{}").expect("extra schema");
        let extra = check(&generated, &committed).unwrap_err();
        assert!(extra.contains("differ from kinds.txt"), "{extra}");
        std::fs::write(committed.join("service-v1.json"), "{}").expect("stale schema");
        let stale = check(&generated, &committed).unwrap_err();
        assert!(stale.starts_with("service-v1.json differs"), "{stale}");

        write(&generated, &committed).expect("rewrite");
        assert_eq!(check(&generated, &committed), Ok(()));
        let _ = std::fs::remove_dir_all(&root);
    }
}
