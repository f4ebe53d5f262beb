//! The limit on requests handled at once: a request takes a slot when it arrives and gives it back
//! when its answer's head is sent, so a wait counts for its whole wait, an exec stream or a download
//! only until its answer starts (its body then streams as one open connection, bounded by the
//! connection limit). A request that finds no free slot is refused at once (load shedding, not
//! queueing) with 503 `Overloaded`, `retryable: true` and `Retry-After`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus::IntCounter;
use tokio::sync::Semaphore;

use super::errors::ApiError;
use super::metrics::GatewayMetrics;

/// Slots of requests in flight (cloned for every request: shared parts only).
#[derive(Clone)]
pub struct InFlight {
    slots: Arc<Semaphore>,
    limit: usize,
    /// `orchard_gateway_throttled_total{reason="in_flight"}`.
    shed: IntCounter,
}

impl InFlight {
    /// At most `limit` requests at once (at least one).
    pub fn new(limit: usize, metrics: &GatewayMetrics) -> Self {
        let limit = limit.max(1);
        Self {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            shed: metrics.throttled.with_label_values(&["in_flight"]),
        }
    }
}

/// Middleware: runs the request in a free slot, or answers 503 `Overloaded`.
pub async fn limit(State(in_flight): State<InFlight>, request: Request, next: Next) -> Response {
    let Ok(_slot) = in_flight.slots.try_acquire() else {
        in_flight.shed.inc();
        return ApiError::overloaded(in_flight.limit).into_response();
    };
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use axum::Router;
    use axum::body::Body;
    use axum::middleware::from_fn_with_state;
    use axum::routing::get;
    use tower::ServiceExt;

    #[tokio::test]
    async fn requests_beyond_the_limit_are_shed_with_a_retryable_503() {
        let registry = prometheus::Registry::new();
        let metrics = GatewayMetrics::register(&registry).unwrap();
        let (release, released) = tokio::sync::watch::channel(false);
        let router = Router::new()
            .route(
                "/hold",
                get(move || {
                    let mut released = released.clone();
                    async move {
                        let _ = released.wait_for(|r| *r).await;
                        "held"
                    }
                }),
            )
            .route("/quick", get(|| async { "quick" }))
            .layer(from_fn_with_state(InFlight::new(2, &metrics), limit));
        let get = |path: &str| {
            router
                .clone()
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
        };
        let first = tokio::spawn(get("/hold"));
        let second = tokio::spawn(get("/hold"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let shed = get("/quick").await.unwrap();
        assert_eq!(shed.status(), 503);
        assert_eq!(shed.headers()["retry-after"], "1");
        let body = axum::body::to_bytes(shed.into_body(), 4096).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["code"], "Overloaded");
        assert_eq!(body["retryable"], true);
        assert_eq!(metrics.throttled.with_label_values(&["in_flight"]).get(), 1);
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap().unwrap().status(), 200);
        assert_eq!(second.await.unwrap().unwrap().status(), 200);
        assert_eq!(
            get("/quick").await.unwrap().status(),
            200,
            "slots given back"
        );
    }
}
