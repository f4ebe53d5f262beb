//! What a sandbox is made of, shared by the Sandbox and SandboxPool controllers and the gateway: its
//! Pod ([`spec`]) and NetworkPolicies ([`policy`]), their names and labels ([`naming`]), its agent's
//! token ([`token`]), its OOM kills ([`oom`]) and disruptions ([`disruption`]) and the operator's client of agents ([`agent_client`]),
//! the placement policy ([`placement`]), GPUs ([`gpu`]), CIDRs ([`cidr`]), the policy enforcement canaries
//! ([`policy_canary`]) and the cluster's own ranges ([`cluster_ranges`]).

pub mod agent_client;
pub mod agent_target;
pub mod apply;
pub mod cidr;
pub mod cluster_ranges;
pub mod conditions;
pub mod context;
pub mod disruption;
pub mod egress_proxy;
pub mod failure;
#[cfg(test)]
pub mod fixtures;
pub mod gpu;
pub mod health;
pub mod lookup;
pub mod naming;
pub mod oom;
pub mod placement;
pub mod policy;
pub mod policy_canary;
pub mod spec;
pub mod token;
