//! The limits on requests handled at once. A request takes a slot when it arrives and gives it back
//! when its answer's head is sent, so a wait counts for its whole wait, an exec stream or a download
//! only until its answer starts (its body then streams as one open connection, bounded by the
//! connection limit).
//!
//! Two pools: waits (`.../wait`, which may last minutes) and every other request, so callers waiting
//! for sandboxes never take the slots of calls. A request that finds no free slot in its pool is
//! refused at once (load shedding, not queueing) with 503 `Overloaded`, `retryable: true` and
//! `Retry-After`. Within each pool one caller may hold at most `per_caller` slots: once
//! authentication knows who is calling, it charges the request to that caller ([`charge_caller`]),
//! and a caller already holding its share gets 429 `TooManyRequests`, so one tenant with a stuck
//! sandbox and a thousand waits cannot lock the others out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prometheus::{IntCounter, IntGauge};
use tokio::sync::Semaphore;

use super::errors::ApiError;
use super::metrics::GatewayMetrics;

/// Which pool a request draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolKind {
    /// `.../wait` routes.
    Waits,
    /// Everything else.
    Calls,
}

impl PoolKind {
    /// The pool of a request to the route template `route` (pure).
    pub fn of_route(route: &str) -> Self {
        if route.ends_with("/wait") {
            Self::Waits
        } else {
            Self::Calls
        }
    }

    /// The `reason` of a request this pool sheds.
    fn label(self) -> &'static str {
        match self {
            Self::Waits => "waits",
            Self::Calls => "in_flight",
        }
    }

    /// The `pool` label of the in-flight gauge.
    fn pool_label(self) -> &'static str {
        match self {
            Self::Waits => "waits",
            Self::Calls => "calls",
        }
    }
}

/// Slots per caller: how many each caller holds, and whether one more is allowed (pure but for the
/// lock around it).
#[derive(Debug, Default)]
pub struct CallerShares {
    held: HashMap<String, usize>,
}

impl CallerShares {
    /// Counts one more slot for `caller`, unless it holds `per_caller` already.
    pub fn try_take(&mut self, caller: &str, per_caller: usize) -> bool {
        // A caller with slots is found without allocating its name.
        let Some(held) = self.held.get_mut(caller) else {
            if per_caller == 0 {
                return false;
            }
            self.held.insert(caller.to_string(), 1);
            return true;
        };
        if *held >= per_caller {
            return false;
        }
        *held += 1;
        true
    }

    /// Gives one of `caller`'s slots back.
    pub fn give_back(&mut self, caller: &str) {
        if let Some(held) = self.held.get_mut(caller) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                self.held.remove(caller);
            }
        }
    }

    /// Slots `caller` holds.
    pub fn held(&self, caller: &str) -> usize {
        self.held.get(caller).copied().unwrap_or(0)
    }
}

/// One pool of slots.
struct Pool {
    kind: PoolKind,
    slots: Arc<Semaphore>,
    limit: usize,
    per_caller: usize,
    callers: Mutex<CallerShares>,
    /// `orchard_gateway_throttled_total{reason="in_flight"|"waits"}`.
    shed: IntCounter,
    /// `orchard_gateway_throttled_total{reason="caller_share"}`.
    over_share: IntCounter,
    /// `orchard_gateway_requests_in_flight{pool}`.
    held: IntGauge,
}

/// The request pools of one gateway (cloned for every request: shared parts only).
#[derive(Clone)]
pub struct InFlight {
    calls: Arc<Pool>,
    waits: Arc<Pool>,
}

/// Sizes of the pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Requests other than waits handled at once.
    pub calls: usize,
    /// Waits handled at once.
    pub waits: usize,
    /// Slots one caller may hold in each pool.
    pub per_caller: usize,
}

impl InFlight {
    /// Pools of the given sizes (each at least one slot).
    pub fn new(limits: PoolLimits, metrics: &GatewayMetrics) -> Self {
        let pool = |kind: PoolKind, limit: usize| {
            let limit = limit.max(1);
            Arc::new(Pool {
                kind,
                slots: Arc::new(Semaphore::new(limit)),
                limit,
                per_caller: limits.per_caller.max(1),
                callers: Mutex::default(),
                shed: metrics.throttled.with_label_values(&[kind.label()]),
                over_share: metrics.throttled.with_label_values(&["caller_share"]),
                held: metrics.in_flight.with_label_values(&[kind.pool_label()]),
            })
        };
        Self {
            calls: pool(PoolKind::Calls, limits.calls),
            waits: pool(PoolKind::Waits, limits.waits),
        }
    }

    fn pool(&self, kind: PoolKind) -> &Arc<Pool> {
        match kind {
            PoolKind::Calls => &self.calls,
            PoolKind::Waits => &self.waits,
        }
    }
}

/// The slot of the request being handled, and the caller it was charged to (the pool's semaphore
/// permit itself is held by [`limit`] beside it).
struct RequestSlot {
    pool: Arc<Pool>,
    caller: Mutex<Option<String>>,
}

impl Drop for RequestSlot {
    // Also when the request is dropped unanswered (its client went away).
    fn drop(&mut self) {
        self.pool.held.dec();
        let caller = self.caller.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(caller) = caller.take() {
            let mut callers = self.pool.callers.lock().unwrap_or_else(|p| p.into_inner());
            callers.give_back(&caller);
        }
    }
}

tokio::task_local! {
    /// The slot of the request the current task handles.
    static REQUEST: Arc<RequestSlot>;
}

impl InFlight {
    /// Runs `handler` on `request` (to the route template `route`) in a free slot of its pool, or
    /// answers 503 `Overloaded`.
    pub async fn run<F, Fut>(&self, route: &str, request: Request, handler: F) -> Response
    where
        F: FnOnce(Request) -> Fut,
        Fut: Future<Output = Response>,
    {
        let pool = self.pool(PoolKind::of_route(route));
        let Ok(_slot) = pool.slots.try_acquire() else {
            pool.shed.inc();
            return overloaded(pool).into_response();
        };
        pool.held.inc();
        let held = Arc::new(RequestSlot {
            pool: pool.clone(),
            caller: Mutex::new(None),
        });
        REQUEST.scope(held, handler(request)).await
    }
}

fn overloaded(pool: &Pool) -> ApiError {
    match pool.kind {
        PoolKind::Calls => ApiError::overloaded(pool.limit),
        PoolKind::Waits => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "Overloaded",
            format!(
                "the gateway is handling its maximum of {} waits at once (--gateway-max-waits, Helm gateway.maxWaits); retry after the Retry-After delay",
                pool.limit
            ),
        )
        .retryable(true)
        .retry_after(1),
    }
}

/// Charges the request being handled to `caller` (an authenticated user name): 429
/// `TooManyRequests` if that caller already holds its share of the request's pool. Outside a request
/// (a revalidation task), or for a request already charged, it does nothing.
pub fn charge_caller(caller: &str) -> Result<(), ApiError> {
    let Ok(slot) = REQUEST.try_with(Arc::clone) else {
        return Ok(());
    };
    let mut charged = slot.caller.lock().unwrap_or_else(|p| p.into_inner());
    if charged.is_some() {
        return Ok(());
    }
    let pool = &slot.pool;
    let taken = pool
        .callers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .try_take(caller, pool.per_caller);
    if !taken {
        pool.over_share.inc();
        let what = match pool.kind {
            PoolKind::Calls => "requests",
            PoolKind::Waits => "waits",
        };
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            format!(
                "{caller} already has {} {what} in progress on this gateway replica, the most one caller may have (--gateway-max-in-flight-per-caller, Helm gateway.maxInFlightPerCaller); retry after the Retry-After delay",
                pool.per_caller
            ),
        )
        .retryable(true)
        .retry_after(1));
    }
    *charged = Some(caller.to_string());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use axum::Router;
    use axum::body::Body;
    use axum::extract::{MatchedPath, State};
    use axum::middleware::{Next, from_fn_with_state};
    use axum::routing::get;
    use tokio::sync::watch;
    use tower::ServiceExt;

    #[test]
    fn waits_have_a_pool_of_their_own() {
        assert_eq!(
            PoolKind::of_route("/v1/namespaces/{namespace}/sandboxes/{name}/wait"),
            PoolKind::Waits
        );
        assert_eq!(
            PoolKind::of_route("/v1/namespaces/{namespace}/rolloutgroups/{name}/wait"),
            PoolKind::Waits
        );
        assert_eq!(
            PoolKind::of_route("/v1/namespaces/{namespace}/sandboxes/{name}/exec"),
            PoolKind::Calls
        );
        assert_eq!(PoolKind::of_route("unmatched"), PoolKind::Calls);
    }

    #[test]
    fn a_caller_holds_at_most_its_share() {
        let mut shares = CallerShares::default();
        assert!(shares.try_take("alice", 2));
        assert!(shares.try_take("alice", 2));
        assert!(!shares.try_take("alice", 2), "alice holds her share");
        assert!(shares.try_take("bob", 2), "bob is not held back by alice");
        shares.give_back("alice");
        assert_eq!(shares.held("alice"), 1);
        assert!(shares.try_take("alice", 2));
        shares.give_back("bob");
        assert_eq!(shares.held("bob"), 0);
        shares.give_back("nobody");
        assert!(shares.held.len() == 1, "callers with no slot are forgotten");
    }

    /// A router with `/hold` (waits until released, charged to the caller named by `x-caller`),
    /// `/quick` (charged likewise) and `/x/wait` (a wait, held like `/hold`).
    fn app(
        limits: PoolLimits,
        metrics: &GatewayMetrics,
        released: watch::Receiver<bool>,
    ) -> Router {
        let held = move |headers: axum::http::HeaderMap| {
            let mut released = released.clone();
            async move {
                let caller = headers["x-caller"].to_str().unwrap_or_default().to_string();
                if let Err(refused) = charge_caller(&caller) {
                    return refused.into_response();
                }
                let _ = released.wait_for(|r| *r).await;
                "held".into_response()
            }
        };
        let quick = |headers: axum::http::HeaderMap| async move {
            let caller = headers["x-caller"].to_str().unwrap_or_default().to_string();
            match charge_caller(&caller) {
                Ok(()) => "quick".into_response(),
                Err(refused) => refused.into_response(),
            }
        };
        Router::new()
            .route("/hold", get(held.clone()))
            .route("/x/wait", get(held))
            .route("/quick", get(quick))
            .layer(from_fn_with_state(
                InFlight::new(limits, metrics),
                |State(in_flight): State<InFlight>, request: Request, next: Next| async move {
                    let matched = request.extensions().get::<MatchedPath>().cloned();
                    let route = matched.as_ref().map_or("unmatched", MatchedPath::as_str);
                    in_flight
                        .run(route, request, |request| next.run(request))
                        .await
                },
            ))
    }

    async fn call(router: &Router, path: &str, caller: &str) -> Response {
        router
            .clone()
            .oneshot(
                Request::get(path)
                    .header("x-caller", caller)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap()
    }

    /// Lets spawned requests reach their handlers (single-threaded test runtime).
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn requests_beyond_the_limit_are_shed_with_a_retryable_503() {
        let registry = prometheus::Registry::new();
        let metrics = GatewayMetrics::register(&registry).unwrap();
        let (release, released) = watch::channel(false);
        let limits = PoolLimits {
            calls: 2,
            waits: 2,
            per_caller: 2,
        };
        let router = app(limits, &metrics, released);
        let first = tokio::spawn({
            let router = router.clone();
            async move { call(&router, "/hold", "a").await }
        });
        let second = tokio::spawn({
            let router = router.clone();
            async move { call(&router, "/hold", "b").await }
        });
        settle().await;
        let shed = call(&router, "/quick", "c").await;
        assert_eq!(shed.status(), 503);
        assert_eq!(shed.headers()["retry-after"], "1");
        let body = axum::body::to_bytes(shed.into_body(), 4096).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["code"], "Overloaded");
        assert_eq!(body["retryable"], true);
        assert_eq!(metrics.throttled.with_label_values(&["in_flight"]).get(), 1);
        assert_eq!(metrics.in_flight.with_label_values(&["calls"]).get(), 2);
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap().status(), 200);
        assert_eq!(second.await.unwrap().status(), 200);
        assert_eq!(metrics.in_flight.with_label_values(&["calls"]).get(), 0);
        assert_eq!(
            call(&router, "/quick", "c").await.status(),
            200,
            "slots given back"
        );
    }

    #[tokio::test]
    async fn one_callers_waits_leave_room_for_other_callers_and_their_calls() {
        let registry = prometheus::Registry::new();
        let metrics = GatewayMetrics::register(&registry).unwrap();
        let (release, released) = watch::channel(false);
        let limits = PoolLimits {
            calls: 4,
            waits: 4,
            per_caller: 3,
        };
        let router = app(limits, &metrics, released);
        // Alice tries to hold every wait slot.
        let mut alice = Vec::new();
        for _ in 0..4 {
            let router = router.clone();
            alice.push(tokio::spawn(async move {
                call(&router, "/x/wait", "alice").await
            }));
        }
        settle().await;
        // Her waits take no slot of calls, and her fourth wait is over her share.
        assert_eq!(call(&router, "/quick", "bob").await.status(), 200);
        let bob_waits = tokio::spawn({
            let router = router.clone();
            async move { call(&router, "/x/wait", "bob").await }
        });
        settle().await;
        assert!(!bob_waits.is_finished(), "bob's wait is being served");
        release.send(true).unwrap();
        let mut statuses = Vec::new();
        for wait in alice {
            statuses.push(wait.await.unwrap().status().as_u16());
        }
        statuses.sort_unstable();
        assert_eq!(statuses, vec![200, 200, 200, 429]);
        assert_eq!(bob_waits.await.unwrap().status(), 200);
        assert_eq!(
            metrics.throttled.with_label_values(&["caller_share"]).get(),
            1
        );
        // Every share was given back.
        for _ in 0..3 {
            assert_eq!(call(&router, "/quick", "alice").await.status(), 200);
        }
    }

    #[tokio::test]
    async fn outside_a_request_nothing_is_charged() {
        assert!(charge_caller("anyone").is_ok());
    }
}
