//! Long calls keep checking their caller: while a wait waits, an agent call waits for its answer, or
//! an exec stream streams, the caller's token and RBAC access are checked again (TokenReview +
//! SubjectAccessReview through the same caches) every half cache TTL, so a revoked token or a deleted
//! RoleBinding ends the call within about 1.5 TTL. A wait or an unanswered call then answers 401/403
//! `AccessRevoked`; an NDJSON stream ends with a final `{"type": "error", "code": "AccessRevoked", ...}`
//! event; any other streamed body is cut off. Failures to reach the API server do not end calls.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use futures::StreamExt;
use serde_json::json;

use super::access::Access;
use crate::gateway::http::errors::ApiError;
use crate::gateway::state::State;

/// Shortest interval between re-checks.
const MIN_PERIOD: Duration = Duration::from_millis(100);

/// Interval between re-checks for a cache `ttl` (half of it: an entry cached just before a
/// revocation expires within one TTL, and the next re-check comes within half a TTL after).
pub fn check_period(ttl: Duration) -> Duration {
    (ttl / 2).max(MIN_PERIOD)
}

/// The error that ends a call when a re-check failed with `error`, or `None` when the failure does
/// not say access was revoked (the API server did not answer, the gateway is throttling) (pure).
pub fn revocation(error: &ApiError) -> Option<ApiError> {
    matches!(error.status.as_u16(), 401 | 403).then(|| {
        ApiError::new(
            error.status,
            "AccessRevoked",
            format!(
                "access was revoked while the call was in progress: {}",
                error.body.message
            ),
        )
    })
}

/// The last line of an NDJSON stream ended by `error` (pure).
pub fn error_event(error: &ApiError) -> Bytes {
    let mut line = json!({
        "type": "error",
        "status": error.status.as_u16(),
        "code": error.body.code,
        "message": error.body.message,
        "retryable": error.body.retryable,
    })
    .to_string();
    line.push('\n');
    Bytes::from(line)
}

/// What a long call re-checks, borrowed from the request for as long as the call runs (a streamed
/// body, which outlives the request handler, takes copies).
pub struct Guard<'a> {
    state: &'a State,
    headers: &'a HeaderMap,
    access: &'a Access,
}

impl<'a> Guard<'a> {
    /// Re-checks `access` for the caller of `headers`.
    pub fn new(state: &'a State, headers: &'a HeaderMap, access: &'a Access) -> Self {
        Self {
            state,
            headers,
            access,
        }
    }

    /// Runs `call` while access lasts.
    pub async fn run<T>(
        &self,
        call: impl Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        tokio::select! {
            result = call => result,
            error = revoked(self.state, self.headers, self.access) => Err(error),
        }
    }

    /// `body`, streamed while access lasts; then ended with an error event (`ndjson`) or cut off.
    pub fn stream(&self, body: Body, ndjson: bool) -> Body {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, axum::Error>>(1);
        let (state, headers, access) = (
            self.state.clone(),
            self.headers.clone(),
            self.access.clone(),
        );
        tokio::spawn(async move {
            let mut data = body.into_data_stream();
            let revoked = revoked(&state, &headers, &access);
            tokio::pin!(revoked);
            loop {
                tokio::select! {
                    chunk = data.next() => match chunk {
                        Some(chunk) => {
                            if tx.send(chunk).await.is_err() {
                                return;
                            }
                        }
                        None => return,
                    },
                    error = &mut revoked => {
                        let last = if ndjson {
                            Ok(error_event(&error))
                        } else {
                            Err(axum::Error::new(std::io::Error::other(error.body.message)))
                        };
                        let _ = tx.send(last).await;
                        return;
                    }
                    () = tx.closed() => return,
                }
            }
        });
        Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }))
    }
}

/// Resolves with the error to end the call with once access is revoked (never otherwise).
async fn revoked(state: &State, headers: &HeaderMap, access: &Access) -> ApiError {
    let period = check_period(state.auth.ttl());
    loop {
        tokio::time::sleep(period).await;
        let Err(error) = state.auth.authorize(headers, access).await else {
            continue;
        };
        match revocation(&error) {
            Some(ended) => {
                state.metrics.revoked.inc();
                tracing::info!(%access, "access revoked: ending the call");
                return ended;
            }
            None => tracing::debug!(%error, "re-check of a long call failed; it continues"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_revoke() {
        let denied = revocation(&ApiError::forbidden(
            "user alice cannot create sandboxes/exec",
        ))
        .expect("403 revokes");
        assert_eq!(denied.status, 403);
        assert_eq!(denied.body.code, "AccessRevoked");
        assert!(denied.body.message.contains("alice cannot create"));
        assert!(!denied.body.retryable);
        assert_eq!(
            revocation(&ApiError::unauthorized("expired")).map(|e| e.status.as_u16()),
            Some(401)
        );
        assert!(revocation(&ApiError::unavailable("TokenReview failed")).is_none());
        let throttled = ApiError::new(
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "slow down",
        );
        assert!(revocation(&throttled).is_none());
    }

    #[test]
    fn the_error_event_is_one_json_line() {
        let error = revocation(&ApiError::forbidden("no")).unwrap();
        let line = error_event(&error);
        let text = std::str::from_utf8(&line).unwrap();
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1);
        let event: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(event["type"], "error");
        assert_eq!(event["code"], "AccessRevoked");
        assert_eq!(event["retryable"], false);
    }

    #[test]
    fn checks_come_twice_per_ttl() {
        assert_eq!(
            check_period(Duration::from_secs(10)),
            Duration::from_secs(5)
        );
        assert_eq!(check_period(Duration::ZERO), MIN_PERIOD);
    }
}
