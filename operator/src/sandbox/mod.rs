//! The Sandbox controller: [`build`] (pure: desired Pod, token Secret, NetworkPolicies; the agent's
//! [`policy_canary`] of enforcement), [`status`]
//! (pure: observed Pod -> status), [`expiry`] (pure deadline arithmetic), [`apply`] (thin I/O) and
//! [`reconcile`] (the loop that ties them together), and the trajectory [`runner`] of `spec.run`
//! (its pure half: [`run_result`]), and the retries of `spec.retry` ([`retry`], pure: a lost pod
//! replaced by a new attempt's). [`enforcement`] keeps the cluster-wide verdict on NetworkPolicy
//! enforcement the sandboxes' policy waits tell. [`cluster_ranges`] keeps the cluster's own
//! addresses that the egress policies protect (the API server's, the nodes' pod ranges) current.

pub mod apply;
pub mod blocked;
pub mod claim;
pub mod coalesce;
pub mod context;
pub mod decide;
pub mod enforcement;
pub mod execute;
pub mod expiry;
#[cfg(test)]
pub mod fixtures;
pub mod identity;
pub mod reconcile;
pub mod refusals;
pub mod retry;
pub mod run_protocol;
pub mod run_result;
pub mod runner;
pub mod status;

#[cfg(test)]
mod reconcile_tests;

pub use reconcile::{CONTROLLER, error_policy, reconcile};
