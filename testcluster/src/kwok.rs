//! KWOK nodes: many fake Nodes whose pods have no processes, for the control plane at scale.
//!
//! KWOK's controller (`sigs.k8s.io/kwok`, pinned and built from its Go module by `e2e/tools/build.sh
//! kwok`) plays Stages on the Nodes and Pods it manages: a Node becomes Ready with KWOK's default
//! capacity (1k CPU, 1 TiB, 1M pods) and keeps a Lease, a scheduled Pod becomes Running and Ready at
//! once with an IP from [`POD_CIDR`], a deleted Pod is removed. The Stages are KWOK's own "fast" ones,
//! from the same module. kube-scheduler (the cluster's, from `e2e/k8s-tools`) binds the pods, with its
//! client rate limits raised so that it measures binding, not a throttle.
//!
//! No agent answers at a KWOK pod's IP: the operator runs with `--simulated-agent`, a test-only flag
//! that answers its own agent calls (a pool claim's identity) in process. Exec, files and `spec.run`
//! need a node with processes (the hollow or the real node).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::binaries::{kubernetes_bin_dir, observability_tool};
use crate::control_plane::ControlPlane;
use crate::error::{E2eError, Result};
use crate::supervise::{Child, Spec};

/// The annotation KWOK manages Nodes by (`--manage-nodes-with-annotation-selector`).
pub const NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// The label every KWOK Node carries, for selectors and counts.
pub const NODE_LABEL: (&str, &str) = ("type", "kwok");

/// Where KWOK's pods get their IPs: room for 262,142 pods, none of them routed anywhere.
pub const POD_CIDR: &str = "10.64.0.0/14";

/// How long a KWOK Node's Lease lasts (it is renewed every quarter of it): with
/// [`NODE_MONITOR_GRACE`] as on a default cluster, 100 Nodes cost 10 Lease writes a second.
pub const NODE_LEASE_SECONDS: u32 = 40;

/// kube-controller-manager's `--node-monitor-grace-period` with KWOK nodes: Kubernetes' default
/// (50 s). The hollow node renews every second and is watched with 5 s.
pub const NODE_MONITOR_GRACE: Duration = Duration::from_secs(50);

/// The name of KWOK node `index` (`kwok-node-0`, ...).
pub fn node_name(index: u16) -> String {
    format!("kwok-node-{index}")
}

/// A KWOK Node object (pure): managed by KWOK through [`NODE_ANNOTATION`], labelled [`NODE_LABEL`];
/// KWOK fills in its status.
pub fn node_object(index: u16) -> Result<Node> {
    let name = node_name(index);
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "annotations": {NODE_ANNOTATION.0: NODE_ANNOTATION.1},
            "labels": {
                NODE_LABEL.0: NODE_LABEL.1,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
    }))
    .map_err(|e| E2eError::Setup(format!("node {name}: {e}")))
}

/// KWOK's configuration (pure): its options, then the Stages it plays (`stages`, YAML documents).
pub fn config_text(stages: &[String]) -> String {
    let mut text = format!(
        "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n  cidr: {POD_CIDR}\n  nodeLeaseDurationSeconds: {NODE_LEASE_SECONDS}\n  manageNodesWithAnnotationSelector: {}={}\n  podPlayStageParallelism: 8\n  nodePlayStageParallelism: 4\n  nodeLeaseParallelism: 4\n  podsOnNodeSyncParallelism: 4\n",
        NODE_ANNOTATION.0, NODE_ANNOTATION.1
    );
    for stage in stages {
        text.push_str("---\n");
        text.push_str(stage.trim_start_matches("---\n").trim_end());
        text.push('\n');
    }
    text
}

/// kube-scheduler's configuration (pure): no leader election, and a client rate well above what the
/// benchmarks ask (its default, 50 requests a second, would cap bindings at 50 pods a second).
pub fn scheduler_config_text(kubeconfig: &Path) -> String {
    format!(
        "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: {}\n  qps: 2000\n  burst: 4000\nleaderElection:\n  leaderElect: false\n",
        kubeconfig.display()
    )
}

/// The Stage files KWOK plays, beside its binary (`e2e/tools/build.sh` copies them there).
fn stage_files(kwok: &Path) -> Result<Vec<PathBuf>> {
    let dir = kwok
        .parent()
        .map(|d| d.join("kwok-stages"))
        .ok_or_else(|| E2eError::Setup(format!("{} has no directory", kwok.display())))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| {
            E2eError::Setup(format!(
                "KWOK's stages are missing ({}: {e}): run `make kwok`",
                dir.display()
            ))
        })?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(E2eError::Setup(format!(
            "{} holds no stages: run `make kwok`",
            dir.display()
        )));
    }
    Ok(files)
}

/// KWOK's controller and kube-scheduler, and the fake Nodes.
pub struct KwokNodes {
    kwok: Child,
    scheduler: Child,
    /// How many Nodes.
    pub count: u16,
}

impl KwokNodes {
    /// Starts KWOK and kube-scheduler against `plane` (files and logs under `dir`), creates `count`
    /// Nodes and waits until every one is Ready.
    pub async fn start(plane: &ControlPlane, dir: &Path, count: u16) -> Result<Self> {
        let kwok_bin = observability_tool("kwok")?;
        let stages = stage_files(&kwok_bin)?
            .iter()
            .map(std::fs::read_to_string)
            .collect::<std::io::Result<Vec<_>>>()?;
        std::fs::create_dir_all(dir.join("logs"))?;
        let config = dir.join("kwok.yaml");
        std::fs::write(&config, config_text(&stages))?;
        let kwok = Child::spawn(
            Spec::new("kwok", &kwok_bin)
                .args([
                    format!("--kubeconfig={}", plane.kubeconfig.display()),
                    format!("--config={}", config.display()),
                ])
                .log(dir.join("logs/kwok.log")),
        )?;
        let scheduler_config = dir.join("kube-scheduler.yaml");
        std::fs::write(&scheduler_config, scheduler_config_text(&plane.kubeconfig))?;
        let scheduler = Child::spawn(
            Spec::new(
                "kube-scheduler",
                kubernetes_bin_dir()?.join("kube-scheduler"),
            )
            .args([
                format!("--config={}", scheduler_config.display()),
                "--secure-port=0".to_string(),
                "--v=1".to_string(),
            ])
            .log(dir.join("logs/kube-scheduler.log")),
        )?;
        let nodes = Self {
            kwok,
            scheduler,
            count,
        };
        let client = plane.client().await?;
        let api: Api<Node> = Api::all(client.clone());
        for index in 0..count {
            match api
                .create(&PostParams::default(), &node_object(index)?)
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(err) => {
                    return Err(E2eError::Setup(format!(
                        "cannot create node {}: {err}",
                        node_name(index)
                    )));
                }
            }
        }
        nodes.wait_ready(&client, Duration::from_secs(120)).await?;
        Ok(nodes)
    }

    /// Waits until all [`KwokNodes::count`] Nodes are Ready (KWOK has initialized them).
    async fn wait_ready(&self, client: &Client, timeout: Duration) -> Result<()> {
        let api: Api<Node> = Api::all(client.clone());
        let selector = format!("{}={}", NODE_LABEL.0, NODE_LABEL.1);
        let deadline = Instant::now() + timeout;
        let mut ready = 0;
        while Instant::now() < deadline {
            for child in [&self.kwok, &self.scheduler] {
                if let Some(exit) = child.reap() {
                    return Err(E2eError::Setup(format!(
                        "{} exited ({exit:?}) while the KWOK nodes started",
                        child.name()
                    )));
                }
            }
            let nodes = api.list(&ListParams::default().labels(&selector)).await?;
            ready = nodes.items.iter().filter(|n| node_ready(n)).count();
            if ready >= usize::from(self.count) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(E2eError::NotReady {
            component: "KWOK nodes".into(),
            seconds: timeout.as_secs(),
            detail: format!("{ready} of {} Ready", self.count),
        })
    }

    /// Process id of KWOK's controller and of kube-scheduler (for resource accounting).
    pub fn pids(&self) -> [(&'static str, u32); 2] {
        [
            ("kwok", self.kwok.pid()),
            ("kube-scheduler", self.scheduler.pid()),
        ]
    }

    /// Stops kube-scheduler and KWOK.
    pub async fn stop(&self) {
        self.scheduler.stop(Duration::from_secs(5)).await;
        self.kwok.stop(Duration::from_secs(5)).await;
    }
}

/// Whether `node`'s Ready condition is True.
fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_carries_the_options_then_each_stage_as_a_document() {
        let text = config_text(&[
            "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata: {name: a}\n".into(),
            "---\nkind: Stage\nmetadata: {name: b}\n\n".into(),
        ]);
        let documents: Vec<&str> = text.split("---\n").collect();
        assert_eq!(documents.len(), 3, "{text}");
        assert!(documents[0].contains("kind: KwokConfiguration"));
        assert!(documents[0].contains(&format!("cidr: {POD_CIDR}")));
        assert!(
            documents[0].contains("manageNodesWithAnnotationSelector: kwok.x-k8s.io/node=fake")
        );
        assert!(documents[1].ends_with("metadata: {name: a}\n"));
        assert_eq!(documents[2], "kind: Stage\nmetadata: {name: b}\n");
    }

    #[test]
    fn a_node_is_annotated_for_kwok_and_labelled() {
        let node = node_object(7).expect("node");
        assert_eq!(node.metadata.name.as_deref(), Some("kwok-node-7"));
        let annotations = node.metadata.annotations.expect("annotations");
        assert_eq!(annotations["kwok.x-k8s.io/node"], "fake");
        let labels = node.metadata.labels.expect("labels");
        assert_eq!(labels["type"], "kwok");
        assert_eq!(labels["kubernetes.io/hostname"], "kwok-node-7");
    }

    #[test]
    fn the_scheduler_is_not_throttled_below_the_benchmark_rate() {
        let text = scheduler_config_text(Path::new("/k/kubeconfig"));
        assert!(text.contains("kubeconfig: /k/kubeconfig"));
        assert!(text.contains("qps: 2000"));
        assert!(text.contains("leaderElect: false"));
    }
}
