//! The RolloutGroup controller: Balanced Adaptive Rollout (see `docs/BAR.md`) as a controller.
//! [`params`] (spec -> BAR parameters), [`build`] (trajectory Sandboxes), [`observe`] (progress from
//! status and children) and [`status`] are pure; [`apply`] is the thin I/O layer (children, creates,
//! deletes) and [`reconcile`] ties them together, as in the Sandbox controller.

pub mod apply;
pub mod build;
pub mod context;
pub mod observe;
pub mod params;
pub mod reconcile;
pub mod status;

#[cfg(test)]
mod reconcile_tests;

pub use reconcile::{CONTROLLER, error_policy, reconcile};
