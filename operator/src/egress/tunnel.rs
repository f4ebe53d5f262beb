//! `CONNECT host:port`: once admitted, `200 Connection established`, then the client's upgraded
//! connection and the upstream's are spliced until either end closes or the connection is cut.
//! TLS inside is never intercepted.

use std::io;
use std::net::IpAddr;

use hyper::body::Incoming;
use hyper::{Request, Response, Uri};
use hyper_util::rt::TokioIo;

use super::admission::{Admitted, admit};
use super::audit::Via;
use super::deps::Shared;
use super::refusal::{ProxyBody, Refusal, text_body};
use super::rules::Target;

/// `CONNECT host:port`: a tunnel to an allowed target.
pub(super) async fn tunnel(
    shared: &Shared,
    source: IpAddr,
    mut request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Refusal> {
    let (target, port) = connect_target(request.uri())?;
    let Admitted { open, mut stream } = admit(shared, source, target, port, Via::Connect).await?;
    let upgrade = hyper::upgrade::on(&mut request);
    shared.tasks.spawn(async move {
        let token = open.token().clone();
        let copied = async {
            let client = upgrade.await.map_err(io::Error::other)?;
            tokio::io::copy_bidirectional(&mut TokioIo::new(client), &mut stream).await
        };
        tokio::select! {
            copied = copied => match copied {
                Ok((sent, received)) => tracing::debug!(%source, sent, received, "egress tunnel closed"),
                Err(error) => tracing::debug!(%source, %error, "egress tunnel ended"),
            },
            // Dropping both ends closes both sockets.
            () = token.cancelled() => tracing::debug!(%source, "egress tunnel cut"),
        }
        drop(open);
    });
    let mut response = Response::new(text_body(String::new()));
    response
        .extensions_mut()
        .insert(hyper::ext::ReasonPhrase::from_static(
            b"Connection established",
        ));
    Ok(response)
}

/// The target and port of a `CONNECT` request's authority (pure).
fn connect_target(uri: &Uri) -> Result<(Target, u16), Refusal> {
    const USAGE: &str = "CONNECT needs a host:port target, e.g. CONNECT pypi.org:443";
    let authority = uri
        .authority()
        .filter(|_| uri.scheme().is_none() && uri.path_and_query().is_none())
        .ok_or_else(|| Refusal::bad_request(USAGE))?;
    let port = authority
        .port_u16()
        .filter(|port| *port != 0)
        .ok_or_else(|| Refusal::bad_request(USAGE))?;
    let target = Target::parse(authority.host()).map_err(Refusal::bad_request)?;
    Ok((target, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;

    fn uri(text: &str) -> Uri {
        text.parse().expect(text)
    }

    #[test]
    fn connect_targets_need_host_and_port() {
        let name = |text: &str| Target::Name(text.into());
        let cases = [
            ("pypi.org:443", Ok((name("pypi.org"), 443))),
            ("PyPI.org.:443", Ok((name("pypi.org"), 443))),
            (
                "[2001:db8::1]:443",
                Ok((Target::Ip("2001:db8::1".parse().expect("ip")), 443)),
            ),
            ("pypi.org", Err(StatusCode::BAD_REQUEST)),
            ("pypi.org:0", Err(StatusCode::BAD_REQUEST)),
            ("127.1:443", Err(StatusCode::BAD_REQUEST)),
            ("http://pypi.org:443/", Err(StatusCode::BAD_REQUEST)),
        ];
        for (authority, expected) in cases {
            assert_eq!(
                connect_target(&uri(authority)).map_err(|refusal| refusal.status),
                expected,
                "{authority}"
            );
        }
    }
}
