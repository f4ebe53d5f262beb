//! The gateway's routes, one module per resource: [`sandboxes`] (lifecycle, wait, heartbeat, result),
//! [`agent`] (calls proxied to the sandbox's agent), [`rollout_groups`], [`snapshots`], [`network`] and
//! [`system`] (health and the OpenAPI document); [`waiting`] is the wait route of every kind.
//! Every handler authorises first, then reads caches, then acts.

pub mod network;
pub mod objects;
pub mod rollout_groups;
pub mod sandboxes;
pub mod snapshots;
pub mod system;
pub mod waiting;
