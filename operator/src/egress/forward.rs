//! Absolute-form plain-HTTP requests (`GET http://host/path`, any method): once admitted,
//! forwarded over a fresh connection in origin form, with `Host` set to the name the policy checked
//! (whatever `Host` the client sent) and hop-by-hop and `Proxy-*` headers removed; the answer
//! streams back, and ends at once when a policy change cuts it.

use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Response, Uri, Version};
use hyper_util::rt::TokioIo;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::admission::{Admitted, admit};
use super::audit::Via;
use super::connections::Open;
use super::deps::Shared;
use super::refusal::{ProxyBody, Refusal};
use super::rules::Target;

/// The answer to an origin-form request: the client is not using the proxy as a proxy.
const NOT_A_PROXY_REQUEST: &str =
    "this is the Orchard egress proxy: set HTTP_PROXY/HTTPS_PROXY to use it";

/// Where an absolute-form plain-HTTP request goes (pure): target, port, the `Host` header to send
/// and the origin-form URI.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HttpTarget {
    target: Target,
    port: u16,
    host_header: String,
    origin_form: Uri,
}

fn http_target(uri: &Uri) -> Result<HttpTarget, Refusal> {
    match uri.scheme_str() {
        None => return Err(Refusal::bad_request(NOT_A_PROXY_REQUEST)),
        Some("http") => {}
        Some("https") => {
            return Err(Refusal::bad_request(
                "use CONNECT for https:// URLs (the proxy never sees inside TLS); set HTTPS_PROXY",
            ));
        }
        Some(other) => {
            return Err(Refusal::bad_request(format!(
                "the egress proxy carries http:// URLs, and https:// through CONNECT, not {other}://"
            )));
        }
    }
    let authority = uri
        .authority()
        .ok_or_else(|| Refusal::bad_request("the URL has no host"))?;
    if authority.as_str().contains('@') {
        return Err(Refusal::bad_request(
            "the URL carries user information (user@host); send credentials in a header",
        ));
    }
    let explicit_port = authority.port_u16();
    let port = explicit_port.unwrap_or(80);
    if port == 0 {
        return Err(Refusal::bad_request("port 0 is not a port"));
    }
    let target = Target::parse(authority.host()).map_err(Refusal::bad_request)?;
    let origin_form = uri
        .path_and_query()
        .map_or("/", |path| path.as_str())
        .parse()
        .map_err(|_| Refusal::bad_request("the URL's path is not valid"))?;
    Ok(HttpTarget {
        host_header: target.host_header(explicit_port),
        target,
        port,
        origin_form,
    })
}

/// Headers that describe one hop (RFC 9110 section 7.6.1), and every `Proxy-*` header.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection" | "keep-alive" | "te" | "trailer" | "transfer-encoding" | "upgrade"
    ) || name.as_str().starts_with("proxy-")
}

/// Removes the hop-by-hop headers, those the `Connection` header names included (pure).
fn end_to_end(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    let hop: Vec<HeaderName> = headers
        .keys()
        .filter(|name| is_hop_by_hop(name))
        .cloned()
        .collect();
    for name in hop {
        headers.remove(name);
    }
}

/// An absolute-form `http://` request: forwarded to an allowed target.
pub(super) async fn forward(
    shared: &Shared,
    source: IpAddr,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Refusal> {
    let HttpTarget {
        target,
        port,
        host_header,
        origin_form,
    } = http_target(request.uri())?;
    let host_value = HeaderValue::from_str(&host_header)
        .map_err(|_| Refusal::bad_request("the URL's host is not valid header text"))?;
    let label = target.with_port(port);
    let Admitted { open, stream } = admit(shared, source, target, port, Via::Http).await?;
    let (mut parts, body) = request.into_parts();
    end_to_end(&mut parts.headers);
    parts.headers.insert(header::HOST, host_value);
    parts.uri = origin_form;
    parts.version = Version::HTTP_11;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| Refusal::bad_gateway(format!("{label}: {error}")))?;
    let token = open.token().clone();
    shared.tasks.spawn(async move {
        tokio::select! {
            ended = connection => if let Err(error) = ended {
                tracing::debug!(%error, "egress upstream connection ended with an error");
            },
            () = token.cancelled() => {}
        }
    });
    let answer = tokio::select! {
        answer = sender.send_request(Request::from_parts(parts, body)) => answer,
        () = open.token().cancelled() => return Err(Refusal::cancelled(shared.shutdown.is_cancelled(), &label)),
    };
    let answer = answer.map_err(|error| {
        tracing::debug!(%source, target = %label, %error, "egress upstream gave no answer");
        Refusal::bad_gateway(format!("{label} closed the connection without an answer"))
    })?;
    let (mut parts, body) = answer.into_parts();
    end_to_end(&mut parts.headers);
    // The proxy speaks its own HTTP version to the client, whatever the upstream's.
    parts.version = Version::HTTP_11;
    Ok(Response::from_parts(
        parts,
        CutBody::new(body, open).boxed(),
    ))
}

/// An upstream's answer streaming back; ends with an error (the client's connection is closed
/// mid-answer) when its connection is cut. Holds the connection's registration until it ends.
struct CutBody {
    inner: Incoming,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    _open: Open,
}

impl CutBody {
    fn new(inner: Incoming, open: Open) -> Self {
        Self {
            inner,
            cut: Box::pin(open.token().clone().cancelled_owned()),
            _open: open,
        }
    }
}

impl Body for CutBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.cut.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(
                "the sandbox's network policy no longer allows this request".into(),
            )));
        }
        Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(|error| error.into())
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;

    fn uri(text: &str) -> Uri {
        text.parse().expect(text)
    }

    #[test]
    fn absolute_form_urls_become_origin_form_with_their_host() {
        let cases = [
            ("http://allowed.test/x?y=1", "allowed.test", 80, "/x?y=1"),
            ("http://Allowed.Test.:8080", "allowed.test:8080", 8080, "/"),
            ("http://[2001:db8::1]/", "[2001:db8::1]", 80, "/"),
            ("http://203.0.113.5:81/a", "203.0.113.5:81", 81, "/a"),
        ];
        for (url, host, port, path) in cases {
            let found = http_target(&uri(url)).expect(url);
            assert_eq!(
                (
                    found.host_header.as_str(),
                    found.port,
                    found.origin_form.to_string()
                ),
                (host, port, path.to_string()),
                "{url}"
            );
        }
    }

    #[test]
    fn other_request_targets_are_refused_with_a_reason() {
        let cases = [
            ("/simple/", "set HTTP_PROXY/HTTPS_PROXY"),
            ("https://pypi.org/", "use CONNECT for https://"),
            ("ftp://pypi.org/", "not ftp://"),
            ("http://user:pw@pypi.org/", "user information"),
            ("http://pypi.org:0/", "port 0"),
            ("http://a_b..c/", "not a host name"),
        ];
        for (url, expected) in cases {
            let refusal = http_target(&uri(url)).expect_err(url);
            assert_eq!(refusal.status, StatusCode::BAD_REQUEST, "{url}");
            assert!(
                refusal.message.contains(expected),
                "{url}: {}",
                refusal.message
            );
        }
    }

    #[test]
    fn only_end_to_end_headers_are_passed_on() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic abc"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "websocket"),
            ("te", "trailers"),
            ("accept", "*/*"),
            ("authorization", "Bearer t"),
            ("content-length", "3"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        end_to_end(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, vec!["accept", "authorization", "content-length"]);
    }
}
