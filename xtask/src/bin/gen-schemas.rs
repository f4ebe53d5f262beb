//! `gen-schemas` (`make schemas`): regenerates the Kubernetes JSON schemas kubeconform uses
//! (`e2e/packaging-tools/schemas/kubernetes-v1.36.3`, the kinds in `kinds.txt`) from `/openapi/v2` of
//! a local control plane (etcd and the real kube-apiserver, started here and stopped at the end).
//! `tests/manifests_install.rs` checks the committed files with the same generator
//! ([`xtask::k8s_schemas`]).

use orchard_testcluster::binaries::{kubernetes_bin_dir, target_dir, workspace_root};
use orchard_testcluster::control_plane::{ControlPlane, PlaneOptions};
use orchard_testcluster::error::Result;
use xtask::k8s_schemas::{self, KUBERNETES_VERSION_DIR, SCHEMAS_DIR};

async fn regenerate(dir: &std::path::Path) -> Result<bool> {
    let plane = ControlPlane::start(
        dir,
        &kubernetes_bin_dir()?,
        &workspace_root().join("crds"),
        PlaneOptions::default(),
    )
    .await?;
    let generated = k8s_schemas::generate(&plane.client().await?, &dir.join("schemas")).await;
    plane.stop();
    let generated = generated?;
    let committed = k8s_schemas::committed_dir();
    if k8s_schemas::check(&generated, &committed).is_ok() {
        return Ok(false);
    }
    k8s_schemas::write(&generated, &committed)?;
    Ok(true)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = target_dir()
        .join("e2e")
        .join(format!("gen-schemas-{}", std::process::id()));
    let result = regenerate(&dir).await;
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let what = format!("{SCHEMAS_DIR}/{KUBERNETES_VERSION_DIR}");
    match result {
        Ok(true) => println!("{what}: regenerated"),
        Ok(false) => println!("{what}: up to date"),
        Err(err) => {
            eprintln!("gen-schemas: {err} (logs were in {})", dir.display());
            std::process::exit(1);
        }
    }
}
