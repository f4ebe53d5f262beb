//! The gateway (default :8080): the REST API trainers use. Sandbox and RolloutGroup lifecycle from the
//! watch caches, exec/file/process/patch calls proxied straight to each sandbox's agent at its pod IP
//! with the sandbox's own token, callers authenticated with TokenReview and authorised with
//! SubjectAccessReview, heartbeats coalesced into few API writes. `docs/API.md` is the reference.
//!
//! Modules by concern: [`auth`] (who calls, what RBAC lets them do), [`http`] (the server, its
//! limits, errors, metrics, OpenAPI), [`objects`] (Sandboxes and RolloutGroups from the caches),
//! [`agent`] (calls proxied to agents), [`routes`] (the handlers that tie them), [`config`] (flags).
//! The gateway reads the cluster only through [`deps::ReadModel`]; [`serve`] assembles it and
//! [`state`] is what every handler shares.

pub mod agent;
pub mod auth;
pub mod config;
pub mod deps;
pub mod http;
pub mod objects;
pub mod routes;
pub mod serve;
pub mod state;
