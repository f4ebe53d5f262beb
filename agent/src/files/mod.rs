//! The files API: resolving request paths and guarding the agent's own executable and token file
//! (`paths`), acting on entries through a descriptor of their directory (`directory`), deleting
//! (`remove`), opening only regular files for reading (`regular`), streaming transfers that never hold
//! a whole file in memory (`transfer`), and the HTTP routes (`routes`).

pub mod directory;
pub mod paths;
pub mod regular;
pub mod remove;
pub mod routes;
pub mod transfer;
