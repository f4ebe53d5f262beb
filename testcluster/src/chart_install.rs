//! The operator installed by its own Helm chart on the real node, pulled by the kubelet like any image,
//! run under the chart's securityContext, RBAC and probes, with leader election between its replicas.
//! The chart and images come either from the workspace (`charts/orchard-env`, `make operator-image`) or
//! from a release (`make dist`: the packaged chart and the image tarballs, pushed into the node's
//! registry with `crane push` as docs/INSTALL.md tells users). The gateway is reached through its
//! Service (kube-proxy) or `kubectl port-forward`.

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

/// The files of a `make dist` release that an install uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistRelease {
    /// The workspace version the release was built at: the chart's version and appVersion, and the
    /// images' tag.
    pub version: String,
    /// `orchard-env-<version>.tgz` (`helm package`).
    pub chart: PathBuf,
    /// `images/orchard-operator-<version>.tar` (docker save-style, `crane push` takes it as it is).
    pub operator_image: PathBuf,
    /// `images/orchard-agent-<version>.tar`.
    pub agent_image: PathBuf,
}

impl DistRelease {
    /// The release of `version` in directory `dir`, named as `make dist` names its files (pure).
    pub fn in_dir(dir: &Path, version: &str) -> Self {
        let image = |name: &str| dir.join("images").join(format!("{name}-{version}.tar"));
        Self {
            version: version.to_string(),
            chart: dir.join(format!("orchard-env-{version}.tgz")),
            operator_image: image("orchard-operator"),
            agent_image: image("orchard-agent"),
        }
    }

    /// This workspace's `dist/` at the workspace's version.
    pub fn of_workspace() -> Self {
        Self::in_dir(&workspace_root().join("dist"), env!("CARGO_PKG_VERSION"))
    }

    /// The release's files that do not exist, if any, as an error saying what writes them.
    pub fn check_present(&self) -> Result<()> {
        let missing: Vec<String> = [&self.chart, &self.operator_image, &self.agent_image]
            .into_iter()
            .filter(|path| !path.is_file())
            .map(|path| path.display().to_string())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(E2eError::Setup(format!(
            "the release {} is incomplete, missing {}: run `make dist-release` (make e2e does) or `make dist`",
            self.version,
            missing.join(", ")
        )))
    }
}

/// Where the chart and the images of a release come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseSource {
    /// `charts/orchard-env` and the node's own images (`make operator-image`, tag `dev`), both named
    /// with their tags.
    Workspace,
    /// A release written by `make dist`: its images pushed into the node's registry under the
    /// release's version, its packaged chart installed with image repositories only (the tags default
    /// to the chart's appVersion, as for a user).
    Dist(DistRelease),
}

/// What to install.
#[derive(Debug, Clone)]
pub struct ReleaseOptions {
    /// Where the chart and the images come from.
    pub source: ReleaseSource,
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
            source: ReleaseSource::Workspace,
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
    /// The operator image the pods run (`localhost:5000/orchard-operator:<tag>`).
    pub operator_image: String,
    /// The agent image sandboxes get (`localhost:5000/orchard-agent:<tag>`).
    pub agent_image: String,
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

/// The `--set` values naming the images: each repository, and each tag unless it is `app_version`,
/// the chart's appVersion the tags default to (a release's images carry it; a user sets only the
/// repositories) (pure).
pub fn image_values(
    operator_image: &str,
    agent_image: &str,
    app_version: Option<&str>,
) -> Vec<String> {
    let mut values = Vec::new();
    for (key, reference) in [("image", operator_image), ("agentImage", agent_image)] {
        let (repository, tag) = split_reference(reference);
        values.push(format!("{key}.repository={repository}"));
        if app_version != Some(tag) {
            values.push(format!("{key}.tag={tag}"));
        }
    }
    values
}

/// The `--set` values that point the chart at the node's images ([`image_values`]), size it for the
/// node and tell it the protected outside test host (pure; the test process reaches the gateway from
/// the host through [`node_json_values`], and the API server listens on 6443, which the chart's
/// NetworkPolicy allows by default). The node's pod range is not given: the operator reads it from the
/// Node (`sandboxEgress.discoverPodCidrs`).
pub fn node_values(images: Vec<String>, layout: &Layout, options: &ReleaseOptions) -> Vec<String> {
    let mut values = images;
    values.extend([
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
    ]);
    values.extend(options.values.iter().map(|(k, v)| format!("{k}={v}")));
    values
}

/// The `--set-json` values of [`node_values`]: the chart's default gateway peers (every pod but
/// sandbox pods) and the host's address, where the test process calls the gateway from (pure). With
/// more than one node, also the first node's address: the host reaches the gateway's Service through
/// the first node, whose kube-proxy masquerades a connection from outside the pod range to its own
/// address when the gateway pod it picks is on another node (`layouts`: the first node first).
pub fn node_json_values(layouts: &[&Layout]) -> Vec<String> {
    let mut peers = vec![serde_json::json!(
        {"namespaceSelector": {},
         "podSelector": {"matchExpressions": [
             {"key": "orchard.dev/sandbox-pod", "operator": "DoesNotExist"}]}}
    )];
    if let Some(first) = layouts.first() {
        peers.push(serde_json::json!({"ipBlock": {"cidr": format!("{}/32", first.host_ip)}}));
        if layouts.len() > 1 {
            peers.push(serde_json::json!({"ipBlock": {"cidr": format!("{}/32", first.node_ip)}}));
        }
    }
    vec![format!(
        "networkPolicy.gatewayFrom={}",
        serde_json::Value::Array(peers)
    )]
}

impl ChartRelease {
    /// `helm install`s the chart (taking over the CRDs the harness installed) and waits until every
    /// replica is Ready and the gateway answers through its Service. Needs the real node, and the
    /// operator image (`make operator-image`) or the release (`make dist-release`).
    pub async fn install(env: &TestEnv, options: &ReleaseOptions) -> Result<Self> {
        let node = env.node.real();
        let (chart, operator_image, agent_image, app_version) = match &options.source {
            ReleaseSource::Workspace => {
                if !node.has_image("orchard-operator") {
                    return Err(E2eError::Setup(
                        "the operator image was not built: run `make operator-image`".into(),
                    ));
                }
                (
                    workspace_root().join("charts/orchard-env"),
                    node.image("orchard-operator"),
                    node.image("orchard-agent"),
                    None,
                )
            }
            ReleaseSource::Dist(dist) => {
                dist.check_present()?;
                let version = dist.version.as_str();
                (
                    dist.chart.clone(),
                    node.push_image(&dist.operator_image, "orchard-operator", version)?,
                    node.push_image(&dist.agent_image, "orchard-agent", version)?,
                    Some(version),
                )
            }
        };
        let release = Self {
            namespace: options.namespace.clone(),
            fullname: "orchard-operator".into(),
            operator_image,
            agent_image,
            kubeconfig: env.control_plane.kubeconfig.clone(),
            helm: packaging_tools_dir()?.join("helm"),
        };
        let mut args: Vec<String> = [
            "install",
            "orchard",
            &chart.display().to_string(),
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
            image_values(&release.operator_image, &release.agent_image, app_version),
            layout,
            options,
        ) {
            args.push("--set".into());
            args.push(value);
        }
        let layouts: Vec<&Layout> = env
            .node
            .reals()
            .iter()
            .map(|node| &node.namespaces.layout)
            .collect();
        for value in node_json_values(&layouts) {
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
            image_values(
                "localhost:5000/orchard-operator:dev",
                "localhost:5000/orchard-agent:dev",
                None,
            ),
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
        let json = node_json_values(&[&layout]);
        assert!(
            json[0].starts_with("networkPolicy.gatewayFrom=["),
            "{json:?}"
        );
        assert!(
            json[0].contains(&format!("{}/32", layout.host_ip)),
            "{json:?}"
        );
        assert!(
            !json[0].contains(&format!("{}/32", layout.node_ip)),
            "one node: the host only"
        );
        let second = Layout::member(1, 4, 1, Path::new("/m"), &layout);
        let json = node_json_values(&[&layout, &second]);
        assert!(
            json[0].contains(&format!("{}/32", layout.node_ip)),
            "two nodes: the first node's address too: {json:?}"
        );
        assert!(!json[0].contains(&format!("{}/32", second.node_ip)));
        assert!(values.contains(&"image.repository=localhost:5000/orchard-operator".into()));
        assert!(values.contains(&"agentImage.tag=dev".into()));
        assert!(values.contains(&"replicas=2".into()));
    }

    #[test]
    fn a_release_sets_only_the_repositories_and_its_tags_default_to_the_app_version() {
        let values = image_values(
            "localhost:5000/orchard-operator:0.1.0",
            "localhost:5000/orchard-agent:0.1.0",
            Some("0.1.0"),
        );
        assert_eq!(
            values,
            [
                "image.repository=localhost:5000/orchard-operator",
                "agentImage.repository=localhost:5000/orchard-agent"
            ]
        );
        let other = image_values(
            "localhost:5000/orchard-operator:dev",
            "localhost:5000/orchard-agent:0.1.0",
            Some("0.1.0"),
        );
        assert_eq!(
            other,
            [
                "image.repository=localhost:5000/orchard-operator",
                "image.tag=dev",
                "agentImage.repository=localhost:5000/orchard-agent"
            ]
        );
    }

    #[test]
    fn a_dist_release_is_named_as_make_dist_writes_it() {
        let release = DistRelease::in_dir(Path::new("/w/dist"), "1.2.3");
        assert_eq!(release.chart, Path::new("/w/dist/orchard-env-1.2.3.tgz"));
        assert_eq!(
            release.operator_image,
            Path::new("/w/dist/images/orchard-operator-1.2.3.tar")
        );
        assert_eq!(
            release.agent_image,
            Path::new("/w/dist/images/orchard-agent-1.2.3.tar")
        );
        assert_eq!(
            DistRelease::of_workspace().chart,
            workspace_root().join(format!(
                "dist/orchard-env-{}.tgz",
                env!("CARGO_PKG_VERSION")
            ))
        );
    }

    #[test]
    fn a_missing_release_says_which_files_and_what_writes_them() {
        let release = DistRelease::in_dir(Path::new("/nonexistent/dist"), "1.2.3");
        let message = release
            .check_present()
            .expect_err("nothing there")
            .to_string();
        assert!(
            message.contains("/nonexistent/dist/orchard-env-1.2.3.tgz"),
            "{message}"
        );
        assert!(
            message.contains("/nonexistent/dist/images/orchard-agent-1.2.3.tar"),
            "{message}"
        );
        assert!(message.contains("make dist-release"), "{message}");
    }
}
