//! Running commands: request validation (`request`), starting them in their own process group
//! (`spawn`), capping and encoding output (`output`), driving them to the end (`supervise`), and the
//! HTTP routes `/v1/exec` and `/v1/exec/stream` (`routes`); `budget` caps the output buffered by all
//! commands together; `pty` gives background processes a terminal; `oom` tells OOM kills.

pub mod budget;
pub mod oom;
pub mod output;
pub mod pty;
pub mod request;
pub mod routes;
pub mod spawn;
pub mod supervise;
