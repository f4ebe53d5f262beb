//! The process: configuration ([`config`]), settings derived from it ([`settings`]), start-up wiring
//! ([`start`]), the admin server ([`admin`]), logging ([`telemetry`]) and the operator key's Secret
//! ([`token_key`]). The only layer that knows every other one.

pub mod admin;
pub mod config;
pub mod discovery;
pub mod egress_args;
pub mod egress_proxy;
pub mod settings;
pub mod start;
pub mod telemetry;
pub mod token_key;
pub mod watches;

pub use start::run;
