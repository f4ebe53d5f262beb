//! Where a real node lives and how its parts are configured (pure): addresses, names, paths, and the
//! configuration files of containerd, the CNI bridge, the kubelet and kube-proxy.
//!
//! The node runs in network, mount and PID namespaces of its own (like a kind node, without a container
//! engine). It reaches the host through one veth pair in a /30 of 10.250.0.0/16; pods sit on a bridge in
//! a /24 of 10.244.0.0/16. The node's namespace has no default route and no masquerading: pod traffic
//! can reach the host's control plane and nothing beyond this machine.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Name of the real node (the kubelet's `--hostname-override`).
pub const NODE_NAME: &str = "orchard-node";
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
    /// from the host to the node: each live node has its own, so runs never share a route.
    pub service_subnet: Ipv4Addr,
    /// Host-side veth name.
    pub host_veth: String,
    /// Node-side veth name.
    pub node_veth: String,
    /// The node's cgroup (created in every cgroup v1 hierarchy and removed after the run).
    pub cgroup_root: String,
    /// Directory holding the node's configuration and state.
    pub dir: PathBuf,
}

/// Prefix of the node's cgroup directories (`<prefix><pid>`); the sweep removes those of dead runs.
pub const CGROUP_PREFIX: &str = "orchard-node-";

impl Layout {
    /// The layout of node `index` for the harness process `pid`, keeping its files in `dir`.
    pub fn new(index: u8, pid: u32, dir: &Path) -> Self {
        let index = index % 64;
        let quad = index * 4;
        Self {
            index,
            host_ip: Ipv4Addr::new(10, 250, 0, quad + 1),
            node_ip: Ipv4Addr::new(10, 250, 0, quad + 2),
            outside_ip: Ipv4Addr::new(10, 251, index, 1),
            protected_ip: Ipv4Addr::new(10, 251, index, 2),
            pod_subnet: Ipv4Addr::new(10, 244, index, 0),
            service_subnet: Ipv4Addr::new(10, 96, index, 0),
            host_veth: format!("orh{index}"),
            node_veth: format!("orn{index}"),
            cgroup_root: format!("/{CGROUP_PREFIX}{pid}"),
            dir: dir.to_path_buf(),
        }
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
hostnameOverride: {NODE_NAME}
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
