//! The egress proxy's HTTP/1.1 server: the forward proxy a sandbox's task reaches the internet
//! through (its `HTTP_PROXY`/`HTTPS_PROXY`). The client's source address says which sandbox asks
//! ([`PolicyTable`]); its rules decide every request ([`Rules::decide`](super::rules::Rules::decide)).
//!
//! - `CONNECT host:port` opens a tunnel: `200 Connection established`, then bytes both ways until
//!   either end closes. TLS inside is never intercepted.
//! - An absolute-form `http://` request (any method) is forwarded over a fresh connection, in origin
//!   form, with `Host` set to the name the policy checked (whatever `Host` the client sent) and
//!   hop-by-hop and `Proxy-*` headers removed; the answer streams back.
//! - Anything else is refused with a `text/plain` line; a denial is a 403 with
//!   `X-Orchard-Egress: denied`.
//!
//! Every decision goes to [`Audit::record`]. A new table on the watch channel cuts at once the open
//! tunnels and requests it no longer allows. Shutdown stops accepting and closes every connection.
//!
//! Here: the server and the watcher; a request's admission is in `admission`, its two shapes in
//! `tunnel` and `forward`, the proxy's own answers in `refusal`.

use std::convert::Infallible;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::audit::Audit;
use super::connections::Connections;
use super::deps::Shared;
pub use super::deps::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, ProxyDeps};
use super::refusal::{ProxyBody, Refusal};
use super::table::PolicyTable;
use super::{forward, tunnel};
use crate::plumbing::accept::{accept, serve_until_stopped};

/// Serves the proxy on `listener` until `shutdown` is cancelled, then closes every connection and
/// waits for their tasks to end. Also runs the watcher that cuts, on every new table, the open
/// connections it no longer allows.
pub async fn serve(
    listener: TcpListener,
    deps: ProxyDeps,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let tasks = TaskTracker::new();
    let connections = Connections::new(shutdown.child_token());
    tasks.spawn(cut_on_change(
        deps.table.clone(),
        connections.clone(),
        deps.audit.clone(),
        shutdown.clone(),
    ));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(deps.header_read_timeout);
    let shared = Arc::new(Shared {
        deps,
        connections,
        tasks: tasks.clone(),
        shutdown: shutdown.clone(),
    });
    loop {
        let Some((stream, peer)) = accept(&listener, &shutdown, "egress proxy").await else {
            break;
        };
        let source = peer.ip().to_canonical();
        let for_requests = shared.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let shared = for_requests.clone();
            async move { Ok::<_, Infallible>(handle(&shared, source, request).await) }
        });
        let connection = http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let stop = shutdown.clone();
        tasks.spawn(async move {
            // At shutdown: no new requests; the one in progress is cut by its token.
            if let Err(error) = serve_until_stopped(connection, stop).await {
                tracing::debug!(%error, %source, "egress proxy connection ended with an error");
            }
        });
    }
    drop(listener);
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// Cuts, on every new table, the open connections it no longer allows.
async fn cut_on_change(
    mut table: watch::Receiver<Arc<PolicyTable>>,
    connections: Arc<Connections>,
    audit: Arc<dyn Audit>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            changed = table.changed() => if changed.is_err() {
                tracing::warn!("the egress policy table has no writer any more; the last table stays in force");
                return;
            },
            () = shutdown.cancelled() => return,
        }
        let current = table.borrow_and_update().clone();
        let cut = connections.cut_denied(&current, audit.as_ref());
        if cut > 0 {
            tracing::info!(
                cut,
                open = connections.open_count(),
                "egress connections cut after a policy change"
            );
        }
    }
}

/// Answers one request: a tunnel, a forwarded request, or a refusal.
async fn handle(
    shared: &Shared,
    source: IpAddr,
    request: Request<Incoming>,
) -> Response<ProxyBody> {
    let answered = if request.method() == Method::CONNECT {
        tunnel::tunnel(shared, source, request).await
    } else {
        forward::forward(shared, source, request).await
    };
    answered.unwrap_or_else(Refusal::into_response)
}
