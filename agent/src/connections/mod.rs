//! Serving HTTP/1.1 connections with hyper, so that connections cannot be held against the agent:
//!
//! - a header-read timeout: a connection that sends no complete request head within it is closed,
//!   whether it is fresh or kept alive after a response (idle connections close after it);
//! - a cap on open connections: at the cap, a new connection is still accepted, and the connection
//!   that has waited longest for a request head is closed to make room (`table` says why that one).
//!   Holding thousands of idle connections therefore evicts only the holder's own connections, never
//!   locks the operator's calls out of the listen backlog, and the agent's descriptors stay bounded.
//!   When the process runs out of descriptors anyway (a low `RLIMIT_NOFILE`), the same rule frees one;
//! - graceful shutdown: no new connections, waiting ones close at once, requests in progress finish.

pub mod table;

use crate::held_body::holding;
use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::response::Response;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

use self::table::{Admission, ConnectionId, ConnectionTable};

/// Limits of [`serve_connections`] (`--header-read-timeout`, `--max-connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a connection has to send a complete request head, from its start or from the end of
    /// the previous response.
    pub header_read_timeout: Duration,
    /// Most connections open at once (evicted ones still closing aside).
    pub max_connections: usize,
}

/// The connection cap to use under a soft `RLIMIT_NOFILE` of `open_files`: `configured`, but at most
/// half the descriptors the process may open, leaving the rest to commands' pipes and to files.
pub fn cap_for_open_files(configured: usize, open_files: u64) -> usize {
    let half = usize::try_from(open_files / 2).unwrap_or(usize::MAX);
    configured.min(half).max(1)
}

/// The soft `RLIMIT_NOFILE` of this process, if it can be read and is finite.
pub fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit for getrlimit to fill in.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    Some(limit.rlim_cur)
}

/// The table shared by the accept loop, the connections and their requests, with the signals that
/// go with it.
#[derive(Debug)]
struct Connections {
    table: Mutex<ConnectionTable>,
    /// One per open connection: notified when it is evicted.
    evictions: Mutex<std::collections::HashMap<ConnectionId, Arc<Notify>>>,
    /// Notified (`notify_waiters`: every waiter created before re-checks) when a connection closes
    /// or finishes a request: room may have appeared, or the last connection closed.
    changed: Notify,
}

impl Connections {
    fn table(&self) -> MutexGuard<'_, ConnectionTable> {
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn evictions(&self) -> MutexGuard<'_, std::collections::HashMap<ConnectionId, Arc<Notify>>> {
        self.evictions
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Admits a connection: its id and its eviction signal, after signalling the connection evicted
    /// for it; `None` when every connection is busy.
    fn admit(&self) -> Option<(ConnectionId, Arc<Notify>)> {
        let Admission::Open { id, evict } = self.table().admit() else {
            return None;
        };
        let signal = Arc::new(Notify::new());
        let mut evictions = self.evictions();
        evictions.insert(id, Arc::clone(&signal));
        if let Some(victim) = evict.and_then(|victim| evictions.get(&victim)) {
            victim.notify_one();
        }
        Some((id, signal))
    }

    /// Evicts the connection waiting longest (out of descriptors); whether there was one.
    fn evict_one(&self) -> bool {
        let Some(victim) = self.table().evict_longest_waiting() else {
            return false;
        };
        if let Some(signal) = self.evictions().get(&victim) {
            signal.notify_one();
        }
        true
    }

    fn close(&self, id: ConnectionId) {
        self.table().close(id);
        self.evictions().remove(&id);
        self.signal_change();
    }

    /// Wakes whoever waits for room or for the last connection to close (they re-check the table).
    fn signal_change(&self) {
        self.changed.notify_waiters();
    }
}

/// Marks its connection busy while it lives: from the request head until the response body is gone.
struct RequestInProgress {
    connections: Arc<Connections>,
    id: ConnectionId,
}

impl RequestInProgress {
    fn start(connections: &Arc<Connections>, id: ConnectionId) -> RequestInProgress {
        connections.table().request_started(id);
        RequestInProgress {
            connections: Arc::clone(connections),
            id,
        }
    }
}

impl Drop for RequestInProgress {
    fn drop(&mut self) {
        self.connections.table().request_finished(self.id);
        self.connections.signal_change();
    }
}

/// A connection's socket, noting whether everything written to it has been flushed: hyper flushes
/// the socket only once its own buffer is empty, so a connection whose last write was followed by a
/// flush holds no unsent response bytes and can be dropped without cutting one.
struct FlushTracked {
    stream: TcpStream,
    unflushed: Arc<AtomicBool>,
}

impl AsyncRead for FlushTracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(context, buffer)
    }
}

impl AsyncWrite for FlushTracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.unflushed.store(true, Ordering::Relaxed);
        Pin::new(&mut self.stream).poll_write(context, bytes)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.unflushed.store(true, Ordering::Relaxed);
        Pin::new(&mut self.stream).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.stream).poll_flush(context);
        if matches!(flushed, Poll::Ready(Ok(()))) {
            self.unflushed.store(false, Ordering::Relaxed);
        }
        flushed
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(context)
    }
}

/// Errors of `accept` that concern one connection only (it was gone before it was accepted).
fn is_connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

fn is_out_of_descriptors(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Serves `router` on `listener` until `stop` turns true, then waits until every connection closed
/// (waiting ones close at once, requests in progress finish).
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let connections = Arc::new(Connections {
        table: Mutex::new(ConnectionTable::new(limits.max_connections)),
        evictions: Mutex::default(),
        changed: Notify::new(),
    });
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let mut stopping = stop.clone();
    'accepting: loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stopping.wait_for(|stop| *stop) => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) if is_connection_error(&error) => continue,
            Err(error) if is_out_of_descriptors(&error) => {
                // The pending connection stays in the backlog; closing a waiting one makes room.
                let closed = connections.changed.notified();
                if connections.evict_one() {
                    tracing::debug!(%error, "out of descriptors: closed the longest-waiting connection");
                    let _ = tokio::time::timeout(Duration::from_millis(100), closed).await;
                } else {
                    tracing::warn!(%error, "cannot accept a connection: out of descriptors");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // TCP_NODELAY: without it a response written in two parts waits for the client's delayed ACK.
        let _ = stream.set_nodelay(true);
        let (id, evicted) = loop {
            let changed = connections.changed.notified();
            if let Some(admitted) = connections.admit() {
                break admitted;
            }
            tokio::select! {
                () = changed => {}
                _ = stopping.wait_for(|stop| *stop) => break 'accepting,
            }
        };
        let connection = serve_one(
            &http,
            stream,
            router.clone(),
            Arc::clone(&connections),
            id,
            evicted,
            stop.clone(),
        );
        tokio::spawn(connection);
    }
    drop(listener);
    loop {
        let changed = connections.changed.notified();
        if connections.table().is_empty() {
            return Ok(());
        }
        changed.await;
    }
}

/// Serves connection `id` until it ends, is evicted or the server stops. Evicted or stopping, it is
/// dropped at once when it waits for a request head with its last response flushed (nothing can be
/// cut: only polling the connection, which this task does, starts a request or writes), or else
/// finishes its request (or its flush) and closes: a connection that has sent half a request head
/// does not get to keep its descriptor until the header-read timeout.
fn serve_one(
    http: &http1::Builder,
    stream: TcpStream,
    router: Router,
    connections: Arc<Connections>,
    id: ConnectionId,
    evicted: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let service = {
        let connections = Arc::clone(&connections);
        let router = TowerToHyperService::new(router);
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let in_progress = RequestInProgress::start(&connections, id);
            let response = router.call(request);
            async move {
                let response: Result<Response, Infallible> = response.await;
                response.map(|response| response.map(|body| holding(body, in_progress)))
            }
        })
    };
    let unflushed = Arc::new(AtomicBool::new(false));
    let stream = FlushTracked {
        stream,
        unflushed: Arc::clone(&unflushed),
    };
    // With upgrades: a tunnel (`/v1/ports/{port}/tunnel`) takes the socket over after its 101; the
    // connection then leaves the table (the tunnel has a cap of its own).
    let connection = http
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    async move {
        // Boxed, not pinned on the stack, so it can be dropped (the socket closed) before the table
        // forgets the connection.
        let mut connection = Box::pin(connection);
        let mut closing = false;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%error, "connection ended with an error");
                    }
                    break;
                }
                () = async {
                    tokio::select! {
                        () = evicted.notified() => {}
                        _ = stop.wait_for(|stop| *stop) => {}
                    }
                }, if !closing => {
                    if connections.table().is_waiting(id) && !unflushed.load(Ordering::Relaxed) {
                        break;
                    }
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
        drop(connection);
        connections.close(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_half_the_descriptors_to_everything_else() {
        assert_eq!(cap_for_open_files(1024, 1_048_576), 1024);
        assert_eq!(cap_for_open_files(1024, 1024), 512);
        assert_eq!(cap_for_open_files(100, 1024), 100);
        assert_eq!(cap_for_open_files(1024, 1), 1);
    }

    #[tokio::test]
    async fn writes_count_as_unflushed_until_a_flush_completes() {
        use tokio::io::AsyncWriteExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap());
        let (client, accepted) = tokio::join!(client, listener.accept());
        let _client = client.unwrap();
        let unflushed = Arc::new(AtomicBool::new(false));
        let mut tracked = FlushTracked {
            stream: accepted.unwrap().0,
            unflushed: Arc::clone(&unflushed),
        };
        assert!(!unflushed.load(Ordering::Relaxed), "nothing written yet");
        tracked.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        assert!(unflushed.load(Ordering::Relaxed));
        tracked.flush().await.unwrap();
        assert!(!unflushed.load(Ordering::Relaxed));
    }
}
