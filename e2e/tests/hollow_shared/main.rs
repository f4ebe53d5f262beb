//! The end-to-end tests that share one hollow-node cluster: `TestEnv::shared()`, started by the
//! first test that asks for it and kept for the rest of this process. Each module was a test binary
//! of its own before; grouped, the cluster starts once and the operator, the harness and the tests
//! are linked once. Every test makes its own namespaces and touches only its own objects and pods.
//!
//! Not here, though they use the same kind of cluster: tests that kill, restart or pause a part of
//! it (`apiserver_restart`, `chaos`, `operator_restart`, `rollout_restart`,
//! `rollout_queue_restart`, `node_pause`, `gateway_faults`), count the operator's API writes or the
//! gateway's heartbeat writes from its metrics (`api_writes`, `recreate_churn`, `gateway_heartbeat`)
//! or bound timings under a load of their own (`expiry_load`): other tests running beside them in the
//! same cluster would disturb them, so each keeps a binary, and a cluster, of its own
//! (docs/TESTING.md, "Test binaries").

mod expiry;
mod faults;
mod gateway_api;
mod kubectl_plugin;
mod name_conflicts;
mod python_sdk;
mod retries;
mod rollout_group;
mod sandbox_lifecycle;
mod sandbox_retries;
mod security;
