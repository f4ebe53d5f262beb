//! Generic Kubernetes machinery every controller and the gateway build on. Nothing here knows a
//! controller: no module of this folder imports `sandbox`, `pod`, `pool`, `rollout`, `queue`,
//! `gateway` or `app` (the layering test in `tests/layers.rs` checks it).
//!
//! The API client ([`api_client`]); what the Pod cache keeps of a Pod ([`cached_pod`]); the write layer ([`writes`], [`status_patch`]) and its short
//! memory of the operator's own writes ([`own_writes`]); ownership and seals ([`ownership`]);
//! per-object backoff and reconcile slots ([`backoff`], [`reconcile_slots`]); leadership
//! ([`leader`]); the change feed waiters read ([`change_feed`]) and the controllers' triggers
//! ([`triggers`]); conditions and events ([`conditions`], [`events`]); the start time of a jittered
//! trajectory ([`launch_after`]); messages cut to fit a status ([`text`]); metrics ([`metrics`]) and the
//! error type ([`error`]).

pub mod accept;
pub mod api_client;
pub mod backoff;
pub mod cached_pod;
pub mod caches;
pub mod change_feed;
pub mod conditions;
pub mod error;
pub mod events;
pub mod keyed_locks;
pub mod kube_ctx;
pub mod launch_after;
pub mod leader;
pub mod metrics;
#[cfg(test)]
pub mod mock_api;
pub mod operator_key;
pub mod own_writes;
pub mod ownership;
pub mod quantity;
pub mod reconcile;
pub mod reconcile_slots;
pub mod status_patch;
pub mod task_set;
pub mod text;
pub mod time;
pub mod triggers;
pub mod watch;
pub mod writes;
