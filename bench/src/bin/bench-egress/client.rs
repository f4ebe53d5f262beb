//! The HTTPS client: hyper's HTTP/1.1 client over rustls, straight to the origin's address (what a
//! client that resolved `origin.test` itself does), through a plain TCP relay to it, or, as a client
//! with `https_proxy` set does, through `CONNECT origin.test:<port>` to the egress proxy and TLS
//! inside the tunnel.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

use crate::stats;

/// Which way a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// TCP to the origin's address.
    Direct,
    /// TCP to a relay that copies bytes to and from the origin (no HTTP, no policy).
    Relay,
    /// `CONNECT` through the egress proxy.
    Proxy,
}

impl Route {
    /// Every route, in the order of the report's columns.
    pub const ALL: [Route; 3] = [Route::Direct, Route::Relay, Route::Proxy];

    /// The route's column.
    pub fn index(self) -> usize {
        match self {
            Route::Direct => 0,
            Route::Relay => 1,
            Route::Proxy => 2,
        }
    }
}

/// Where the client goes and how it trusts the origin.
pub struct Client {
    /// The origin's host name (SNI, `Host`, the `CONNECT` target).
    pub host: String,
    /// The origin's address.
    pub origin: SocketAddr,
    /// The relay's address.
    pub relay: SocketAddr,
    /// The proxy's address.
    pub proxy: SocketAddr,
    pub tls: TlsConnector,
}

/// One HTTP/1.1 connection to the origin.
pub type Connection = SendRequest<Empty<Bytes>>;

fn other(error: impl std::fmt::Display) -> io::Error {
    io::Error::other(error.to_string())
}

impl Client {
    /// Opens a tunnel through the proxy: `CONNECT`, then the head of its answer; `Err` unless 200.
    pub async fn tunnel(&self, target: &str) -> io::Result<TcpStream> {
        let mut stream = TcpStream::connect(self.proxy).await?;
        stream.set_nodelay(true)?;
        let request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut head = Vec::with_capacity(256);
        let mut buffer = [0u8; 512];
        let end = loop {
            let read = stream.read(&mut buffer).await?;
            if read == 0 {
                return Err(other("the proxy closed the connection before answering"));
            }
            head.extend_from_slice(&buffer[..read]);
            if let Some(end) = stats::head_end(&head) {
                break end;
            }
            if head.len() > 16 * 1024 {
                return Err(other("the proxy's answer has no end of head"));
            }
        };
        let status = stats::status_code(&head).map_err(other)?;
        if status != 200 || end != head.len() {
            return Err(other(format!(
                "CONNECT {target}: {}",
                String::from_utf8_lossy(&head)
            )));
        }
        Ok(stream)
    }

    /// A new TCP connection, TLS handshake and HTTP/1.1 connection to the origin by `route`.
    pub async fn connect(&self, route: Route) -> io::Result<Connection> {
        let tcp = match route {
            Route::Direct | Route::Relay => {
                let to = if route == Route::Direct {
                    self.origin
                } else {
                    self.relay
                };
                let stream = TcpStream::connect(to).await?;
                stream.set_nodelay(true)?;
                stream
            }
            Route::Proxy => {
                self.tunnel(&format!("{}:{}", self.host, self.origin.port()))
                    .await?
            }
        };
        let name = ServerName::try_from(self.host.clone()).map_err(other)?;
        let tls = self.tls.connect(name, tcp).await?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(other)?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// The negotiated TLS version and cipher suite of a direct connection (for the report).
    pub async fn tls_parameters(&self) -> io::Result<String> {
        let tcp = TcpStream::connect(self.origin).await?;
        let name = ServerName::try_from(self.host.clone()).map_err(other)?;
        let tls = self.tls.connect(name, tcp).await?;
        let (_, session) = tls.get_ref();
        Ok(format!(
            "{:?}, {:?}",
            session
                .protocol_version()
                .ok_or_else(|| other("no version"))?,
            session
                .negotiated_cipher_suite()
                .ok_or_else(|| other("no cipher suite"))?
                .suite()
        ))
    }

    /// `GET path` on `connection`; the body's length.
    pub async fn get(&self, connection: &mut Connection, path: &str) -> io::Result<u64> {
        connection.ready().await.map_err(other)?;
        let request = Request::get(path)
            .header(hyper::header::HOST, self.host.as_str())
            .body(Empty::new())
            .map_err(other)?;
        let response = connection.send_request(request).await.map_err(other)?;
        if response.status() != StatusCode::OK {
            return Err(other(format!("GET {path}: {}", response.status())));
        }
        let mut body = response.into_body();
        let mut length = 0;
        while let Some(frame) = body.frame().await {
            if let Some(data) = frame.map_err(other)?.data_ref() {
                length += data.len() as u64;
            }
        }
        Ok(length)
    }

    /// `count` GETs of `path`, each on a fresh connection (TCP, TLS, request, body), timed from the
    /// TCP connect to the body's last byte.
    pub async fn fresh(&self, route: Route, path: &str, count: usize) -> io::Result<Vec<Duration>> {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let started = Instant::now();
            let mut connection = self.connect(route).await?;
            self.get(&mut connection, path).await?;
            samples.push(started.elapsed());
        }
        Ok(samples)
    }

    /// `count` GETs of `path` on one kept-alive connection (opened before timing), each timed.
    pub async fn kept(&self, route: Route, path: &str, count: usize) -> io::Result<Vec<Duration>> {
        let mut connection = self.connect(route).await?;
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let started = Instant::now();
            self.get(&mut connection, path).await?;
            samples.push(started.elapsed());
        }
        Ok(samples)
    }
}
