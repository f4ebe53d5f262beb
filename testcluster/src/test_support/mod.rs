//! Helpers the end-to-end tests share: sandbox and RolloutGroup fixtures and checks, gateway users
//! and their RBAC, the two-real-node tests' helpers, the Python SDK's pytest driver, and rendering the chart and kustomize manifests.

pub mod gateway;
pub mod internet;
pub mod manifests;
pub mod nodes;
pub mod rollouts;
pub mod sandboxes;
pub mod sdk;
