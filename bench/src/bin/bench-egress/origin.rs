//! The HTTPS origin: a certificate authority and a certificate for `origin.test` made with the
//! `openssl` command, and an HTTP/1.1 server over rustls answering `GET /big` (a fixed number of
//! bytes) and `GET /small` (3 bytes).

use std::convert::Infallible;
use std::path::Path;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};

/// The body of `GET /small`.
pub const SMALL: &[u8] = b"ok\n";

/// Size of the slices `GET /big` is sent in.
const CHUNK: usize = 64 * 1024;

/// The certificates of one run.
pub struct Certs {
    /// The authority the client trusts.
    pub ca: CertificateDer<'static>,
    /// The origin's certificate (signed by [`Certs::ca`]) and its key.
    pub leaf: CertificateDer<'static>,
    pub key: PrivateKeyDer<'static>,
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (the benchmark makes its certificates with it)");
    assert!(
        output.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Makes, in `dir`, an ECDSA P-256 authority and a certificate for `host` it signs (valid 2 days).
pub fn make_certs(dir: &Path, host: &str) -> Certs {
    std::fs::create_dir_all(dir).expect("certificate directory");
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=bench-egress CA",
    ]);
    openssl(dir, &ca);
    let subject = format!("/CN={host}");
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend(["-keyout", "leaf.key", "-out", "leaf.csr", "-subj", &subject]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("leaf.ext"),
        format!(
            "subjectAltName=DNS:{host}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        ),
    )
    .expect("write leaf.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-days",
            "2",
            "-extfile",
            "leaf.ext",
        ],
    );
    let read = |name: &str| std::fs::read(dir.join(name)).expect(name);
    Certs {
        ca: CertificateDer::from_pem_slice(&read("ca.pem")).expect("ca.pem"),
        leaf: CertificateDer::from_pem_slice(&read("leaf.pem")).expect("leaf.pem"),
        key: PrivateKeyDer::from_pem_slice(&read("leaf.key")).expect("leaf.key"),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The origin's TLS configuration: its certificate only (no client authentication), HTTP/1.1.
pub fn server_config(certs: &Certs) -> Arc<ServerConfig> {
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![certs.leaf.clone()], certs.key.clone_key())
        .expect("the origin's certificate and key");
    Arc::new(config)
}

/// The client's TLS configuration: trusts the benchmark's authority only; no session resumption,
/// so every fresh connection makes a full handshake.
pub fn client_config(certs: &Certs) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots.add(certs.ca.clone()).expect("trust the authority");
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// A body of `remaining` bytes sent as slices of one buffer (no copy per slice); exact length, so
/// the response carries `Content-Length`.
pub struct Repeat {
    chunk: Bytes,
    remaining: u64,
}

impl Repeat {
    pub fn new(chunk: Bytes, length: u64) -> Self {
        Repeat {
            chunk,
            remaining: length,
        }
    }
}

impl Body for Repeat {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.remaining == 0 {
            return Poll::Ready(None);
        }
        let length = self.remaining.min(self.chunk.len() as u64) as usize;
        self.remaining -= length as u64;
        Poll::Ready(Some(Ok(Frame::data(self.chunk.slice(..length)))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

/// Answers one request.
fn answer(request: &Request<hyper::body::Incoming>, big: u64, chunk: &Bytes) -> Response<Repeat> {
    let (status, body) = match request.uri().path() {
        "/big" => (StatusCode::OK, Repeat::new(chunk.clone(), big)),
        "/small" => (
            StatusCode::OK,
            Repeat::new(Bytes::from_static(SMALL), SMALL.len() as u64),
        ),
        _ => (StatusCode::NOT_FOUND, Repeat::new(Bytes::new(), 0)),
    };
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
}

/// Serves HTTPS on `listener` until the runtime stops: `GET /big` is `big` bytes.
pub async fn serve(listener: TcpListener, tls: TlsAcceptor, big: u64) {
    // Not all zeros, though TLS makes that moot on the wire.
    let chunk: Bytes = (0..CHUNK).map(|i| (i * 131 % 251) as u8).collect();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (tls, chunk) = (tls.clone(), chunk.clone());
        tokio::spawn(async move {
            let Ok(stream) = tls.accept(stream).await else {
                return;
            };
            let service = hyper::service::service_fn(move |request| {
                let response = answer(&request, big, &chunk);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
