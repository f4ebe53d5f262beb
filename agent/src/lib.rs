//! `orchard-agent`: the in-pod execution agent of Orchard Env sandboxes. One static binary that serves
//! exec (unary, streamed, background), shell sessions, files, patches, port tunnels, metrics and health
//! over HTTP on the Pod IP.
//!
//! Data flow: `cli` (flags, env) -> `listen` (the socket, dual-stack by default) -> `connections`
//! (HTTP/1.1 connections: header-read timeout, cap) -> `server` (router, `/v1` guard, shutdown; the handlers' shared `state`) ->
//! handlers in `exec`, `processes`, `sessions`, `files`, `patch`, `ports` (TCP tunnels); `process_group` owns the kill-the-whole-group
//! rule; `users` resolves and switches to a request's `user`; `init` the PID 1 duty; `policy_gate` holds everything back until the sandbox's
//! NetworkPolicies are enforced; `error` the JSON error mapping; `cgroup` and `metrics` report what the
//! container uses.

pub mod auth;
pub mod cgroup;
pub mod cli;
pub mod clock;
pub mod connections;
pub mod entropy;
pub mod error;
pub mod exec;
pub mod files;
pub mod hardening;
pub mod held_body;
pub mod init;
pub mod install;
pub mod json_body;
pub mod listen;
pub mod logging;
pub mod metrics;
pub mod patch;
pub mod policy_gate;
pub mod ports;
pub mod process_group;
pub mod processes;
pub mod server;
pub mod sessions;
pub mod state;
pub mod users;

/// The agent's version (the crate version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
