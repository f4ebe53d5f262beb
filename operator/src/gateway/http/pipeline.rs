//! What every gateway request goes through around its handler, outermost first: its latency and
//! answer counted by route template ([`GatewayMetrics::observe`]), `Connection: close` on an answer
//! given before its body was read ([`unread_body`](super::unread_body)), and a slot of its pool
//! ([`in_flight`](super::in_flight)). The router's routes get it as one layer ([`layer`]); agent calls,
//! dispatched before the router, call [`Pipeline::run`] themselves.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use super::in_flight::InFlight;
use super::metrics::GatewayMetrics;
use super::unread_body::close_if_unread;

/// The request pipeline of one gateway.
pub struct Pipeline {
    metrics: GatewayMetrics,
    in_flight: InFlight,
}

impl Pipeline {
    /// A pipeline counting on `metrics` and holding slots of `in_flight`.
    pub fn new(metrics: GatewayMetrics, in_flight: InFlight) -> Self {
        Self { metrics, in_flight }
    }

    /// Runs `handler` on `request`, a request to the route template `route`.
    pub async fn run<F, Fut>(&self, route: &str, request: Request, handler: F) -> Response
    where
        F: FnOnce(Request) -> Fut,
        Fut: Future<Output = Response>,
    {
        let started = Instant::now();
        let response = close_if_unread(request, |request| {
            self.in_flight.run(route, request, handler)
        })
        .await;
        self.metrics.observe(route, started, response.status());
        response
    }
}

/// The pipeline as the router's layer: the route template is the one the router matched
/// (`unmatched` for none).
pub async fn layer(
    State(pipeline): State<Arc<Pipeline>>,
    request: Request,
    next: Next,
) -> Response {
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
    pipeline
        .run(route, request, |request| next.run(request))
        .await
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;
    use crate::gateway::http::in_flight::PoolLimits;

    #[tokio::test]
    async fn requests_are_counted_by_the_route_the_router_matched() {
        let registry = prometheus::Registry::new();
        let metrics = GatewayMetrics::register(&registry).expect("metrics");
        let limits = PoolLimits {
            calls: 4,
            waits: 4,
            per_caller: 4,
        };
        let pipeline = Arc::new(Pipeline::new(
            metrics.clone(),
            InFlight::new(limits, &metrics),
        ));
        let router = Router::new()
            .route("/things/{name}", get(|| async { "ok" }))
            .layer(axum::middleware::from_fn_with_state(pipeline, layer));
        for path in ["/things/a", "/things/b", "/nothing"] {
            let request = Request::get(path).body(Body::empty()).expect("request");
            router.clone().oneshot(request).await.expect("answer");
        }
        let count =
            |route: &str, code: &str| metrics.requests.with_label_values(&[route, code]).get();
        assert_eq!(count("/things/{name}", "200"), 2);
        assert_eq!(count("unmatched", "404"), 1);
        assert_eq!(
            metrics
                .duration
                .with_label_values(&["/things/{name}"])
                .get_sample_count(),
            2
        );
    }
}
