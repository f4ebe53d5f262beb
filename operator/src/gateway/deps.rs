//! What the gateway needs from the rest of the operator, and nothing more: a client, a read-only
//! view of the watch caches ([`ReadModel`]), the metrics registry, the sandbox defaults it answers
//! with, its limits and the operator's key.

use crate::plumbing::cached_pod::CachedPod;
use std::sync::Arc;

use kube::Client;
use kube::runtime::reflector::Store;

use crate::gateway::config::GatewayLimits;
use crate::plumbing::change_feed::ChangeFeed;
use crate::plumbing::metrics::Metrics;
use crate::plumbing::operator_key::OperatorKey;
use orchard_api::{RolloutGroup, Sandbox, SandboxSnapshot};

/// Field manager of the gateway's writes (heartbeat annotations, results, creates), distinct from the
/// controllers' so server-side apply never takes their fields away.
pub const GATEWAY_FIELD_MANAGER: &str = "orchard-gateway";

/// What the gateway reads of the cluster: the watch caches the controllers fill (read only; the
/// gateway never writes a cache) and the feed of their changes. It reads nothing else of the
/// controllers.
#[derive(Clone)]
pub struct ReadModel {
    /// Every Sandbox in scope.
    pub sandboxes: Store<Sandbox>,
    /// Sandbox pods.
    pub pods: Store<CachedPod>,
    /// Every RolloutGroup in scope.
    pub rollout_groups: Store<RolloutGroup>,
    /// Every SandboxSnapshot in scope.
    pub snapshots: Store<SandboxSnapshot>,
    /// Notes of changed Sandboxes and RolloutGroups, published after the caches applied them.
    pub changes: ChangeFeed,
}

/// The sandbox settings the gateway answers with (from the operator's command line).
#[derive(Debug, Clone, PartialEq)]
pub struct GatewaySettings {
    /// Port of the agents.
    pub agent_port: u16,
    /// TTL of sandboxes whose spec sets none.
    pub default_ttl_seconds: i64,
    /// Longest TTL a spec or a `/timeout` call may ask for.
    pub max_ttl_seconds: i64,
    /// Heartbeat timeout of sandboxes whose spec sets none.
    pub default_heartbeat_timeout_seconds: i64,
}

/// What the gateway needs from the rest of the operator.
#[derive(Clone)]
pub struct GatewayDeps {
    /// Kubernetes client (the operator's own identity).
    pub client: Client,
    /// What it reads.
    pub reads: ReadModel,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Sandbox defaults.
    pub settings: GatewaySettings,
    /// Connection, request and authentication limits.
    pub limits: GatewayLimits,
    /// The key the agents' tokens are derived from.
    pub key: Arc<OperatorKey>,
}
