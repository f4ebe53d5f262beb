//! The real node's own network, mount and PID namespaces, and its cgroup.
//!
//! One long-lived process holds the namespaces: `unshare` runs `orchard-pause` as PID 1 of a new PID
//! namespace (it reaps the orphans containerd's shims leave). Every node component is started inside
//! with `nsenter`. When the harness dies, `unshare` dies (parent-death signal), kills PID 1, and the
//! kernel kills everything else in the namespace: the mounts (overlay snapshots, pod volumes, pod network
//! namespaces) vanish with the mount namespace, the veth pair, the bridge and every iptables rule with
//! the network namespace. Only the cgroup directories outlive it; [`remove_cgroups`] and the sweep of
//! dead runs remove them.
//!
//! Why not `ip netns exec`: it remounts `/sys` and loses the cgroup mounts the kubelet and runc need.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::layout::{Layout, cgroup_owner};
use crate::error::{E2eError, Result};
use crate::supervise::{Child, Spec};

/// Host-wide kernel settings the kubelet would change (they are not per network namespace); inside the
/// node's mount namespace they are shadowed by files holding the values it wants, so it reads those and
/// writes nothing.
const SHADOWED_SYSCTLS: &[(&str, &str)] = &[
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// The namespaces of a running node.
pub struct NodeNamespaces {
    /// Addresses, names, paths.
    pub layout: Layout,
    /// `unshare` (the supervised process; killing it tears the node down).
    pub holder: Child,
    /// Host pid of PID 1 inside the node.
    pub init_pid: u32,
}

/// Runs `command`, failing with its output when it does not succeed.
pub fn run(what: &str, command: &mut Command) -> Result<String> {
    let output = command.output().map_err(|e| {
        E2eError::Setup(format!(
            "{what}: cannot run {:?}: {e}",
            command.get_program()
        ))
    })?;
    if !output.status.success() {
        return Err(E2eError::Setup(format!(
            "{what} failed ({}): {}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).to_string())
}

/// The shell script that prepares the node's mount namespace (pure): a sysfs of the node's own network
/// namespace, private `/run`, `/var/log` and `/var/lib/cni`, the shadowed sysctls, and shared mount
/// propagation inside the namespace (the kubelet needs it for volumes; the host sees none of it).
pub fn mount_script(layout: &Layout) -> String {
    let dir = layout.dir.display();
    let mut script = format!(
        "set -e\n\
         mkdir -p {dir}/.cgroup-move /var/lib/cni\n\
         mount --rbind /sys/fs/cgroup {dir}/.cgroup-move\n\
         mount -t sysfs sysfs /sys\n\
         mount --move {dir}/.cgroup-move /sys/fs/cgroup\n\
         mount -t tmpfs -o mode=0755 tmpfs /run\n\
         mkdir -p /run/containerd\n\
         mount -t tmpfs -o mode=0755 tmpfs /var/log\n\
         mount -t tmpfs -o mode=0755 tmpfs /var/lib/cni\n"
    );
    for (name, value) in SHADOWED_SYSCTLS {
        let file = format!("{dir}/sysctl/{}", name.replace('/', "."));
        script.push_str(&format!(
            "printf '%s\\n' {value} > {file}\nmount --bind {file} /proc/sys/{name}\n"
        ));
    }
    script.push_str("mount --make-rshared /\n");
    script
}

/// `nsenter` into the node's namespaces: network and mount always, PID for long-running components
/// (so they die with the node).
pub fn nsenter(init_pid: u32, pid_namespace: bool) -> Vec<String> {
    let mut args = vec![
        "--target".to_string(),
        init_pid.to_string(),
        "--net".to_string(),
        "--mount".to_string(),
    ];
    if pid_namespace {
        args.push("--pid".to_string());
    }
    args.push("--".to_string());
    args
}

/// The shell script that moves its own shell into the cgroup directory given as `$0`, then becomes
/// the command in its arguments: the command, and every process it starts, is counted there from its
/// first instruction.
const JOIN_CGROUP_AND_EXEC: &str = "echo $$ > \"$0/cgroup.procs\" && exec \"$@\"";

/// The `cpuacct` hierarchy (cgroup v1; a separate mount on this machine, so joining a cgroup there
/// counts CPU time and changes no scheduling or limit).
const CPUACCT: &str = "/sys/fs/cgroup/cpuacct";

/// The `cpuacct` directory of `cgroup` (a path from the hierarchy's root, e.g. the node's cgroup).
pub fn cpuacct_dir(cgroup: &str) -> PathBuf {
    Path::new(CPUACCT).join(cgroup.trim_start_matches('/'))
}

/// Creates `cgroup` in the `cpuacct` hierarchy only (it accounts, it limits nothing) and returns its
/// directory.
pub fn create_accounting_cgroup(cgroup: &str) -> Result<PathBuf> {
    let dir = cpuacct_dir(cgroup);
    std::fs::create_dir_all(&dir)
        .map_err(|e| E2eError::Setup(format!("cannot create the cgroup {}: {e}", dir.display())))?;
    Ok(dir)
}

/// A supervised component running inside the node, accounted in the cgroup directory `cgroup_dir`
/// (from [`create_accounting_cgroup`]). The supervised process is the shell that joins the cgroup,
/// then `nsenter`; the component is its child.
pub fn component(
    name: &str,
    init_pid: u32,
    cgroup_dir: &Path,
    program: &Path,
    args: &[String],
    log: PathBuf,
) -> Spec {
    Spec::new(name, "sh")
        .args([
            OsString::from("-c"),
            OsString::from(JOIN_CGROUP_AND_EXEC),
            cgroup_dir.as_os_str().to_owned(),
            OsString::from("nsenter"),
        ])
        .args(nsenter(init_pid, true))
        .args([program.as_os_str().to_owned()])
        .args(args.iter().cloned())
        .log(log)
}

/// Runs a short command inside the node's network and mount namespaces and returns its output.
pub fn exec_in_node(init_pid: u32, what: &str, program: &str, args: &[&str]) -> Result<String> {
    run(
        what,
        Command::new("nsenter")
            .args(nsenter(init_pid, false))
            .arg(program)
            .args(args),
    )
}

/// The pid of the single child of `parent` (the namespace's PID 1, started by `unshare --fork`).
pub(crate) fn only_child(parent: u32, timeout: Duration) -> Result<u32> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let children = std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        if let Some(pid) = children
            .split_whitespace()
            .next()
            .and_then(|p| p.parse().ok())
        {
            return Ok(pid);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(E2eError::NotReady {
        component: "node namespaces".into(),
        seconds: timeout.as_secs(),
        detail: format!("unshare (pid {parent}) started no child"),
    })
}

impl NodeNamespaces {
    /// Creates the namespaces and the host's link into them for a cluster's first node, trying the
    /// next subnet while one is taken by another run. `pause` is the static `orchard-pause` binary.
    pub fn create(dir: &Path, pause: &Path) -> Result<Self> {
        Self::create_trying(
            dir,
            |index| Layout::new(index, std::process::id(), dir),
            pause,
            None,
        )
    }

    /// Creates the namespaces of node `ordinal` (1, 2, ...) of the cluster whose first node is
    /// `first` (already created, so its subnet is taken), with routes to the API server on the first
    /// node's host end. Join it to the cluster's other nodes with [`NodeNamespaces::peer`].
    pub fn create_member(dir: &Path, pause: &Path, ordinal: u8, first: &Layout) -> Result<Self> {
        Self::create_trying(
            dir,
            |index| Layout::member(ordinal, index, std::process::id(), dir, first),
            pause,
            Some(first.host_ip),
        )
    }

    fn create_trying(
        dir: &Path,
        layout_at: impl Fn(u8) -> Layout,
        pause: &Path,
        api: Option<std::net::Ipv4Addr>,
    ) -> Result<Self> {
        let first = Layout::for_this_process(dir);
        let mut last_error = None;
        for step in 0..8u8 {
            let layout = layout_at(first.index.wrapping_add(step));
            match Self::create_with(layout, pause, api) {
                Ok(node) => return Ok(node),
                Err(err) => last_error = Some(err),
            }
        }
        Err(last_error.unwrap_or_else(|| E2eError::Setup("no node subnet was free".into())))
    }

    fn create_with(layout: Layout, pause: &Path, api: Option<std::net::Ipv4Addr>) -> Result<Self> {
        let socket = layout.containerd_socket();
        if socket.as_os_str().len() > 100 {
            return Err(E2eError::Setup(format!(
                "the node directory {} is too deep for unix sockets (108 bytes); use a shorter CARGO_TARGET_DIR",
                layout.dir.display()
            )));
        }
        for sub in [
            "containerd/root",
            "containerd/state",
            "containerd/opt",
            "containerd/runc",
            "cni/net.d",
            "cni/ipam",
            "kubelet/volume-plugins",
            "kubelet/pki",
            "log/pods",
            "sysctl",
            "registry",
        ] {
            std::fs::create_dir_all(layout.path(sub))?;
        }
        std::fs::create_dir_all(
            layout.path(&format!("containerd/certs.d/{}", super::layout::IMAGE_HOST)),
        )?;
        let holder = Child::spawn(
            Spec::new("node-namespaces", "unshare")
                .args([
                    "--net",
                    "--mount",
                    "--pid",
                    "--fork",
                    "--kill-child",
                    "--mount-proc",
                    "--propagation",
                    "private",
                    "--",
                ])
                .args([pause.as_os_str().to_owned()])
                .log(layout.path("namespaces.log")),
        )?;
        let init_pid = only_child(holder.pid(), Duration::from_secs(10))?;
        let node = Self {
            layout,
            holder,
            init_pid,
        };
        if let Err(err) = node.prepare(api) {
            node.holder.kill_now();
            return Err(err);
        }
        Ok(node)
    }

    /// `api`: the API server's address when it is not this node's host end (a node other than the
    /// cluster's first).
    fn prepare(&self, api: Option<std::net::Ipv4Addr>) -> Result<()> {
        let layout = &self.layout;
        run(
            "preparing the node's mount namespace",
            Command::new("nsenter")
                .args(nsenter(self.init_pid, false))
                .args(["/bin/sh", "-c", &mount_script(layout)]),
        )?;
        run(
            "creating the node's veth pair",
            Command::new("ip").args([
                "link",
                "add",
                &layout.host_veth,
                "type",
                "veth",
                "peer",
                "name",
                &layout.node_veth,
                "netns",
                &self.init_pid.to_string(),
            ]),
        )?;
        let host_address = format!("{}/30", layout.host_ip);
        run(
            "addressing the host's veth",
            Command::new("ip").args(["addr", "add", &host_address, "dev", &layout.host_veth]),
        )?;
        run(
            "bringing up the host's veth",
            Command::new("ip").args(["link", "set", &layout.host_veth, "up"]),
        )?;
        // Host addresses that are neither the API server's nor the node's: the network tests' outside
        // hosts (listeners in the test process). They go with the veth.
        for ip in [layout.outside_ip, layout.protected_ip] {
            run(
                "addressing the outside test hosts",
                Command::new("ip").args([
                    "addr",
                    "add",
                    &format!("{ip}/32"),
                    "dev",
                    &layout.host_veth,
                ]),
            )?;
        }
        let outside_address = layout.outside_cidr();
        let node_address = format!("{}/30", layout.node_ip);
        let host_ip = layout.host_ip.to_string();
        for (what, args) in [
            ("loopback", vec!["link", "set", "lo", "up"]),
            (
                "node address",
                vec!["addr", "add", &node_address, "dev", &layout.node_veth],
            ),
            ("node veth", vec!["link", "set", &layout.node_veth, "up"]),
            (
                "route to the outside test hosts",
                vec![
                    "route",
                    "add",
                    &outside_address,
                    "via",
                    &host_ip,
                    "dev",
                    &layout.node_veth,
                ],
            ),
        ] {
            exec_in_node(self.init_pid, what, "ip", &args)?;
        }
        // Pods answer the host (the operator, the gateway, tests) through the node: a route into our
        // namespace, never one out of the machine.
        run(
            "routing the pod subnet to the node",
            Command::new("ip").args([
                "route",
                "add",
                &layout.pod_cidr(),
                "via",
                &layout.node_ip.to_string(),
                "dev",
                &layout.host_veth,
            ]),
        )?;
        // The cluster's Service range goes to its first node (kube-proxy there translates it; the
        // backend may be on another node, reached over the nodes' own link).
        if layout.is_first() {
            run(
                "routing service addresses to the node",
                Command::new("ip").args([
                    "route",
                    "add",
                    &layout.service_cidr(),
                    "via",
                    &layout.node_ip.to_string(),
                    "dev",
                    &layout.host_veth,
                ]),
            )?;
        }
        if let Some(route) = api.and_then(|api| layout.api_route(api)) {
            let args: Vec<&str> = route.iter().map(String::as_str).collect();
            exec_in_node(self.init_pid, "route to the API server", "ip", &args)?;
        }
        create_cgroups(&layout.cgroup_root)?;
        Ok(())
    }

    /// Joins this node and `other` (of the same cluster) by a veth pair created straight into their
    /// two network namespaces (the host never holds either end), and routes each one's pod subnet
    /// and address over it ([`Layout::peer_routes`]). The link goes away with either namespace, and
    /// the routes through it with the link.
    pub fn peer(&self, other: &NodeNamespaces) -> Result<()> {
        let (a, b) = (&self.layout, &other.layout);
        run(
            "joining two nodes' network namespaces",
            Command::new("ip").args([
                "link",
                "add",
                &a.peer_link(b),
                "netns",
                &self.init_pid.to_string(),
                "type",
                "veth",
                "peer",
                "name",
                &b.peer_link(a),
                "netns",
                &other.init_pid.to_string(),
            ]),
        )?;
        for (node, routes) in [(self, a.peer_routes(b)), (other, b.peer_routes(a))] {
            for route in routes {
                let args: Vec<&str> = route.iter().map(String::as_str).collect();
                exec_in_node(node.init_pid, "routing to the other node", "ip", &args)?;
            }
        }
        Ok(())
    }

    /// Kills the node (everything in its PID namespace) and removes its cgroups.
    pub async fn destroy(&self) {
        self.holder.stop(Duration::from_secs(5)).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{}", self.init_pid)).exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let root = self.layout.cgroup_root.clone();
        let _ = tokio::task::spawn_blocking(move || remove_cgroups(&root, Duration::from_secs(10)))
            .await;
    }
}

/// The cgroup hierarchies mounted under `/sys/fs/cgroup` (v1 controllers, `systemd`, and `unified`).
fn hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Creates `root` in every hierarchy (the kubelet checks they all exist), with the parent's cpuset.
pub fn create_cgroups(root: &str) -> Result<()> {
    for hierarchy in hierarchies() {
        let dir = hierarchy.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir)?;
        if hierarchy.ends_with("cpuset") {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let value = std::fs::read_to_string(hierarchy.join(file))?;
                std::fs::write(dir.join(file), value.trim())?;
            }
        }
    }
    Ok(())
}

/// Removes `root` and everything under it from every hierarchy, deepest first, retrying while the
/// kernel still tears down the last tasks (blocking; at most `timeout`).
pub fn remove_cgroups(root: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let left: Vec<PathBuf> = hierarchies()
            .into_iter()
            .map(|h| h.join(root.trim_start_matches('/')))
            .filter(|d| d.exists())
            .collect();
        for dir in &left {
            remove_tree(dir);
        }
        if left.iter().all(|d| !d.exists()) || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `rmdir` of a cgroup directory and its sub-cgroups, children first (cgroupfs has no recursive
/// removal; the files inside are not removable and go with their directory).
fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Top-level node cgroups (`/orchard-node-<pid>`, `/orchard-node-<pid>-<n>`) of the harness
/// processes for which `owned` holds, in any hierarchy.
fn cgroup_roots_where(owned: impl Fn(u32) -> bool) -> Vec<String> {
    let mut roots = std::collections::BTreeSet::new();
    for hierarchy in hierarchies() {
        let Ok(entries) = std::fs::read_dir(&hierarchy) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if cgroup_owner(&name).is_some_and(&owned) {
                roots.insert(format!("/{name}"));
            }
        }
    }
    roots.into_iter().collect()
}

/// Node cgroups of harness runs whose process is gone (an interrupted run); used by the sweep.
pub fn stale_cgroup_roots() -> Vec<String> {
    cgroup_roots_where(|pid| !Path::new(&format!("/proc/{pid}")).exists())
}

/// The node cgroups of harness process `pid` (every node of its cluster).
pub fn cgroup_roots_of(pid: u32) -> Vec<String> {
    cgroup_roots_where(|owner| owner == pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_component_joins_its_cgroup_before_it_becomes_its_command() {
        let dir = std::env::temp_dir().join(format!("join-cgroup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let output = Command::new("sh")
            .args(["-c", JOIN_CGROUP_AND_EXEC])
            .arg(&dir)
            .args(["sh", "-c", "echo $$"])
            .output()
            .unwrap();
        let joined = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(output.status.success());
        assert_eq!(
            joined.trim(),
            String::from_utf8_lossy(&output.stdout).trim(),
            "the process that joined is the command (exec keeps the pid)"
        );
        let failed = Command::new("sh")
            .args(["-c", JOIN_CGROUP_AND_EXEC, "/nonexistent-cgroup", "true"])
            .output()
            .unwrap();
        assert!(!failed.status.success(), "no cgroup, no command");
    }

    #[test]
    fn the_mount_script_keeps_cgroups_and_shadows_the_global_sysctls() {
        let script = mount_script(&Layout::new(1, 7, Path::new("/n")));
        let sysfs = script.find("mount -t sysfs").unwrap();
        let moved = script
            .find("mount --move /n/.cgroup-move /sys/fs/cgroup")
            .unwrap();
        let shared = script.find("mount --make-rshared /").unwrap();
        assert!(
            sysfs < moved && moved < shared,
            "cgroups survive the new sysfs; propagation last"
        );
        assert!(script.contains(
            "mount --bind /n/sysctl/vm.overcommit_memory /proc/sys/vm/overcommit_memory"
        ));
        assert!(script.contains("mount -t tmpfs -o mode=0755 tmpfs /run"));
    }

    #[test]
    fn components_enter_all_three_namespaces() {
        assert_eq!(
            nsenter(42, true),
            ["--target", "42", "--net", "--mount", "--pid", "--"]
        );
        assert!(!nsenter(42, false).contains(&"--pid".to_string()));
    }
}
