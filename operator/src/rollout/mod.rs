//! The RolloutGroup controller: Balanced Adaptive Rollout (see `docs/BAR.md`) as a controller.
//! [`params`] (spec -> BAR parameters), [`build`] (trajectory Sandboxes), [`observe`] (progress from
//! status and children) and [`status`] are pure; [`reconcile`] does the I/O.

pub mod build;
pub mod observe;
pub mod params;
pub mod reconcile;
pub mod status;

pub use reconcile::{CONTROLLER, error_policy, reconcile};
