//! Where a sandbox's host rules stand (pure): the egress proxy reports in `status.egress` which
//! `metadata.generation` of `spec.network` it enforces for which pod IP; the operator turns that into
//! the `HostEgress` condition and holds a new sandbox back from Ready until its rules are in force.

use orchard_api::{EgressStatus, Sandbox};

/// Condition type of a sandbox whose `spec.network` names hosts (or did).
pub const HOST_EGRESS: &str = "HostEgress";

/// Reason of a sandbox naming hosts in an operator without an egress proxy.
pub const EGRESS_PROXY_MISSING: &str = "EgressProxyMissing";

/// Where the host rules of a sandbox stand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEgress {
    /// It names no hosts and never did: no condition.
    Unused,
    /// The proxy enforces the current generation for the sandbox's pod IP.
    InForce,
    /// The proxy has not caught up with this generation (or this pod IP) yet.
    Pending(String),
    /// The proxy refused the current generation; the message says why (the previous one stays).
    NotEnforced(String),
    /// The operator runs without an egress proxy.
    ProxyMissing,
}

impl HostEgress {
    /// The condition's status, reason and message (`None` for [`HostEgress::Unused`]).
    pub fn condition(&self) -> Option<(bool, &'static str, String)> {
        match self {
            Self::Unused => None,
            Self::InForce => Some((true, "InForce", String::new())),
            Self::Pending(message) => Some((false, "EgressPending", message.clone())),
            Self::NotEnforced(message) => Some((false, "EgressNotEnforced", message.clone())),
            Self::ProxyMissing => Some((false, EGRESS_PROXY_MISSING, proxy_missing_message())),
        }
    }
}

/// The message of a sandbox naming hosts in an operator without an egress proxy.
pub fn proxy_missing_message() -> String {
    "spec.network names hosts (allow[].host or deny), which only the egress proxy enforces, and the operator runs without one: install the chart with egress.enabled=true (--egress-proxy-service), or allow address ranges (allow[].cidr)".to_string()
}

/// Where `sandbox`'s host rules stand for its pod at `pod_ip`, with `egress` the proxy's report and
/// `has_proxy` whether the operator knows an egress proxy (pure).
pub fn host_egress(
    sandbox: &Sandbox,
    egress: Option<&EgressStatus>,
    pod_ip: Option<&str>,
    has_proxy: bool,
) -> HostEgress {
    let names_hosts = sandbox
        .spec
        .network
        .as_ref()
        .is_some_and(|network| network.names_hosts());
    if !names_hosts && egress.is_none() {
        return HostEgress::Unused;
    }
    if !has_proxy {
        return if names_hosts {
            HostEgress::ProxyMissing
        } else {
            HostEgress::Unused
        };
    }
    let generation = sandbox.metadata.generation.unwrap_or_default();
    let Some(egress) = egress else {
        return HostEgress::Pending("waiting for the egress proxy to enforce spec.network".into());
    };
    if let Some(message) = &egress.message {
        return HostEgress::NotEnforced(format!(
            "the egress proxy cannot enforce generation {generation} of spec.network and keeps generation {} in force: {message}",
            egress.observed_generation
        ));
    }
    match pod_ip {
        Some(ip) if egress.pod_ip == ip && egress.observed_generation >= generation => {
            HostEgress::InForce
        }
        Some(ip) if egress.pod_ip != ip => HostEgress::Pending(format!(
            "waiting for the egress proxy to know the sandbox's pod at {ip} (it enforces generation {} for {})",
            egress.observed_generation, egress.pod_ip
        )),
        _ => HostEgress::Pending(format!(
            "waiting for the egress proxy to enforce generation {generation} of spec.network (generation {} is in force)",
            egress.observed_generation
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::{EgressPolicy, EgressRule, NetworkSpec, SandboxSpec};

    fn sandbox(hosts: bool, generation: i64) -> Sandbox {
        let mut sandbox = Sandbox::new(
            "s",
            SandboxSpec {
                image: "i".into(),
                network: hosts.then(|| NetworkSpec {
                    egress: EgressPolicy::AllowList,
                    allow: vec![EgressRule {
                        cidr: None,
                        host: Some("pypi.org".into()),
                        ports: vec![],
                    }],
                    deny: vec![],
                }),
                ..SandboxSpec::default()
            },
        );
        sandbox.metadata.generation = Some(generation);
        sandbox
    }

    fn report(generation: i64, ip: &str, message: Option<&str>) -> EgressStatus {
        EgressStatus {
            observed_generation: generation,
            pod_ip: ip.into(),
            message: message.map(Into::into),
        }
    }

    #[test]
    fn host_rules_stand_as_the_proxy_reports() {
        let ip = Some("10.1.0.5");
        let cases = [
            (sandbox(false, 1), None, true, HostEgress::Unused),
            (sandbox(true, 1), None, false, HostEgress::ProxyMissing),
            (
                sandbox(true, 2),
                Some(report(2, "10.1.0.5", None)),
                true,
                HostEgress::InForce,
            ),
            (
                sandbox(true, 2),
                Some(report(3, "10.1.0.5", None)),
                true,
                HostEgress::InForce,
            ),
        ];
        for (sandbox, egress, has_proxy, expected) in cases {
            assert_eq!(
                host_egress(&sandbox, egress.as_ref(), ip, has_proxy),
                expected
            );
        }
        let pending = [
            (sandbox(true, 2), None),
            (sandbox(true, 2), Some(report(1, "10.1.0.5", None))),
            (sandbox(true, 2), Some(report(2, "10.1.0.9", None))),
        ];
        for (sandbox, egress) in pending {
            assert!(matches!(
                host_egress(&sandbox, egress.as_ref(), ip, true),
                HostEgress::Pending(_)
            ));
        }
        let refused = host_egress(
            &sandbox(true, 3),
            Some(&report(2, "10.1.0.5", Some("bad"))),
            ip,
            true,
        );
        assert_eq!(
            refused,
            HostEgress::NotEnforced("the egress proxy cannot enforce generation 3 of spec.network and keeps generation 2 in force: bad".into())
        );
        // A sandbox that dropped its hosts keeps its condition while the proxy's report stands.
        assert_eq!(
            host_egress(
                &sandbox(false, 4),
                Some(&report(4, "10.1.0.5", None)),
                ip,
                true
            ),
            HostEgress::InForce
        );
    }
}
