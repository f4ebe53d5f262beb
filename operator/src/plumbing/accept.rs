//! Accepting and serving TCP connections the one way every server of the process does (the gateway,
//! the egress proxy): until shutdown, backing off instead of spinning when accept fails (out of file
//! descriptors and the like), with `TCP_NODELAY` on each connection (without it a response written
//! in two parts waits for the client's delayed ACK, about 40 ms per call on Linux), and each HTTP/1
//! connection ended gracefully at shutdown.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long a failed accept waits before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The next connection on `listener` (named `server` in logs), or `None` once `shutdown` is
/// cancelled.
pub async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    server: &str,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = shutdown.cancelled() => return None,
        };
        match accepted {
            Ok((stream, peer)) => {
                if let Err(error) = stream.set_nodelay(true) {
                    tracing::debug!(%error, server, "cannot set TCP_NODELAY on a connection");
                }
                return Some((stream, peer));
            }
            Err(error) => {
                tracing::warn!(%error, server, "cannot accept a connection");
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => {},
                    () = shutdown.cancelled() => return None,
                }
            }
        }
    }
}

/// Serves `connection` until it ends or `stop` is cancelled; then it takes no new request and the
/// one in progress ends (a server's own tokens cut long ones: streams, tunnels). hyper-util's
/// `GracefulShutdown` does not take upgradeable connections, hence this.
pub async fn serve_until_stopped<S, B>(
    connection: hyper::server::conn::http1::UpgradeableConnection<
        hyper_util::rt::TokioIo<TcpStream>,
        S,
    >,
    stop: CancellationToken,
) -> hyper::Result<()>
where
    S: hyper::service::HttpService<hyper::body::Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(connection);
    tokio::select! {
        ended = connection.as_mut() => ended,
        () = stop.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepts_with_nodelay_until_shutdown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let shutdown = CancellationToken::new();
        let client = tokio::spawn(TcpStream::connect(address));
        let (stream, _) = accept(&listener, &shutdown, "test")
            .await
            .expect("a connection");
        assert!(stream.nodelay().expect("nodelay"));
        drop(client.await);
        shutdown.cancel();
        assert!(accept(&listener, &shutdown, "test").await.is_none());
    }
}
