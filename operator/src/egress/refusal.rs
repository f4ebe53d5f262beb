//! The proxy's own answers: a status and one `text/plain` line; a policy denial (403) carries
//! `X-Orchard-Egress: denied`, so a client can tell it from an upstream's own 403.

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

/// Header on every 403 of the proxy, so a client (or a human reading curl's output) can tell a
/// policy denial from an upstream's own 403.
pub const DENIED_HEADER: &str = "x-orchard-egress";

/// A response body: the proxy's own text, or an upstream's answer streaming back.
pub type ProxyBody = BoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Why the proxy answers a request itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The status code.
    pub status: StatusCode,
    /// One line for the client.
    pub message: String,
}

impl Refusal {
    /// 400: the request is not one the proxy takes.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// 403: the policy denies it.
    pub fn denied(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            message: message.into(),
        }
    }

    /// 502: the upstream cannot be reached.
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_GATEWAY,
            message: message.into(),
        }
    }

    /// The answer when a connection to `label` (`host:port`) was cut before it was established: by
    /// shutdown (503) or by a policy change (403).
    pub fn cancelled(shutting_down: bool, label: &str) -> Self {
        if shutting_down {
            Self {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "the egress proxy is shutting down; retry".into(),
            }
        } else {
            Self::denied(format!(
                "{label} is no longer allowed: the sandbox's network policy changed"
            ))
        }
    }

    /// One `text/plain` line; 403s carry [`DENIED_HEADER`].
    pub fn into_response(self) -> Response<ProxyBody> {
        let mut response = Response::new(text_body(format!("{}\n", self.message)));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        if self.status == StatusCode::FORBIDDEN {
            headers.insert(DENIED_HEADER, HeaderValue::from_static("denied"));
        }
        response
    }
}

/// A body of `text`.
pub fn text_body(text: String) -> ProxyBody {
    Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn refusals_are_one_text_line_and_denials_are_marked() {
        let denied = Refusal::denied("pypi.org:443 is not in network.allow").into_response();
        assert_eq!(denied.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            denied
                .headers()
                .get(DENIED_HEADER)
                .map(HeaderValue::as_bytes),
            Some(&b"denied"[..])
        );
        assert_eq!(
            denied
                .headers()
                .get(header::CONTENT_TYPE)
                .map(HeaderValue::as_bytes),
            Some(&b"text/plain; charset=utf-8"[..])
        );
        let bad = Refusal::bad_request("not a proxy request").into_response();
        assert!(bad.headers().get(DENIED_HEADER).is_none());
    }
}
