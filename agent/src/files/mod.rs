//! The files API: resolving request paths and guarding the agent's own executable and token file
//! (`paths`), opening only regular files for reading (`regular`), streaming transfers that never hold a whole file in memory (`transfer`), and the HTTP
//! routes (`routes`).

pub mod paths;
pub mod regular;
pub mod routes;
pub mod transfer;
