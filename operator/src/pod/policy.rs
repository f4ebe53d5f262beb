//! The NetworkPolicies of a sandbox (pure): the namespace baseline (default-deny egress, agent
//! ingress only from the operator) and each sandbox's own egress policy from its spec, never opening a
//! protected range.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::seal;
use crate::pod::cidr::{Cidr, excepts_within};
use orchard_api::{
    EgressPolicy, MANAGED_BY, MANAGED_BY_LABEL, PortProtocol, SANDBOX_POD_LABEL, Sandbox,
};

use crate::pod::naming::*;

/// Who may reach agents, and where DNS lives: the inputs of the NetworkPolicies.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyShape {
    /// Port the agent listens on.
    pub agent_port: u16,
    /// Namespace of the operator's pods.
    pub operator_namespace: String,
    /// Labels of the operator's pods.
    pub operator_pod_labels: BTreeMap<String, String>,
    /// Namespace of the cluster DNS resolver.
    pub dns_namespace: String,
    /// Labels of the cluster DNS resolver pods.
    pub dns_pod_labels: BTreeMap<String, String>,
    /// Ranges `AllowAll` and `AllowList` never reach (`except` entries of their IP blocks): the
    /// operator's except list, the API server's endpoints, and the cluster's pod ranges when the
    /// operator's namespace is protected.
    pub protected_cidrs: Vec<Cidr>,
    /// `AllowAll` reaches pods through a namespace selector that leaves out the operator's namespace
    /// (false: every namespace).
    pub protect_operator_namespace: bool,
    /// The egress proxy's pods, which every sandbox may reach (they enforce each sandbox's own
    /// rules); `None` without one.
    pub egress_proxy: Option<ProxyPeer>,
}

/// Where the egress proxy's pods are, for the baseline's one egress rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyPeer {
    /// Namespace of the proxy's pods (the operator's).
    pub namespace: String,
    /// Labels selecting them (the proxy Service's selector).
    pub pod_labels: BTreeMap<String, String>,
    /// Their TCP port (the Service port's target port).
    pub port: i32,
}

fn labels_selector(labels: &BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels.clone()),
        ..LabelSelector::default()
    }
}

/// The namespace baseline, ensured once per namespace that holds sandboxes: every sandbox pod gets no
/// egress at all, and ingress only to the agent port from the operator's own pods. It selects only
/// sandbox pods, so it never affects anything else in the namespace.
pub fn baseline_policy(namespace: &str, shape: &PolicyShape) -> NetworkPolicy {
    let sandbox_pods = BTreeMap::from([(SANDBOX_POD_LABEL.to_string(), "true".to_string())]);
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(BASELINE_POLICY.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_string(),
                MANAGED_BY.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(labels_selector(&sandbox_pods)),
            policy_types: Some(vec!["Ingress".to_string(), "Egress".to_string()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![NetworkPolicyPeer {
                    namespace_selector: Some(labels_selector(&BTreeMap::from([(
                        "kubernetes.io/metadata.name".to_string(),
                        shape.operator_namespace.clone(),
                    )]))),
                    pod_selector: Some(labels_selector(&shape.operator_pod_labels)),
                    ..NetworkPolicyPeer::default()
                }]),
                ports: Some(vec![tcp_port(i32::from(shape.agent_port))]),
            }]),
            // `policyTypes: [Egress]` with no rules denies all egress. Written as absent, not `[]`: the
            // API server drops empty lists, and a desired spec must equal the stored one, or every
            // sandbox in the namespace would re-apply the baseline once the memory of the write ends.
            // With an egress proxy, its pods are the one destination every sandbox reaches.
            egress: shape.egress_proxy.as_ref().map(|proxy| {
                vec![NetworkPolicyEgressRule {
                    to: Some(vec![NetworkPolicyPeer {
                        namespace_selector: Some(labels_selector(&BTreeMap::from([(
                            "kubernetes.io/metadata.name".to_string(),
                            proxy.namespace.clone(),
                        )]))),
                        pod_selector: Some(labels_selector(&proxy.pod_labels)),
                        ..NetworkPolicyPeer::default()
                    }]),
                    ports: Some(vec![tcp_port(proxy.port)]),
                }]
            }),
        }),
    }
}

fn tcp_port(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".to_string()),
        ..NetworkPolicyPort::default()
    }
}

fn dns_rule(shape: &PolicyShape) -> NetworkPolicyEgressRule {
    NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(labels_selector(&BTreeMap::from([(
                "kubernetes.io/metadata.name".to_string(),
                shape.dns_namespace.clone(),
            )]))),
            pod_selector: Some(labels_selector(&shape.dns_pod_labels)),
            ..NetworkPolicyPeer::default()
        }]),
        ports: Some(
            ["UDP", "TCP"]
                .into_iter()
                .map(|protocol| NetworkPolicyPort {
                    port: Some(IntOrString::Int(53)),
                    protocol: Some(protocol.to_string()),
                    ..NetworkPolicyPort::default()
                })
                .collect(),
        ),
    }
}

/// An IP block of `cidr` with every protected range inside it excepted; `None` when `cidr` lies
/// wholly inside a protected range.
fn guarded_block(cidr: &str, shape: &PolicyShape) -> Option<NetworkPolicyPeer> {
    let parsed = Cidr::parse(cidr).ok()?;
    let except = excepts_within(&parsed, &shape.protected_cidrs)?;
    Some(NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: parsed.to_string(),
            except: (!except.is_empty()).then_some(except),
        }),
        ..NetworkPolicyPeer::default()
    })
}

/// `AllowList` entries the sandbox cannot have: not a CIDR, or wholly inside a protected range (the
/// metadata address, the API server, the cluster's pods). The policy leaves them out; the controller
/// reports them (pure).
pub fn refused_allow_rules(sandbox: &Sandbox, shape: &PolicyShape) -> Vec<String> {
    let network = sandbox.spec.network.clone().unwrap_or_default();
    if network.egress != EgressPolicy::AllowList {
        return Vec::new();
    }
    network
        .allow
        .iter()
        .filter_map(|rule| rule.cidr.as_ref())
        .filter(|cidr| guarded_block(cidr, shape).is_none())
        .cloned()
        .collect()
}

/// `AllowAll`: every address except the protected ranges, pods through a namespace selector (every
/// namespace but the operator's when it is protected), and DNS.
fn allow_all_rules(shape: &PolicyShape) -> Vec<NetworkPolicyEgressRule> {
    let everywhere: Vec<NetworkPolicyPeer> = ["0.0.0.0/0", "::/0"]
        .into_iter()
        .filter_map(|cidr| guarded_block(cidr, shape))
        .collect();
    let namespaces = if shape.protect_operator_namespace {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "kubernetes.io/metadata.name".to_string(),
                operator: "NotIn".to_string(),
                values: Some(vec![shape.operator_namespace.clone()]),
            }]),
            ..LabelSelector::default()
        }
    } else {
        LabelSelector::default()
    };
    vec![
        NetworkPolicyEgressRule {
            to: Some(everywhere),
            ports: None,
        },
        NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                namespace_selector: Some(namespaces),
                ..NetworkPolicyPeer::default()
            }]),
            ports: None,
        },
        dns_rule(shape),
    ]
}

/// The sandbox's own egress policy: `None` for `Deny` (the baseline already denies everything); for
/// `AllowAll` any destination but the protected ranges and the operator's namespace, for `AllowList`
/// exactly the listed destinations (minus protected ranges inside them) plus cluster DNS. It selects
/// the pods labelled with this sandbox's name (`orchard.dev/sandbox`): the sandbox's own, and also
/// any Pod that someone allowed to create or label Pods in the namespace labels so (a label selector
/// cannot tell who set a label). Controlled by `owner` and sealed for it under `key`.
pub fn desired_egress_policy(
    sandbox: &Sandbox,
    owner: &OwnerReference,
    shape: &PolicyShape,
    key: &OperatorKey,
) -> Option<NetworkPolicy> {
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let network = sandbox.spec.network.clone().unwrap_or_default();
    let egress = match network.egress {
        EgressPolicy::Deny => return None,
        EgressPolicy::AllowAll => allow_all_rules(shape),
        EgressPolicy::AllowList => {
            let mut rules: Vec<NetworkPolicyEgressRule> = network
                .allow
                .iter()
                .filter_map(|rule| {
                    // Host entries go through the egress proxy, which the baseline lets every
                    // sandbox reach; only address ranges become IP blocks.
                    let peer = guarded_block(rule.cidr.as_deref()?, shape)?;
                    Some(NetworkPolicyEgressRule {
                        to: Some(vec![peer]),
                        ports: (!rule.ports.is_empty()).then(|| {
                            rule.ports
                                .iter()
                                .map(|p| NetworkPolicyPort {
                                    port: Some(IntOrString::Int(p.port)),
                                    protocol: Some(protocol_name(p.protocol).to_string()),
                                    ..NetworkPolicyPort::default()
                                })
                                .collect()
                        }),
                    })
                })
                .collect();
            rules.push(dns_rule(shape));
            rules
        }
    };
    let mut policy = NetworkPolicy {
        metadata: child_meta(sandbox, &name, egress_policy_name(&name), owner, key),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(labels_selector(&sandbox_selector(&name))),
            policy_types: Some(vec!["Egress".to_string()]),
            egress: Some(egress),
            ingress: None,
        }),
    };
    seal(&mut policy, key);
    Some(policy)
}

fn protocol_name(protocol: PortProtocol) -> &'static str {
    match protocol {
        PortProtocol::TCP => "TCP",
        PortProtocol::UDP => "UDP",
        PortProtocol::SCTP => "SCTP",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::fixtures::*;

    use orchard_api::{EgressPort, EgressRule, NetworkSpec};
    use orchard_api::{SANDBOX_LABEL, SandboxSpec};

    #[test]
    fn baseline_denies_egress_and_admits_only_the_operator() {
        let policy = baseline_policy("ns", &policy_shape());
        let spec = policy.spec.unwrap();
        assert_eq!(
            spec.pod_selector.unwrap().match_labels.unwrap()[SANDBOX_POD_LABEL],
            "true"
        );
        assert_eq!(spec.policy_types.unwrap(), vec!["Ingress", "Egress"]);
        // Egress is governed by the policy (policyTypes) and has no rule: all denied.
        assert_eq!(spec.egress, None, "no egress rule at all");
        let ingress = &spec.ingress.unwrap()[0];
        let peer = &ingress.from.as_ref().unwrap()[0];
        assert_eq!(
            peer.namespace_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["kubernetes.io/metadata.name"],
            "orchard-system"
        );
        assert_eq!(
            peer.pod_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["app.kubernetes.io/name"],
            "orchard-operator"
        );
        assert_eq!(
            ingress.ports.as_ref().unwrap()[0].port,
            Some(IntOrString::Int(9090))
        );
    }

    #[test]
    fn deny_egress_builds_no_policy() {
        assert!(desired_egress_policy(&minimal(), &owner(), &policy_shape(), &key()).is_none());
    }

    #[test]
    fn allow_all_selects_only_this_sandbox() {
        let s = sandbox(SandboxSpec {
            image: "x".into(),
            network: Some(NetworkSpec {
                egress: EgressPolicy::AllowAll,
                allow: vec![],
                ..NetworkSpec::default()
            }),
            ..SandboxSpec::default()
        });
        let policy = desired_egress_policy(&s, &owner(), &policy_shape(), &key()).unwrap();
        assert_eq!(policy.metadata.name.as_deref(), Some("s1-egress"));
        let spec = policy.spec.unwrap();
        assert_eq!(
            spec.pod_selector.unwrap().match_labels.unwrap()[SANDBOX_LABEL],
            "s1"
        );
        assert_eq!(spec.policy_types.unwrap(), vec!["Egress"]);
        let egress = spec.egress.unwrap();
        assert_eq!(egress.len(), 3, "addresses, pods, DNS: {egress:?}");
        // Every address, except the protected ranges.
        let blocks: Vec<IPBlock> = egress[0]
            .to
            .clone()
            .unwrap()
            .into_iter()
            .filter_map(|p| p.ip_block)
            .collect();
        assert_eq!(blocks[0].cidr, "0.0.0.0/0");
        assert_eq!(
            blocks[0].except.clone().unwrap(),
            vec!["169.254.169.254/32", "10.250.0.1/32", "10.244.0.0/16"]
        );
        assert_eq!(blocks[1].cidr, "::/0");
        assert_eq!(blocks[1].except, None);
        assert_eq!(egress[0].ports, None);
        // Pods of every namespace but the operator's.
        let namespaces = egress[1].to.clone().unwrap()[0]
            .namespace_selector
            .clone()
            .unwrap();
        let requirement = &namespaces.match_expressions.unwrap()[0];
        assert_eq!(requirement.operator, "NotIn");
        assert_eq!(requirement.values, Some(vec!["orchard-system".to_string()]));
        // With the operator's namespace allowed: pods of every namespace.
        let mut open = policy_shape();
        open.protect_operator_namespace = false;
        let egress = desired_egress_policy(&s, &owner(), &open, &key())
            .unwrap()
            .spec
            .unwrap()
            .egress
            .unwrap();
        assert_eq!(
            egress[1].to.clone().unwrap()[0].namespace_selector,
            Some(LabelSelector::default())
        );
    }

    #[test]
    fn allow_list_never_covers_a_protected_range() {
        let rule = |cidr: &str| EgressRule {
            cidr: Some(cidr.into()),
            host: None,
            ports: vec![],
        };
        let s = sandbox(SandboxSpec {
            image: "x".into(),
            network: Some(NetworkSpec {
                egress: EgressPolicy::AllowList,
                allow: vec![
                    rule("10.0.0.0/8"),
                    rule("169.254.169.254/32"),
                    rule("10.244.7.0/24"),
                ],
                ..NetworkSpec::default()
            }),
            ..SandboxSpec::default()
        });
        let egress = desired_egress_policy(&s, &owner(), &policy_shape(), &key())
            .unwrap()
            .spec
            .unwrap()
            .egress
            .unwrap();
        assert_eq!(
            egress.len(),
            2,
            "one listed range kept, plus DNS: {egress:?}"
        );
        let block = egress[0].to.clone().unwrap()[0].ip_block.clone().unwrap();
        assert_eq!(block.cidr, "10.0.0.0/8");
        assert_eq!(
            block.except,
            Some(vec![
                "10.250.0.1/32".to_string(),
                "10.244.0.0/16".to_string()
            ])
        );
        assert_eq!(
            refused_allow_rules(&s, &policy_shape()),
            vec!["169.254.169.254/32", "10.244.7.0/24"]
        );
    }

    #[test]
    fn allow_list_opens_exactly_the_listed_destinations_and_dns() {
        let s = sandbox(SandboxSpec {
            image: "x".into(),
            network: Some(NetworkSpec {
                egress: EgressPolicy::AllowList,
                allow: vec![
                    EgressRule {
                        cidr: Some("203.0.113.0/24".into()),
                        host: None,
                        ports: vec![EgressPort {
                            port: 443,
                            protocol: PortProtocol::TCP,
                        }],
                    },
                    EgressRule {
                        cidr: Some("10.1.2.3/32".into()),
                        host: None,
                        ports: vec![],
                    },
                ],
                ..NetworkSpec::default()
            }),
            ..SandboxSpec::default()
        });
        let egress = desired_egress_policy(&s, &owner(), &policy_shape(), &key())
            .unwrap()
            .spec
            .unwrap()
            .egress
            .unwrap();
        assert_eq!(egress.len(), 3);
        assert_eq!(
            egress[0].to.as_ref().unwrap()[0]
                .ip_block
                .as_ref()
                .unwrap()
                .cidr,
            "203.0.113.0/24"
        );
        assert_eq!(
            egress[0].ports.as_ref().unwrap()[0].port,
            Some(IntOrString::Int(443))
        );
        assert!(
            egress[1].ports.is_none(),
            "no ports listed means all ports of that CIDR"
        );
        let dns = &egress[2];
        assert_eq!(dns.ports.as_ref().unwrap().len(), 2);
        assert_eq!(
            dns.to.as_ref().unwrap()[0]
                .pod_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["k8s-app"],
            "kube-dns"
        );
        // No rule may be the empty (allow-everything) rule.
        assert!(egress.iter().all(|r| r.to.is_some()));
    }

    #[test]
    fn with_an_egress_proxy_the_baseline_lets_sandboxes_reach_only_its_pods() {
        let shape = PolicyShape {
            egress_proxy: Some(ProxyPeer {
                namespace: "orchard-system".into(),
                pod_labels: BTreeMap::from([(
                    "app.kubernetes.io/name".into(),
                    "orchard-egress".into(),
                )]),
                port: 3128,
            }),
            ..policy_shape()
        };
        let spec = baseline_policy("ns", &shape).spec.unwrap();
        let egress = spec.egress.unwrap();
        assert_eq!(egress.len(), 1);
        let peer = &egress[0].to.as_ref().unwrap()[0];
        assert!(peer.ip_block.is_none());
        assert_eq!(
            peer.pod_selector
                .as_ref()
                .unwrap()
                .match_labels
                .as_ref()
                .unwrap()["app.kubernetes.io/name"],
            "orchard-egress"
        );
        assert_eq!(
            egress[0].ports.as_ref().unwrap()[0].port,
            Some(IntOrString::Int(3128))
        );
    }

    #[test]
    fn host_entries_open_no_ip_block() {
        let mut sandbox = minimal();
        sandbox.spec.network = Some(NetworkSpec {
            egress: EgressPolicy::AllowList,
            allow: vec![EgressRule {
                cidr: None,
                host: Some("pypi.org".into()),
                ports: vec![],
            }],
            ..NetworkSpec::default()
        });
        let policy = desired_egress_policy(&sandbox, &owner(), &policy_shape(), &key()).unwrap();
        let rules = policy.spec.unwrap().egress.unwrap();
        assert_eq!(rules.len(), 1, "DNS only: {rules:?}");
        assert!(rules[0].to.as_ref().unwrap()[0].ip_block.is_none());
    }
}
