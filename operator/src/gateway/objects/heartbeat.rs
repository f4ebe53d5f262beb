//! Heartbeats through the gateway: the `/heartbeat` route and every exec, file, process and patch call
//! refresh a sandbox's expiry by patching its `orchard.dev/heartbeat` annotation (the controller turns
//! it into `status.lastHeartbeatTime` and a new `expiresAt`). Writes are coalesced: at most one API
//! write per sandbox per third of its heartbeat timeout, none when the timeout is 0 (off).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::gateway::deps::GATEWAY_FIELD_MANAGER;
use crate::gateway::http::errors::{ApiError, from_kube};
use crate::gateway::http::metrics::GatewayMetrics;
use crate::plumbing::metrics::Metrics;
use orchard_api::Lifecycle;
use orchard_api::{HEARTBEAT_ANNOTATION, Sandbox};

/// Entries kept before expired ones are pruned.
const PRUNE_ABOVE: usize = 4096;

/// The smallest gap between two heartbeat writes of one sandbox: a third of its timeout; `None` when
/// heartbeats are off (timeout 0).
pub fn write_interval(heartbeat_timeout_seconds: i64) -> Option<Duration> {
    (heartbeat_timeout_seconds > 0)
        .then(|| Duration::from_secs_f64(heartbeat_timeout_seconds as f64 / 3.0))
}

/// Whether a heartbeat should be written now (pure): heartbeats are on, and neither this gateway's
/// last write (`since_last_write`) nor the annotation already on the object (`annotation_age`, which
/// another replica may have written) is younger than the write interval.
pub fn write_due(
    heartbeat_timeout_seconds: i64,
    since_last_write: Option<Duration>,
    annotation_age: Option<Duration>,
) -> bool {
    let Some(interval) = write_interval(heartbeat_timeout_seconds) else {
        return false;
    };
    let fresh = |age: Option<Duration>| age.is_some_and(|age| age < interval);
    !fresh(since_last_write) && !fresh(annotation_age)
}

/// Age of the heartbeat annotation on `sandbox` at `now`, if it holds a time in the past.
fn annotation_age(sandbox: &Sandbox, now: Timestamp) -> Option<Duration> {
    let value = sandbox.annotations().get(HEARTBEAT_ANNOTATION)?;
    let at: Timestamp = value.trim().parse().ok()?;
    Duration::try_from(now.duration_since(at)).ok()
}

/// What a heartbeat did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// Effective heartbeat timeout of the sandbox (0 = off).
    pub timeout_seconds: i64,
    /// Whether an annotation write was sent (or started, for activity heartbeats).
    pub written: bool,
}

/// Coalesces heartbeats and writes the annotation.
#[derive(Clone)]
pub struct Heartbeats {
    client: Client,
    default_timeout_seconds: i64,
    default_ttl_seconds: i64,
    /// When this replica last wrote each sandbox's heartbeat, by UID, and the write interval then.
    last_writes: Arc<Mutex<HashMap<String, (Instant, Duration)>>>,
    metrics: GatewayMetrics,
    operator_metrics: Metrics,
}

impl Heartbeats {
    /// Heartbeats writing through `client`; `default_timeout_seconds` applies when a spec sets none.
    pub fn new(
        client: Client,
        default_timeout_seconds: i64,
        default_ttl_seconds: i64,
        metrics: GatewayMetrics,
        operator_metrics: Metrics,
    ) -> Self {
        Self {
            client,
            default_timeout_seconds,
            default_ttl_seconds,
            last_writes: Arc::new(Mutex::new(HashMap::new())),
            metrics,
            operator_metrics,
        }
    }

    /// Effective heartbeat timeout of `sandbox`.
    pub fn timeout_seconds(&self, sandbox: &Sandbox) -> i64 {
        Lifecycle::of(
            &sandbox.spec,
            self.default_ttl_seconds,
            self.default_timeout_seconds,
        )
        .heartbeat_timeout_seconds
    }

    /// Reserves the write slot of `sandbox` if a write is due (so concurrent calls do not both write);
    /// the slot's key (the sandbox's UID) when it does.
    fn reserve(&self, sandbox: &Sandbox, timeout_seconds: i64) -> Option<String> {
        let interval = write_interval(timeout_seconds)?;
        let uid = sandbox.metadata.uid.as_deref().unwrap_or_default();
        let mut last = self.last_writes.lock().unwrap_or_else(|p| p.into_inner());
        let since = last.get(uid).map(|(at, _)| at.elapsed());
        // This replica's own last write usually says "not yet": the annotation is read only when not.
        if !write_due(timeout_seconds, since, None)
            || !write_due(
                timeout_seconds,
                since,
                annotation_age(sandbox, Timestamp::now()),
            )
        {
            return None;
        }
        if last.len() > PRUNE_ABOVE {
            // An entry older than its interval no longer blocks a write: forgetting it changes nothing.
            last.retain(|_, (at, interval)| at.elapsed() < *interval);
        }
        last.insert(uid.to_string(), (Instant::now(), interval));
        Some(uid.to_string())
    }

    fn release(&self, key: &str) {
        self.last_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Records activity on `sandbox` (an exec, file, process or patch call): writes in the background
    /// when due, never delaying the call.
    pub fn activity(&self, sandbox: &Sandbox) {
        let timeout = self.timeout_seconds(sandbox);
        if timeout <= 0 {
            return;
        }
        match self.reserve(sandbox, timeout) {
            Some(key) => {
                let this = self.clone();
                let namespace = sandbox.namespace().unwrap_or_default();
                let name = sandbox.name_any();
                let uid = sandbox.uid().unwrap_or_default();
                tokio::spawn(async move {
                    if let Err(err) = this.write(&namespace, &name, &uid).await {
                        this.release(&key);
                        tracing::warn!(sandbox = %format!("{namespace}/{name}"), error = %err, "heartbeat write failed");
                    }
                });
            }
            None => self.metrics.heartbeats_coalesced.inc(),
        }
    }

    /// An explicit heartbeat (`POST .../heartbeat`): writes now when due and reports what it did.
    pub async fn beat(&self, sandbox: &Sandbox) -> Result<Beat, ApiError> {
        let timeout = self.timeout_seconds(sandbox);
        let Some(key) = self.reserve(sandbox, timeout) else {
            if timeout > 0 {
                self.metrics.heartbeats_coalesced.inc();
            }
            return Ok(Beat {
                timeout_seconds: timeout,
                written: false,
            });
        };
        let namespace = sandbox.namespace().unwrap_or_default();
        let uid = sandbox.uid().unwrap_or_default();
        if let Err(err) = self.write(&namespace, &sandbox.name_any(), &uid).await {
            self.release(&key);
            return Err(err);
        }
        Ok(Beat {
            timeout_seconds: timeout,
            written: true,
        })
    }

    /// Writes the annotation on the sandbox with `uid` only: a UID in a merge patch of the object
    /// itself is checked by the API server (422 if the name now holds another object).
    async fn write(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ApiError> {
        let api: Api<Sandbox> = Api::namespaced(self.client.clone(), namespace);
        let patch = json!({"metadata": {"uid": uid, "annotations": {HEARTBEAT_ANNOTATION: Timestamp::now().to_string()}}});
        let params = PatchParams {
            field_manager: Some(GATEWAY_FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        api.patch(name, &params, &Patch::Merge(&patch))
            .await
            .map_err(|err| from_kube(&err, &format!("heartbeat of sandbox {namespace}/{name}")))?;
        self.metrics.heartbeat_writes.inc();
        self.operator_metrics.api_write("sandboxes", "patch");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::SandboxSpec;
    use std::collections::BTreeMap;

    #[test]
    fn interval_is_a_third_of_the_timeout_and_zero_is_off() {
        assert_eq!(write_interval(0), None);
        assert_eq!(write_interval(-1), None);
        assert_eq!(write_interval(30), Some(Duration::from_secs(10)));
        assert_eq!(write_interval(3), Some(Duration::from_secs(1)));
    }

    #[test]
    fn writes_are_due_only_after_a_third_of_the_timeout() {
        let s = Duration::from_secs;
        assert!(write_due(30, None, None), "first heartbeat writes");
        assert!(!write_due(0, None, None), "off");
        assert!(!write_due(30, Some(s(9)), None), "coalesced");
        assert!(write_due(30, Some(s(10)), None), "a third has passed");
        assert!(
            !write_due(30, None, Some(s(2))),
            "another replica wrote recently"
        );
        assert!(write_due(30, Some(s(11)), Some(s(11))));
        assert!(!write_due(30, Some(s(11)), Some(s(5))));
    }

    #[test]
    fn n_calls_within_an_interval_give_one_write() {
        // Simulated clock: 1000 calls spread over 25 s with a 30 s timeout -> writes at 0, 10 and 20 s.
        let mut last_write: Option<f64> = None;
        let mut writes = 0;
        for call in 0..1000 {
            let now = call as f64 * 0.025;
            let since = last_write.map(|at| Duration::from_secs_f64(now - at));
            if write_due(30, since, None) {
                writes += 1;
                last_write = Some(now);
            }
        }
        assert_eq!(writes, 3);
    }

    #[test]
    fn annotation_age_reads_the_annotation() {
        let mut sandbox = Sandbox::new("s", SandboxSpec::default());
        let now: Timestamp = "2026-01-01T00:00:10Z".parse().unwrap();
        assert_eq!(annotation_age(&sandbox, now), None);
        sandbox.metadata.annotations = Some(BTreeMap::from([(
            HEARTBEAT_ANNOTATION.to_string(),
            "2026-01-01T00:00:04Z".to_string(),
        )]));
        assert_eq!(annotation_age(&sandbox, now), Some(Duration::from_secs(6)));
        let future: Timestamp = "2026-01-01T00:00:01Z".parse().unwrap();
        assert_eq!(annotation_age(&sandbox, future), None);
    }
}
