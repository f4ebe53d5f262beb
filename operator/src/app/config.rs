//! Operator configuration: command-line flags (each with an environment variable) and the sandbox
//! defaults they carry. Parsed once at startup; everything downstream takes plain values.

use std::net::SocketAddr;

use clap::{Parser, ValueEnum};

/// `orchard-operator`: runs the Sandbox and RolloutGroup controllers, the gateway and the metrics server.
#[derive(Parser, Debug, Clone)]
#[command(name = "orchard-operator", version, about, long_about = None)]
pub struct OperatorArgs {
    /// Namespace to watch; all namespaces when empty.
    #[arg(long, env = "ORCHARD_WATCH_NAMESPACE", default_value = "")]
    pub watch_namespace: String,

    /// Address of the gateway (REST API routing exec and file calls to sandboxes).
    #[arg(long, env = "ORCHARD_GATEWAY_LISTEN", default_value = "0.0.0.0:8080")]
    pub gateway_listen: SocketAddr,

    /// Address of the metrics and health server (`/metrics`, `/healthz`, `/readyz`).
    #[arg(long, env = "ORCHARD_METRICS_LISTEN", default_value = "0.0.0.0:8081")]
    pub metrics_listen: SocketAddr,

    /// Log format: `json` (structured, for clusters) or `text` (for terminals).
    #[arg(long, env = "ORCHARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,

    /// Sandbox defaults and pod shape.
    #[command(flatten)]
    pub sandbox: SandboxDefaults,

    /// Controller tuning.
    #[command(flatten)]
    pub controller: ControllerTuning,

    /// Leader election.
    #[command(flatten)]
    pub leader: LeaderElectionArgs,

    /// Gateway connection, request and authentication limits.
    #[command(flatten)]
    pub gateway: crate::gateway::config::GatewayLimits,

    /// Which placement fields (priority class, tolerations, runtime class, node selector) a Sandbox may set.
    #[command(flatten)]
    pub placement: crate::pod::placement::PlacementPolicy,

    /// GPUs: the extended resource, the GPU type map and the GPU toleration.
    #[command(flatten)]
    pub gpu: crate::pod::gpu::GpuFlags,

    /// SandboxSnapshots: where they are pushed and how the committer Pods run.
    #[command(flatten)]
    pub snapshots: SnapshotFlags,
}

/// How SandboxSnapshots are committed and where they go (docs/SNAPSHOTS.md).
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct SnapshotFlags {
    /// Repository prefix snapshots are pushed under, e.g. `registry.example.com/orchard-snapshots` (each snapshot becomes `<prefix>/<namespace>/<name>:<uid>`); nodes must be able to pull from it. Empty: snapshots are off and every SandboxSnapshot fails with reason SnapshotsDisabled.
    #[arg(long, env = "ORCHARD_SNAPSHOT_REGISTRY", default_value = "")]
    pub snapshot_registry: String,

    /// Namespace the committer Pods run in: Pod Security `privileged` (they hold the node's containerd socket), and nobody but the operator may create pods there.
    #[arg(
        long,
        env = "ORCHARD_SNAPSHOT_NAMESPACE",
        default_value = "orchard-snapshots"
    )]
    pub snapshot_namespace: String,

    /// Image of the committer Pods: busybox, `ctr`, `crane` and `orchard-layer-filter` (`make node-images` builds it as `orchard-committer`).
    #[arg(long, env = "ORCHARD_SNAPSHOT_COMMITTER_IMAGE", default_value = concat!("ghcr.io/orchard-env/orchard-committer:", env!("CARGO_PKG_VERSION")))]
    pub snapshot_committer_image: String,

    /// Path of containerd's socket on the nodes (k3s: `/run/k3s/containerd/containerd.sock`).
    #[arg(
        long,
        env = "ORCHARD_SNAPSHOT_CONTAINERD_SOCKET",
        default_value = "/run/containerd/containerd.sock"
    )]
    pub snapshot_containerd_socket: String,

    /// Push to the snapshot registry over plain HTTP (a registry without TLS).
    #[arg(
        long,
        env = "ORCHARD_SNAPSHOT_INSECURE_REGISTRY",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub snapshot_insecure_registry: bool,

    /// Secret of type `kubernetes.io/dockerconfigjson` in the snapshot namespace holding the push credentials; empty: push anonymously. Sandboxes pulling snapshots use their own `imagePullSecrets`.
    #[arg(long, env = "ORCHARD_SNAPSHOT_REGISTRY_SECRET", default_value = "")]
    pub snapshot_registry_secret: String,

    /// Longest a committer Pod may run (its activeDeadlineSeconds); a snapshot not pushed by then fails with reason CommitterFailed.
    #[arg(long, env = "ORCHARD_SNAPSHOT_TIMEOUT_SECONDS", default_value_t = 600, value_parser = clap::value_parser!(i64).range(10..=86400))]
    pub snapshot_timeout_seconds: i64,

    /// Longest a sandbox stays paused while its changes are read: a longer read is stopped, the sandbox resumed and the snapshot failed (reason CommitFailed).
    #[arg(long, env = "ORCHARD_SNAPSHOT_PAUSE_LIMIT_SECONDS", default_value_t = 120, value_parser = clap::value_parser!(i64).range(1..=3600))]
    pub snapshot_pause_limit_seconds: i64,
}

/// Log output format.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

/// Defaults applied to every sandbox, and the shape of the pods the operator builds.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct SandboxDefaults {
    /// Image holding the static agent binary at `/orchard-agent` (the injector init container's, or the
    /// image volume's).
    #[arg(long, env = "ORCHARD_AGENT_IMAGE", default_value = concat!("ghcr.io/orchard-env/orchard-agent:", env!("CARGO_PKG_VERSION")))]
    pub agent_image: String,

    /// How the agent gets into each sandbox pod: `init-container` (any cluster) or `image-volume`
    /// (Kubernetes 1.35+ with containerd 2.1+ or CRI-O 1.31+; no init container to run).
    #[arg(long, env = "ORCHARD_AGENT_INJECTION", value_enum, default_value_t = crate::pod::spec::AgentInjection::InitContainer)]
    pub agent_injection: crate::pod::spec::AgentInjection,

    /// Port the agent listens on inside each sandbox pod.
    #[arg(long, env = "ORCHARD_AGENT_PORT", default_value_t = 9090)]
    pub agent_port: u16,

    /// CPU of a sandbox whose spec sets none (requests = limits).
    #[arg(long, env = "ORCHARD_DEFAULT_CPU", default_value = "1")]
    pub default_cpu: String,

    /// Memory of a sandbox whose spec sets none (requests = limits).
    #[arg(long, env = "ORCHARD_DEFAULT_MEMORY", default_value = "2Gi")]
    pub default_memory: String,

    /// Ephemeral storage of a sandbox whose spec sets none; unlimited when empty.
    #[arg(long, env = "ORCHARD_DEFAULT_EPHEMERAL_STORAGE", default_value = "")]
    pub default_ephemeral_storage: String,

    /// Security profile of a sandbox whose spec sets none: `Default` (Pod Security `baseline`) or `Restricted` (non-root, no capabilities; Pod Security `restricted`).
    #[arg(
        long,
        env = "ORCHARD_DEFAULT_SECURITY_PROFILE",
        default_value = "Default"
    )]
    pub default_security_profile: orchard_api::SecurityProfile,

    /// Time-to-live after Ready of a sandbox whose spec sets none.
    #[arg(long, env = "ORCHARD_DEFAULT_TTL_SECONDS", default_value_t = 7200)]
    pub default_ttl_seconds: i64,

    /// Longest time-to-live after Ready of any sandbox: a spec or a `/timeout` call asking for more is refused by the gateway (422), and the controller never keeps a sandbox longer.
    #[arg(long, env = "ORCHARD_MAX_TTL_SECONDS", default_value_t = 86400)]
    pub max_ttl_seconds: i64,

    /// Heartbeat timeout of a sandbox whose spec sets none (0 = off).
    #[arg(
        long,
        env = "ORCHARD_DEFAULT_HEARTBEAT_TIMEOUT_SECONDS",
        default_value_t = 0
    )]
    pub default_heartbeat_timeout_seconds: i64,

    /// A sandbox that is not Ready this long after creation fails with reason StartupTimeout. A RolloutGroup's trajectory counts from when its pod was scheduled: waiting for a ResourceQuota or a node does not count (its group's activeDeadlineSeconds bounds that wait).
    #[arg(long, env = "ORCHARD_STARTUP_TIMEOUT_SECONDS", default_value_t = 600)]
    pub startup_timeout_seconds: i64,

    /// Termination grace period of sandbox pods.
    #[arg(long, env = "ORCHARD_TERMINATION_GRACE_SECONDS", default_value_t = 5)]
    pub termination_grace_seconds: i64,

    /// How long a sandbox stays bound to a node that stopped answering (tainted `node.kubernetes.io/unreachable` or `not-ready`) before Kubernetes deletes its pod and the sandbox fails with reason NodeLost (a RolloutGroup can then retry the trajectory elsewhere). Each sandbox Pod gets a `NoExecute` toleration of those taints for this long unless its spec tolerates them itself; 0 adds none (the cluster's default, usually 300 s, applies).
    #[arg(long, env = "ORCHARD_NODE_LOST_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(i64).range(0..=86400))]
    pub node_lost_seconds: i64,

    /// Namespace of the operator's own pods (ingress to agents is allowed only from them).
    #[arg(long, env = "POD_NAMESPACE", default_value = "orchard-system")]
    pub operator_namespace: String,

    /// Label selector (`key=value[,key=value]`) of the operator's own pods.
    #[arg(
        long,
        env = "ORCHARD_OPERATOR_POD_SELECTOR",
        default_value = "app.kubernetes.io/name=orchard-operator"
    )]
    pub operator_pod_selector: String,

    /// Namespace of the cluster DNS resolver (opened for egress unless a sandbox denies egress).
    #[arg(long, env = "ORCHARD_DNS_NAMESPACE", default_value = "kube-system")]
    pub dns_namespace: String,

    /// Label selector of the cluster DNS resolver pods.
    #[arg(
        long,
        env = "ORCHARD_DNS_POD_SELECTOR",
        default_value = "k8s-app=kube-dns"
    )]
    pub dns_pod_selector: String,

    /// CIDRs (comma-separated) that `AllowAll` and `AllowList` sandboxes never reach: by default the cloud metadata addresses (AWS, GCP and Azure IMDS `169.254.169.254`, AWS IMDS over IPv6 `fd00:ec2::254`, Azure WireServer `168.63.129.16`, Alibaba Cloud `100.100.100.200`) and IPv6 link-local `fe80::/10`; empty allows them.
    #[arg(
        long,
        env = "ORCHARD_EGRESS_EXCEPT_CIDRS",
        default_value = "169.254.169.254/32,fd00:ec2::254/128,168.63.129.16/32,100.100.100.200/32,fe80::/10"
    )]
    pub egress_except_cidrs: String,

    /// Let `AllowAll` and `AllowList` sandboxes reach the API server's endpoints (by default they are excepted: the operator watches the `default/kubernetes` EndpointSlice and rewrites the policies when they change).
    #[arg(long, env = "ORCHARD_EGRESS_ALLOW_API_SERVER", default_value_t = false)]
    pub egress_allow_api_server: bool,

    /// Make every sandbox wait for its NetworkPolicies to be enforced before it is Ready: its agent serves nothing, and its startup command waits, until a TCP connection to the API server's endpoints (which its policies deny) fails. Enforcers program a new pod's rules some time after its network is up; without this a `Deny` sandbox reaches everything for that long. Turn it off only on clusters without a NetworkPolicy enforcer, where sandboxes would never become Ready. With --egress-allow-api-server only `Deny` sandboxes wait.
    #[arg(
        long,
        env = "ORCHARD_AWAIT_POLICY_ENFORCEMENT",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub await_policy_enforcement: bool,

    /// Pod address ranges of the cluster (comma-separated). With them, `AllowAll` reaches pods only through a namespace selector that leaves out the operator's namespace, and `AllowList` CIDRs never cover pods; without them, enforcers that match IP blocks against pod addresses let `AllowAll` reach the operator's pods.
    #[arg(long, env = "ORCHARD_CLUSTER_POD_CIDRS", default_value = "")]
    pub cluster_pod_cidrs: String,

    /// Read the cluster's pod ranges from the nodes (`spec.podCIDRs`, kept current with a watch; needs `list` and `watch` on nodes) and except them from `AllowAll`'s IP blocks like `--cluster-pod-cidrs`. Clusters whose IPAM does not set node pod ranges (Calico, Cilium cluster-pool) need `--cluster-pod-cidrs`.
    #[arg(
        long,
        env = "ORCHARD_DISCOVER_POD_CIDRS",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub discover_pod_cidrs: bool,

    /// Service (in the operator's namespace) of the egress proxy that enforces `network.allow[].host` and `network.deny` (Helm `egress.enabled`); empty: no egress proxy, and sandboxes naming hosts fail with reason `EgressProxyMissing`. At start the operator reads the Service: sandboxes get `HTTP_PROXY`/`HTTPS_PROXY` set to its cluster IP and port `proxy`, and the namespace baseline NetworkPolicy lets them reach the pods it selects on that port.
    #[arg(long, env = "ORCHARD_EGRESS_PROXY_SERVICE", default_value = "")]
    pub egress_proxy_service: String,

    /// Let `AllowAll` sandboxes reach pods in the operator's namespace.
    #[arg(
        long,
        env = "ORCHARD_EGRESS_ALLOW_OPERATOR_NAMESPACE",
        default_value_t = false
    )]
    pub egress_allow_operator_namespace: bool,
}

impl Default for SandboxDefaults {
    fn default() -> Self {
        // Same values as the flags' defaults, for tests and library users.
        let args = OperatorArgs::parse_from(["orchard-operator"]);
        args.sandbox
    }
}

/// Controller tuning knobs.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct ControllerTuning {
    /// Most Sandbox reconciles running at once (more wait their turn, first come first served).
    #[arg(long, env = "ORCHARD_SANDBOX_CONCURRENCY", default_value_t = 64)]
    pub sandbox_concurrency: u16,

    /// Most RolloutGroup reconciles running at once (more wait their turn, first come first served).
    #[arg(long, env = "ORCHARD_ROLLOUT_CONCURRENCY", default_value_t = 16)]
    pub rollout_concurrency: u16,

    /// First retry delay after a failed reconcile, in milliseconds (doubles per failure).
    #[arg(long, env = "ORCHARD_BACKOFF_BASE_MS", default_value_t = 500)]
    pub backoff_base_ms: u64,

    /// Longest retry delay after failed reconciles, in seconds.
    #[arg(long, env = "ORCHARD_BACKOFF_MAX_SECONDS", default_value_t = 300)]
    pub backoff_max_seconds: u64,

    /// Transient sandbox phases (Pending, Starting) are not written during a sandbox's first this-many
    /// milliseconds: a sandbox that becomes Ready in that window (even under load) costs one status
    /// write, not three.
    /// Ready and Failed are always written at once. 0 writes every phase.
    #[arg(long, env = "ORCHARD_STATUS_COALESCE_MS", default_value_t = 10000)]
    pub status_coalesce_ms: u64,

    /// Test clusters only, never an install (hidden; no environment variable): answer the operator's
    /// own calls to agents in process, for KWOK nodes whose pods run nothing. A claimed pool member
    /// is told its sandbox without a call; a `spec.run` trajectory fails (there is no agent to run
    /// it). Refused together with --await-policy-enforcement.
    #[arg(long, hide = true, default_value_t = false)]
    pub simulated_agent: bool,

    /// Periodic re-reconcile of healthy objects, in seconds (a safety net for missed watch events).
    #[arg(long, env = "ORCHARD_RESYNC_SECONDS", default_value_t = 600)]
    pub resync_seconds: u64,
}

/// Leader election with a `coordination.k8s.io` Lease.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct LeaderElectionArgs {
    /// Gate the controllers on holding the Lease (the gateway serves on every replica regardless).
    #[arg(long, env = "ORCHARD_LEADER_ELECTION", default_value_t = false)]
    pub leader_election: bool,

    /// Name of the Lease.
    #[arg(long, env = "ORCHARD_LEASE_NAME", default_value = "orchard-operator")]
    pub lease_name: String,

    /// Namespace of the Lease; defaults to the operator namespace.
    #[arg(long, env = "ORCHARD_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// Lease duration in seconds: how long a stopped leader blocks takeover.
    #[arg(long, env = "ORCHARD_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,

    /// Identity of this replica in the Lease (defaults to the pod name or hostname).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

/// Parses a `key=value[,key=value]` label selector into pairs, rejecting anything else with a message.
pub fn parse_label_pairs(selector: &str) -> Result<Vec<(String, String)>, String> {
    selector
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| match part.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok((key.trim().to_string(), value.trim().to_string()))
            }
            _ => Err(format!(
                "`{part}` is not a `key=value` label pair (in selector `{selector}`)"
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_pairs_parse_and_reject_garbage() {
        assert_eq!(
            parse_label_pairs("a=b, c=d").unwrap(),
            vec![("a".into(), "b".into()), ("c".into(), "d".into())]
        );
        assert!(parse_label_pairs("").unwrap().is_empty());
        assert!(
            parse_label_pairs("novalue")
                .unwrap_err()
                .contains("novalue")
        );
        assert!(parse_label_pairs("=x").is_err());
    }

    #[test]
    fn defaults_match_the_flags() {
        let defaults = SandboxDefaults::default();
        assert_eq!(defaults.agent_port, 9090);
        assert_eq!(defaults.default_ttl_seconds, 7200);
    }
}
