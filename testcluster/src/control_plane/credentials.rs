//! Clients from kubeconfigs, and the CA and client certificate kube-apiserver uses to call kubelets.
//! (The control plane's own kubeconfig and client methods are in the parent module.)

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::error::{E2eError, Result};

/// A CA and, signed by it, the client certificate (in `system:masters`) kube-apiserver uses to call
/// kubelets, written to `pki` with openssl.
pub(super) fn write_kubelet_client_certificate(pki: &Path) -> Result<()> {
    let key = |name: &str| pki.join(name).display().to_string();
    let steps: [Vec<String>; 3] = [
        vec![
            "req".into(),
            "-x509".into(),
            "-newkey".into(),
            "ec".into(),
            "-pkeyopt".into(),
            "ec_paramgen_curve:prime256v1".into(),
            "-nodes".into(),
            "-days".into(),
            "3650".into(),
            "-subj".into(),
            "/CN=orchard-e2e-kubelet-client-ca".into(),
            "-keyout".into(),
            key("kubelet-ca.key"),
            "-out".into(),
            key("kubelet-ca.crt"),
        ],
        vec![
            "req".into(),
            "-newkey".into(),
            "ec".into(),
            "-pkeyopt".into(),
            "ec_paramgen_curve:prime256v1".into(),
            "-nodes".into(),
            "-subj".into(),
            "/O=system:masters/CN=kube-apiserver-kubelet-client".into(),
            "-keyout".into(),
            key("kubelet-client.key"),
            "-out".into(),
            key("kubelet-client.csr"),
        ],
        vec![
            "x509".into(),
            "-req".into(),
            "-days".into(),
            "3650".into(),
            "-in".into(),
            key("kubelet-client.csr"),
            "-CA".into(),
            key("kubelet-ca.crt"),
            "-CAkey".into(),
            key("kubelet-ca.key"),
            "-CAcreateserial".into(),
            "-out".into(),
            key("kubelet-client.crt"),
        ],
    ];
    for args in steps {
        let output = std::process::Command::new("openssl")
            .args(&args)
            .output()
            .map_err(|e| {
                E2eError::Setup(format!(
                    "openssl is needed for the kubelet client certificate: {e}"
                ))
            })?;
        if !output.status.success() {
            return Err(E2eError::Setup(format!(
                "openssl {} failed: {}",
                args[0],
                String::from_utf8_lossy(&output.stderr)
            )));
        }
    }
    Ok(())
}

/// A client from a kubeconfig file (never the developer's own configuration).
pub async fn client_from_kubeconfig(path: &Path) -> Result<Client> {
    let kubeconfig = Kubeconfig::read_from(path)
        .map_err(|e| E2eError::Setup(format!("kubeconfig {}: {e}", path.display())))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| E2eError::Setup(format!("kubeconfig {}: {e}", path.display())))?;
    Ok(Client::try_from(config)?)
}
