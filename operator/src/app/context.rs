//! What every reconcile shares: the client, settings, metrics, the event recorder, per-object
//! backoff, the watch caches of children, and the short memory of our own writes (so a lagging watch
//! cache does not make us write the same object twice; see `own_writes`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Client;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use tokio::sync::watch;

use crate::pool::book::PoolBook;
use crate::queue::book::QueueBook;
use crate::plumbing::backoff::ReconcileBackoff;
use crate::app::config::{OperatorArgs, parse_label_pairs};
use crate::plumbing::error::{Error, Result};
use crate::plumbing::leader::Leadership;
use crate::plumbing::metrics::Metrics;
use crate::plumbing::own_writes::OwnWrites;
use crate::plumbing::reconcile_slots::ReconcileSlots;
use crate::pod::agent_client::AgentClient;
use crate::pod::build::{PodShape, PolicyShape};
use crate::pod::cidr::Cidr;
use crate::pod::cluster_ranges::{ClusterRanges, Watched};
use crate::pod::placement::Placement;
use crate::pod::policy_canary::PolicyCanaries;
use crate::sandbox::runner::Runners;
use crate::pod::token::TokenKey;
use orchard_api::{RolloutGroup, RolloutQueue, Sandbox, SandboxPool};

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
    /// Sandbox reconciles running at once.
    pub sandbox_concurrency: u16,
    /// RolloutGroup reconciles running at once.
    pub rollout_concurrency: u16,
    /// Which placement fields sandboxes may set.
    pub placement: Placement,
    /// How the cluster's own ranges ([`ClusterRanges`]) enter policies and pods.
    pub ranges: RangeUse,
}

/// How the cluster's own ranges, observed while the operator runs, enter policies and pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeUse {
    /// The API server's endpoints are excepted from `AllowAll` and `AllowList` (not
    /// `--egress-allow-api-server`).
    pub protect_api_server: bool,
    /// New sandboxes' agents wait until their policies deny the canaries
    /// (`--await-policy-enforcement`).
    pub await_enforcement: bool,
    /// The nodes' pod ranges are excepted from `AllowAll`'s IP blocks (`--discover-pod-cidrs`, and
    /// not `--egress-allow-operator-namespace`).
    pub protect_pod_cidrs: bool,
}

impl RangeUse {
    /// What the operator must observe for this use.
    pub fn watched(&self) -> Watched {
        Watched {
            api_server: self.protect_api_server || self.await_enforcement,
            nodes: self.protect_pod_cidrs,
        }
    }
}

impl Settings {
    /// The inputs of the NetworkPolicies with the cluster's current `ranges` (pure).
    pub fn policy_shape(&self, ranges: &ClusterRanges) -> PolicyShape {
        let mut shape = self.policy.clone();
        if self.ranges.protect_api_server {
            shape
                .protected_cidrs
                .extend(ranges.api_server.iter().cloned());
        }
        if self.ranges.protect_pod_cidrs {
            shape
                .protected_cidrs
                .extend(ranges.pod_cidrs.iter().cloned());
        }
        shape
    }

    /// The shape of new sandbox pods with the cluster's current `ranges` (pure): the canaries are
    /// the API server's endpoints that answered the operator.
    pub fn pod_shape(&self, ranges: &ClusterRanges) -> PodShape {
        let mut shape = self.pod.clone();
        if self.ranges.await_enforcement {
            shape.policy_canaries = PolicyCanaries {
                addresses: ranges.live_canaries.clone(),
                denied_to_open_egress: self.ranges.protect_api_server,
            };
        }
        shape
    }
}

/// A comma-separated CIDR list of flag `flag` (empty: none).
fn cidr_list(text: &str, flag: &str) -> Result<Vec<Cidr>> {
    text.split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| Cidr::parse(part).map_err(|e| Error::Config(format!("{flag}: {e}"))))
        .collect()
}

/// Whether `text` is a Kubernetes quantity above zero (pure): a number (`2`, `0.5`, `.5`, an optional
/// `+`) with an optional suffix (`m`, `k`, `M`, `G`, `T`, `P`, `E`, `Ki` to `Ei`, or an exponent such
/// as `e3`), not all of whose digits are zero. Kubernetes reads a zero limit as none.
fn is_positive_quantity(text: &str) -> bool {
    let unsigned = text.strip_prefix('+').unwrap_or(text);
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let mut digits = number.bytes().filter(u8::is_ascii_digit).peekable();
    let has_digits = digits.peek().is_some();
    let nonzero = digits.any(|d| d != b'0');
    let exponent = |suffix: &str| {
        let Some(power) = suffix.strip_prefix(['e', 'E']) else {
            return false;
        };
        let power = power.strip_prefix(['+', '-']).unwrap_or(power);
        !power.is_empty() && power.bytes().all(|d| d.is_ascii_digit())
    };
    let suffix_ok = matches!(
        suffix,
        "" | "m" | "k" | "M" | "G" | "T" | "P" | "E" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"
    ) || exponent(suffix);
    has_digits && nonzero && number.matches('.').count() <= 1 && suffix_ok
}

/// Refuses a default amount `value` of flag `flag` (Helm value `helm`) that is not above zero: a
/// sandbox given it would run without that limit.
fn positive_default(value: &str, flag: &str, helm: &str, example: &str) -> Result<()> {
    if is_positive_quantity(value) {
        return Ok(());
    }
    Err(Error::Config(format!(
        "{flag} (Helm value {helm}) must be a quantity greater than 0, e.g. {example}; got `{value}` (Kubernetes reads a zero limit as no limit)"
    )))
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
        positive_default(
            &defaults.default_cpu,
            "--default-cpu",
            "sandboxDefaults.cpu",
            "1 or 500m",
        )?;
        positive_default(
            &defaults.default_memory,
            "--default-memory",
            "sandboxDefaults.memory",
            "2Gi",
        )?;
        if !defaults.default_ephemeral_storage.is_empty() {
            // Empty means no limit (the documented default); anything else must be a real one.
            positive_default(
                &defaults.default_ephemeral_storage,
                "--default-ephemeral-storage",
                "sandboxDefaults.ephemeralStorage",
                "10Gi, or empty for no limit",
            )?;
        }
        Ok(Self {
            pod: PodShape {
                agent_image: defaults.agent_image.clone(),
                agent_injection: defaults.agent_injection,
                agent_port: defaults.agent_port,
                default_cpu: defaults.default_cpu.clone(),
                default_memory: defaults.default_memory.clone(),
                default_ephemeral_storage: Some(defaults.default_ephemeral_storage.clone())
                    .filter(|s| !s.is_empty()),
                termination_grace_seconds: defaults.termination_grace_seconds,
                default_security_profile: defaults.default_security_profile,
                // From the API server's endpoints while the operator runs (`Settings::pod_shape`).
                policy_canaries: PolicyCanaries::default(),
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
                protected_cidrs: {
                    let mut protected =
                        cidr_list(&defaults.egress_except_cidrs, "--egress-except-cidrs")?;
                    if !defaults.egress_allow_operator_namespace {
                        protected.extend(cidr_list(
                            &defaults.cluster_pod_cidrs,
                            "--cluster-pod-cidrs",
                        )?);
                    }
                    protected
                },
                protect_operator_namespace: !defaults.egress_allow_operator_namespace,
            },
            default_ttl_seconds: defaults.default_ttl_seconds,
            default_heartbeat_timeout_seconds: defaults.default_heartbeat_timeout_seconds,
            startup_timeout_seconds: defaults.startup_timeout_seconds,
            resync: Duration::from_secs(args.controller.resync_seconds.max(1)),
            status_coalesce: Duration::from_millis(args.controller.status_coalesce_ms),
            sandbox_concurrency: args.controller.sandbox_concurrency,
            rollout_concurrency: args.controller.rollout_concurrency,
            placement: Placement::from_policy(&args.placement),
            ranges: RangeUse {
                protect_api_server: !defaults.egress_allow_api_server,
                await_enforcement: defaults.await_policy_enforcement,
                protect_pod_cidrs: defaults.discover_pod_cidrs
                    && !defaults.egress_allow_operator_namespace,
            },
        })
    }
}

/// Watch caches (reflector stores) the controllers and the gateway read instead of the API server.
#[derive(Clone)]
pub struct Caches {
    /// Every Sandbox in scope.
    pub sandboxes: Store<Sandbox>,
    /// Sandbox pods (label `orchard.dev/sandbox-pod=true`).
    pub pods: Store<Pod>,
    /// NetworkPolicies the operator manages.
    pub policies: Store<NetworkPolicy>,
    /// Every RolloutGroup in scope.
    pub rollout_groups: Store<RolloutGroup>,
    /// Every RolloutQueue in scope.
    pub rollout_queues: Store<RolloutQueue>,
    /// Every SandboxPool in scope.
    pub sandbox_pools: Store<SandboxPool>,
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
    /// Per-object backoff of failed reconciles (by UID).
    pub backoff: Arc<ReconcileBackoff>,
    /// Watch caches.
    pub caches: Caches,
    /// Our own writes the caches may not show yet (by UID).
    pub own_writes: Arc<OwnWrites>,
    /// Client for the operator's own agent calls (trajectory runs).
    pub agent: AgentClient,
    /// The trajectory runs this replica drives (bounded, stopped at shutdown).
    pub runners: Runners,
    /// Whether this replica may write (leader election).
    pub leadership: Leadership,
    /// Sandbox reconciles running at once (FIFO; see `reconcile_slots`).
    pub sandbox_slots: ReconcileSlots,
    /// RolloutGroup reconciles running at once.
    pub rollout_slots: ReconcileSlots,
    /// One baseline-policy apply in flight per namespace (the first sandboxes of a new namespace would
    /// otherwise all apply the same object at once, and the API server serialises those updates).
    pub baseline_applies: KeyedLocks,
    /// Admission state of the RolloutQueues (waiting groups, reservations) and the queue loop's signals.
    pub queues: Arc<QueueBook>,
    /// The pools' in-memory state (member reservations, claim counts, waiting Sandboxes) and signals.
    pub pools: Arc<PoolBook>,
    /// The key every sandbox pod's agent token is derived from.
    pub token_key: Arc<TokenKey>,
    /// The cluster's own ranges as last observed (`cluster_ranges`).
    pub ranges: watch::Receiver<ClusterRanges>,
}

/// Async locks by key, created on first use and dropped when nobody holds or waits for them.
#[derive(Default)]
pub struct KeyedLocks {
    locks: Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl KeyedLocks {
    /// Runs `work` while holding the lock of `key`.
    pub async fn with<T>(&self, key: &str, work: impl std::future::Future<Output = T>) -> T {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(key.to_string()).or_default().clone()
        };
        let result = {
            let _held = lock.lock().await;
            work.await
        };
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Ours and the map's: nobody else holds or waits for it.
        if Arc::strong_count(&lock) == 2 {
            locks.remove(key);
        }
        result
    }
}

impl Context {
    /// Builds the context; `backoff` carries the configured base and cap. The watches share `backoff`
    /// and `own_writes` to forget deleted objects. Every argument is a handle start-up made and shares
    /// with others (the watches, the gateway), hence their number.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        settings: Settings,
        metrics: Metrics,
        backoff: Arc<ReconcileBackoff>,
        caches: Caches,
        own_writes: Arc<OwnWrites>,
        leadership: Leadership,
        token_key: Arc<TokenKey>,
    ) -> Self {
        let reporter = Reporter {
            controller: "orchard-operator".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let (sandbox_slots, rollout_slots) = (
            ReconcileSlots::new(settings.sandbox_concurrency),
            ReconcileSlots::new(settings.rollout_concurrency),
        );
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            settings,
            metrics,
            backoff,
            caches,
            own_writes,
            agent: AgentClient::new(),
            runners: Runners::default(),
            leadership,
            sandbox_slots,
            rollout_slots,
            baseline_applies: KeyedLocks::default(),
            queues: Arc::default(),
            pools: Arc::default(),
            token_key,
            ranges: watch::channel(ClusterRanges::default()).1,
        }
    }

    /// The inputs of the NetworkPolicies now (see [`Settings::policy_shape`]).
    pub fn policy_shape(&self) -> PolicyShape {
        self.settings.policy_shape(&self.ranges.borrow())
    }

    /// The shape of a sandbox pod created now (see [`Settings::pod_shape`]).
    pub fn pod_shape(&self) -> PodShape {
        self.settings.pod_shape(&self.ranges.borrow())
    }

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
    fn by_default_open_egress_never_reaches_metadata_addresses_of_either_family() {
        use crate::pod::build::desired_egress_policy;
        use orchard_api::{EgressPolicy, NetworkSpec, SandboxSpec};
        let args = OperatorArgs::parse_from(["orchard-operator"]);
        let settings = Settings::from_args(&args).unwrap();
        let mut sandbox = Sandbox::new(
            "s",
            SandboxSpec {
                image: "x".into(),
                network: Some(NetworkSpec {
                    egress: EgressPolicy::AllowAll,
                    ..NetworkSpec::default()
                }),
                ..SandboxSpec::default()
            },
        );
        sandbox.metadata.namespace = Some("ns".into());
        sandbox.metadata.uid = Some("u".into());
        let owner = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "orchard.dev/v1alpha1".into(),
            kind: "Sandbox".into(),
            name: "s".into(),
            uid: "u".into(),
            controller: Some(true),
            ..Default::default()
        };
        let shape = settings.policy_shape(&ClusterRanges::default());
        let key = TokenKey::new(&[7; 32]).unwrap();
        let policy = desired_egress_policy(&sandbox, &owner, &shape, &key).unwrap();
        let text = serde_json::to_string(&policy.spec).unwrap();
        for except in [
            "169.254.169.254/32",
            "fd00:ec2::254/128",
            "168.63.129.16/32",
            "100.100.100.200/32",
            "fe80::/10",
        ] {
            assert!(
                text.contains(&format!("\"{except}\"")),
                "{except} in {text}"
            );
        }
    }

    #[test]
    fn the_observed_ranges_join_the_configured_ones() {
        let args = OperatorArgs::parse_from([
            "orchard-operator",
            "--egress-except-cidrs=10.9.9.9/32",
            "--cluster-pod-cidrs=10.244.0.0/16",
        ]);
        let settings = Settings::from_args(&args).unwrap();
        let ranges = ClusterRanges {
            api_server: vec![Cidr::parse("10.0.0.1/32").unwrap()],
            live_canaries: vec!["10.0.0.1:6443".parse().unwrap()],
            dead_canaries: vec!["10.0.0.2:6443".parse().unwrap()],
            pod_cidrs: vec![Cidr::parse("10.245.0.0/24").unwrap()],
        };
        let protected: Vec<String> = settings
            .policy_shape(&ranges)
            .protected_cidrs
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            protected,
            vec![
                "10.9.9.9/32",
                "10.244.0.0/16",
                "10.0.0.1/32",
                "10.245.0.0/24"
            ]
        );
        let canaries = settings.pod_shape(&ranges).policy_canaries;
        assert_eq!(canaries.addresses, ranges.live_canaries);
        assert!(canaries.denied_to_open_egress);
        // Sandboxes allowed to reach the API server and the operator's namespace protect neither.
        let open = Settings::from_args(&OperatorArgs::parse_from([
            "orchard-operator",
            "--egress-except-cidrs=",
            "--egress-allow-api-server",
            "--egress-allow-operator-namespace",
            "--await-policy-enforcement=false",
        ]))
        .unwrap();
        assert!(open.policy_shape(&ranges).protected_cidrs.is_empty());
        assert!(open.pod_shape(&ranges).policy_canaries.addresses.is_empty());
        assert!(!open.ranges.watched().api_server && !open.ranges.watched().nodes);
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
    fn quantities_above_zero_are_told_from_the_rest() {
        for good in [
            "1", "1m", "500m", "0.5", ".5", "2.", "+2", "64Mi", "2Gi", "1k", "1e3", "1E-3",
            "0.001", "10Gi", "1E",
        ] {
            assert!(is_positive_quantity(good), "{good}");
        }
        for bad in [
            "", "0", "0m", "0.0", "-1", "-500m", "0Gi", "0e3", "lots", "1x", "1..5", "m", "1e",
            "1 Gi", "1mi",
        ] {
            assert!(!is_positive_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn defaults_that_are_not_above_zero_are_refused_naming_flag_and_helm_value() {
        for (flag, value, helm) in [
            ("--default-cpu", "0", "sandboxDefaults.cpu"),
            ("--default-cpu", "-1", "sandboxDefaults.cpu"),
            ("--default-memory", "0Mi", "sandboxDefaults.memory"),
            (
                "--default-ephemeral-storage",
                "0",
                "sandboxDefaults.ephemeralStorage",
            ),
        ] {
            let given = format!("{flag}={value}");
            let args = OperatorArgs::parse_from(["orchard-operator", given.as_str()]);
            let err = Settings::from_args(&args).unwrap_err().to_string();
            assert!(
                err.contains(flag) && err.contains(helm) && err.contains("greater than 0"),
                "{err}"
            );
        }
        let args = OperatorArgs::parse_from([
            "orchard-operator",
            "--default-cpu",
            "250m",
            "--default-memory",
            "64Mi",
            "--default-ephemeral-storage",
            "",
        ]);
        assert!(Settings::from_args(&args).is_ok());
    }
}
