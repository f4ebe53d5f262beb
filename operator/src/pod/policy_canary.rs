//! Canaries of NetworkPolicy enforcement (`--await-policy-enforcement`): addresses a sandbox's
//! policies deny and that accept connections otherwise. The sandbox's agent serves nothing, so its pod
//! is not Ready and its startup command waits, until a TCP connection to each fails: enforcers program
//! a new pod's rules some time after its network is up, and until then a `Deny` sandbox reaches
//! everything.
//!
//! The canaries are the API server's endpoints (EndpointSlice `default/kubernetes`, read at start):
//! always listening, reachable from every pod the policies leave alone, and denied to every sandbox
//! (`Deny` by the baseline; `AllowAll` and `AllowList` by their `except` entries, unless
//! `--egress-allow-api-server`, which leaves only `Deny` sandboxes with a canary).

use crate::plumbing::cached_pod::CachedPod;
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use orchard_api::EgressPolicy;

use crate::pod::naming::TASK_CONTAINER;

pub use crate::plumbing::cached_pod::CANARY_VARIABLE;

/// The canaries the operator found at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyCanaries {
    /// The API server's endpoints; empty when enforcement is not awaited.
    pub addresses: Vec<SocketAddr>,
    /// `AllowAll` and `AllowList` sandboxes are denied them too (the API server's addresses are
    /// protected); otherwise only `Deny` sandboxes are.
    pub denied_to_open_egress: bool,
}

/// The canaries of a sandbox with egress `egress`: the ones its policies deny (pure).
pub fn canaries_for(egress: EgressPolicy, canaries: &PolicyCanaries) -> &[SocketAddr] {
    match egress {
        EgressPolicy::Deny => &canaries.addresses,
        EgressPolicy::AllowAll | EgressPolicy::AllowList if canaries.denied_to_open_egress => {
            &canaries.addresses
        }
        EgressPolicy::AllowAll | EgressPolicy::AllowList => &[],
    }
}

/// The agent's value for `addresses`, `None` when there is nothing to wait for (pure).
pub fn canary_value(addresses: &[SocketAddr]) -> Option<String> {
    (!addresses.is_empty()).then(|| {
        addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// The socket addresses of an EndpointSlice's ready endpoints at its TCP port (the slice's port
/// named `https`, else its first TCP port); none without such a port (pure).
pub fn endpoint_addresses(slice: &EndpointSlice) -> Vec<SocketAddr> {
    let ports = slice.ports.iter().flatten();
    let tcp = |p: &&k8s_openapi::api::discovery::v1::EndpointPort| {
        p.protocol.as_deref().unwrap_or("TCP") == "TCP" && p.port.is_some()
    };
    let port = ports
        .clone()
        .filter(tcp)
        .find(|p| p.name.as_deref() == Some("https"))
        .or_else(|| ports.clone().find(tcp))
        .and_then(|p| p.port)
        .and_then(|p| u16::try_from(p).ok());
    let Some(port) = port else {
        return Vec::new();
    };
    super::cidr::ready_addresses(slice)
        .filter_map(|address| address.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .collect()
}

/// Whether `pod`'s agent waits for its policies to be enforced before it serves (pure).
pub fn awaits_enforcement(pod: &CachedPod) -> bool {
    pod.spec
        .iter()
        .flat_map(|spec| spec.containers.iter())
        .filter(|c| c.name == TASK_CONTAINER)
        .flat_map(|c| c.env.iter().flatten())
        .any(|v| v.name == CANARY_VARIABLE && v.value.as_deref().is_some_and(|v| !v.is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(text: &str) -> SocketAddr {
        text.parse().expect("address")
    }

    #[test]
    fn every_sandbox_whose_policies_deny_the_api_server_waits_for_it() {
        let protected = PolicyCanaries {
            addresses: vec![a("10.0.0.1:6443")],
            denied_to_open_egress: true,
        };
        for egress in [
            EgressPolicy::Deny,
            EgressPolicy::AllowAll,
            EgressPolicy::AllowList,
        ] {
            assert_eq!(canaries_for(egress, &protected), &[a("10.0.0.1:6443")]);
        }
        // --egress-allow-api-server: only Deny sandboxes are denied it.
        let allowed = PolicyCanaries {
            denied_to_open_egress: false,
            ..protected
        };
        assert_eq!(
            canaries_for(EgressPolicy::Deny, &allowed),
            &[a("10.0.0.1:6443")]
        );
        assert!(canaries_for(EgressPolicy::AllowAll, &allowed).is_empty());
        assert!(canaries_for(EgressPolicy::AllowList, &allowed).is_empty());
        assert!(canaries_for(EgressPolicy::Deny, &PolicyCanaries::default()).is_empty());
    }

    #[test]
    fn the_agent_gets_its_canaries_comma_separated() {
        assert_eq!(canary_value(&[]), None);
        assert_eq!(
            canary_value(&[a("10.0.0.1:6443"), a("[fd00::1]:6443")]).as_deref(),
            Some("10.0.0.1:6443,[fd00::1]:6443")
        );
    }

    fn slice(value: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(value).expect("slice")
    }

    #[test]
    fn canaries_are_the_ready_endpoints_at_the_https_port() {
        let kubernetes = slice(serde_json::json!({
            "metadata": {"name": "kubernetes", "namespace": "default"},
            "addressType": "IPv4",
            "ports": [
                {"name": "metrics", "port": 9000, "protocol": "UDP"},
                {"name": "other", "port": 8443},
                {"name": "https", "port": 6443, "protocol": "TCP"}
            ],
            "endpoints": [
                {"addresses": ["10.250.0.1"], "conditions": {"ready": true}},
                {"addresses": ["10.250.0.2"], "conditions": {"ready": false}},
                {"addresses": ["10.250.0.3"]},
                {"addresses": ["not-an-ip"]}
            ]
        }));
        assert_eq!(
            endpoint_addresses(&kubernetes),
            vec![a("10.250.0.1:6443"), a("10.250.0.3:6443")]
        );
        // No port named https: the first TCP one.
        let unnamed = slice(serde_json::json!({
            "metadata": {"name": "kubernetes"},
            "addressType": "IPv4",
            "ports": [{"port": 53, "protocol": "UDP"}, {"port": 443}],
            "endpoints": [{"addresses": ["10.250.0.1"]}]
        }));
        assert_eq!(endpoint_addresses(&unnamed), vec![a("10.250.0.1:443")]);
        let portless = slice(serde_json::json!({
            "metadata": {"name": "kubernetes"},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.250.0.1"]}]
        }));
        assert!(endpoint_addresses(&portless).is_empty());
    }
}
