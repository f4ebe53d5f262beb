//! The admin HTTP server (default :8081): `/metrics` (Prometheus text), `/healthz` (the process is
//! alive) and `/readyz` (the watch caches are filled, so the controllers and gateway see the cluster).

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::plumbing::caches::{CacheFill, Caches};
use crate::plumbing::metrics::Metrics;
use orchard_api::SandboxPhase;

/// State of the admin server.
#[derive(Clone)]
pub struct AdminState {
    /// Metrics to render.
    pub metrics: Metrics,
    /// Caches whose contents feed the by-phase gauge.
    pub caches: Caches,
    /// Which watch caches have been filled.
    pub filled: CacheFill,
}

/// Phase label of a sandbox without a status yet.
const NO_PHASE: &str = "Unknown";

/// Sets `gauge{phase}` to how many of `phases` (each object's phase, `None` without a status) fall in
/// each of `known` (and `Unknown`), so a phase nobody is in reads 0 rather than disappearing.
fn set_phase_counts(
    gauge: &prometheus::IntGaugeVec,
    known: &[&'static str],
    phases: impl Iterator<Item = Option<&'static str>>,
) {
    let mut counts: std::collections::BTreeMap<&'static str, i64> =
        known.iter().chain([&NO_PHASE]).map(|p| (*p, 0)).collect();
    for phase in phases {
        *counts.entry(phase.unwrap_or(NO_PHASE)).or_insert(0) += 1;
    }
    for (phase, count) in counts {
        gauge.with_label_values(&[phase]).set(count);
    }
}

/// Counts sandboxes and RolloutGroups by phase into `orchard_sandboxes` and `orchard_rolloutgroups`.
fn refresh_phase_gauges(state: &AdminState) {
    set_phase_counts(
        &state.metrics.sandboxes,
        &[
            "Pending",
            "Starting",
            "Ready",
            "Succeeded",
            "Failed",
            "Expired",
            "Terminating",
        ],
        state.caches.sandboxes.state().iter().map(|s| {
            s.status
                .as_ref()
                .and_then(|s| s.phase)
                .map(SandboxPhase::as_str)
        }),
    );
    set_phase_counts(
        &state.metrics.rollout_groups,
        &["Pending", "Queued", "Generating", "Complete", "Failed"],
        state.caches.rollout_groups.state().iter().map(|g| {
            g.status
                .as_ref()
                .and_then(|s| s.phase)
                .map(orchard_api::RolloutPhase::as_str)
        }),
    );
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    refresh_phase_gauges(&state);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if state.filled.all_filled() {
        (StatusCode::OK, "ok\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "watch caches not filled yet\n",
        )
    }
}

/// The admin router.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves the admin router on `addr` until `shutdown` is cancelled.
pub async fn serve(
    addr: SocketAddr,
    state: AdminState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "admin server (metrics, health) listening");
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}
