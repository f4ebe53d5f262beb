//! What every reconcile shares: the client, settings, metrics, the event recorder, per-object
//! backoff, the watch caches of children, and a short memory of our own recent writes (so a lagging
//! watch cache does not make us write the same object twice).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;

use crate::agent_client::AgentClient;
use crate::api::{RolloutGroup, RolloutGroupStatus, Sandbox, SandboxStatus};
use crate::backoff::ReconcileBackoff;
use crate::config::{OperatorArgs, parse_label_pairs};
use crate::error::{Error, Result};
use crate::leader::Leadership;
use crate::metrics::Metrics;
use crate::sandbox::build::{PodShape, PolicyShape};
use crate::status_memory::StatusMemory;

/// Field manager of every server-side apply the operator sends.
pub const FIELD_MANAGER: &str = "orchard-operator";

/// Settings derived once from the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Shape of sandbox pods.
    pub pod: PodShape,
    /// Inputs of the NetworkPolicies.
    pub policy: PolicyShape,
    /// TTL of sandboxes whose spec sets none.
    pub default_ttl_seconds: i64,
    /// Heartbeat timeout of sandboxes whose spec sets none.
    pub default_heartbeat_timeout_seconds: i64,
    /// Seconds a sandbox may take to become Ready.
    pub startup_timeout_seconds: i64,
    /// Periodic re-reconcile of healthy objects.
    pub resync: Duration,
    /// Window after creation in which transient phases are not written.
    pub status_coalesce: Duration,
}

impl Settings {
    /// Validates and converts the command line.
    pub fn from_args(args: &OperatorArgs) -> Result<Self> {
        let defaults = &args.sandbox;
        let labels = |selector: &str, flag: &str| -> Result<BTreeMap<String, String>> {
            let pairs =
                parse_label_pairs(selector).map_err(|e| Error::Config(format!("{flag}: {e}")))?;
            if pairs.is_empty() {
                return Err(Error::Config(format!("{flag} must not be empty")));
            }
            Ok(pairs.into_iter().collect())
        };
        if defaults.default_ttl_seconds <= 0 {
            return Err(Error::Config(
                "--default-ttl-seconds must be positive".into(),
            ));
        }
        if defaults.default_heartbeat_timeout_seconds < 0 {
            return Err(Error::Config(
                "--default-heartbeat-timeout-seconds must be 0 (off) or positive".into(),
            ));
        }
        if defaults.startup_timeout_seconds <= 0 {
            return Err(Error::Config(
                "--startup-timeout-seconds must be positive".into(),
            ));
        }
        Ok(Self {
            pod: PodShape {
                agent_image: defaults.agent_image.clone(),
                agent_port: defaults.agent_port,
                default_cpu: defaults.default_cpu.clone(),
                default_memory: defaults.default_memory.clone(),
                default_ephemeral_storage: Some(defaults.default_ephemeral_storage.clone())
                    .filter(|s| !s.is_empty()),
                termination_grace_seconds: defaults.termination_grace_seconds,
            },
            policy: PolicyShape {
                agent_port: defaults.agent_port,
                operator_namespace: defaults.operator_namespace.clone(),
                operator_pod_labels: labels(
                    &defaults.operator_pod_selector,
                    "--operator-pod-selector",
                )?,
                dns_namespace: defaults.dns_namespace.clone(),
                dns_pod_labels: labels(&defaults.dns_pod_selector, "--dns-pod-selector")?,
            },
            default_ttl_seconds: defaults.default_ttl_seconds,
            default_heartbeat_timeout_seconds: defaults.default_heartbeat_timeout_seconds,
            startup_timeout_seconds: defaults.startup_timeout_seconds,
            resync: Duration::from_secs(args.controller.resync_seconds.max(1)),
            status_coalesce: Duration::from_millis(args.controller.status_coalesce_ms),
        })
    }
}

/// Keys of objects we wrote moments ago, so a reconcile running before the watch cache caught up
/// does not send the same write again. Entries expire after [`RecentWrites::TTL`].
#[derive(Debug, Default)]
pub struct RecentWrites {
    entries: Mutex<HashMap<String, Instant>>,
}

impl RecentWrites {
    /// How long a write is remembered.
    pub const TTL: Duration = Duration::from_secs(30);

    /// Remembers a write of `key`.
    pub fn record(&self, key: String) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        entries.retain(|_, at| now.duration_since(*at) < Self::TTL);
        entries.insert(key, now);
    }

    /// Whether `key` was written within the TTL.
    pub fn contains(&self, key: &str) -> bool {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.get(key).is_some_and(|at| at.elapsed() < Self::TTL)
    }

    /// Forgets `key`.
    pub fn forget(&self, key: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries.remove(key);
    }
}

/// Pods we created moments ago, until the watch cache shows them: a reconcile running in that window
/// uses the Pod the create returned instead of reading it from the API server.
#[derive(Debug, Default)]
pub struct CreatedPods {
    entries: Mutex<HashMap<String, (Instant, k8s_openapi::api::core::v1::Pod)>>,
}

impl CreatedPods {
    /// Remembers a created Pod under `key` (`namespace/name`).
    pub fn record(&self, key: String, pod: k8s_openapi::api::core::v1::Pod) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        entries.retain(|_, (at, _)| now.duration_since(*at) < RecentWrites::TTL);
        entries.insert(key, (now, pod));
    }

    /// The Pod created under `key` within the TTL.
    pub fn get(&self, key: &str) -> Option<k8s_openapi::api::core::v1::Pod> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|(at, _)| at.elapsed() < RecentWrites::TTL)
            .map(|(_, pod)| pod.clone())
    }
}

/// Watch caches (reflector stores) the controllers and the gateway read instead of the API server.
#[derive(Clone)]
pub struct Caches {
    /// Every Sandbox in scope.
    pub sandboxes: Store<Sandbox>,
    /// Sandbox pods (label `orchard.dev/sandbox-pod=true`).
    pub pods: Store<Pod>,
    /// Agent-token Secrets (label `app.kubernetes.io/managed-by=orchard-operator`).
    pub secrets: Store<Secret>,
    /// NetworkPolicies the operator manages.
    pub policies: Store<NetworkPolicy>,
    /// Every RolloutGroup in scope.
    pub rollout_groups: Store<RolloutGroup>,
}

/// Shared state of the Sandbox controller.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Settings from the command line.
    pub settings: Settings,
    /// Metrics registry.
    pub metrics: Metrics,
    /// Event recorder (one for the whole process).
    pub recorder: Recorder,
    /// Per-object backoff of failed reconciles.
    pub backoff: ReconcileBackoff,
    /// Watch caches.
    pub caches: Caches,
    /// Writes the caches may not show yet.
    pub recent: RecentWrites,
    /// Pods created that the cache may not show yet.
    pub created_pods: CreatedPods,
    /// Sandbox statuses we wrote that the cache may not show yet.
    pub written_status: StatusMemory<SandboxStatus>,
    /// RolloutGroup statuses we wrote that the cache may not show yet.
    pub written_group_status: StatusMemory<RolloutGroupStatus>,
    /// Client for the operator's own agent calls (trajectory runs).
    pub agent: AgentClient,
    /// Uids of sandboxes whose trajectory runner is in flight.
    pub runners: Mutex<HashSet<String>>,
    /// Whether this replica may write (leader election).
    pub leadership: Leadership,
}

impl Context {
    /// Builds the context; `backoff` carries the configured base and cap.
    pub fn new(
        client: Client,
        settings: Settings,
        metrics: Metrics,
        backoff: ReconcileBackoff,
        caches: Caches,
        leadership: Leadership,
    ) -> Self {
        let reporter = Reporter {
            controller: "orchard-operator".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            metrics,
            backoff,
            caches,
            recent: RecentWrites::default(),
            created_pods: CreatedPods::default(),
            written_status: StatusMemory::default(),
            written_group_status: StatusMemory::default(),
            agent: AgentClient::new(),
            runners: Mutex::new(HashSet::new()),
            leadership,
        }
    }

    /// Bookkeeping after `controller` reconciled the object `key` (`namespace/name`): forgets its
    /// failures and counts the success.
    pub fn reconciled(&self, controller: &str, key: &str) {
        self.backoff.reset(&format!("{controller}/{key}"));
        self.metrics
            .reconciles
            .with_label_values(&[controller, "ok"])
            .inc();
    }

    /// Bookkeeping after a failed reconcile: counts it by error kind and returns the object's next
    /// retry delay (per-object exponential backoff).
    pub fn reconcile_failed(&self, controller: &str, key: &str, error: &Error) -> Duration {
        self.metrics
            .reconciles
            .with_label_values(&[controller, "error"])
            .inc();
        self.metrics
            .reconcile_errors
            .with_label_values(&[controller, error.metric_label()])
            .inc();
        self.backoff.next_delay(&format!("{controller}/{key}"))
    }
}

/// `namespace/name` of an object, for logs and per-object bookkeeping.
pub fn object_key<K: kube::ResourceExt>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn settings_from_default_flags() {
        let args = OperatorArgs::parse_from(["orchard-operator"]);
        let settings = Settings::from_args(&args).unwrap();
        assert_eq!(
            settings.policy.operator_pod_labels["app.kubernetes.io/name"],
            "orchard-operator"
        );
        assert_eq!(settings.pod.default_ephemeral_storage, None);
    }

    #[test]
    fn invalid_flags_are_rejected_with_the_flag_name() {
        let args = OperatorArgs::parse_from(["orchard-operator", "--dns-pod-selector", "k8s-app"]);
        let err = Settings::from_args(&args).unwrap_err().to_string();
        assert!(err.contains("--dns-pod-selector"), "{err}");
        let args = OperatorArgs::parse_from(["orchard-operator", "--default-ttl-seconds", "0"]);
        assert!(Settings::from_args(&args).is_err());
    }

    #[test]
    fn recent_writes_expire_and_can_be_forgotten() {
        let recent = RecentWrites::default();
        recent.record("pods/ns/a".into());
        assert!(recent.contains("pods/ns/a"));
        assert!(!recent.contains("pods/ns/b"));
        recent.forget("pods/ns/a");
        assert!(!recent.contains("pods/ns/a"));
    }
}
