//! What every controller shares: the client, the watch caches, metrics, the event recorder,
//! per-object backoff, leadership, the operator's key, and the short memory of its own writes (so a
//! lagging watch cache does not make it write the same object twice; see `own_writes`). Each
//! controller's own context holds an `Arc` of it beside what only that controller uses.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;

use crate::plumbing::backoff::ReconcileBackoff;
use crate::plumbing::caches::{CacheFill, Caches};
use crate::plumbing::error::Error;
use crate::plumbing::leader::Leadership;
use crate::plumbing::metrics::Metrics;
use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::own_writes::OwnWrites;

/// Field manager of every server-side apply the controllers send.
pub const FIELD_MANAGER: &str = "orchard-operator";

/// The controllers' shared handles.
pub struct KubeCtx {
    /// Kubernetes client (its writes pass only while this replica leads: `leader::WriteGate`).
    pub client: Client,
    /// Watch caches.
    pub caches: Caches,
    /// Which caches have their first full list: no reconcile decides before all have (a decision
    /// on a half-listed cache, e.g. a queue that sees no running trajectory yet, would be wrong).
    pub filled: CacheFill,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Event recorder (one for the whole process).
    pub recorder: Recorder,
    /// Per-object backoff of failed reconciles (by UID).
    pub backoff: Arc<ReconcileBackoff>,
    /// Our own writes the caches may not show yet (by UID).
    pub own_writes: Arc<OwnWrites>,
    /// Whether this replica may write (leader election).
    pub leadership: Leadership,
    /// The key agent tokens and seals are derived from.
    pub key: Arc<OperatorKey>,
    /// Periodic re-reconcile of healthy objects.
    pub resync: Duration,
}

impl KubeCtx {
    /// Bookkeeping after `controller` reconciled the object with `uid`: forgets its failures and
    /// counts the success.
    pub fn reconciled(&self, controller: &str, uid: &str) {
        self.backoff.reset(uid);
        self.metrics
            .reconciles
            .with_label_values(&[controller, "ok"])
            .inc();
    }

    /// Bookkeeping after a failed reconcile of the object with `uid`: counts it by error kind and
    /// returns the object's next retry delay (per-object exponential backoff).
    pub fn reconcile_failed(&self, controller: &str, uid: &str, error: &Error) -> Duration {
        self.metrics
            .reconciles
            .with_label_values(&[controller, "error"])
            .inc();
        self.metrics
            .reconcile_errors
            .with_label_values(&[controller, error.metric_label()])
            .inc();
        self.backoff.next_delay(uid)
    }

    /// The controller action for a reconcile of `uid` that wants to run again after `next` (`None`:
    /// on the next change only): never later than the expiry of anything the operator remembers about
    /// the object, so no wait on a memory ends without a reconcile.
    pub fn next_action(&self, uid: &str, next: Option<Duration>) -> Action {
        let memory = self.own_writes.next_expiry(uid);
        match (next, memory) {
            (Some(a), Some(b)) => Action::requeue(a.min(b)),
            (Some(a), None) | (None, Some(a)) => Action::requeue(a),
            (None, None) => Action::await_change(),
        }
    }
}

/// `namespace/name` of an object, for logs and per-object bookkeeping.
pub fn object_key<K: kube::ResourceExt>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}
