//! Orchard Env operator: the `Sandbox` and `RolloutGroup` APIs, their controllers, the gateway that
//! routes exec/file calls straight to pod IPs. The Balanced Adaptive Rollout (BAR) engine is the pure
//! crate `orchard_bar`.
//!
//! Layout: the two controllers ([`sandbox`], [`rollout`]: pure builders and status, a thin apply
//! layer, the reconcile that ties them), the RolloutQueues' admission ([`queue`]), the SandboxPools' warm members ([`pool`]), the [`gateway`] (REST to pod IPs behind Kubernetes RBAC), and
//! one plumbing module, [`runtime`] (start-up, caches and triggers, leadership, the generic write layer
//! and its memory, metrics, configuration). docs/CONTROLLER.md draws the data flow.

/// The API types live in the crate `orchard_api`; re-exported for the binaries and tests.
pub use orchard_api as api;

pub mod app;
pub mod egress;
pub mod gateway;
pub mod plumbing;
pub mod pod;
pub mod pool;
pub mod queue;
pub mod retry;
pub mod rollout;
pub mod sandbox;
pub mod snapshot;
