//! A response body that keeps something alive until the body is dropped: once it was sent, or when
//! the client went away. Used for what an answer holds while it is on its way out (the output it
//! charges to the agent-wide budget, the admission permit, the connection's in-progress mark).
//!
//! It passes the inner body through unchanged, its size included: a body of known length keeps its
//! `Content-Length`. (`http_body_util`'s `map_frame`, used for this before, reports every body's
//! size as unknown, so every answer went out chunked, and the gateway took each one for a download
//! of unknown length that has to be watched while it streams.)

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use hyper::body::{Body as HttpBody, Frame, SizeHint};

/// `body`, keeping `held` until it is dropped.
pub fn holding<T: Send + 'static>(body: Body, held: T) -> Body {
    Body::new(Holding { inner: body, held })
}

struct Holding<T> {
    inner: Body,
    #[allow(dead_code)] // held for its drop only
    held: T,
}

// The held value is never pinned (nothing is projected to it), so the body may move whatever it holds.
impl<T> Unpin for Holding<T> {}

impl<T: Send + 'static> HttpBody for Holding<T> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
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
    use http_body_util::BodyExt;
    use std::sync::Arc;

    #[tokio::test]
    async fn the_size_and_contents_pass_through_and_the_value_lives_until_the_body_goes() {
        let held = Arc::new(());
        let body = holding(Body::from("{\"exitCode\":0}"), Arc::clone(&held));
        assert_eq!(body.size_hint().exact(), Some(14));
        assert_eq!(Arc::strong_count(&held), 2);
        let bytes = body.collect().await.expect("body").to_bytes();
        assert_eq!(&bytes[..], b"{\"exitCode\":0}");
        assert_eq!(Arc::strong_count(&held), 1, "released with the body");
    }

    #[tokio::test]
    async fn a_body_dropped_unsent_releases_the_value() {
        let held = Arc::new(());
        drop(holding(Body::from("x"), Arc::clone(&held)));
        assert_eq!(Arc::strong_count(&held), 1);
    }
}
