//! Settings derived once from the command line and validated: each layer's own part (the pods', the
//! Sandbox controller's, the gateway's) and what the whole process shares.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::app::config::{OperatorArgs, parse_label_pairs};
use crate::gateway::deps::GatewaySettings;
use crate::plumbing::error::{Error, Result};
use crate::pod::cidr::Cidr;
use crate::pod::context::{PodSettings, RangeUse};
use crate::pod::gpu::shape_from_flags;
use crate::pod::placement::Placement;
use crate::pod::policy::PolicyShape;
use crate::pod::policy_canary::PolicyCanaries;
use crate::pod::spec::PodShape;
use crate::sandbox::context::SandboxSettings;
use crate::snapshot::committer::CommitterSettings;

/// Settings derived once from the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// How sandbox Pods and their policies are shaped.
    pub pod: PodSettings,
    /// The Sandbox controller's lifecycle defaults and tuning.
    pub sandbox: SandboxSettings,
    /// Periodic re-reconcile of healthy objects.
    pub resync: Duration,
    /// RolloutGroup reconciles running at once.
    pub rollout_concurrency: u16,
    /// How SandboxSnapshots are committed.
    pub snapshot: CommitterSettings,
}

impl Settings {
    /// What the gateway needs of them.
    pub fn gateway(&self) -> GatewaySettings {
        GatewaySettings {
            agent_port: self.pod.pod.agent_port,
            default_ttl_seconds: self.sandbox.default_ttl_seconds,
            max_ttl_seconds: self.sandbox.max_ttl_seconds,
            default_heartbeat_timeout_seconds: self.sandbox.default_heartbeat_timeout_seconds,
        }
    }
}

/// A comma-separated CIDR list of flag `flag` (empty: none).
/// The CIDRs of a comma-separated flag value, or which part of `flag` is not one.
pub fn cidr_list(text: &str, flag: &str) -> Result<Vec<Cidr>> {
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
        if defaults.max_ttl_seconds < defaults.default_ttl_seconds {
            return Err(Error::Config(format!(
                "--max-ttl-seconds (Helm value sandboxDefaults.maxTtlSeconds) is {}, below --default-ttl-seconds (sandboxDefaults.ttlSeconds) {}: the maximum must allow the default",
                defaults.max_ttl_seconds, defaults.default_ttl_seconds
            )));
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
        if args.controller.simulated_agent && defaults.await_policy_enforcement {
            return Err(Error::Config(
                "--simulated-agent is for test clusters whose pods run no agent (KWOK nodes) and cannot be combined with --await-policy-enforcement (on by default): there is no sandbox to enforce policies on".into(),
            ));
        }
        let gpu = shape_from_flags(&args.gpu).map_err(Error::Config)?;
        let pod = PodSettings {
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
                // From the API server's endpoints while the operator runs (`PodSettings::pod_shape`).
                policy_canaries: PolicyCanaries::default(),
                egress_proxy_url: None,
                gpu: gpu.clone(),
                node_lost_seconds: Some(defaults.node_lost_seconds).filter(|s| *s > 0),
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
                // From the proxy's Service at start (`app::discovery::egress_proxy`).
                egress_proxy: None,
            },
            placement: Placement::from_policy(&args.placement).with_gpu_types(gpu.types),
            ranges: RangeUse {
                protect_api_server: !defaults.egress_allow_api_server,
                await_enforcement: defaults.await_policy_enforcement,
                protect_pod_cidrs: defaults.discover_pod_cidrs
                    && !defaults.egress_allow_operator_namespace,
            },
        };
        Ok(Self {
            pod,
            sandbox: SandboxSettings {
                default_ttl_seconds: defaults.default_ttl_seconds,
                max_ttl_seconds: defaults.max_ttl_seconds,
                default_heartbeat_timeout_seconds: defaults.default_heartbeat_timeout_seconds,
                startup_timeout_seconds: defaults.startup_timeout_seconds,
                status_coalesce: Duration::from_millis(args.controller.status_coalesce_ms),
                concurrency: args.controller.sandbox_concurrency,
                simulated_agent: args.controller.simulated_agent,
            },
            resync: Duration::from_secs(args.controller.resync_seconds.max(1)),
            rollout_concurrency: args.controller.rollout_concurrency,
            snapshot: snapshot_settings(args)?,
        })
    }
}

/// The committer settings of the `--snapshot-*` flags, validated.
fn snapshot_settings(args: &OperatorArgs) -> Result<CommitterSettings> {
    let flags = &args.snapshots;
    let registry = flags.snapshot_registry.trim().trim_end_matches('/');
    if registry.contains("://") || registry.contains(char::is_whitespace) {
        return Err(Error::Config(format!(
            "--snapshot-registry (Helm value snapshots.registry) must be a repository prefix such as registry.example.com/orchard-snapshots, without a scheme or spaces; got `{}`",
            flags.snapshot_registry
        )));
    }
    if flags.snapshot_namespace.trim().is_empty() {
        return Err(Error::Config(
            "--snapshot-namespace (Helm value snapshots.namespace) must not be empty".into(),
        ));
    }
    Ok(CommitterSettings {
        registry: Some(registry.to_string()).filter(|r| !r.is_empty()),
        namespace: flags.snapshot_namespace.trim().to_string(),
        image: flags.snapshot_committer_image.clone(),
        containerd_socket: flags.snapshot_containerd_socket.clone(),
        insecure_registry: flags.snapshot_insecure_registry,
        registry_secret: Some(flags.snapshot_registry_secret.trim().to_string())
            .filter(|s| !s.is_empty()),
        timeout_seconds: flags.snapshot_timeout_seconds,
        pause_limit_seconds: flags.snapshot_pause_limit_seconds,
        node_lost_seconds: Some(args.sandbox.node_lost_seconds).filter(|s| *s > 0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::cluster_ranges::ClusterRanges;
    use clap::Parser;
    use orchard_api::Sandbox;

    #[test]
    fn settings_from_default_flags() {
        let args = OperatorArgs::parse_from(["orchard-operator"]);
        let settings = Settings::from_args(&args).unwrap();
        assert_eq!(
            settings.pod.policy.operator_pod_labels["app.kubernetes.io/name"],
            "orchard-operator"
        );
        assert_eq!(settings.pod.pod.default_ephemeral_storage, None);
    }

    #[test]
    fn by_default_open_egress_never_reaches_metadata_addresses_of_either_family() {
        use crate::pod::policy::desired_egress_policy;
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
        let shape = settings.pod.policy_shape(&ClusterRanges::default());
        let key = crate::plumbing::operator_key::OperatorKey::new(&[7; 32]).unwrap();
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
            .pod
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
        let canaries = settings.pod.pod_shape(&ranges).policy_canaries;
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
        assert!(open.pod.policy_shape(&ranges).protected_cidrs.is_empty());
        assert!(
            open.pod
                .pod_shape(&ranges)
                .policy_canaries
                .addresses
                .is_empty()
        );
        assert!(!open.pod.ranges.watched().api_server && !open.pod.ranges.watched().nodes);
    }

    #[test]
    fn the_simulated_agent_is_refused_where_policies_are_awaited() {
        let args = OperatorArgs::parse_from(["orchard-operator", "--simulated-agent"]);
        let err = Settings::from_args(&args).unwrap_err().to_string();
        assert!(
            err.contains("--simulated-agent") && err.contains("--await-policy-enforcement"),
            "{err}"
        );
        let args = OperatorArgs::parse_from([
            "orchard-operator",
            "--simulated-agent",
            "--await-policy-enforcement=false",
        ]);
        let settings = Settings::from_args(&args).expect("a KWOK test cluster's flags");
        assert!(settings.sandbox.simulated_agent);
        let defaults = Settings::from_args(&OperatorArgs::parse_from(["orchard-operator"]));
        assert!(!defaults.expect("defaults").sandbox.simulated_agent);
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
    fn gpu_flags_shape_pods_and_placement_alike() {
        let args = OperatorArgs::parse_from(["orchard-operator"]);
        let settings = Settings::from_args(&args).unwrap();
        assert_eq!(settings.pod.pod.gpu, crate::pod::gpu::GpuShape::default());
        assert_eq!(settings.pod.pod.gpu.resource, "nvidia.com/gpu");
        assert!(settings.pod.pod.gpu.toleration);
        assert!(settings.pod.placement.gpu_types.is_empty());
        let args = OperatorArgs::parse_from([
            "orchard-operator",
            "--gpu-resource=amd.com/gpu",
            "--gpu-toleration=false",
            "--gpu-type",
            "MI300X=amd.com/gpu.product=MI300X",
            "--gpu-type=mi250=amd.com/gpu.product=MI250,w7900=amd.com/gpu.product=W7900",
        ]);
        let settings = Settings::from_args(&args).unwrap();
        let gpu = &settings.pod.pod.gpu;
        assert_eq!(gpu.resource, "amd.com/gpu");
        assert!(!gpu.toleration);
        assert_eq!(
            gpu.types.keys().collect::<Vec<_>>(),
            ["mi250", "mi300x", "w7900"]
        );
        assert_eq!(settings.pod.placement.gpu_types, gpu.types);
        let args = OperatorArgs::parse_from(["orchard-operator", "--gpu-type=h100"]);
        let err = Settings::from_args(&args).unwrap_err().to_string();
        assert!(
            err.contains("--gpu-type") && err.contains("gpu.types"),
            "{err}"
        );
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
    fn a_maximum_ttl_below_the_default_is_refused_naming_both() {
        let args = OperatorArgs::parse_from([
            "orchard-operator",
            "--default-ttl-seconds=7200",
            "--max-ttl-seconds=3600",
        ]);
        let err = Settings::from_args(&args).unwrap_err().to_string();
        assert!(
            err.contains("--max-ttl-seconds") && err.contains("sandboxDefaults.maxTtlSeconds"),
            "{err}"
        );
        let args = OperatorArgs::parse_from(["orchard-operator", "--max-ttl-seconds=7200"]);
        let settings = Settings::from_args(&args).expect("the maximum may equal the default");
        assert_eq!(settings.sandbox.max_ttl_seconds, 7200);
        assert_eq!(settings.gateway().max_ttl_seconds, 7200);
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
