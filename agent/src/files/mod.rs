//! The files API: resolving request paths and guarding the agent's own executable and token file
//! (`paths`), streaming transfers that never hold a whole file in memory (`transfer`), and the HTTP
//! routes (`routes`).

pub mod paths;
pub mod routes;
pub mod transfer;
