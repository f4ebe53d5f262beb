//! Integration tests of the real `orchard-agent` binary over loopback HTTP, one module per API area.

mod api;
mod common;
mod empty_root;
mod exec;
mod file_tree;
mod files;
mod hardening;
mod metrics;
mod patch;
mod pid1;
mod policy_gate;
mod process_input;
mod processes;
mod sessions;
mod tunnels;
mod users;
