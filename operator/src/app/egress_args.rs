//! Flags of `orchard-operator egress-proxy` (each also an environment variable, as the chart sets
//! them).

use std::net::SocketAddr;

use super::config::LogFormat;

/// The egress proxy's command line.
#[derive(clap::Parser, Debug, Clone, PartialEq)]
#[command(
    name = "orchard-operator egress-proxy",
    about = "The egress proxy: enforces sandboxes' network.allow[].host and network.deny rules by the name each client asks for"
)]
pub struct EgressArgs {
    /// Address sandboxes send proxied requests to (HTTP absolute-form requests and CONNECT).
    #[arg(long, env = "ORCHARD_EGRESS_LISTEN", default_value = "0.0.0.0:3128")]
    pub listen: SocketAddr,

    /// Address of `/metrics`, `/healthz` and `/readyz` (ready once the Sandbox cache is filled).
    #[arg(
        long,
        env = "ORCHARD_EGRESS_ADMIN_LISTEN",
        default_value = "0.0.0.0:8082"
    )]
    pub admin_listen: SocketAddr,

    /// Namespace whose Sandboxes the proxy serves; all namespaces when empty.
    #[arg(long, env = "ORCHARD_WATCH_NAMESPACE", default_value = "")]
    pub watch_namespace: String,

    /// Seconds to wait for a TCP connection to a host before answering 502.
    #[arg(
        long,
        env = "ORCHARD_EGRESS_CONNECT_TIMEOUT_SECONDS",
        default_value_t = 10
    )]
    pub connect_timeout_seconds: u64,

    /// Seconds a client may take to send its request head.
    #[arg(
        long,
        env = "ORCHARD_EGRESS_HEADER_READ_TIMEOUT_SECONDS",
        default_value_t = 10
    )]
    pub header_read_timeout_seconds: u64,

    /// Ranges the proxy never connects to (comma-separated), as the operator's flag of the same name: the cloud metadata addresses by default.
    #[arg(
        long,
        env = "ORCHARD_EGRESS_EXCEPT_CIDRS",
        default_value = "169.254.169.254/32,fd00:ec2::254/128,168.63.129.16/32,100.100.100.200/32,fe80::/10"
    )]
    pub egress_except_cidrs: String,

    /// Let sandboxes reach the API server's endpoints through the proxy (by default they are never connected to).
    #[arg(long, env = "ORCHARD_EGRESS_ALLOW_API_SERVER", default_value_t = false, action = clap::ArgAction::Set)]
    pub egress_allow_api_server: bool,

    /// Pod address ranges of the cluster (comma-separated), never connected to.
    #[arg(long, env = "ORCHARD_CLUSTER_POD_CIDRS", default_value = "")]
    pub cluster_pod_cidrs: String,

    /// Read the nodes' pod ranges (`spec.podCIDRs`, watched) and never connect to them.
    #[arg(long, env = "ORCHARD_DISCOVER_POD_CIDRS", default_value_t = true, action = clap::ArgAction::Set)]
    pub discover_pod_cidrs: bool,

    /// More ranges the proxy never connects to (comma-separated), e.g. the service CIDR on a cluster without ServiceCIDR objects.
    #[arg(long, env = "ORCHARD_EGRESS_DENY_CIDRS", default_value = "")]
    pub deny_cidrs: String,

    /// Log format: `json` or `text`.
    #[arg(long, env = "ORCHARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
}
