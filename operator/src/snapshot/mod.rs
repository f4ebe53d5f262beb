//! SandboxSnapshots: a Ready Sandbox's filesystem committed on its node into an image that new
//! Sandboxes (`spec.fromSnapshot`) start from.
//!
//! [`committer`] (the committer Pod and its script, the result it reports), [`decide`] (what a
//! reconcile does, as a plan) and [`source`] (what `fromSnapshot` resolves to, who names a
//! snapshot) are pure; [`execute`] carries out a plan and [`controller`] ties them together.
//! docs/SNAPSHOTS.md explains the behaviour, the guarantees and the privileges.

pub mod committer;
pub mod context;
pub mod controller;
pub mod decide;
pub mod execute;
pub mod quota;
pub mod source;

#[cfg(test)]
mod decide_tests;
