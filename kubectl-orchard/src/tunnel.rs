//! Port tunnels through the gateway (`GET .../sandboxes/{name}/ports/{port}/tunnel`): an HTTP/1.1
//! request upgraded (`101`, `Upgrade: tcp`) to a raw TCP stream to the port on the sandbox's
//! loopback. A refusal (nothing listening, no permission, a bad port) comes back as a JSON error
//! before anything is upgraded.

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper::header::{AUTHORIZATION, CONNECTION, HOST, UPGRADE};
use hyper_util::rt::TokioIo;
use orchard_api::agent::TUNNEL_PROTOCOL;
use tokio::net::TcpStream;

use crate::error::{CliError, Result};
use crate::gateway::Gateway;

/// An open tunnel: read and write it like the remote port's connection.
pub type Tunnel = TokioIo<hyper::upgrade::Upgraded>;

/// Reads a port-forward spec (pure): `LOCAL:REMOTE`, `PORT` (the same on both sides) or `:REMOTE`
/// (any free local port, shown as 0).
pub fn parse_ports(text: &str) -> Result<(u16, u16)> {
    let port = |part: &str, zero_ok: bool| -> Result<u16> {
        match part.parse::<u16>() {
            Ok(0) if !zero_ok => Err(CliError::Usage(format!("port 0 in `{text}`"))),
            Ok(port) => Ok(port),
            Err(_) => Err(CliError::Usage(format!(
                "`{text}` is not LOCAL:REMOTE or PORT (ports 1 to 65535)"
            ))),
        }
    };
    match text.split_once(':') {
        Some(("", remote)) => Ok((0, port(remote, false)?)),
        Some((local, remote)) => Ok((port(local, true)?, port(remote, false)?)),
        None => {
            let both = port(text, false)?;
            Ok((both, both))
        }
    }
}

/// Opens a tunnel to `port` in `sandbox`, on a connection of its own.
pub async fn open(gateway: &Gateway, sandbox: &str, port: u16) -> Result<Tunnel> {
    let url = gateway.url(sandbox, &["ports", &port.to_string(), "tunnel"], &[])?;
    let host = url
        .host_str()
        .ok_or_else(|| CliError::Settings(format!("gateway URL `{}` has no host", gateway.base())))?
        .to_string();
    let gateway_port = url.port_or_known_default().unwrap_or(80);
    let stream = TcpStream::connect((host.trim_matches(['[', ']']), gateway_port))
        .await
        .map_err(|e| gateway.connection(e))?;
    // Interactive protocols through the tunnel should not wait for Nagle.
    stream
        .set_nodelay(true)
        .map_err(|e| gateway.connection(e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| gateway.connection(e))?;
    tokio::spawn(async move {
        // Ends when the tunnel (or the refusal) is done; its error, if any, shows on the tunnel.
        let _ = connection.with_upgrades().await;
    });
    let path = match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_string(),
    };
    let request = Request::get(path)
        .header(HOST, format!("{host}:{gateway_port}"))
        .header(AUTHORIZATION, format!("Bearer {}", gateway.token()))
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, TUNNEL_PROTOCOL)
        .body(Empty::<Bytes>::new())
        .map_err(|e| CliError::Protocol(e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| gateway.connection(e))?;
    if response.status() == hyper::StatusCode::SWITCHING_PROTOCOLS {
        let upgraded = hyper::upgrade::on(response)
            .await
            .map_err(|e| gateway.connection(e))?;
        return Ok(TokioIo::new(upgraded));
    }
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| gateway.connection(e))?
        .to_bytes();
    Err(CliError::from_answer(status, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_specs() {
        assert_eq!(parse_ports("8080").unwrap(), (8080, 8080));
        assert_eq!(parse_ports("9000:80").unwrap(), (9000, 80));
        assert_eq!(parse_ports(":80").unwrap(), (0, 80));
        assert_eq!(parse_ports("0:80").unwrap(), (0, 80));
        for bad in ["", "0", "80:0", "x", "70000", "1:2:3", "80:"] {
            assert!(parse_ports(bad).is_err(), "{bad}");
        }
    }
}
