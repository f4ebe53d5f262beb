//! The gateway's HTTP server: HTTP/1.1 connections served by hyper with a header-read timeout (a client
//! that sends its headers slowly, or nothing, is disconnected), at most `max_connections` open at once
//! (further connections are not accepted: they wait in the kernel's listen backlog until one closes),
//! the peer address of each request available to authentication ([`peer_ip`]), and graceful shutdown
//! (no new connections; idle ones close; requests in progress finish). Connections may be upgraded (a
//! port-forward tunnel takes the socket over after its `101`); an upgraded connection leaves the
//! connection count, tunnels have a limit of their own.

use std::convert::Infallible;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::plumbing::accept::{accept, serve_until_stopped};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::metrics::GatewayMetrics;

tokio::task_local! {
    /// The IP address of the client whose request the current task handles.
    static PEER: IpAddr;
}

/// The IP address of the client whose request is being handled (its TCP peer; a proxy in front of
/// the gateway makes all its clients one), when called from a request's handler.
pub fn peer_ip() -> Option<IpAddr> {
    PEER.try_with(|ip| *ip).ok()
}

/// Connection limits of [`serve_requests`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a client has to send a request's headers, from the first read of a connection or
    /// the end of the previous response on a kept-alive one (idle connections close after it).
    pub header_read_timeout: Duration,
    /// Most connections served at once.
    pub max_connections: usize,
}

/// Serves requests on `listener` with `handle` until `shutdown` is cancelled, then waits for the
/// connections in progress to finish.
pub async fn serve_requests<H, F>(
    listener: TcpListener,
    handle: H,
    limits: ConnectionLimits,
    metrics: GatewayMetrics,
    shutdown: CancellationToken,
) -> io::Result<()>
where
    H: Fn(Request) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let connections = TaskTracker::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    loop {
        // A free slot first, then accept: beyond the limit, connections wait in the backlog.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.map_err(io::Error::other)?,
            () = shutdown.cancelled() => break,
        };
        let Some((stream, peer)) = accept(&listener, &shutdown, "gateway").await else {
            break;
        };
        let handle = handle.clone();
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let handled = handle(request.map(Body::new));
            PEER.scope(peer.ip(), async move { Ok::<_, Infallible>(handled.await) })
        });
        let connection = http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let open = metrics.open_connections.clone();
        open.inc();
        let stop = shutdown.clone();
        connections.spawn(async move {
            // At shutdown: no new requests on this connection; the one in progress ends.
            if let Err(err) = serve_until_stopped(connection, stop).await {
                tracing::debug!(%err, "gateway connection ended with an error");
            }
            open.dec();
            drop(slot);
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tower::ServiceExt;

    async fn start(limits: ConnectionLimits) -> (std::net::SocketAddr, CancellationToken) {
        let router = Router::new()
            .route("/ip", get(|| async { format!("{:?}", peer_ip()) }))
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    "done"
                }),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let registry = prometheus::Registry::new();
        let metrics = GatewayMetrics::register(&registry).unwrap();
        let shutdown = CancellationToken::new();
        let handle = move |request: Request| {
            let answer = router.clone().oneshot(request);
            async move {
                match answer.await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            }
        };
        tokio::spawn(serve_requests(
            listener,
            handle,
            limits,
            metrics,
            shutdown.clone(),
        ));
        (addr, shutdown)
    }

    /// Reads until the peer closes; `None` if it is still open after `wait`.
    async fn closed_within(stream: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
        let mut seen = Vec::new();
        let read = tokio::time::timeout(wait, async {
            let mut buf = [0u8; 1024];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        read.ok().map(|()| seen)
    }

    const LIMITS: ConnectionLimits = ConnectionLimits {
        header_read_timeout: Duration::from_millis(300),
        max_connections: 64,
    };

    #[tokio::test]
    async fn silent_and_slow_clients_are_disconnected() {
        let (addr, _shutdown) = start(LIMITS).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /ip HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        assert!(
            closed_within(&mut silent, Duration::from_secs(3))
                .await
                .is_some()
        );
        assert!(
            closed_within(&mut slow, Duration::from_secs(3))
                .await
                .is_some()
        );
    }

    #[tokio::test]
    async fn requests_see_their_peer_address() {
        let (addr, _shutdown) = start(LIMITS).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /ip HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = closed_within(&mut client, Duration::from_secs(3))
            .await
            .expect("answered and closed");
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.ends_with("Some(127.0.0.1)"), "{text}");
    }

    #[tokio::test]
    async fn connections_beyond_the_limit_wait_for_a_free_one() {
        let (addr, _shutdown) = start(ConnectionLimits {
            header_read_timeout: Duration::from_secs(5),
            max_connections: 1,
        })
        .await;
        let mut first = TcpStream::connect(addr).await.unwrap();
        first
            .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let started = std::time::Instant::now();
        let mut second = TcpStream::connect(addr).await.unwrap();
        second
            .write_all(b"GET /ip HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let answer = closed_within(&mut second, Duration::from_secs(3))
            .await
            .expect("answered once the first connection closed");
        assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
        assert!(
            started.elapsed() >= Duration::from_millis(400),
            "answered after {:?}: not held back",
            started.elapsed()
        );
        assert!(
            closed_within(&mut first, Duration::from_secs(1))
                .await
                .is_some()
        );
    }

    #[tokio::test]
    async fn shutdown_lets_requests_in_progress_finish() {
        let (addr, shutdown) = start(LIMITS).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        shutdown.cancel();
        let answer = closed_within(&mut client, Duration::from_secs(3))
            .await
            .expect("closed after answering");
        let text = String::from_utf8_lossy(&answer);
        assert!(
            text.starts_with("HTTP/1.1 200") && text.ends_with("done"),
            "{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "no longer listening"
        );
    }
}
