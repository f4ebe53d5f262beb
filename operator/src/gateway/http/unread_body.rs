//! `Connection: close` on an answer given before the request's body was read to its end.
//!
//! Many answers come before a body is needed: 401, 403, 404, 409 `NotReady`, a shed 503. hyper then
//! cannot reuse the connection (the rest of the body is still on the wire), and if the body had not
//! arrived when the answer's head was written, the head promised keep-alive: hyper closes the
//! connection afterwards, and a client that sends its next request on it sees "server disconnected
//! without a response" (the SDK's tests did, once in three runs). Saying `Connection: close` in such an
//! answer tells the client not to reuse the connection.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use http_body::{Frame, SizeHint};

/// Whether a request with `headers` carries a body (a non-zero length, or chunked).
fn has_body(headers: &HeaderMap) -> bool {
    match headers.get(header::CONTENT_LENGTH) {
        Some(length) => !matches!(length.to_str().map(str::trim), Ok("0")),
        None => headers.contains_key(header::TRANSFER_ENCODING),
    }
}

/// A request body that notes when it has been read to its end.
struct Tracked {
    inner: Body,
    finished: Arc<AtomicBool>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        // A reader that knows the length stops at `is_end_stream` without polling for the end:
        // hyper's client forwarding a body with a Content-Length does (the gateway's proxy).
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.finished.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let end = self.inner.is_end_stream();
        if end {
            self.finished.store(true, Ordering::Release);
        }
        end
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Runs `handler` on `request` and adds `Connection: close` to its answer if the request's body was
/// not read to its end.
pub async fn close_if_unread<F, Fut>(request: Request, handler: F) -> Response
where
    F: FnOnce(Request) -> Fut,
    Fut: Future<Output = Response>,
{
    if !has_body(request.headers()) {
        return handler(request).await;
    }
    let finished = Arc::new(AtomicBool::new(false));
    let (parts, body) = request.into_parts();
    let tracked = Tracked {
        inner: body,
        finished: finished.clone(),
    };
    let mut response = handler(Request::from_parts(parts, Body::new(tracked))).await;
    if !finished.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::routing::post;
    use tower::ServiceExt;

    use super::*;

    fn app() -> Router {
        Router::new()
            .route("/ignores", post(|| async { "not needed" }))
            .route("/reads", post(|body: Bytes| async move { body }))
            .route("/forwards", post(forward_like_hyper))
            .layer(axum::middleware::from_fn(
                |request: Request, next: axum::middleware::Next| {
                    close_if_unread(request, |request| next.run(request))
                },
            ))
    }

    /// Reads frames until the body says it is at its end, never polling past it: what hyper's client
    /// does when it sends a body of known length on to the agent.
    async fn forward_like_hyper(mut body: Body) -> Vec<u8> {
        use http_body_util::BodyExt;
        let mut sent = Vec::new();
        while !body.is_end_stream() {
            match body.frame().await {
                Some(Ok(frame)) => sent.extend_from_slice(&frame.into_data().unwrap_or_default()),
                _ => break,
            }
        }
        sent
    }

    async fn connection_header(path: &str, body: &'static str) -> Option<String> {
        let request = Request::post(path)
            .header(header::CONTENT_LENGTH, body.len())
            .body(Body::from(body))
            .expect("request");
        let response = app().oneshot(request).await.expect("answer");
        response
            .headers()
            .get(header::CONNECTION)
            .map(|v| v.to_str().unwrap_or_default().to_string())
    }

    #[tokio::test]
    async fn an_answer_before_the_body_is_read_closes_the_connection() {
        assert_eq!(
            connection_header("/ignores", "payload").await.as_deref(),
            Some("close")
        );
        assert_eq!(connection_header("/reads", "payload").await, None);
        assert_eq!(
            connection_header("/forwards", "payload").await,
            None,
            "a body read up to its known length is read: the connection stays open for the next call"
        );
        assert_eq!(
            connection_header("/ignores", "").await,
            None,
            "no body, nothing left on the wire"
        );
    }

    #[test]
    fn bodies_are_recognised_by_length_or_chunking() {
        let mut headers = HeaderMap::new();
        assert!(!has_body(&headers));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        assert!(!has_body(&headers));
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
        assert!(has_body(&headers));
        let mut chunked = HeaderMap::new();
        chunked.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        assert!(has_body(&chunked));
    }
}
