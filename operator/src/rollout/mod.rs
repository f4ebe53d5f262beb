//! The RolloutGroup controller: Balanced Adaptive Rollout (see `docs/BAR.md`) as a controller.
//! [`params`] (spec -> BAR parameters), [`retry`] (which failed attempts are retried, with what),
//! [`jitter`] (when each trajectory of a stride starts), [`build`] (trajectory Sandboxes), [`observe`] (progress from status and children), [`status`] and
//! [`decide`] (what a reconcile does, as plans) are pure;
//! [`apply`] is the thin I/O layer (children, creates, deletes), [`execute`] carries out the plans,
//! and [`reconcile`] ties them together, as in the Sandbox controller.

pub mod apply;
pub mod build;
pub mod context;
pub mod decide;
pub mod execute;
pub mod jitter;
pub mod observe;
pub mod params;
pub mod reconcile;
pub mod retry;
pub mod status;

#[cfg(test)]
mod reconcile_tests;

pub use reconcile::{CONTROLLER, error_policy, reconcile};
