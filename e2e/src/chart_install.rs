//! The operator installed by its own Helm chart (`charts/orchard-env`) on the real node: the operator
//! image built here (`make operator-image`), pulled by the kubelet like any image, run under the
//! chart's securityContext, RBAC and probes, with leader election between its replicas. The gateway is
//! reached through its Service (kube-proxy) or `kubectl port-forward`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Client;
use kube::api::{Api, ListParams};

use crate::binaries::{packaging_tools_dir, workspace_root};
use crate::env::{REAL_NODE_DEFAULT_CPU, REAL_NODE_DEFAULT_MEMORY, TestEnv};
use crate::error::{E2eError, Result};
use crate::port_forward::PortForward;
use crate::real_node::Layout;

/// How long [`ChartRelease::install`] waits for the gateway to answer through its Service after helm.
const GATEWAY_SERVICE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Label selector of the chart's operator pods (its `selectorLabels` for a release named `orchard`).
pub const OPERATOR_SELECTOR: &str =
    "app.kubernetes.io/name=orchard-operator,app.kubernetes.io/instance=orchard";

/// What to install.
#[derive(Debug, Clone)]
pub struct ReleaseOptions {
    /// Namespace of the release (created by helm).
    pub namespace: String,
    /// Operator replicas.
    pub replicas: u32,
    /// Lease duration in seconds (how long a killed leader blocks takeover).
    pub lease_seconds: u32,
    /// Further `--set` values.
    pub values: Vec<(String, String)>,
}

impl Default for ReleaseOptions {
    fn default() -> Self {
        Self {
            namespace: "orchard-system".into(),
            replicas: 2,
            lease_seconds: 6,
            values: Vec::new(),
        }
    }
}

/// A release of the chart named `orchard`.
#[derive(Debug, Clone)]
pub struct ChartRelease {
    /// Namespace of the release.
    pub namespace: String,
    /// Fullname of the chart's objects (Deployment, Lease, Services: `orchard-operator`).
    pub fullname: String,
    kubeconfig: PathBuf,
    helm: PathBuf,
}

/// `repository` and `tag` of an image reference `host:port/name:tag` (pure).
pub fn split_reference(reference: &str) -> (&str, &str) {
    match reference.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => (repository, tag),
        _ => (reference, ""),
    }
}

/// The `--set` values that point the chart at the node's images, size it for the node, tell it the
/// protected outside test host, and let the test process (on the host, outside the cluster) reach the
/// gateway through the chart's NetworkPolicy (pure; the API server listens on 6443, which the
/// policy's defaults allow). The node's pod range is not given: the operator reads it from
/// the Node (`sandboxEgress.discoverPodCidrs`).
pub fn node_values(
    operator_image: &str,
    agent_image: &str,
    layout: &Layout,
    options: &ReleaseOptions,
) -> Vec<String> {
    let (repository, tag) = split_reference(operator_image);
    let (agent_repository, agent_tag) = split_reference(agent_image);
    let mut values = vec![
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        format!("agentImage.repository={agent_repository}"),
        format!("agentImage.tag={agent_tag}"),
        format!("replicas={}", options.replicas),
        format!(
            "leaderElection.leaseDurationSeconds={}",
            options.lease_seconds
        ),
        format!("sandboxDefaults.cpu={REAL_NODE_DEFAULT_CPU}"),
        format!("sandboxDefaults.memory={REAL_NODE_DEFAULT_MEMORY}"),
        format!(
            "sandboxEgress.exceptCidrs={{169.254.169.254/32,fd00:ec2::254/128,168.63.129.16/32,100.100.100.200/32,fe80::/10,{}/32}}",
            layout.protected_ip
        ),
    ];
    values.extend(options.values.iter().map(|(k, v)| format!("{k}={v}")));
    values
}

/// The `--set-json` values of [`node_values`]: the chart's default gateway peers (every pod but
/// sandbox pods) and the host's address, where the test process calls the gateway from (pure).
pub fn node_json_values(layout: &Layout) -> Vec<String> {
    let peers = serde_json::json!([
        {"namespaceSelector": {},
         "podSelector": {"matchExpressions": [
             {"key": "orchard.dev/sandbox-pod", "operator": "DoesNotExist"}]}},
        {"ipBlock": {"cidr": format!("{}/32", layout.host_ip)}},
    ]);
    vec![format!("networkPolicy.gatewayFrom={peers}")]
}

impl ChartRelease {
    /// `helm install`s the chart (taking over the CRDs the harness installed) and waits until every
    /// replica is Ready and the gateway answers through its Service. Needs the real node and the operator image (`make operator-image`).
    pub async fn install(env: &TestEnv, options: &ReleaseOptions) -> Result<Self> {
        let node = env.node.real();
        if !node.has_image("orchard-operator") {
            return Err(E2eError::Setup(
                "the operator image was not built: run `make operator-image` (make e2e does)"
                    .into(),
            ));
        }
        let release = Self {
            namespace: options.namespace.clone(),
            fullname: "orchard-operator".into(),
            kubeconfig: env.control_plane.kubeconfig.clone(),
            helm: packaging_tools_dir()?.join("helm"),
        };
        let mut args: Vec<String> = [
            "install",
            "orchard",
            "charts/orchard-env",
            "--namespace",
            &options.namespace,
            "--create-namespace",
            // The harness installed the same CRDs before the chart: the release adopts them.
            "--take-ownership",
            "--wait",
            "--timeout",
            "180s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let layout = &node.namespaces.layout;
        for value in node_values(
            &node.image("orchard-operator"),
            &node.image("orchard-agent"),
            layout,
            options,
        ) {
            args.push("--set".into());
            args.push(value);
        }
        for value in node_json_values(layout) {
            args.push("--set-json".into());
            args.push(value);
        }
        release.helm(&args).await?;
        let client = env.client().await;
        release
            .wait_gateway_serving(&client, GATEWAY_SERVICE_TIMEOUT)
            .await?;
        Ok(release)
    }

    /// Waits until the gateway answers `GET /healthz` through its Service. `helm --wait` returns once
    /// the pods are Ready, but kube-proxy programs the Service's address on the node some time after
    /// the pods' endpoints appear; until then the node has no route for it and answers a connection
    /// with ICMP "network unreachable", which the first test to call the gateway got once.
    async fn wait_gateway_serving(
        &self,
        client: &Client,
        timeout: std::time::Duration,
    ) -> Result<()> {
        let url = format!("{}/healthz", self.gateway_url(client).await?);
        let http = crate::gateway_http();
        let started = std::time::Instant::now();
        loop {
            let last = match http
                .get(&url)
                .timeout(std::time::Duration::from_secs(2))
                .send()
                .await
            {
                Ok(answer) if answer.status().is_success() => return Ok(()),
                Ok(answer) => format!("{url} answered {}", answer.status()),
                Err(err) => format!("{url}: {}", crate::with_causes(&err)),
            };
            if started.elapsed() >= timeout {
                return Err(E2eError::NotReady {
                    component: "the gateway through its Service".into(),
                    seconds: timeout.as_secs(),
                    detail: last,
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }

    /// Runs helm with the cluster's admin kubeconfig from the repository root.
    async fn helm(&self, args: &[String]) -> Result<String> {
        let output = tokio::process::Command::new(&self.helm)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", helm_home("cache"))
            .env("HELM_CONFIG_HOME", helm_home("config"))
            .env("HELM_DATA_HOME", helm_home("data"))
            .current_dir(workspace_root())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| E2eError::Setup(format!("cannot run {}: {e}", self.helm.display())))?;
        if !output.status.success() {
            return Err(E2eError::Setup(format!(
                "helm {} failed: {}{}",
                args.first().map(String::as_str).unwrap_or_default(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).to_string())
    }

    /// `http://<ClusterIP>:<port>` of Service `<fullname>-<suffix>` (this machine routes the Service
    /// range to the node, where kube-proxy translates it).
    pub async fn service_url(&self, client: &Client, suffix: &str) -> Result<String> {
        let api: Api<Service> = Api::namespaced(client.clone(), &self.namespace);
        let name = format!("{}-{suffix}", self.fullname);
        let service = api.get(&name).await?;
        let spec = service
            .spec
            .ok_or_else(|| E2eError::Setup(format!("Service {name} has no spec")))?;
        let ip = spec
            .cluster_ip
            .ok_or_else(|| E2eError::Setup(format!("Service {name} has no ClusterIP")))?;
        let port = spec
            .ports
            .and_then(|p| p.first().map(|p| p.port))
            .ok_or_else(|| E2eError::Setup(format!("Service {name} has no port")))?;
        Ok(format!("http://{ip}:{port}"))
    }

    /// The gateway through its Service.
    pub async fn gateway_url(&self, client: &Client) -> Result<String> {
        self.service_url(client, "gateway").await
    }

    /// The operator's pods.
    pub async fn pods(&self, client: &Client) -> Result<Vec<Pod>> {
        let api: Api<Pod> = Api::namespaced(client.clone(), &self.namespace);
        Ok(api
            .list(&ListParams::default().labels(OPERATOR_SELECTOR))
            .await?
            .items)
    }

    /// The pod holding the Lease (its holder identity is the pod name), if any.
    pub async fn leader(&self, client: &Client) -> Result<Option<String>> {
        let api: Api<Lease> = Api::namespaced(client.clone(), &self.namespace);
        Ok(api
            .get_opt(&self.fullname)
            .await?
            .and_then(|lease| lease.spec?.holder_identity)
            .filter(|holder| !holder.is_empty()))
    }

    /// The last `lines` log lines of every operator pod (for failure messages).
    pub async fn logs(&self, lines: u32) -> String {
        let output = tokio::process::Command::new("kubectl")
            .args([
                "logs",
                "--namespace",
                &self.namespace,
                "--selector",
                OPERATOR_SELECTOR,
                "--prefix",
                "--tail",
                &lines.to_string(),
            ])
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::null())
            .output()
            .await;
        match output {
            Ok(out) => format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(err) => format!("kubectl logs: {err}"),
        }
    }

    /// `kubectl port-forward` to the gateway Service on a free local port; stops when dropped.
    pub async fn port_forward_gateway(&self) -> Result<PortForward> {
        PortForward::start(
            &self.kubeconfig,
            &self.namespace,
            &format!("service/{}-gateway", self.fullname),
            8080,
        )
        .await
    }
}

/// Helm's cache, config and data under the run's own directory of `~/.cache/orchard` (no repositories
/// are used; this keeps helm from writing into the user's home).
fn helm_home(kind: &str) -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    Path::new(&home).join(".cache/orchard/helm").join(kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_split_at_the_tag() {
        assert_eq!(
            split_reference("localhost:5000/orchard-operator:dev"),
            ("localhost:5000/orchard-operator", "dev")
        );
        assert_eq!(
            split_reference("localhost:5000/orchard-operator"),
            ("localhost:5000/orchard-operator", "")
        );
    }

    #[test]
    fn node_values_point_the_chart_at_the_node_registry() {
        let layout = Layout::new(3, 1, Path::new("/n"));
        let values = node_values(
            "localhost:5000/orchard-operator:dev",
            "localhost:5000/orchard-agent:dev",
            &layout,
            &ReleaseOptions::default(),
        );
        assert!(
            !values
                .iter()
                .any(|v| v.starts_with("sandboxEgress.clusterPodCidrs")),
            "the pod range is discovered from the Node"
        );
        assert!(values.contains(
            &"sandboxEgress.exceptCidrs={169.254.169.254/32,fd00:ec2::254/128,168.63.129.16/32,100.100.100.200/32,fe80::/10,10.251.3.2/32}".into()
        ));
        let json = node_json_values(&layout);
        assert!(
            json[0].starts_with("networkPolicy.gatewayFrom=["),
            "{json:?}"
        );
        assert!(
            json[0].contains(&format!("{}/32", layout.host_ip)),
            "{json:?}"
        );
        assert!(values.contains(&"image.repository=localhost:5000/orchard-operator".into()));
        assert!(values.contains(&"agentImage.tag=dev".into()));
        assert!(values.contains(&"replicas=2".into()));
    }
}
