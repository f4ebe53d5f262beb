//! Request bodies the gateway reads itself (the JSON of create and result requests). A body is read
//! only after its caller is authenticated and authorised, so a client without a valid token, or
//! without the permission, never has a byte of its body read: it gets its 401 or 403 and the
//! connection is closed (`unread_body`). An authorised body is read whole within a deadline, up to a
//! size limit, and within its caller's budget of bytes being read at once, so neither slow nor many
//! bodies can hold the gateway's memory. Bodies of calls proxied to agents (file uploads, exec
//! requests) are streamed through, never read here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use prometheus::IntCounterVec;

use super::errors::ApiError;

/// How bodies are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Largest body, in bytes.
    pub max_bytes: usize,
    /// Longest time to receive a whole body.
    pub read_timeout: Duration,
    /// Bytes of bodies one caller may have being read at once (by announced length).
    pub per_caller_bytes: usize,
}

/// The length a request announces for its body (pure): its `Content-Length`, or `max_bytes` when it
/// announces none (a chunked body may be that long); 413 when the announced length is larger than
/// `max_bytes`, 400 when `Content-Length` is not a number.
pub fn announced_length(headers: &HeaderMap, max_bytes: usize) -> Result<usize, ApiError> {
    let Some(value) = headers.get(header::CONTENT_LENGTH) else {
        return Ok(max_bytes);
    };
    let length: u64 = value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| ApiError::bad_request("Content-Length is not a number"))?;
    match usize::try_from(length) {
        Ok(length) if length <= max_bytes => Ok(length),
        _ => Err(too_large(max_bytes)),
    }
}

fn too_large(max_bytes: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "PayloadTooLarge",
        format!(
            "the request body is larger than {max_bytes} bytes, the most this gateway reads (--gateway-max-body-bytes, Helm gateway.maxBodyBytes)"
        ),
    )
}

/// Bytes being read per caller (pure but for the lock around it).
#[derive(Debug, Default)]
struct Reading {
    bytes: HashMap<String, usize>,
}

impl Reading {
    fn try_reserve(&mut self, caller: &str, bytes: usize, budget: usize) -> bool {
        let reading = self.bytes.entry(caller.to_string()).or_insert(0);
        // A single body is always allowed when nothing else of the caller is being read, so a budget
        // below the size limit never refuses every body.
        if *reading > 0 && reading.saturating_add(bytes) > budget {
            return false;
        }
        *reading = reading.saturating_add(bytes);
        true
    }

    fn release(&mut self, caller: &str, bytes: usize) {
        if let Some(reading) = self.bytes.get_mut(caller) {
            *reading = reading.saturating_sub(bytes);
            if *reading == 0 {
                self.bytes.remove(caller);
            }
        }
    }
}

/// Reads authorised bodies within [`BodyLimits`].
pub struct BodyReader {
    limits: BodyLimits,
    reading: Arc<Mutex<Reading>>,
    /// `orchard_gateway_throttled_total{reason}` (`body_budget`, `body_timeout`, `body_too_large`).
    throttled: IntCounterVec,
}

/// Bytes reserved for one body, given back when it is dropped.
struct Reservation {
    reading: Arc<Mutex<Reading>>,
    caller: String,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.reading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .release(&self.caller, self.bytes);
    }
}

impl BodyReader {
    /// A reader with `limits`, counting refusals in `throttled`.
    pub fn new(limits: BodyLimits, throttled: IntCounterVec) -> Self {
        Self {
            limits,
            reading: Arc::default(),
            throttled,
        }
    }

    fn refused(&self, reason: &str, error: ApiError) -> ApiError {
        self.throttled.with_label_values(&[reason]).inc();
        error
    }

    /// Reads the body of an authorised `caller`'s request with `headers`: 413 if it is too large,
    /// 429 if the caller's budget is spent, 408 if it does not arrive in time.
    pub async fn read(
        &self,
        caller: &str,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<Bytes, ApiError> {
        let limits = self.limits;
        let announced = announced_length(headers, limits.max_bytes)
            .map_err(|error| self.refused("body_too_large", error))?;
        let reserved = self
            .reading
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .try_reserve(caller, announced, limits.per_caller_bytes);
        if !reserved {
            return Err(self.refused(
                "body_budget",
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TooManyRequests",
                    format!(
                        "{caller} is already sending request bodies of {} bytes or more to this gateway replica at once (--gateway-body-bytes-per-caller, Helm gateway.bodyBytesPerCaller); retry after the Retry-After delay",
                        limits.per_caller_bytes
                    ),
                )
                .retryable(true)
                .retry_after(1),
            ));
        }
        let _reservation = Reservation {
            reading: self.reading.clone(),
            caller: caller.to_string(),
            bytes: announced,
        };
        match tokio::time::timeout(
            limits.read_timeout,
            axum::body::to_bytes(body, limits.max_bytes),
        )
        .await
        {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(error)) if is_length_limit(&error) => {
                Err(self.refused("body_too_large", too_large(limits.max_bytes)))
            }
            Ok(Err(error)) => Err(ApiError::bad_request(format!(
                "cannot read the request body: {error}"
            ))),
            Err(_) => Err(self.refused(
                "body_timeout",
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "RequestTimeout",
                    format!(
                        "the request body did not arrive within {} s (--gateway-body-read-timeout-seconds, Helm gateway.bodyReadTimeoutSeconds)",
                        limits.read_timeout.as_secs_f64()
                    ),
                ),
            )),
        }
    }
}

/// Whether a body error is `to_bytes`' size limit.
fn is_length_limit(error: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = source {
        if current
            .downcast_ref::<http_body_util::LengthLimitError>()
            .is_some()
        {
            return true;
        }
        source = current.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    use futures::stream;

    fn headers(length: Option<&str>) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(length) = length {
            headers.insert(header::CONTENT_LENGTH, length.parse().unwrap());
        }
        headers
    }

    fn reader(max_bytes: usize, per_caller_bytes: usize, timeout: Duration) -> BodyReader {
        let registry = prometheus::Registry::new();
        let metrics = crate::gateway::http::metrics::GatewayMetrics::register(&registry).unwrap();
        BodyReader::new(
            BodyLimits {
                max_bytes,
                read_timeout: timeout,
                per_caller_bytes,
            },
            metrics.throttled,
        )
    }

    /// A body that sends `first` and then nothing, ever.
    fn stalled(first: &'static [u8]) -> Body {
        let chunks = stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(first))])
            .chain(stream::pending());
        Body::from_stream(chunks)
    }

    use futures::StreamExt;

    #[test]
    fn the_announced_length_is_checked_before_reading() {
        assert_eq!(announced_length(&headers(Some("10")), 100).unwrap(), 10);
        assert_eq!(announced_length(&headers(None), 100).unwrap(), 100);
        let too_large = announced_length(&headers(Some("2000000")), 1000).unwrap_err();
        assert_eq!(too_large.status, 413);
        assert!(too_large.body.message.contains("--gateway-max-body-bytes"));
        assert_eq!(
            announced_length(&headers(Some("x")), 100)
                .unwrap_err()
                .status,
            400
        );
    }

    #[test]
    fn a_callers_budget_bounds_its_bodies_but_not_others() {
        let mut reading = Reading::default();
        assert!(reading.try_reserve("alice", 600, 1000));
        assert!(!reading.try_reserve("alice", 600, 1000));
        assert!(reading.try_reserve("bob", 600, 1000));
        reading.release("alice", 600);
        assert!(reading.try_reserve("alice", 600, 1000));
        // One body larger than the budget is still read when nothing else is.
        assert!(reading.try_reserve("carol", 5000, 1000));
        reading.release("carol", 5000);
        assert!(!reading.bytes.contains_key("carol"));
    }

    #[tokio::test]
    async fn a_whole_body_is_read() {
        let reader = reader(100, 1000, Duration::from_secs(5));
        let bytes = reader
            .read("a", &headers(Some("2")), Body::from("{}"))
            .await
            .unwrap();
        assert_eq!(&bytes[..], b"{}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_stalls_is_answered_408_at_its_deadline_and_its_bytes_given_back() {
        let reader = reader(100, 100, Duration::from_secs(30));
        let error = reader
            .read("a", &headers(Some("100")), stalled(b"{\"ima"))
            .await
            .unwrap_err();
        assert_eq!(error.status, 408);
        assert!(
            error
                .body
                .message
                .contains("--gateway-body-read-timeout-seconds")
        );
        assert!(reader.reading.lock().unwrap().bytes.is_empty());
        assert_eq!(
            reader.throttled.with_label_values(&["body_timeout"]).get(),
            1
        );
    }

    #[tokio::test]
    async fn a_chunked_body_longer_than_the_limit_is_refused() {
        let reader = reader(4, 1000, Duration::from_secs(5));
        let error = reader
            .read("a", &headers(None), Body::from("0123456789"))
            .await
            .unwrap_err();
        assert_eq!(error.status, 413);
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_over_its_budget_gets_429_while_its_first_body_is_still_arriving() {
        let reader = Arc::new(reader(100, 150, Duration::from_secs(30)));
        let first = tokio::spawn({
            let reader = reader.clone();
            async move {
                reader
                    .read("alice", &headers(Some("100")), stalled(b"{"))
                    .await
            }
        });
        tokio::task::yield_now().await;
        let second = reader
            .read("alice", &headers(Some("100")), Body::from("{}"))
            .await
            .unwrap_err();
        assert_eq!(second.status, 429);
        assert!(second.body.retryable);
        let other = reader
            .read("bob", &headers(Some("2")), Body::from("{}"))
            .await;
        assert!(other.is_ok(), "another caller is not held back");
        assert_eq!(first.await.unwrap().unwrap_err().status, 408);
    }
}
