//! A whole local cluster for tests or the demo: control plane, CRDs, a node and the operator process.
//! The node is the hollow node (each pod's agent a host process: fast, for the scale run and most
//! tests) or a real node (kubelet, containerd, runc, CNI: every sandbox a real container). Test binaries
//! share one environment ([`TestEnv::shared`] or [`TestEnv::shared_real`]), started on first use on a
//! dedicated thread whose runtime lives as long as the process; each test works in its own namespace.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};

use crate::binaries::{
    agent_bin, kubernetes_bin_dir, node_bin, operator_bin, target_dir, workspace_root,
};
use crate::control_plane::{ControlPlane, PlaneOptions};
use crate::error::{E2eError, Result};
use crate::hollow_node::{HollowNode, NodeConfig};
use crate::kwok::{KwokNodes, NODE_MONITOR_GRACE};
use crate::operator_process::OperatorProcess;
use crate::real_node::namespaces::{cgroup_roots_of, remove_cgroups, stale_cgroup_roots};
use crate::real_node::{NodeNamespaces, RealNode, images};
use crate::supervise::{RUN_MARKER, kill_marked, run_marker, sweep_orphans};

/// CPU of a sandbox on the real node whose spec sets none (the operator's default is 1): 400 sandboxes
/// fit on the node's two cores. The node does not enforce CPU limits as quotas (`real_node::layout`),
/// so this reserves capacity without throttling.
pub const REAL_NODE_DEFAULT_CPU: &str = "5m";
/// Memory of a sandbox on the real node whose spec sets none (the operator's default is 2Gi): 200
/// sandboxes fit in this machine's memory. Enforced: a spec that needs more asks for more.
pub const REAL_NODE_DEFAULT_MEMORY: &str = "64Mi";

/// CPU of a sandbox on the KWOK nodes whose spec sets none: KWOK gives each node 1k CPU.
pub const KWOK_DEFAULT_CPU: &str = "100m";
/// Memory of a sandbox on the KWOK nodes whose spec sets none: with KWOK's 1 TiB a node, 100 nodes
/// hold 400,000 of them.
pub const KWOK_DEFAULT_MEMORY: &str = "256Mi";

/// The operator's test-only flag for nodes without agents (`kwok`): its own calls to agents are
/// answered in process.
pub const SIMULATED_AGENT_FLAG: &str = "--simulated-agent";

/// Which node the cluster gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeKind {
    /// Pods' agents as host processes (`hollow_node`).
    #[default]
    Hollow,
    /// kubelet, containerd, runc and CNI in namespaces of their own (`real_node`), as many nodes
    /// as [`EnvOptions::real_nodes`] says.
    Real,
    /// [`EnvOptions::kwok_nodes`] fake nodes whose pods have no processes (`kwok`), and the operator
    /// with `--simulated-agent`: the control plane at scale.
    Kwok,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct EnvOptions {
    /// Start the operator process.
    pub operator: bool,
    /// Extra operator flags.
    pub operator_args: Vec<String>,
    /// The node.
    pub node: NodeKind,
    /// How many real nodes, with [`NodeKind::Real`] (at least 1): `orchard-node`, `orchard-node-2`,
    /// ..., each with its own kubelet, containerd, registry and network namespace, pod traffic
    /// between them over links of their own (`real_node::layout`). kube-scheduler runs once.
    pub real_nodes: u8,
    /// Enforce NetworkPolicies on the real node (kube-router). Off by default: an operator running
    /// as a host process reaches agents from the host, which the sandboxes' policies do not allow.
    pub enforce_network_policies: bool,
    /// kube-apiserver writes an audit log of writes (`ControlPlane::audit_log`).
    pub audit_log: bool,
    /// With `audit_log`: reads too (`PlaneOptions::audit_reads`).
    pub audit_reads: bool,
    /// How many KWOK nodes, with [`NodeKind::Kwok`].
    pub kwok_nodes: u16,
}

/// Where a real node's SandboxSnapshots go: the operator flags that commit them through its containerd
/// (its socket is not at the usual `/run/containerd/containerd.sock`) and push them to its registry
/// (pods name it `localhost:5000`; the committer runs in the node's network namespace).
pub fn snapshot_flags(node: &RealNode) -> [(&'static str, String); 3] {
    [
        (
            "--snapshot-registry",
            format!("{}/orchard-snapshots", crate::real_node::IMAGE_HOST),
        ),
        (
            "--snapshot-committer-image",
            node.image("orchard-committer"),
        ),
        (
            "--snapshot-containerd-socket",
            node.namespaces
                .layout
                .containerd_socket()
                .display()
                .to_string(),
        ),
    ]
}

impl Default for EnvOptions {
    fn default() -> Self {
        Self {
            operator: true,
            operator_args: Vec::new(),
            node: NodeKind::Hollow,
            real_nodes: 1,
            enforce_network_policies: false,
            audit_log: false,
            audit_reads: false,
            kwok_nodes: 100,
        }
    }
}

/// The cluster's node (or real nodes).
pub enum ClusterNode {
    /// The hollow node.
    Hollow(HollowNode),
    /// The real nodes, the first (`orchard-node`) first; never empty.
    Real(Vec<RealNode>),
    /// KWOK's fake nodes.
    Kwok(KwokNodes),
}

impl ClusterNode {
    /// The hollow node (panics on a real node: the test needs the hollow node's fault injection).
    pub fn hollow(&self) -> &HollowNode {
        match self {
            Self::Hollow(node) => node,
            _ => panic!("this test needs the hollow node"),
        }
    }

    /// The (first) real node, `orchard-node` (panics on the hollow node).
    pub fn real(&self) -> &RealNode {
        match self.reals().first() {
            Some(node) => node,
            None => panic!("the cluster has no real node"),
        }
    }

    /// Every real node, the first first (panics on the hollow node).
    pub fn reals(&self) -> &[RealNode] {
        match self {
            Self::Real(nodes) => nodes,
            _ => panic!("this test needs the real node"),
        }
    }

    /// The real node named `name` (`orchard-node-2`; panics when there is none).
    pub fn real_named(&self, name: &str) -> &RealNode {
        match self.reals().iter().find(|node| node.name() == name) {
            Some(node) => node,
            None => panic!("the cluster has no real node {name}"),
        }
    }

    /// The KWOK nodes (panics on any other node).
    pub fn kwok(&self) -> &KwokNodes {
        match self {
            Self::Kwok(nodes) => nodes,
            _ => panic!("this test needs the KWOK nodes"),
        }
    }

    async fn stop(&self) {
        match self {
            Self::Hollow(node) => node.shutdown().await,
            Self::Kwok(nodes) => nodes.stop().await,
            // The others first: the first one runs the cluster's kube-scheduler.
            Self::Real(nodes) => {
                for node in nodes.iter().rev() {
                    node.stop().await;
                }
            }
        }
    }
}

/// A running local cluster.
pub struct TestEnv {
    /// Working directory (logs, kubeconfig, pod directories).
    pub dir: PathBuf,
    /// etcd, kube-apiserver, kube-controller-manager.
    pub control_plane: ControlPlane,
    /// The node.
    pub node: ClusterNode,
    /// The operator process, if started.
    pub operator: Option<OperatorProcess>,
    handle: tokio::runtime::Handle,
}

extern "C" fn kill_own_children_at_exit() {
    kill_marked(RUN_MARKER, run_marker());
    // A real node's processes are gone with its namespaces; the kernel keeps its (now empty) cgroup,
    // one per node.
    for root in cgroup_roots_of(std::process::id()) {
        remove_cgroups(&root, Duration::from_secs(5));
    }
    // Pod directories on tmpfs hold memory: remove this run's.
    if let Ok(entries) = std::fs::read_dir("/dev/shm") {
        let suffix = format!("-{}", std::process::id());
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with("orchard-e2e-") && name.ends_with(&suffix) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// How long the working directory (logs, etcd data) of a finished run is kept, so that `make e2e`
/// running the next test binary does not delete the logs of one that failed.
const KEEP_FINISHED_RUNS: Duration = Duration::from_secs(3600);

/// Removes working directories of earlier runs whose process is gone and that have not changed for
/// [`KEEP_FINISHED_RUNS`].
fn remove_stale_dirs(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let pid = name.rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
        let age = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|modified| modified.elapsed().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
            && age.is_none_or(|age| age > KEEP_FINISHED_RUNS)
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl TestEnv {
    /// Starts a cluster named `name` on the current runtime.
    pub async fn start(name: &str, options: EnvOptions) -> Result<Self> {
        let swept = sweep_orphans();
        if swept > 0 {
            tracing::warn!(swept, "killed processes left over by an earlier run");
        }
        // Interrupted real-node runs leave empty cgroups (the kernel keeps them): remove them.
        for root in stale_cgroup_roots() {
            tracing::warn!(%root, "removing the cgroup of an interrupted real-node run");
            remove_cgroups(&root, Duration::from_secs(5));
        }
        static AT_EXIT: OnceLock<()> = OnceLock::new();
        AT_EXIT.get_or_init(|| {
            // SAFETY: registers a plain extern "C" function with no captured state (nix has no atexit).
            unsafe {
                libc::atexit(kill_own_children_at_exit);
            }
        });
        let root = target_dir().join("e2e");
        std::fs::create_dir_all(&root)?;
        remove_stale_dirs(&root);
        remove_stale_pod_roots();
        let dir = root.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("logs"))?;
        log_harness_to(&dir.join("logs/harness.log"));
        let bin_dir = kubernetes_bin_dir()?;
        let crds = workspace_root().join("crds");
        let mut operator_args = options.operator_args.clone();
        let (control_plane, node) = match options.node {
            NodeKind::Hollow => {
                let plane_options = PlaneOptions {
                    audit_log: options.audit_log,
                    ..PlaneOptions::default()
                };
                let control_plane =
                    ControlPlane::start(&dir, &bin_dir, &crds, plane_options).await?;
                let client = control_plane.client_as("orchard-local-node").await?;
                // The agent injector "image": a root filesystem holding only the static agent binary.
                let image_root = dir.join("images/orchard-agent");
                std::fs::create_dir_all(&image_root)?;
                let agent = agent_bin()?;
                std::fs::copy(&agent, image_root.join("orchard-agent")).map_err(|e| {
                    E2eError::Setup(format!("cannot copy {}: {e}", agent.display()))
                })?;
                let node = HollowNode::start(
                    client,
                    NodeConfig::new("orchard-local-node", pod_root(&dir), image_root),
                )
                .await?;
                (control_plane, ClusterNode::Hollow(node))
            }
            NodeKind::Kwok => {
                let plane_options = PlaneOptions {
                    audit_log: options.audit_log,
                    audit_reads: options.audit_reads,
                    node_monitor_grace: NODE_MONITOR_GRACE,
                    ..PlaneOptions::default()
                };
                let control_plane =
                    ControlPlane::start(&dir, &bin_dir, &crds, plane_options).await?;
                let nodes = KwokNodes::start(&control_plane, &dir, options.kwok_nodes).await?;
                operator_args.push(SIMULATED_AGENT_FLAG.to_string());
                for (flag, value) in [
                    ("--default-cpu", KWOK_DEFAULT_CPU),
                    ("--default-memory", KWOK_DEFAULT_MEMORY),
                ] {
                    if !operator_args.iter().any(|a| a.starts_with(flag)) {
                        operator_args.push(format!("{flag}={value}"));
                    }
                }
                (control_plane, ClusterNode::Kwok(nodes))
            }
            NodeKind::Real => {
                if let Some(why) = RealNode::unavailable() {
                    return Err(E2eError::Setup(format!("no real node here: {why}")));
                }
                let built = images::build()?;
                let pause = node_bin("orchard-pause")?;
                let count = options.real_nodes.max(1);
                let first = NodeNamespaces::create(&dir.join("node"), &pause)?;
                let mut namespaces = vec![first];
                let mut joined = Ok(());
                for ordinal in 1..count {
                    let member = NodeNamespaces::create_member(
                        &dir.join(format!("node-{}", u16::from(ordinal) + 1)),
                        &pause,
                        ordinal,
                        &namespaces[0].layout,
                    )
                    .and_then(|member| {
                        for other in &namespaces {
                            other.peer(&member)?;
                        }
                        Ok(member)
                    });
                    match member {
                        Ok(member) => namespaces.push(member),
                        Err(err) => {
                            joined = Err(err);
                            break;
                        }
                    }
                }
                if let Err(err) = joined {
                    for node in &namespaces {
                        node.destroy().await;
                    }
                    return Err(err);
                }
                let plane_options = PlaneOptions {
                    address: namespaces[0].layout.host_ip,
                    service_cidr: namespaces[0].layout.service_cidr(),
                    real_node: true,
                    real_nodes: count,
                    audit_log: options.audit_log,
                    ..PlaneOptions::default()
                };
                let control_plane =
                    match ControlPlane::start(&dir, &bin_dir, &crds, plane_options).await {
                        Ok(plane) => plane,
                        Err(err) => {
                            for node in &namespaces {
                                node.destroy().await;
                            }
                            return Err(err);
                        }
                    };
                // One after the other: the first runs kube-scheduler, and the nodes' registries share
                // one blob directory (a later node's push finds every blob there and writes none).
                let mut nodes = Vec::new();
                for namespaces in namespaces {
                    let ordinal = namespaces.layout.ordinal;
                    let logs = if ordinal == 0 {
                        dir.join("logs/node")
                    } else {
                        dir.join(format!("logs/node-{}", u16::from(ordinal) + 1))
                    };
                    nodes.push(
                        RealNode::start(
                            namespaces,
                            &control_plane,
                            &built,
                            &logs,
                            options.enforce_network_policies,
                            ordinal == 0,
                        )
                        .await?,
                    );
                }
                let node = &nodes[0];
                operator_args.push(format!("--agent-image={}", node.image("orchard-agent")));
                // SandboxSnapshots: committed through the node's containerd and pushed to its own
                // registry, which its containerd pulls from. One node only: each node has a socket
                // path and a registry of its own.
                if count == 1 {
                    for (flag, value) in snapshot_flags(node) {
                        if !operator_args.iter().any(|a| a.starts_with(flag)) {
                            operator_args.push(format!("{flag}={value}"));
                        }
                    }
                }
                // The node has this machine's two cores and the scheduler counts requests: a small
                // default lets tests and benchmarks run many sandboxes at once.
                for (flag, value) in [
                    ("--default-cpu", REAL_NODE_DEFAULT_CPU),
                    ("--default-memory", REAL_NODE_DEFAULT_MEMORY),
                ] {
                    if !operator_args.iter().any(|a| a.starts_with(flag)) {
                        operator_args.push(format!("{flag}={value}"));
                    }
                }
                (control_plane, ClusterNode::Real(nodes))
            }
        };

        let operator = if options.operator {
            Some(
                OperatorProcess::start(
                    &operator_bin()?,
                    &control_plane.kubeconfig,
                    &dir.join("logs/orchard-operator.log"),
                    &operator_args,
                )
                .await?,
            )
        } else {
            None
        };
        Ok(Self {
            dir,
            control_plane,
            node,
            operator,
            handle: tokio::runtime::Handle::current(),
        })
    }

    /// The environment with the hollow node shared by every test of this test binary (started on first
    /// use).
    pub fn shared() -> &'static TestEnv {
        static ENV: OnceLock<TestEnv> = OnceLock::new();
        ENV.get_or_init(|| Self::start_on_own_thread(EnvOptions::default()))
    }

    /// The environment with a real node shared by every test of this test binary.
    pub fn shared_real() -> &'static TestEnv {
        static ENV: OnceLock<TestEnv> = OnceLock::new();
        ENV.get_or_init(|| {
            Self::start_on_own_thread(EnvOptions {
                node: NodeKind::Real,
                ..EnvOptions::default()
            })
        })
    }

    /// A real node that enforces NetworkPolicies, and no operator process, shared by every test of
    /// this test binary: the tests install the operator into the cluster (`chart_install`).
    pub fn shared_in_cluster() -> &'static TestEnv {
        static ENV: OnceLock<TestEnv> = OnceLock::new();
        ENV.get_or_init(|| {
            Self::start_on_own_thread(EnvOptions {
                operator: false,
                node: NodeKind::Real,
                enforce_network_policies: true,
                ..EnvOptions::default()
            })
        })
    }

    fn start_on_own_thread(options: EnvOptions) -> TestEnv {
        let name = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().to_string()))
            .map(|s| s.split('-').next().unwrap_or("e2e").to_string())
            .unwrap_or_else(|| "e2e".into());
        Self::start_named_on_own_thread(&name, options)
    }

    /// Starts a local cluster named `name` with `options` on a thread of its own, whose runtime keeps
    /// it alive for the rest of the process (a test binary's shared environment: `OnceLock<TestEnv>`).
    pub fn start_named_on_own_thread(name: &str, options: EnvOptions) -> TestEnv {
        let name = name.to_string();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("e2e-env".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = tx.send(Err(E2eError::Setup(format!("tokio runtime: {err}"))));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let env = TestEnv::start(&name, options).await;
                    let _ = tx.send(env);
                    std::future::pending::<()>().await;
                });
            })
            .expect("cannot start the e2e environment thread");
        match rx.recv() {
            Ok(Ok(env)) => env,
            Ok(Err(err)) => panic!("the local test cluster did not start: {err}"),
            Err(_) => panic!("the local test cluster thread died while starting"),
        }
    }

    /// A new admin client usable on the caller's runtime.
    pub async fn client(&self) -> Client {
        match self.control_plane.client().await {
            Ok(client) => client,
            Err(err) => panic!("cannot build a client for the local cluster: {err}"),
        }
    }

    /// The operator process (panics when the environment was started without one).
    pub fn operator(&self) -> &OperatorProcess {
        self.operator
            .as_ref()
            .expect("this environment runs no operator")
    }

    /// Runs `future` on the environment's own runtime (for operations that use its long-lived client).
    pub async fn on_env_runtime<F, T>(&self, future: F) -> T
    where
        F: std::future::Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        match self.handle.spawn(future).await {
            Ok(value) => value,
            Err(err) => panic!("task on the environment runtime failed: {err}"),
        }
    }

    /// Creates a fresh namespace `<prefix>-<random>` and returns its name.
    pub async fn namespace(&self, prefix: &str) -> String {
        let client = self.client().await;
        let name = format!("{prefix}-{:04x}", rand_u16());
        let api: Api<Namespace> = Api::all(client);
        let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
            .expect("namespace JSON is valid");
        if let Err(err) = api.create(&PostParams::default(), &ns).await {
            panic!("cannot create namespace {name}: {err}");
        }
        name
    }

    /// Deletes a namespace (best effort; the namespace controller finishes it asynchronously).
    pub async fn delete_namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.client().await);
        let _ = api.delete(name, &DeleteParams::default()).await;
    }

    /// The last `lines` lines of the operator's log (for failure messages).
    pub fn operator_log_tail(&self, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self.dir.join("logs/orchard-operator.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Stops the operator, the node's pods and the control plane.
    pub async fn stop(&self) {
        if let Some(operator) = &self.operator {
            operator.kill();
        }
        self.node.stop().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.control_plane.stop();
        kill_marked(RUN_MARKER, run_marker());
        if let Some(shm_dir) = pod_root(&self.dir)
            .parent()
            .filter(|p| p.starts_with("/dev/shm"))
        {
            let _ = std::fs::remove_dir_all(shm_dir);
        }
    }
}

/// Sends the harness's own warnings (the hollow node's watches and status writes, the real node's
/// start) to `path`, once per process (`ORCHARD_E2E_LOG` sets the filter; default `warn`). A process
/// that installed a subscriber of its own (a binary) keeps it.
fn log_harness_to(path: &Path) {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        else {
            return;
        };
        let filter = tracing_subscriber::EnvFilter::try_from_env("ORCHARD_E2E_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(file))
            .try_init();
    });
}

/// Removes pod directories on tmpfs of runs whose process is gone (they hold memory: no grace period).
fn remove_stale_pod_roots() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix("orchard-e2e-") else {
            continue;
        };
        let pid = rest.rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Where pod directories live: on tmpfs (`/dev/shm`) when there is one, like `emptyDir` with
/// `medium: Memory` (thousands of short-lived pod directories cost ext4 a lot of journal work), else
/// under the cluster directory.
fn pod_root(dir: &Path) -> PathBuf {
    let shm = Path::new("/dev/shm");
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "cluster".into());
    let candidate = shm.join(format!("orchard-e2e-{name}"));
    if shm.is_dir() && std::fs::create_dir_all(&candidate).is_ok() {
        return candidate.join("pods");
    }
    dir.join("pods")
}

fn rand_u16() -> u16 {
    rand::random()
}
