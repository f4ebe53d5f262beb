//! Orchard Env operator: the `Sandbox` and `RolloutGroup` APIs, their controllers, the gateway that
//! routes exec/file calls straight to pod IPs, and the pure Balanced Adaptive Rollout (BAR) engine.
//!
//! Data flow: [`api`] (types) -> [`sandbox`] controller (pure `build` and `status`, thin `apply`)
//! -> gateway -> agent. [`bar`] is pure and does no I/O.

pub mod admin;
pub mod agent_client;
pub mod api;
pub mod backoff;
pub mod bar;
pub mod bar_sim;
pub mod change_feed;
pub mod conditions;
pub mod config;
pub mod context;
pub mod error;
pub mod events;
pub mod gateway;
pub mod leader;
pub mod metrics;
pub mod own_writes;
pub mod ownership;
pub mod reconcile_slots;
pub mod rollout;
pub mod runtime;
pub mod sandbox;
pub mod status_patch;
pub mod telemetry;
pub mod triggers;
pub mod writes;
