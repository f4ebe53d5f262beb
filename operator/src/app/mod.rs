//! The process: configuration ([`config`]), settings derived from it ([`context`]), start-up wiring
//! ([`start`]), the admin server ([`admin`]), logging ([`telemetry`]) and the operator key's Secret
//! ([`token_key`]). The only layer that knows every other one.

pub mod admin;
pub mod config;
pub mod context;
pub mod start;
pub mod telemetry;
pub mod token_key;

pub use start::{CacheFill, run, scoped_api};
