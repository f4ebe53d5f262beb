//! The files API: resolving request paths and guarding the agent's own executable and token file
//! (`paths`), acting on entries through a descriptor of their directory (`directory`), deleting
//! (`remove`), opening only regular files for reading (`regular`), streaming transfers that never hold
//! a whole file in memory (`transfer`, `receive`), and the HTTP routes (`routes`; `stat`, `mkdir`,
//! `rename`; directories as tar streams: `tar_upload` after `tar_check` decided the whole archive may
//! be written, `tar_download`).

pub mod directory;
pub mod mkdir;
pub mod paths;
pub mod receive;
pub mod regular;
pub mod remove;
pub mod rename;
pub mod routes;
pub mod stat;
pub mod tar_check;
pub mod tar_download;
pub mod tar_upload;
pub mod transfer;
