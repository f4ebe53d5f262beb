//! The operator's Kubernetes plumbing, shared by both controllers and the gateway: the API client
//! ([`api_client`]), process start-up
//! and the watch caches ([`start`], [`triggers`], [`change_feed`]), leadership ([`leader`]), the
//! generic write layer ([`writes`], [`status_patch`]) and its memory of the operator's own writes
//! ([`own_writes`]), ownership checks ([`ownership`]), per-object backoff and reconcile slots
//! ([`backoff`], [`reconcile_slots`]), conditions and events ([`conditions`], [`events`]), the
//! shared [`context`], configuration ([`config`]), errors ([`error`]), metrics and the admin server
//! ([`metrics`], [`admin`]), logging ([`telemetry`]) and the agent-token key ([`token_key`]).

pub mod admin;
pub mod api_client;
pub mod backoff;
pub mod change_feed;
pub mod conditions;
pub mod config;
pub mod context;
pub mod error;
pub mod events;
pub mod leader;
pub mod metrics;
#[cfg(test)]
pub mod mock_api;
pub mod own_writes;
pub mod ownership;
pub mod reconcile_slots;
pub mod start;
pub mod status_patch;
pub mod telemetry;
pub mod token_key;
pub mod triggers;
pub mod writes;

pub use start::{CacheFill, run, scoped_api};
