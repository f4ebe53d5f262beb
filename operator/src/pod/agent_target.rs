//! Where a sandbox's agent answers (pure): derived from its own Pod, never from its status.

use k8s_openapi::api::core::v1::Pod;

use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::sealed_for;
use crate::pod::health::pod_ready;
use orchard_api::Sandbox;

/// Where the agent of `sandbox` answers, derived from `pod` (pure): only the sandbox's own pod (sealed
/// for its UID under `key`: a pod anyone planted with a controller reference to the sandbox is not),
/// not being deleted, Ready, with an IP. Never read from `status.agentEndpoint`: anyone allowed to
/// patch a Sandbox's status could point it anywhere, and the caller would send the sandbox's token
/// there.
pub fn endpoint_of_own_pod(
    sandbox: &Sandbox,
    pod: &Pod,
    agent_port: u16,
    key: &OperatorKey,
) -> Option<String> {
    let uid = sandbox.metadata.uid.as_deref()?;
    if !sealed_for(pod, uid, key) || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    if !pod_ready(pod) {
        return None;
    }
    let ip = pod.status.as_ref()?.pod_ip.as_deref()?;
    (!ip.is_empty()).then(|| agent_endpoint(ip, agent_port))
}

/// The agent's base URL for a pod IP (IPv6 in brackets).
pub fn agent_endpoint(pod_ip: &str, port: u16) -> String {
    if pod_ip.contains(':') {
        format!("http://[{pod_ip}]:{port}")
    } else {
        format!("http://{pod_ip}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_endpoints_are_bracketed() {
        assert_eq!(agent_endpoint("fd00::7", 9090), "http://[fd00::7]:9090");
    }
}
