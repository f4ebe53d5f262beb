//! What every reconcile does around its own work, once: waiting for the watch caches' first lists, a
//! slot (FIFO, bounded), the duration metric,
//! leadership as a cancellation signal, the object's freshest version, success bookkeeping and the
//! next requeue, and per-object backoff on failure.

use std::future::Future;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::warn;

use crate::plumbing::error::{Error, Result};
use crate::plumbing::kube_ctx::{KubeCtx, object_key};
use crate::plumbing::metrics::ReconcileTimer;
use crate::plumbing::reconcile_slots::ReconcileSlots;
use crate::plumbing::writes;

/// How soon a reconcile that came before the caches were filled is tried again.
const CACHE_FILL_RETRY: Duration = Duration::from_millis(200);

/// One controller's reconcile of one object.
pub struct Reconcile<'a, K: kube::Resource<DynamicType = ()> + 'static> {
    /// The shared handles.
    pub kube: &'a KubeCtx,
    /// The controller's name in metrics and logs.
    pub controller: &'static str,
    /// The controller's cache of its objects.
    pub store: &'a Store<K>,
    /// Its slots, if it bounds its reconciles.
    pub slots: Option<&'a ReconcileSlots>,
}

impl<K> Reconcile<'_, K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    /// Runs `work` for `object` and returns the controller's action: `work` says when to reconcile
    /// again (`None`: on the next change only; the operator's memory of its writes may bring that
    /// earlier). A replica that steps down drops `work` (its request in flight aborted) and counts
    /// it as one that had nothing to do.
    pub async fn run(
        &self,
        object: &K,
        work: impl Future<Output = Result<Option<Duration>>>,
    ) -> Result<Action> {
        let _slot = match self.slots {
            Some(slots) => Some(slots.acquire().await),
            None => None,
        };
        if !self.kube.filled.all_filled() {
            // Started moments ago: decide nothing on caches that have not listed everything yet.
            return Ok(Action::requeue(CACHE_FILL_RETRY));
        }
        let _timer = ReconcileTimer::start(&self.kube.metrics, self.controller);
        let next = self
            .kube
            .leadership
            .while_leader(work)
            .await
            .unwrap_or(Ok(None))?;
        // The incarnation that holds the name now (the queued object may be an older one).
        let uid = self
            .store
            .get(&ObjectRef::from_obj(object))
            .and_then(|o| o.uid())
            .unwrap_or_default();
        self.kube.reconciled(self.controller, &uid);
        Ok(self.kube.next_action(&uid, next))
    }

    /// The version of `queued` to reconcile (see [`writes::freshest`]), or `None` when there is
    /// nothing to do: it is being deleted, this replica is a standby (it keeps its caches warm and
    /// writes nothing; gaining the Lease reconciles all), or it was deleted since it was queued.
    pub fn fresh<S: std::any::Any + Clone>(
        &self,
        queued: &K,
        set_status: impl FnOnce(&mut K, S),
    ) -> Option<K> {
        if queued.meta().deletion_timestamp.is_some() || !self.kube.leadership.is_leader() {
            return None;
        }
        writes::freshest(self.kube, self.store, queued, set_status)
    }

    /// The action after a failed reconcile: counted by error kind, retried with the object's
    /// exponential backoff.
    pub fn retry(&self, object: &K, error: &Error) -> Action {
        let delay =
            self.kube
                .reconcile_failed(self.controller, &object.uid().unwrap_or_default(), error);
        warn!(
            controller = self.controller,
            object = %object_key(object),
            %error,
            retry_in_ms = delay.as_millis() as u64,
            "reconcile failed"
        );
        Action::requeue(delay)
    }
}
