//! The egress proxy's data plane: the HTTP forward proxy through which a sandbox's task reaches the
//! host names its `spec.network` allows (NetworkPolicies deny it everything else). It runs as its
//! own Deployment (`app::egress_proxy`), whose watch of Sandboxes builds the [`table::PolicyTable`]
//! it reads ([`sandboxes`]); decisions become metrics and Events ([`sink`], [`metrics`]).
//!
//! The path of one request: the client's source address finds its sandbox ([`table`]), that
//! sandbox's compiled rules decide the asked host and port ([`rules`]), the proxy resolves the name
//! itself and never connects to a protected address ([`resolve`], [`upstream`]), and the
//! [`proxy`] tunnels (`CONNECT`) or forwards (plain `http://`); what it refuses gets one line of
//! text and, for a denial, `X-Orchard-Egress: denied`. Open connections stay registered
//! ([`connections`]) so a policy change cuts what it no longer allows; every decision and cut is
//! reported ([`audit`]).

mod admission;
pub mod audit;
pub mod connections;
mod deps;
mod forward;
pub mod metrics;
pub mod proxy;
mod refusal;
pub mod resolve;
pub mod rules;
pub mod sandboxes;
pub mod sink;
pub mod table;
mod tunnel;
pub mod upstream;

#[cfg(test)]
mod proxy_tests;
