//! The verdict as the process keeps it: behind a lock in the Sandbox controller's context, told by
//! every reconcile and by a fold over the watch cache at start and every resync, exported as the
//! `orchard_network_policy_enforcement{state}` gauge, and logged once each time its kind changes.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use prometheus::IntGaugeVec;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Evidence, Verdict, after_all, evidence_of};
use crate::plumbing::caches::{CacheFill, Caches};
use crate::plumbing::kube_ctx::object_key;
use crate::plumbing::operator_key::OperatorKey;
use crate::pod::lookup::cached_pod;

/// How often the fold waits for the watch caches' first lists.
const FILL_POLL: Duration = Duration::from_millis(200);

/// The cluster-wide verdict and its gauge.
pub struct SharedVerdict {
    verdict: Mutex<Verdict>,
    gauge: IntGaugeVec,
}

impl SharedVerdict {
    /// `Unknown`, with the gauge saying so.
    pub fn new(gauge: IntGaugeVec) -> Self {
        let shared = Self {
            verdict: Mutex::new(Verdict::Unknown),
            gauge,
        };
        shared.export(&Verdict::Unknown);
        shared
    }

    /// The verdict now.
    pub fn current(&self) -> Verdict {
        self.verdict
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes `evidence` into account (see [`after_all`]); exports and logs a change of kind.
    pub fn observe(&self, evidence: Vec<Evidence>) {
        if evidence.is_empty() {
            return;
        }
        let (before, after) = {
            let mut verdict = self.verdict.lock().unwrap_or_else(PoisonError::into_inner);
            let before = verdict.clone();
            *verdict = after_all(&before, evidence);
            (before, verdict.clone())
        };
        if before.state() == after.state() {
            return;
        }
        self.export(&after);
        match &after {
            Verdict::Missing { since, sandbox } => warn!(
                %since,
                sandbox = %sandbox,
                "NetworkPolicies seem not to be enforced in this cluster: new sandboxes waiting for theirs say PolicyEnforcementMissing at once (install an enforcer, or set Helm value sandboxEgress.awaitEnforcement=false)"
            ),
            Verdict::Enforced { since } => {
                info!(%since, "NetworkPolicies are enforced in this cluster (a sandbox's agent saw its policies enforced)")
            }
            Verdict::Unknown => {}
        }
    }

    /// Sets the gauge: 1 for the verdict's state, 0 for the others.
    fn export(&self, verdict: &Verdict) {
        for state in Verdict::STATES {
            let value = i64::from(state == verdict.state());
            self.gauge.with_label_values(&[state]).set(value);
        }
    }
}

/// What the sandboxes in the watch cache tell, each with its Pod from the cache.
pub fn cached_evidence(caches: &Caches, key: &OperatorKey) -> Vec<Evidence> {
    caches
        .sandboxes
        .state()
        .iter()
        .filter_map(|sandbox| {
            let status = sandbox.status.as_ref()?;
            let pod = cached_pod(&caches.pods, sandbox, key);
            evidence_of(&object_key(sandbox.as_ref()), status, pod.as_deref())
        })
        .collect()
}

/// Folds the watch cache into `verdict` once the Sandbox and Pod caches have their first lists (the
/// sandboxes that were there before the operator started), then again every `period` (so a replica
/// that does not lead, and reconciles nothing, keeps its gauge current), until `shutdown`.
pub async fn keep_folding(
    verdict: std::sync::Arc<SharedVerdict>,
    caches: Caches,
    filled: CacheFill,
    key: std::sync::Arc<OperatorKey>,
    period: Duration,
    shutdown: CancellationToken,
) {
    use std::sync::atomic::Ordering;
    while !(filled.sandboxes.load(Ordering::Relaxed) && filled.pods.load(Ordering::Relaxed)) {
        tokio::select! {
            () = tokio::time::sleep(FILL_POLL) => {}
            () = shutdown.cancelled() => return,
        }
    }
    loop {
        verdict.observe(cached_evidence(&caches, &key));
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = shutdown.cancelled() => return,
        }
    }
}
