//! What the proxy's parts share: its dependencies ([`ProxyDeps`]) and, per server, the open
//! connections, the task tracker and the shutdown token ([`Shared`]). Below `proxy`, `admission`,
//! `tunnel` and `forward`, so none of them imports another in a circle.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::audit::Audit;
use super::connections::Connections;
use super::resolve::{Protected, Resolve};
use super::table::PolicyTable;

/// The usual [`ProxyDeps::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The usual [`ProxyDeps::header_read_timeout`] (the gateway's default too).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything the proxy needs.
#[derive(Clone)]
pub struct ProxyDeps {
    /// The current policy table; every new value cuts the connections it no longer allows.
    pub table: watch::Receiver<Arc<PolicyTable>>,
    /// Resolves host names.
    pub resolver: Arc<dyn Resolve>,
    /// Addresses never connected to, as the cluster's ranges change.
    pub protected: watch::Receiver<Arc<Protected>>,
    /// Receives every decision and cut.
    pub audit: Arc<dyn Audit>,
    /// Longest wait for one upstream TCP connect (and for resolving a name).
    pub connect_timeout: Duration,
    /// How long a client has to send a request's headers (idle kept-alive connections close after
    /// it too).
    pub header_read_timeout: Duration,
}

/// What every connection's requests share.
pub(super) struct Shared {
    /// The proxy's dependencies.
    pub(super) deps: ProxyDeps,
    /// The open connections.
    pub(super) connections: Arc<Connections>,
    /// Every task the proxy spawns (connections, tunnels, upstream connections).
    pub(super) tasks: TaskTracker,
    /// Cancelled at shutdown.
    pub(super) shutdown: CancellationToken,
}

impl Shared {
    /// The current policy table.
    pub(super) fn table(&self) -> Arc<PolicyTable> {
        self.deps.table.borrow().clone()
    }
}
