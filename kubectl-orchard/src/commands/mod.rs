//! One module per subcommand; each `run` returns the process exit status.

pub mod cp;
pub mod exec;
pub mod extend;
pub mod metrics;
pub mod port_forward;
pub mod shell;
pub mod wait;
