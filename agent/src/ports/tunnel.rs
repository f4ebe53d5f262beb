//! `GET /v1/ports/{port}/tunnel`: connects to the port on the pod's loopback first (so a refused
//! connection is a 502 with the reason, before anything is upgraded), then answers `101 Switching
//! Protocols` and copies bytes both ways between the upgraded connection and the port until either
//! side closes.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::request::{asks_for_tcp_upgrade, parse_port};
use super::slots::MAX_TUNNELS;
use crate::error::AgentError;
use crate::state::AppState;

/// Longest wait for the port to accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

async fn connect(address: SocketAddr) -> io::Result<TcpStream> {
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address)).await {
        Ok(connected) => connected,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no answer within 5 s",
        )),
    }
}

/// Connects to `port` on 127.0.0.1, then on [::1].
async fn connect_loopback(port: u16) -> Result<TcpStream, AgentError> {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    let first = match connect(v4).await {
        Ok(stream) => return Ok(stream),
        Err(error) => error,
    };
    match connect(v6).await {
        Ok(stream) => Ok(stream),
        Err(second) => Err(AgentError::BadGateway(format!(
            "nothing accepts connections on port {port} in the sandbox ({v4}: {first}; {v6}: {second})"
        ))),
    }
}

pub async fn tunnel(
    State(state): State<AppState>,
    port: Result<Path<String>, PathRejection>,
    mut request: Request,
) -> Result<Response, AgentError> {
    let Path(port) =
        port.map_err(|rejection| AgentError::BadRequest(format!("invalid port: {rejection}")))?;
    let port = parse_port(&port).map_err(AgentError::BadRequest)?;
    if !asks_for_tcp_upgrade(request.headers()) {
        return Err(AgentError::BadRequest(
            orchard_api::agent::NOT_AN_UPGRADE.into(),
        ));
    }
    let Ok(slot) = Arc::clone(&state.tunnels).try_acquire_owned() else {
        return Err(AgentError::TooManyRequests(format!(
            "{MAX_TUNNELS} tunnels are open; close one first"
        )));
    };
    let mut upstream = connect_loopback(port).await?;
    let _ = upstream.set_nodelay(true);
    let upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        let _slot = slot;
        match upgrade.await {
            Ok(upgraded) => {
                let mut client = TokioIo::new(upgraded);
                match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
                    Ok((sent, received)) => {
                        tracing::debug!(port, sent, received, "tunnel closed");
                    }
                    Err(error) => tracing::debug!(port, %error, "tunnel ended with an error"),
                }
            }
            Err(error) => tracing::debug!(port, %error, "the tunnel's upgrade failed"),
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("tcp"));
    Ok(response)
}
