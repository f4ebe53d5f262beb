//! A real Kubernetes node on this machine: kubelet, containerd with runc, a CNI bridge and kube-proxy,
//! in namespaces of their own ([`namespaces`]), pulling images built here ([`images`]) from a registry
//! on the node's loopback; kube-scheduler on the host binds pods to it. Every sandbox is then a real
//! container from a real image. See `docs/TESTING.md`, "The real node".
//!
//! Start: [`NodeNamespaces::create`] (before the control plane, which listens on the host's end of
//! the node's veth pair), then [`RealNode::start`]. Stop: [`RealNode::stop`] kills the namespaces and
//! removes the node's cgroups; nothing is left on the host.
//!
//! A cluster may have several: [`NodeNamespaces::create_member`] for each further node and
//! [`NodeNamespaces::peer`] to join every two (a link of their own, [`layout`]), then
//! [`RealNode::start`] for each in turn, the first with kube-scheduler. [`drain`] cordons and drains a
//! node; [`RealNode::reclaim`] takes one away as a spot reclaim does.

pub mod drain;
pub mod images;
pub mod layout;
pub mod namespaces;
pub mod network_policy;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;

pub use self::layout::{IMAGE_HOST, Layout, NODE_NAME, node_name};
pub use self::namespaces::NodeNamespaces;
use crate::binaries::{kubernetes_bin_dir, node_tools_dir};
use crate::control_plane::ControlPlane;
use crate::error::{E2eError, Result};
use crate::supervise::{Child, Spec};

/// The component that runs on the host, not inside the node (and so not in an accounting cgroup).
const SCHEDULER: &str = "kube-scheduler";

/// Where Debian's packages put runc and the CNI plugins (`make node-deps`).
const RUNC: &str = "/usr/sbin/runc";
const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// A running real node.
pub struct RealNode {
    /// The node's namespaces and addresses.
    pub namespaces: NodeNamespaces,
    /// Images pushed into the node's registry: name (`debian-python`) -> pod image reference.
    pub images: images::Pushed,
    /// The OCI image layouts the images were pushed from: name -> directory (for a test that runs an
    /// image's root filesystem outside the node, e.g. the Harbor task set's local equivalence run).
    pub layouts: BTreeMap<String, PathBuf>,
    /// Log directory of the node's components.
    pub logs: PathBuf,
    components: Mutex<Vec<Child>>,
}

impl RealNode {
    /// What is missing for a real node on this machine, if anything (root, the Debian packages, kernel
    /// features), as a sentence.
    pub fn unavailable() -> Option<String> {
        if !nix::unistd::geteuid().is_root() {
            return Some("the real node needs root (namespaces, mounts, cgroups)".into());
        }
        for (path, package) in [
            (RUNC, "runc"),
            ("/usr/lib/cni/bridge", "containernetworking-plugins"),
            ("/usr/sbin/iptables", "iptables"),
        ] {
            if !Path::new(path).exists() {
                return Some(format!(
                    "{path} is missing: install {package} (make node-deps)"
                ));
            }
        }
        if !std::fs::read_to_string("/proc/filesystems").is_ok_and(|f| f.contains("overlay")) {
            return Some("the kernel has no overlayfs".into());
        }
        None
    }

    /// Starts containerd, the kubelet and kube-proxy in `namespaces`, kube-scheduler on the host (with
    /// `scheduler`: once per cluster, with its first node), and waits until the node is Ready.
    /// `images` come from [`images::build`]. A cluster's nodes start one after the other: their
    /// registries keep their blobs in one directory ([`images::blob_dir`]), and a node's push of
    /// blobs that are already there writes none.
    pub async fn start(
        namespaces: NodeNamespaces,
        plane: &ControlPlane,
        images: &[images::Built],
        logs: &Path,
        enforce_network_policies: bool,
        scheduler: bool,
    ) -> Result<Self> {
        let k8s = kubernetes_bin_dir()?;
        let tools = node_tools_dir()?;
        let layout = namespaces.layout.clone();
        let init = namespaces.init_pid;
        std::fs::create_dir_all(logs)?;
        write_configs(&layout, plane)?;

        let node = Self {
            namespaces,
            images: images::Pushed::default(),
            layouts: images
                .iter()
                .map(|built| (built.name.clone(), built.layout.clone()))
                .collect(),
            logs: logs.to_path_buf(),
            components: Mutex::new(Vec::new()),
        };
        let blobs = images::blob_dir()?;
        node.spawn(node.component(
            "registry",
            &tools.join("crane"),
            &[
                "registry".into(),
                "serve".into(),
                "--address".into(),
                layout::REGISTRY.into(),
                "--disk".into(),
                blobs.display().to_string(),
            ],
        )?)?;
        let pushed = images::push(init, &tools.join("crane"), images).await?;
        // containerd moves each shim it starts here (`ShimCgroup`).
        namespaces::create_accounting_cgroup(&layout.accounting_cgroup(layout::SHIMS))?;

        node.spawn(
            node.component(
                "containerd",
                &tools.join("containerd"),
                &[
                    "--config".into(),
                    layout.path("containerd/config.toml").display().to_string(),
                ],
            )?
            // containerd finds its shim next to itself.
            .env(
                "PATH",
                format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", tools.display()),
            ),
        )?;
        wait_for(
            &layout.containerd_socket(),
            Duration::from_secs(30),
            "containerd socket",
        )
        .await?;

        node.spawn(node.component(
            "kubelet",
            &k8s.join("kubelet"),
            &[
                format!("--config={}", layout.path("kubelet/config.yaml").display()),
                format!(
                    "--kubeconfig={}",
                    layout.path("kubelet/kubeconfig").display()
                ),
                format!("--hostname-override={}", layout.name),
                format!("--node-ip={}", layout.node_ip),
                format!("--root-dir={}", layout.path("kubelet/root").display()),
                format!("--cert-dir={}", layout.path("kubelet/pki").display()),
                "--v=1".into(),
            ],
        )?)?;
        node.spawn(node.component(
            "kube-proxy",
            &k8s.join("kube-proxy"),
            &[
                format!(
                    "--config={}",
                    layout.path("kube-proxy/config.yaml").display()
                ),
                "--v=1".into(),
            ],
        )?)?;
        if scheduler {
            node.spawn(
                Spec::new(SCHEDULER, k8s.join("kube-scheduler"))
                    .args([
                        format!(
                            "--kubeconfig={}",
                            layout.path("kube-scheduler.kubeconfig").display()
                        ),
                        "--leader-elect=false".to_string(),
                        "--secure-port=0".to_string(),
                        "--v=1".to_string(),
                    ])
                    .log(logs.join("kube-scheduler.log")),
            )?;
        }
        let node = Self {
            images: pushed,
            ..node
        };
        node.wait_ready(&plane.client().await?, Duration::from_secs(90))
            .await?;
        node.set_pod_cidr(&plane.client().await?).await?;
        // kube-router needs the registered Node (its addresses): it starts once the node is Ready.
        if enforce_network_policies {
            let client = plane.client().await?;
            network_policy::grant_kube_router(&client).await?;
            node.spawn(
                node.component(
                    "kube-router",
                    &tools.join("kube-router"),
                    &network_policy::kube_router_args(&layout),
                )?
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            )?;
            network_policy::wait_enforcing(init, Duration::from_secs(60)).await?;
        }
        Ok(node)
    }

    /// Component `name` inside the node, accounted in its own cgroup with every process it starts
    /// ([`Layout::accounting_cgroup`]); its log is `<name>.log`.
    fn component(&self, name: &str, program: &Path, args: &[String]) -> Result<Spec> {
        let layout = &self.namespaces.layout;
        let cgroup = namespaces::create_accounting_cgroup(&layout.accounting_cgroup(name))?;
        Ok(namespaces::component(
            name,
            self.namespaces.init_pid,
            &cgroup,
            program,
            args,
            self.logs.join(format!("{name}.log")),
        ))
    }

    fn spawn(&self, spec: Spec) -> Result<()> {
        let child = Child::spawn(spec)?;
        self.components
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(child);
        Ok(())
    }

    /// Records the node's pod range in `spec.podCIDRs`, as kube-controller-manager's node IPAM
    /// (`--allocate-node-cidrs`) does in most clusters, so that the operator can discover it
    /// (`--discover-pod-cidrs`).
    async fn set_pod_cidr(&self, client: &Client) -> Result<()> {
        let cidr = self.namespaces.layout.pod_cidr();
        let nodes: Api<Node> = Api::all(client.clone());
        nodes
            .patch(
                &self.namespaces.layout.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({
                    "spec": {"podCIDR": cidr, "podCIDRs": [cidr]}
                })),
            )
            .await?;
        Ok(())
    }

    /// Waits until the Node object reports Ready.
    async fn wait_ready(&self, client: &Client, timeout: Duration) -> Result<()> {
        let nodes: Api<Node> = Api::all(client.clone());
        let deadline = Instant::now() + timeout;
        let mut last = "not registered".to_string();
        while Instant::now() < deadline {
            if let Some(node) = nodes.get_opt(self.name()).await? {
                let ready = node
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
                match ready {
                    Some(c) if c.status == "True" => return Ok(()),
                    Some(c) => {
                        last = format!(
                            "{}: {}",
                            c.reason.clone().unwrap_or_default(),
                            c.message.clone().unwrap_or_default()
                        )
                    }
                    None => last = "no Ready condition yet".into(),
                }
            }
            if let Some(dead) = self.dead_component() {
                return Err(E2eError::Setup(format!(
                    "{dead} exited while the node was starting; see {}",
                    self.logs.join(format!("{dead}.log")).display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(E2eError::NotReady {
            component: format!("node {}", self.name()),
            seconds: timeout.as_secs(),
            detail: format!("{last} (logs: {})", self.logs.display()),
        })
    }

    fn dead_component(&self) -> Option<String> {
        self.components
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|c| c.has_exited())
            .map(|c| c.name().to_string())
    }

    /// The Node's name (`orchard-node` for a cluster's first node, `orchard-node-2`, ...).
    pub fn name(&self) -> &str {
        &self.namespaces.layout.name
    }

    /// The image reference of a built image (`debian-python`, `debian-chromium`, `busybox`, `probe`,
    /// `orchard-agent`).
    pub fn image(&self, name: &str) -> String {
        self.images.reference(name)
    }

    /// Host pids and real uids of this node's processes (those in its cgroup) whose command line
    /// starts with the words `argv` (e.g. a container's `["/orchard-operator"]`, or
    /// `["/orchard-operator", "egress-proxy"]`); `exact` also requires no further words.
    pub fn processes(&self, argv: &[&str], exact: bool) -> Vec<(u32, u32)> {
        let node_cgroup = format!("{}/", self.namespaces.layout.cgroup_root);
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let path = entry.path();
            let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
            let words: Vec<&[u8]> = cmdline
                .strip_suffix(&[0])
                .unwrap_or(&cmdline)
                .split(|b| *b == 0)
                .collect();
            let starts = words.len() >= argv.len()
                && argv.iter().zip(&words).all(|(a, w)| a.as_bytes() == *w);
            let cgroups = std::fs::read_to_string(path.join("cgroup")).unwrap_or_default();
            if !starts || (exact && words.len() != argv.len()) || !cgroups.contains(&node_cgroup) {
                continue;
            }
            let status = std::fs::read_to_string(path.join("status")).unwrap_or_default();
            if let Some(uid) = status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            {
                found.push((pid, uid));
            }
        }
        found
    }

    /// Pushes an image from outside the harness's own builds (a release's image tarball, `make dist`)
    /// into the node's registry as `name:tag`, like a user's `crane push`; returns the reference pods use.
    pub fn push_image(&self, source: &Path, name: &str, tag: &str) -> Result<String> {
        let crane = node_tools_dir()?.join("crane");
        images::push_one(
            self.namespaces.init_pid,
            &crane.display().to_string(),
            source,
            name,
            tag,
        )
    }

    /// Whether image `name` was built and pushed (the operator image only after `make operator-image`).
    pub fn has_image(&self, name: &str) -> bool {
        self.images.contains(name)
    }

    /// Runs a command inside the node's network and mount namespaces (`crictl`-free debugging: `ip`,
    /// `ctr`, `iptables`).
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        namespaces::exec_in_node(self.namespaces.init_pid, program, program, args)
    }

    /// IDs of containerd's Kubernetes containers, all of them or those carrying label `key=value`
    /// (e.g. `io.kubernetes.pod.uid`), read with `ctr`.
    pub fn containers(&self, label: Option<(&str, &str)>) -> Result<Vec<String>> {
        let ctr = node_tools_dir()?.join("ctr");
        let socket = self.namespaces.layout.containerd_socket();
        let mut command = std::process::Command::new(ctr);
        command.arg("--address").arg(&socket).args([
            "--namespace",
            "k8s.io",
            "containers",
            "ls",
            "--quiet",
        ]);
        if let Some((key, value)) = label {
            command.arg(format!("labels.\"{key}\"=={value}"));
        }
        let listed = namespaces::run("listing containers", &mut command)?;
        Ok(listed
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect())
    }

    /// IDs of containerd tasks (running or stopped container processes the runtime still tracks).
    pub fn tasks(&self) -> Result<Vec<String>> {
        let ctr = node_tools_dir()?.join("ctr");
        let socket = self.namespaces.layout.containerd_socket();
        let listed = namespaces::run(
            "listing tasks",
            std::process::Command::new(ctr)
                .arg("--address")
                .arg(&socket)
                .args(["--namespace", "k8s.io", "tasks", "ls", "--quiet"]),
        )?;
        Ok(listed
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect())
    }

    /// The network namespace file of pod `pod_uid`, from its sandbox container's spec (`None` when
    /// the pod has no sandbox container).
    pub fn pod_network_namespace(&self, pod_uid: &str) -> Result<Option<PathBuf>> {
        let ctr = node_tools_dir()?.join("ctr");
        let socket = self.namespaces.layout.containerd_socket();
        let filter = format!(
            "labels.\"io.kubernetes.pod.uid\"=={pod_uid},labels.\"io.cri-containerd.kind\"==sandbox"
        );
        let ids = namespaces::run(
            "listing the pod's sandbox",
            std::process::Command::new(&ctr)
                .arg("--address")
                .arg(&socket)
                .args([
                    "--namespace",
                    "k8s.io",
                    "containers",
                    "ls",
                    "--quiet",
                    &filter,
                ]),
        )?;
        let Some(id) = ids.lines().find(|l| !l.is_empty()) else {
            return Ok(None);
        };
        let info = namespaces::run(
            "reading the pod's sandbox",
            std::process::Command::new(&ctr)
                .arg("--address")
                .arg(&socket)
                .args(["--namespace", "k8s.io", "containers", "info", id]),
        )?;
        let info: serde_json::Value = serde_json::from_str(&info)
            .map_err(|e| E2eError::Setup(format!("ctr containers info: {e}")))?;
        Ok(network_namespace_path(&info))
    }

    /// Process ids of the node's components that run on the host rather than in an accounting
    /// cgroup (kube-scheduler), by name (for resource accounting).
    pub fn host_pids(&self) -> Vec<(String, u32)> {
        self.components
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|c| c.name() == SCHEDULER)
            .map(|c| (c.name().to_string(), c.pid()))
            .collect()
    }

    /// The cgroup v1 `cpuacct.usage` files (CPU nanoseconds) that account everything else the node
    /// runs, by what each holds: every pod's containers; each component with the processes it starts
    /// (containerd with the CNI plugins, kube-proxy with iptables); containerd's shims with `runc`.
    pub fn cpu_usage_files(&self) -> Vec<(String, PathBuf)> {
        let layout = &self.namespaces.layout;
        let usage = |cgroup: &str| namespaces::cpuacct_dir(cgroup).join("cpuacct.usage");
        let mut files = vec![(
            "pods (every container, agents included)".to_string(),
            usage(&format!("{}/kubepods", layout.cgroup_root)),
        )];
        let components = self
            .components
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|c| c.name() != SCHEDULER)
            .map(|c| c.name().to_string())
            .collect::<Vec<_>>();
        for name in components {
            let label = match name.as_str() {
                "containerd" => "containerd (with the CNI plugins it runs)".to_string(),
                "kube-proxy" => "kube-proxy (with iptables)".to_string(),
                other => other.to_string(),
            };
            files.push((label, usage(&layout.accounting_cgroup(&name))));
        }
        files.push((
            "containerd shims and runc".to_string(),
            usage(&layout.accounting_cgroup(layout::SHIMS)),
        ));
        files
    }

    /// Takes the node away as a spot reclaim does: every process of the node is SIGKILLed, the
    /// kubelet, containerd, its shims, every container, kube-proxy, kube-router and the registry (all
    /// that runs in the node's cgroup; kube-scheduler, the cluster's, keeps running), then the node's
    /// network drops every packet (its INPUT, FORWARD and OUTPUT chains), so callers time out as
    /// they would on a vanished machine. The node's
    /// namespaces, links and routes stay (a dead machine still holds its addresses), so packets for
    /// its pods are dropped there rather than routed anywhere else; [`RealNode::stop`] removes them.
    /// The Node object is left to the control plane: it goes NotReady once its Lease expires.
    pub async fn reclaim(&self) -> Result<()> {
        // The sockets the kills orphan would otherwise retransmit into the dropped network for minutes,
        // and an orphaned socket keeps the node's network namespace (and its links) alive after the
        // harness exits. One retry (per network namespace: the host's setting is untouched).
        self.exec(
            "/bin/sh",
            &["-c", "echo 1 > /proc/sys/net/ipv4/tcp_orphan_retries"],
        )?;
        let components: Vec<Child> = {
            let mut all = self.components.lock().unwrap_or_else(|p| p.into_inner());
            let (keep, gone): (Vec<Child>, Vec<Child>) =
                all.drain(..).partition(|c| c.name() == SCHEDULER);
            *all = keep;
            gone
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = self.cgroup_pids();
            if left.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(E2eError::Setup(format!(
                    "processes of node {} outlived SIGKILL: {left:?}",
                    self.name()
                )));
            }
            for pid in left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for child in &components {
            child.stop(Duration::from_secs(1)).await;
        }
        // After the kills, so that no kube-router sync puts its own rules back in front.
        for chain in ["INPUT", "FORWARD", "OUTPUT"] {
            self.exec("iptables", &["-w", "-I", chain, "1", "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Host pids of every process in the node's cgroup (its components with what they start, and
    /// every container).
    fn cgroup_pids(&self) -> Vec<u32> {
        let node_cgroup = format!("{}/", self.namespaces.layout.cgroup_root);
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
                let cgroups = std::fs::read_to_string(entry.path().join("cgroup")).ok()?;
                cgroups.contains(&node_cgroup).then_some(pid)
            })
            .filter(|&pid| pid != self.namespaces.init_pid)
            .collect()
    }

    /// Stops everything: kube-scheduler, then the namespaces (every node process, container, mount and
    /// network device with them), then the node's cgroups and unpacked image layers.
    pub async fn stop(&self) {
        let components: Vec<Child> = self
            .components
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for child in components.iter().filter(|c| c.name() == SCHEDULER) {
            child.stop(Duration::from_secs(5)).await;
        }
        self.namespaces.destroy().await;
        for child in &components {
            child.stop(Duration::from_secs(1)).await;
        }
        let _ = std::fs::remove_dir_all(self.namespaces.layout.path("containerd/root"));
    }
}

/// The network namespace path in a `ctr containers info` document (pure).
pub fn network_namespace_path(info: &serde_json::Value) -> Option<PathBuf> {
    info["Spec"]["linux"]["namespaces"]
        .as_array()?
        .iter()
        .find(|ns| ns["type"] == "network")?["path"]
        .as_str()
        .map(PathBuf::from)
}

async fn wait_for(path: &Path, timeout: Duration, what: &str) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if path.exists() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(E2eError::NotReady {
        component: what.into(),
        seconds: timeout.as_secs(),
        detail: format!("{} does not exist", path.display()),
    })
}

/// Writes containerd's, the CNI's, the kubelet's, kube-proxy's and kube-scheduler's files.
fn write_configs(layout: &Layout, plane: &ControlPlane) -> Result<()> {
    let write = |relative: &str, text: String| -> Result<()> {
        let path = layout.path(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, text)?;
        Ok(())
    };
    write(
        "containerd/config.toml",
        layout::containerd_config(layout, Path::new(RUNC), Path::new(CNI_BIN_DIR)),
    )?;
    write(
        &format!("containerd/certs.d/{IMAGE_HOST}/hosts.toml"),
        layout::registry_hosts(),
    )?;
    // Docker Hub names (`busybox:1.36`) resolve to the node's registry too, which holds stand-ins
    // for the public images the user docs name (`images::aliases`): pod traffic never leaves the
    // machine.
    write(
        "containerd/certs.d/docker.io/hosts.toml",
        layout::registry_hosts(),
    )?;
    write(
        "cni/net.d/10-orchard.conflist",
        serde_json::to_string_pretty(&layout::cni_conflist(layout)).unwrap_or_default(),
    )?;
    let token = |user: &str| {
        plane.tokens.get(user).cloned().ok_or_else(|| {
            E2eError::Setup(format!(
                "the control plane has no user {user}: start it with real_node"
            ))
        })
    };
    let ca = plane.serving_ca();
    write(
        "kubelet/config.yaml",
        layout::kubelet_config(layout, &plane.kubelet_client_ca()),
    )?;
    write(
        "kubelet/kubeconfig",
        layout::token_kubeconfig(
            &plane.server,
            &ca,
            &token(&format!("system:node:{}", layout.name))?,
        ),
    )?;
    write(
        "kube-proxy/config.yaml",
        layout::kube_proxy_config(layout, &layout.path("kube-proxy/kubeconfig")),
    )?;
    write(
        "kube-proxy/kubeconfig",
        layout::token_kubeconfig(&plane.server, &ca, &token("system:kube-proxy")?),
    )?;
    write(
        "kube-router/kubeconfig",
        layout::token_kubeconfig(&plane.server, &ca, &token("system:kube-router")?),
    )?;
    write(
        "kube-scheduler.kubeconfig",
        layout::token_kubeconfig(&plane.server, &ca, &token("system:kube-scheduler")?),
    )?;
    Ok(())
}
