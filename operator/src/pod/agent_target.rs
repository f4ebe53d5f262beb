//! Where a sandbox's agent answers and with which token (pure): derived from its own Pod, never
//! from its status. The one derivation the trajectory runner, the pool claim and the gateway use.

use crate::plumbing::cached_pod::CachedPod;

use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::sealed_for;
use crate::pod::agent_client::AgentTarget;
use crate::pod::health::pod_ready;
use crate::pod::token::{TokenError, token_of};
use orchard_api::Sandbox;

/// Where the agent of `sandbox` answers, derived from `pod` (pure): only the sandbox's own pod (sealed
/// for its UID under `key`: a pod anyone planted with a controller reference to the sandbox is not),
/// not being deleted, Ready, with an IP. Never read from `status.agentEndpoint`: anyone allowed to
/// patch a Sandbox's status could point it anywhere, and the caller would send the sandbox's token
/// there.
pub fn endpoint_of_own_pod(
    sandbox: &Sandbox,
    pod: &CachedPod,
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

/// Why a sandbox's agent cannot be called through `pod`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoTarget {
    /// `pod` is not the sandbox's own, Ready pod with an IP.
    NotReady,
    /// The pod's token cannot be derived (no nonce, another key).
    Token(TokenError),
}

/// The agent endpoint and token of `sandbox` running in `pod` (which must be its own and Ready;
/// see [`endpoint_of_own_pod`]), the token derived from the pod's annotations under `key`.
pub fn agent_target(
    sandbox: &Sandbox,
    pod: &CachedPod,
    agent_port: u16,
    key: &OperatorKey,
) -> Result<AgentTarget, NoTarget> {
    let endpoint = endpoint_of_own_pod(sandbox, pod, agent_port, key).ok_or(NoTarget::NotReady)?;
    let token = token_of(key, pod).map_err(NoTarget::Token)?;
    Ok(AgentTarget { endpoint, token })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_endpoints_are_bracketed() {
        assert_eq!(agent_endpoint("fd00::7", 9090), "http://[fd00::7]:9090");
    }
}
