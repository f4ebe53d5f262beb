//! Where a real node lives and how its parts are configured (pure): addresses, names, paths, and the
//! configuration files of containerd, the CNI bridge, the kubelet and kube-proxy.
//!
//! The node runs in network, mount and PID namespaces of its own (like a kind node, without a container
//! engine). It reaches the host through one veth pair in a /30 of 10.250.0.0/16; pods sit on a bridge in
//! a /24 of 10.244.0.0/16. The node's namespace has no default route and no masquerading: pod traffic
//! can reach the host's control plane and nothing beyond this machine.
//!
//! A cluster may have several real nodes (`orchard-node`, `orchard-node-2`, ...), each a layout of its
//! own index. Pod traffic between two nodes goes over a veth pair joining their network namespaces
//! directly ([`Layout::peer_link`], [`Layout::peer_routes`]), like a private link between two machines:
//! the host forwards nothing, and a node that goes away takes the link and the routes through it along.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Name of the (first) real node (the kubelet's `--hostname-override`); the others are
/// [`node_name`]`(1)` = `orchard-node-2`, ...
pub const NODE_NAME: &str = "orchard-node";

/// The name of node `ordinal` of a cluster (0-based): [`NODE_NAME`], then `orchard-node-2`, ... (pure).
pub fn node_name(ordinal: u8) -> String {
    if ordinal == 0 {
        NODE_NAME.to_string()
    } else {
        format!("{NODE_NAME}-{}", u16::from(ordinal) + 1)
    }
}
/// The registry inside the node's network namespace (its own loopback).
pub const REGISTRY: &str = "127.0.0.1:5000";
/// The name images carry in pod specs; containerd maps it to [`REGISTRY`] over plain HTTP.
pub const IMAGE_HOST: &str = "localhost:5000";
/// The pod sandbox image (our own pause program).
pub const PAUSE_IMAGE: &str = "localhost:5000/pause:3.10";

/// Addresses and names of one node, derived from a small index so concurrent runs do not collide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Index (0..=63) the subnets are derived from.
    pub index: u8,
    /// The node's place in its cluster (0 for the first node, which the host routes the Service
    /// range to and whose host address the API server listens on).
    pub ordinal: u8,
    /// The Node's name ([`node_name`] of the ordinal).
    pub name: String,
    /// The host's end of the veth pair (kube-apiserver listens here).
    pub host_ip: Ipv4Addr,
    /// The node's end of the veth pair (`--node-ip`).
    pub node_ip: Ipv4Addr,
    /// A second address on the host's end (`10.251.<index>.1`), routed from the node: a host outside
    /// the cluster for network tests, distinct from the API server's address.
    pub outside_ip: Ipv4Addr,
    /// A third one (`10.251.<index>.2`): an outside host the tests declare protected (a stand-in for
    /// the cloud metadata address, which must not be taken over on this machine).
    pub protected_ip: Ipv4Addr,
    /// The pod subnet on the node's bridge (a /24).
    pub pod_subnet: Ipv4Addr,
    /// The cluster's Service addresses (a /24, kube-apiserver `--service-cluster-ip-range`), routed
    /// from the host to the cluster's first node: each live cluster has its own (its first node's
    /// index), so runs never share a route; the other nodes of a cluster carry the first one's.
    pub service_subnet: Ipv4Addr,
    /// Host-side veth name.
    pub host_veth: String,
    /// Node-side veth name.
    pub node_veth: String,
    /// The node's cgroup (created in every cgroup v1 hierarchy and removed after the run):
    /// [`cgroup_root`] of the harness pid and the ordinal.
    pub cgroup_root: String,
    /// Directory holding the node's configuration and state.
    pub dir: PathBuf,
}

/// Prefix of the node's cgroup directories (`<prefix><pid>`, `<prefix><pid>-<n>`); the sweep removes
/// those of dead runs.
pub const CGROUP_PREFIX: &str = "orchard-node-";

/// The cgroup of node `ordinal` of harness `pid`: `/orchard-node-<pid>` for the first node (as with a
/// single node), `/orchard-node-<pid>-2`, ... for the others (pure).
pub fn cgroup_root(pid: u32, ordinal: u8) -> String {
    if ordinal == 0 {
        format!("/{CGROUP_PREFIX}{pid}")
    } else {
        format!("/{CGROUP_PREFIX}{pid}-{}", u16::from(ordinal) + 1)
    }
}

/// The harness pid owning a top-level cgroup directory named `name` ([`cgroup_root`] without its
/// slash), or `None` when the name is not a node's (pure).
pub fn cgroup_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(CGROUP_PREFIX)?;
    let (pid, node) = match rest.split_once('-') {
        Some((pid, node)) => (pid, Some(node)),
        None => (rest, None),
    };
    if let Some(node) = node
        && (node.is_empty() || !node.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

impl Layout {
    /// The layout of the first node of a cluster, at `index`, for the harness process `pid`, keeping
    /// its files in `dir`.
    pub fn new(index: u8, pid: u32, dir: &Path) -> Self {
        let index = index % 64;
        let quad = index * 4;
        Self {
            index,
            ordinal: 0,
            name: node_name(0),
            host_ip: Ipv4Addr::new(10, 250, 0, quad + 1),
            node_ip: Ipv4Addr::new(10, 250, 0, quad + 2),
            outside_ip: Ipv4Addr::new(10, 251, index, 1),
            protected_ip: Ipv4Addr::new(10, 251, index, 2),
            pod_subnet: Ipv4Addr::new(10, 244, index, 0),
            service_subnet: Ipv4Addr::new(10, 96, index, 0),
            host_veth: format!("orh{index}"),
            node_veth: format!("orn{index}"),
            cgroup_root: cgroup_root(pid, 0),
            dir: dir.to_path_buf(),
        }
    }

    /// The layout of node `ordinal` (1, 2, ...) of the cluster whose first node is `first`, at `index`:
    /// its own addresses, links, name and cgroup, and the cluster's Service range.
    pub fn member(ordinal: u8, index: u8, pid: u32, dir: &Path, first: &Layout) -> Self {
        Self {
            ordinal,
            name: node_name(ordinal),
            service_subnet: first.service_subnet,
            cgroup_root: cgroup_root(pid, ordinal),
            ..Self::new(index, pid, dir)
        }
    }

    /// Whether this is the cluster's first node (the host routes the Service range to it).
    pub fn is_first(&self) -> bool {
        self.ordinal == 0
    }

    /// The device in this node's network namespace of the veth pair that joins it to node `other`
    /// (`orp<other's index>`; the link exists only inside the two nodes' namespaces).
    pub fn peer_link(&self, other: &Layout) -> String {
        format!("orp{}", other.index)
    }

    /// The `ip` commands, run in this node's network namespace once the link to `other` exists, that
    /// send pod traffic for `other` over it: the link carries this node's own address, `other`'s
    /// address is on its far side, and `other`'s pod subnet is reached through it. Nothing else: no
    /// default route, so a packet for neither node nor the host has nowhere to go (pure).
    pub fn peer_routes(&self, other: &Layout) -> Vec<Vec<String>> {
        let link = self.peer_link(other);
        let own = self.node_ip.to_string();
        let words = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        vec![
            words(&["addr", "add", &format!("{own}/32"), "dev", &link]),
            words(&["link", "set", &link, "up"]),
            words(&[
                "route",
                "add",
                &format!("{}/32", other.node_ip),
                "dev",
                &link,
                "scope",
                "link",
                "src",
                &own,
            ]),
            words(&[
                "route",
                "add",
                &other.pod_cidr(),
                "via",
                &other.node_ip.to_string(),
                "dev",
                &link,
                "src",
                &own,
            ]),
        ]
    }

    /// The route, in this node's namespace, to the API server's address `api` when it is not this
    /// node's own host end (a node other than the first reaches it through its own veth: the host
    /// answers on any of its addresses), or `None` (pure).
    pub fn api_route(&self, api: Ipv4Addr) -> Option<Vec<String>> {
        (api != self.host_ip).then(|| {
            [
                "route",
                "add",
                &format!("{api}/32"),
                "via",
                &self.host_ip.to_string(),
                "dev",
                &self.node_veth,
            ]
            .iter()
            .map(|a| a.to_string())
            .collect()
        })
    }

    /// The Service range as a CIDR (`10.96.<index>.0/24`).
    pub fn service_cidr(&self) -> String {
        format!("{}/24", self.service_subnet)
    }

    /// The layout for this process: the first index from the pid's on (mod 64) whose host link does
    /// not exist yet, so a run never collides with another live node on this machine.
    pub fn for_this_process(dir: &Path) -> Self {
        let pid = std::process::id();
        let taken = |index: u8| Path::new(&format!("/sys/class/net/orh{index}")).exists();
        Self::new(free_index(pid, taken), pid, dir)
    }

    /// The bridge's address, the pods' gateway.
    pub fn pod_gateway(&self) -> Ipv4Addr {
        let [a, b, c, _] = self.pod_subnet.octets();
        Ipv4Addr::new(a, b, c, 1)
    }

    /// The outside test hosts as a CIDR (`10.251.<index>.0/30`: `.1` and `.2`).
    pub fn outside_cidr(&self) -> String {
        format!("10.251.{}.0/30", self.index)
    }

    /// The pod subnet in CIDR notation.
    pub fn pod_cidr(&self) -> String {
        format!("{}/24", self.pod_subnet)
    }

    /// A path under the node's directory.
    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.join(relative)
    }

    /// containerd's socket.
    pub fn containerd_socket(&self) -> PathBuf {
        self.path("containerd/containerd.sock")
    }

    /// The cgroup that accounts the CPU time of node component `name` and of every process it starts
    /// (e.g. `containerd` with the CNI plugins it runs), like a systemd unit's slice on a real node.
    /// [`SHIMS`] holds containerd's shims and the `runc` they run.
    pub fn accounting_cgroup(&self, name: &str) -> String {
        format!("{}/{ACCOUNTING}/{name}", self.cgroup_root)
    }
}

/// The directory under the node's cgroup that holds one accounting cgroup per component.
const ACCOUNTING: &str = "components";

/// The accounting cgroup name of containerd's shims (containerd's `ShimCgroup`): every `runc` call is
/// the child of a shim, so its CPU time is counted there; a container's own processes move to their
/// pod's cgroup.
pub const SHIMS: &str = "shims";

/// containerd's configuration (CRI plugin, overlayfs, runc with cgroupfs, the CNI bridge, the local
/// registry), config format 3. `restrict_oom_score_adj`: this machine's root lacks `CAP_SYS_RESOURCE`,
/// so no process may lower its OOM score below its parent's; containers keep containerd's (0) instead
/// of the kubelet's negative values.
pub fn containerd_config(layout: &Layout, runc: &Path, cni_bin_dir: &Path) -> String {
    let dir = layout.dir.display();
    format!(
        r#"version = 3
root = "{dir}/containerd/root"
state = "{dir}/containerd/state"

[grpc]
  address = "{socket}"

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "{dir}/containerd/opt"
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{PAUSE_IMAGE}"
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = "{dir}/containerd/certs.d"
  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "{runc}"
          SystemdCgroup = false
          Root = "{dir}/containerd/runc"
          ShimCgroup = "{shims}"
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["{cni}"]
      conf_dir = "{dir}/cni/net.d"
      max_conf_num = 1
"#,
        socket = layout.containerd_socket().display(),
        runc = runc.display(),
        cni = cni_bin_dir.display(),
        shims = layout.accounting_cgroup(SHIMS),
    )
}

/// containerd's `hosts.toml` for [`IMAGE_HOST`]: plain HTTP to the registry on the node's loopback.
pub fn registry_hosts() -> String {
    format!(
        "server = \"http://{REGISTRY}\"\n\n[host.\"http://{REGISTRY}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    )
}

/// The CNI network: a bridge with host-local addresses, no masquerading (pod traffic keeps its
/// address and goes nowhere but this machine), and portmap for `hostPort`s.
pub fn cni_conflist(layout: &Layout) -> serde_json::Value {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "orchard",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "orchard0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": layout.pod_cidr(), "gateway": layout.pod_gateway().to_string()}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": layout.path("cni/ipam").display().to_string(),
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    })
}

/// The kubelet's configuration: cgroup v1 allowed, cgroupfs under the node's own cgroup, containerd,
/// x509 and webhook authentication of the API server's calls (exec, logs, port-forward), no eviction
/// or image garbage collection on this test machine's disk, no DNS resolver of the host's, no pull
/// rate limit (the registry is on the node's loopback), OOM scores left alone (this machine's root
/// lacks `CAP_SYS_RESOURCE`), and CPU limits not enforced as CFS quotas: requests still reserve the
/// node's two cores, so sandboxes request a sliver each and are not throttled to it (memory limits are
/// enforced). The node Lease is renewed every second (a quarter of its 4 s duration): the test control
/// plane's node-lifecycle controller declares a node gone after 5 s of silence, and with the default
/// 10 s renewal it marked every pod not ready between two renewals.
pub fn kubelet_config(layout: &Layout, client_ca: &Path) -> String {
    let dir = layout.dir.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {cgroup}
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
containerRuntimeEndpoint: unix://{socket}
runtimeRequestTimeout: 2m
address: {node_ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
rotateCertificates: false
serverTLSBootstrap: false
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true, cacheTTL: 2m}}
  x509: {{clientCAFile: {ca}}}
authorization:
  mode: Webhook
failSwapOn: false
evictionHard: {{memory.available: "100Mi", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}}
evictionPressureTransitionPeriod: 30s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 80
clusterDomain: cluster.local
resolvConf: ""
maxPods: 250
registerNode: true
nodeStatusUpdateFrequency: 5s
nodeLeaseDurationSeconds: 4
podLogsDir: {dir}/log/pods
volumePluginDir: {dir}/kubelet/volume-plugins
protectKernelDefaults: false
serializeImagePulls: false
registryPullQPS: 0
oomScoreAdj: 0
cpuCFSQuota: false
"#,
        cgroup = layout.cgroup_root,
        socket = layout.containerd_socket().display(),
        node_ip = layout.node_ip,
        ca = client_ca.display(),
    )
}

/// kube-proxy's configuration: iptables inside the node's namespace, no conntrack sysctl writes (they
/// are global or read-only outside the host's namespace), no `route_localnet`.
pub fn kube_proxy_config(layout: &Layout, kubeconfig: &Path) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
hostnameOverride: {name}
mode: iptables
clusterCIDR: 10.244.0.0/16
detectLocalMode: ClusterCIDR
bindAddress: {node_ip}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["primary"]
iptables:
  masqueradeAll: false
  localhostNodePorts: false
  minSyncPeriod: 1s
  syncPeriod: 30s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
"#,
        kubeconfig = kubeconfig.display(),
        node_ip = layout.node_ip,
        name = layout.name,
    )
}

/// A kubeconfig that authenticates with a bearer token.
pub fn token_kubeconfig(server: &str, ca: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: local\n  context: {{cluster: local, user: user}}\ncurrent-context: local\n",
        ca = ca.display()
    )
}

/// The first index from `pid % 64` on (wrapping) that `taken` does not claim; `pid % 64` when all are
/// taken (creating the link then fails with a clear error) (pure given `taken`).
pub fn free_index(pid: u32, taken: impl Fn(u8) -> bool) -> u8 {
    let start = u8::try_from(pid % 64).unwrap_or(0);
    (0..64u8)
        .map(|offset| (start + offset) % 64)
        .find(|&index| !taken(index))
        .unwrap_or(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_index_is_skipped() {
        assert_eq!(free_index(70, |_| false), 6);
        assert_eq!(free_index(70, |i| i == 6 || i == 7), 8);
        assert_eq!(free_index(63, |i| i == 63), 0);
        assert_eq!(free_index(5, |_| true), 5);
    }

    #[test]
    fn subnets_follow_the_index_and_never_overlap() {
        let dir = Path::new("/tmp/n");
        let a = Layout::new(0, 10, dir);
        let b = Layout::new(1, 11, dir);
        assert_eq!(a.host_ip, Ipv4Addr::new(10, 250, 0, 1));
        assert_eq!(a.node_ip, Ipv4Addr::new(10, 250, 0, 2));
        assert_eq!(b.host_ip, Ipv4Addr::new(10, 250, 0, 5));
        assert_eq!(b.pod_cidr(), "10.244.1.0/24");
        assert_eq!(b.pod_gateway(), Ipv4Addr::new(10, 244, 1, 1));
        assert_eq!(
            Layout::new(63, 1, dir).node_ip,
            Ipv4Addr::new(10, 250, 0, 254)
        );
        assert_eq!(a.cgroup_root, "/orchard-node-10");
        assert!(
            a.host_veth.len() <= 15 && a.node_veth.len() <= 15,
            "interface names fit IFNAMSIZ"
        );
    }

    #[test]
    fn nodes_are_named_and_given_cgroups_by_ordinal() {
        assert_eq!(node_name(0), "orchard-node");
        assert_eq!(node_name(1), "orchard-node-2");
        assert_eq!(node_name(255), "orchard-node-256");
        assert_eq!(cgroup_root(42, 0), "/orchard-node-42");
        assert_eq!(cgroup_root(42, 1), "/orchard-node-42-2");
        for ordinal in [0, 1, 7] {
            let root = cgroup_root(4242, ordinal);
            assert_eq!(
                cgroup_owner(root.trim_start_matches('/')),
                Some(4242),
                "{root}"
            );
        }
        for foreign in [
            "orchard-node-",
            "orchard-node-x",
            "orchard-node-12-",
            "orchard-node-12-a",
            "orchard-node-12-2-3",
            "orchard-nodes-12",
            "kubepods",
        ] {
            assert_eq!(cgroup_owner(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn a_member_node_has_its_own_addresses_and_the_clusters_services() {
        let first = Layout::new(5, 77, Path::new("/r/node"));
        let second = Layout::member(1, 6, 77, Path::new("/r/node-2"), &first);
        assert!(first.is_first() && !second.is_first());
        assert_eq!(second.name, "orchard-node-2");
        assert_eq!(second.cgroup_root, "/orchard-node-77-2");
        assert_eq!(
            second.service_cidr(),
            first.service_cidr(),
            "one Service range"
        );
        assert_eq!(second.pod_cidr(), "10.244.6.0/24");
        assert_ne!(second.node_ip, first.node_ip);
        assert_ne!(second.host_veth, first.host_veth);
        assert_eq!(second.dir, Path::new("/r/node-2"));
        let proxy = kube_proxy_config(&second, Path::new("/kp"));
        assert!(
            proxy.contains("hostnameOverride: orchard-node-2"),
            "{proxy}"
        );
        assert!(
            kube_proxy_config(&first, Path::new("/kp"))
                .contains("hostnameOverride: orchard-node\n")
        );
    }

    #[test]
    fn peers_route_each_others_pods_over_their_own_link_and_nothing_else() {
        let a = Layout::new(5, 1, Path::new("/a"));
        let b = Layout::member(1, 6, 1, Path::new("/b"), &a);
        assert_eq!(a.peer_link(&b), "orp6");
        assert_eq!(b.peer_link(&a), "orp5");
        let routes = a.peer_routes(&b);
        let text: Vec<String> = routes.iter().map(|r| r.join(" ")).collect();
        assert_eq!(
            text,
            [
                "addr add 10.250.0.22/32 dev orp6",
                "link set orp6 up",
                "route add 10.250.0.26/32 dev orp6 scope link src 10.250.0.22",
                "route add 10.244.6.0/24 via 10.250.0.26 dev orp6 src 10.250.0.22",
            ]
        );
        assert!(
            !text
                .iter()
                .any(|r| r.contains("default") || r.contains("0.0.0.0")),
            "no default route"
        );
        assert_eq!(
            a.api_route(a.host_ip),
            None,
            "the first node's API server is its own host end"
        );
        assert_eq!(
            b.api_route(a.host_ip).map(|r| r.join(" ")),
            Some("route add 10.250.0.21/32 via 10.250.0.25 dev orn6".into())
        );
    }

    #[test]
    fn the_cni_bridge_never_masquerades() {
        let conf = cni_conflist(&Layout::new(3, 1, Path::new("/n")));
        assert_eq!(conf["plugins"][0]["ipMasq"], false);
        assert_eq!(
            conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.244.3.0/24"
        );
    }

    #[test]
    fn configs_name_the_node_paths() {
        let layout = Layout::new(2, 1, Path::new("/n"));
        let containerd = containerd_config(
            &layout,
            Path::new("/usr/sbin/runc"),
            Path::new("/usr/lib/cni"),
        );
        assert!(containerd.contains("address = \"/n/containerd/containerd.sock\""));
        assert!(containerd.contains("sandbox = \"localhost:5000/pause:3.10\""));
        assert!(containerd.contains("ShimCgroup = \"/orchard-node-1/components/shims\""));
        let kubelet = kubelet_config(&layout, Path::new("/ca.crt"));
        assert!(kubelet.contains("failCgroupV1: false"));
        assert!(kubelet.contains("cgroupRoot: /orchard-node-1"));
        assert!(kubelet.contains("address: 10.250.0.10"));
        let proxy = kube_proxy_config(&layout, Path::new("/kp"));
        assert!(proxy.contains("maxPerCore: 0"));
        assert!(registry_hosts().contains("http://127.0.0.1:5000"));
    }
}
