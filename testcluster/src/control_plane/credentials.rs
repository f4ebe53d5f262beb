//! The control plane's credentials and clients: kubeconfigs for the test users and for any bearer
//! token, clients from them, and the CA and client certificate kube-apiserver uses to call kubelets.

use std::path::{Path, PathBuf};

use base64::Engine;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::{ControlPlane, random_hex};
use crate::error::{E2eError, Result};

impl ControlPlane {
    /// The CA that signed the client certificate kube-apiserver presents to kubelets (a real node's
    /// kubelet trusts it for exec, logs and port-forward).
    pub fn kubelet_client_ca(&self) -> PathBuf {
        self.dir.join("pki/kubelet-ca.crt")
    }

    /// The file holding the CA of kube-apiserver's serving certificate.
    pub fn serving_ca(&self) -> PathBuf {
        self.dir.join("pki/apiserver.crt")
    }

    /// PEM of the CA the serving certificate chains to (the apiserver writes its self-signed chain).
    fn ca_pem(&self) -> Result<Vec<u8>> {
        Ok(std::fs::read(self.dir.join("pki/apiserver.crt"))?)
    }

    /// Writes a kubeconfig for `user` (one of [`USERS`]) to `path`.
    pub fn write_kubeconfig(&self, user: &str, path: &Path) -> Result<()> {
        let token = self
            .tokens
            .get(user)
            .ok_or_else(|| E2eError::Setup(format!("no such test user `{user}`")))?;
        self.write_token_kubeconfig(token, path)
    }

    /// Writes a kubeconfig authenticating with `token` (any bearer token, e.g. a service account's).
    pub fn write_token_kubeconfig(&self, token: &str, path: &Path) -> Result<()> {
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem()?);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: orchard-local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: orchard-local\n  context: {{cluster: orchard-local, user: user, namespace: default}}\ncurrent-context: orchard-local\n",
            server = self.server
        );
        std::fs::write(path, text)?;
        Ok(())
    }

    /// A client authenticated as `admin`.
    pub async fn client(&self) -> Result<Client> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// An admin client whose requests carry the User-Agent `agent` (the API server's audit log names
    /// the sender by it: the local node and the test driver share the admin identity).
    pub async fn client_as(&self, agent: &str) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .map_err(|e| E2eError::Setup(format!("kubeconfig: {e}")))?;
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| E2eError::Setup(format!("kubeconfig: {e}")))?;
        if let Ok(value) = http::HeaderValue::from_str(agent) {
            config.headers.push((http::header::USER_AGENT, value));
        }
        Ok(Client::try_from(config)?)
    }

    /// A client authenticated with `token`.
    pub async fn client_with_token(&self, token: &str) -> Result<Client> {
        let path = self.dir.join(format!("kubeconfig-{}", random_hex(4)));
        self.write_token_kubeconfig(token, &path)?;
        let client = client_from_kubeconfig(&path).await;
        let _ = std::fs::remove_file(&path);
        client
    }
}

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
