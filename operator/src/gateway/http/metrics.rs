//! The gateway's Prometheus metrics, registered on the operator's registry. Route labels are route
//! templates (`/v1/namespaces/{namespace}/sandboxes/{name}/exec`), so cardinality stays bounded.

use std::time::Instant;

use axum::http::StatusCode;
use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::plumbing::metrics::HTTP_BUCKETS;

/// Metrics of the gateway.
#[derive(Clone)]
pub struct GatewayMetrics {
    /// `orchard_gateway_requests_total{route, code}`.
    pub requests: IntCounterVec,
    /// `orchard_gateway_request_duration_seconds{route}` (until the response head is sent).
    pub duration: HistogramVec,
    /// `orchard_gateway_heartbeat_writes_total`: heartbeat annotation patches sent.
    pub heartbeat_writes: IntCounter,
    /// `orchard_gateway_heartbeats_coalesced_total`: heartbeats absorbed without an API write.
    pub heartbeats_coalesced: IntCounter,
    /// `orchard_gateway_auth_cache_total{cache, result}`: `cache` is `token` (TokenReview) or
    /// `access` (SubjectAccessReview); `result` is `hit` or `miss`.
    pub auth_cache: IntCounterVec,
    /// `orchard_gateway_agent_errors_total{kind}`: proxied calls that got no answer from the agent
    /// (`unreachable`, `connect_timeout`, `timeout`, `broken`).
    pub agent_errors: IntCounterVec,
    /// `orchard_gateway_token_reviews_total{result}`: TokenReviews sent (`accepted`, `refused`,
    /// `failed`).
    pub token_reviews: IntCounterVec,
    /// `orchard_gateway_throttled_total{reason}`: requests refused by a limit (`in_flight`, `waits`,
    /// `tunnels`:
    /// 503; `caller_share`, `token_review_budget`, `access_review_budget`, `body_budget`: 429;
    /// `body_timeout`: 408; `body_too_large`: 413).
    pub throttled: IntCounterVec,
    /// `orchard_gateway_requests_in_flight{pool}`: requests holding a slot (`calls`, `waits`).
    pub in_flight: IntGaugeVec,
    /// `orchard_gateway_open_connections`: connections being served.
    pub open_connections: IntGauge,
    /// `orchard_gateway_revoked_total`: streams and waits ended because the caller lost access.
    pub revoked: IntCounter,
    /// `orchard_gateway_open_tunnels`: port-forward tunnels open.
    pub open_tunnels: IntGauge,
}

impl GatewayMetrics {
    /// Creates the metrics and registers them on `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new(
                "orchard_gateway_requests_total",
                "Gateway requests by route template and HTTP status code.",
            ),
            &["route", "code"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "orchard_gateway_request_duration_seconds",
                "Gateway request latency by route template, until the response head is sent (streamed bodies continue after).",
            )
            .buckets(HTTP_BUCKETS.to_vec()),
            &["route"],
        )?;
        let heartbeat_writes = IntCounter::new(
            "orchard_gateway_heartbeat_writes_total",
            "Heartbeat annotation patches the gateway sent to the Kubernetes API (coalesced: at most one per sandbox per third of its heartbeat timeout).",
        )?;
        let heartbeats_coalesced = IntCounter::new(
            "orchard_gateway_heartbeats_coalesced_total",
            "Heartbeats (explicit or from gateway activity) absorbed without an API write.",
        )?;
        let auth_cache = IntCounterVec::new(
            Opts::new(
                "orchard_gateway_auth_cache_total",
                "Authentication (token) and authorisation (access) decisions served from the gateway's cache (hit) or asked of the API server (miss).",
            ),
            &["cache", "result"],
        )?;
        let agent_errors = IntCounterVec::new(
            Opts::new(
                "orchard_gateway_agent_errors_total",
                "Proxied calls that got no answer from the sandbox's agent, by kind.",
            ),
            &["kind"],
        )?;
        let token_reviews = IntCounterVec::new(
            Opts::new(
                "orchard_gateway_token_reviews_total",
                "TokenReviews the gateway sent to the Kubernetes API, by result (accepted, refused, failed).",
            ),
            &["result"],
        )?;
        let throttled = IntCounterVec::new(
            Opts::new(
                "orchard_gateway_throttled_total",
                "Requests refused by a gateway limit: in_flight, waits and tunnels (503 Overloaded); caller_share, token_review_budget, access_review_budget and body_budget (429); body_timeout (408); body_too_large (413).",
            ),
            &["reason"],
        )?;
        let in_flight = IntGaugeVec::new(
            Opts::new(
                "orchard_gateway_requests_in_flight",
                "Gateway requests holding a slot of their pool (calls: --gateway-max-in-flight-requests; waits: --gateway-max-waits), until their answer's head is sent.",
            ),
            &["pool"],
        )?;
        let open_connections = IntGauge::new(
            "orchard_gateway_open_connections",
            "Gateway connections being served (at most --gateway-max-connections).",
        )?;
        let revoked = IntCounter::new(
            "orchard_gateway_revoked_total",
            "Streams and waits the gateway ended because their caller's token or RBAC access was revoked.",
        )?;
        let open_tunnels = IntGauge::new(
            "orchard_gateway_open_tunnels",
            "Port-forward tunnels open through the gateway (at most --gateway-max-tunnels).",
        )?;
        registry.register(Box::new(open_tunnels.clone()))?;
        registry.register(Box::new(token_reviews.clone()))?;
        registry.register(Box::new(throttled.clone()))?;
        registry.register(Box::new(open_connections.clone()))?;
        registry.register(Box::new(in_flight.clone()))?;
        registry.register(Box::new(revoked.clone()))?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(heartbeat_writes.clone()))?;
        registry.register(Box::new(heartbeats_coalesced.clone()))?;
        registry.register(Box::new(auth_cache.clone()))?;
        registry.register(Box::new(agent_errors.clone()))?;
        Ok(Self {
            requests,
            duration,
            heartbeat_writes,
            heartbeats_coalesced,
            auth_cache,
            agent_errors,
            token_reviews,
            throttled,
            in_flight,
            open_connections,
            revoked,
            open_tunnels,
        })
    }
}

impl GatewayMetrics {
    /// Counts one request to the route template `route`, answered with `status`, and its latency
    /// since `started`.
    pub fn observe(&self, route: &str, started: Instant, status: StatusCode) {
        self.duration
            .with_label_values(&[route])
            .observe(started.elapsed().as_secs_f64());
        self.requests
            .with_label_values(&[route, status.as_str()])
            .inc();
    }
}
