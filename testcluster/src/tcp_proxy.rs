//! A TCP proxy owned by a test, between one client and kube-apiserver, that cuts the client off from
//! the API server (its traffic, not its process) and heals the cut.
//!
//! The proxy forwards raw TCP, so TLS passes through: the client still verifies the API server's
//! certificate, which names 127.0.0.1, the address the proxy listens on. While cut, the proxy keeps
//! every connection open and keeps accepting new ones, but drops every byte in both directions, as a
//! network that silently loses packets: the client's requests and the server's answers vanish, and
//! nothing tells the client (no reset, no close). Bytes sent during the cut are never delivered, not
//! even after [`TcpProxy::heal`]; a connection that carried some is then a broken TLS stream and is
//! closed by whichever end notices first.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::error::{E2eError, Result};

#[derive(Default)]
struct Shared {
    cut: AtomicBool,
    forwarded: AtomicU64,
    dropped: AtomicU64,
}

/// A running proxy (stopped, with all its connections, when dropped).
pub struct TcpProxy {
    /// Where it listens (`127.0.0.1:<port>`).
    pub address: SocketAddr,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on `127.0.0.1:0` and forwards every connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let task = tokio::spawn(accept_loop(listener, upstream, shared.clone()));
        Ok(Self {
            address,
            shared,
            task,
        })
    }

    /// `https://<address>`: the server URL for a kubeconfig.
    pub fn url(&self) -> String {
        format!("https://{}", self.address)
    }

    /// Cuts the client off: from now on every byte in either direction is dropped.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
    }

    /// Forwards again (bytes dropped during the cut stay lost).
    pub fn heal(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }

    /// Bytes forwarded so far (both directions).
    pub fn forwarded_bytes(&self) -> u64 {
        self.shared.forwarded.load(Ordering::SeqCst)
    }

    /// Bytes dropped by cuts so far (both directions).
    pub fn dropped_bytes(&self) -> u64 {
        self.shared.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // Dropping the accept loop drops its JoinSet, which aborts every connection's task.
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                let shared = shared.clone();
                connections.spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    // Either direction ends on its reader's EOF or an error; the connection ends
                    // when both did.
                    tokio::join!(
                        pump(client_read, server_write, &shared),
                        pump(server_read, client_write, &shared),
                    );
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Copies `from` to `to`, dropping what arrives while the proxy is cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if shared.cut.load(Ordering::SeqCst) {
            shared.dropped.fetch_add(n as u64, Ordering::SeqCst);
            continue;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
        shared.forwarded.fetch_add(n as u64, Ordering::SeqCst);
    }
    // A close during the cut is lost as well until the cut heals (the bytes before it stay lost).
    while shared.cut.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let _ = to.shutdown().await;
}

/// The `host:port` of an `https://host:port` server URL.
pub fn server_address(server: &str) -> Result<SocketAddr> {
    server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .parse()
        .map_err(|e| E2eError::Setup(format!("server URL {server}: {e}")))
}

/// Writes to `out` a copy of the kubeconfig `original` whose server URL `server` is replaced by the
/// proxy's.
pub fn kubeconfig_through(
    original: &Path,
    server: &str,
    proxy: &TcpProxy,
    out: &Path,
) -> Result<()> {
    let text = std::fs::read_to_string(original)?;
    let needle = format!("server: {server}");
    if !text.contains(&needle) {
        return Err(E2eError::Setup(format!(
            "{} does not name the server {server}",
            original.display()
        )));
    }
    std::fs::write(
        out,
        text.replace(&needle, &format!("server: {}", proxy.url())),
    )?;
    Ok(())
}
