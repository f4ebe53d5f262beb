//! The desired Pod of a sandbox (pure): a Sandbox spec plus the operator's defaults in, the Pod out,
//! with the agent injected, the security profile applied and the Pod sealed for its owner. Every
//! variant of the spec is unit-tested here.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, HTTPGetAction,
    ImageVolumeSource, LocalObjectReference, Pod, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::seal;
use crate::pod::gpu::{self, GpuShape};
use crate::pod::policy_canary::{CANARY_VARIABLE, PolicyCanaries, canaries_for, canary_value};
use crate::pod::token::{PodCredentials, VERIFIER_VARIABLE};
use orchard_api::{Sandbox, SandboxSpec, SecurityProfile};

use crate::pod::naming::*;

const AGENT_VOLUME: &str = "orchard-agent";

/// How the static agent gets into a sandbox's task container (whose image need not contain it).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AgentInjection {
    /// An init container copies the agent from the agent image into an `emptyDir` (any cluster).
    #[default]
    InitContainer,
    /// The agent image is mounted read-only as an image volume (Kubernetes 1.35+, where the
    /// `ImageVolume` feature is on by default, with a runtime that supports it: containerd 2.1+ or
    /// CRI-O 1.31+): one container fewer per pod to create, start and remove.
    ImageVolume,
}

/// Everything about the pods the operator builds that does not come from a Sandbox spec.
#[derive(Debug, Clone, PartialEq)]
pub struct PodShape {
    /// Image holding the static agent binary at `/orchard-agent`.
    pub agent_image: String,
    /// How the agent gets into the task container.
    pub agent_injection: AgentInjection,
    /// Port the agent listens on.
    pub agent_port: u16,
    /// CPU when the spec sets none.
    pub default_cpu: String,
    /// Memory when the spec sets none.
    pub default_memory: String,
    /// Ephemeral storage when the spec sets none (`None`: no limit).
    pub default_ephemeral_storage: Option<String>,
    /// Termination grace period of sandbox pods.
    pub termination_grace_seconds: i64,
    /// Security profile when the spec sets none.
    pub default_security_profile: SecurityProfile,
    /// What the agent must find closed before it serves (`--await-policy-enforcement`).
    pub policy_canaries: PolicyCanaries,
    /// URL of the egress proxy (`http://<cluster IP>:<port>`) the task container's proxy variables
    /// name; `None` without one (`--egress-proxy-service`).
    pub egress_proxy_url: Option<String>,
    /// How GPU sandboxes' Pods are shaped (`--gpu-resource`, `--gpu-type`, `--gpu-toleration`).
    pub gpu: GpuShape,
    /// How long a sandbox Pod stays bound to a node that stopped answering before Kubernetes deletes
    /// it (`--node-lost-seconds`; `None`: the cluster's default, usually 300 s).
    pub node_lost_seconds: Option<i64>,
}

/// The tolerations of a sandbox's Pod (pure): the spec's own, the GPU nodes' taint for a GPU sandbox,
/// and the lost-node taints for `--node-lost-seconds` (unless the spec tolerates them itself).
fn tolerations(spec: &SandboxSpec, shape: &PodShape) -> Option<Vec<Toleration>> {
    let mut all = gpu::tolerations(spec, &shape.gpu).unwrap_or_default();
    let lost = crate::pod::disruption::lost_node_tolerations(shape.node_lost_seconds, &all);
    all.extend(lost);
    (!all.is_empty()).then_some(all)
}

/// What a sandbox reaches without the egress proxy: its own loopback (servers a task starts) and
/// in-cluster Service names, which the proxy never connects to (their addresses are protected) and
/// which a sandbox's NetworkPolicies decide directly.
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1,.svc,.cluster.local";

/// The proxy variables of a task container with egress proxy `url` (pure): both spellings, because
/// curl reads only the lower-case `http_proxy` and Python and Go read either.
pub fn proxy_env(url: &str) -> [(&'static str, String); 6] {
    [
        ("HTTP_PROXY", url.to_string()),
        ("HTTPS_PROXY", url.to_string()),
        ("http_proxy", url.to_string()),
        ("https_proxy", url.to_string()),
        ("NO_PROXY", NO_PROXY.to_string()),
        ("no_proxy", NO_PROXY.to_string()),
    ]
}

/// Resource requirements of the task container with requests equal to limits, from the spec or the
/// defaults: CPU, memory, ephemeral storage and, for a GPU sandbox, `resources.gpu.count` of the GPU
/// extended resource.
pub fn resource_requirements(spec: &SandboxSpec, shape: &PodShape) -> ResourceRequirements {
    let wanted = spec.resources.clone().unwrap_or_default();
    let mut amounts = BTreeMap::new();
    amounts.insert(
        "cpu".to_string(),
        wanted
            .cpu
            .unwrap_or_else(|| Quantity(shape.default_cpu.clone())),
    );
    amounts.insert(
        "memory".to_string(),
        wanted
            .memory
            .unwrap_or_else(|| Quantity(shape.default_memory.clone())),
    );
    if let Some(storage) = wanted
        .ephemeral_storage
        .or_else(|| shape.default_ephemeral_storage.clone().map(Quantity))
    {
        amounts.insert("ephemeral-storage".to_string(), storage);
    }
    if let Some(gpus) = wanted.gpu {
        amounts.insert(shape.gpu.resource.clone(), Quantity(gpus.count.to_string()));
    }
    ResourceRequirements {
        limits: Some(amounts.clone()),
        requests: Some(amounts),
        ..ResourceRequirements::default()
    }
}

/// The environment of the task container: the user's variables, then what the agent needs.
/// User variables cannot override the agent's own settings (the agent variables come last).
fn task_env(sandbox: &Sandbox, name: &str, shape: &PodShape, verifier: &str) -> Vec<EnvVar> {
    let spec = &sandbox.spec;
    let mut env: Vec<EnvVar> = spec
        .env
        .iter()
        .filter(|v| !v.name.starts_with("ORCHARD_AGENT_"))
        .map(|v| EnvVar {
            name: v.name.clone(),
            value: Some(v.value.clone()),
            ..EnvVar::default()
        })
        .collect();
    let mut push = |key: &str, value: String| {
        env.push(EnvVar {
            name: key.to_string(),
            value: Some(value),
            ..EnvVar::default()
        })
    };
    push("ORCHARD_SANDBOX", name.to_string());
    push(
        "ORCHARD_AGENT_LISTEN",
        // Both families: the pod IP is IPv6 in IPv6 clusters (the agent falls back to IPv4 where the
        // kernel has no IPv6).
        format!("[::]:{}", shape.agent_port),
    );
    push(VERIFIER_VARIABLE, verifier.to_string());
    let egress = spec.network.as_ref().map(|n| n.egress).unwrap_or_default();
    if let Some(canaries) = canary_value(canaries_for(egress, &shape.policy_canaries)) {
        push(CANARY_VARIABLE, canaries);
    }
    if let Some(url) = &shape.egress_proxy_url {
        // The user's own value wins (e.g. a NO_PROXY naming an allowed address range).
        let user_set = |key: &str| spec.env.iter().any(|v| v.name == key);
        for (key, value) in proxy_env(url) {
            if !user_set(key) {
                push(key, value);
            }
        }
    }
    if let Some(startup) = &spec.startup {
        push(
            "ORCHARD_AGENT_STARTUP",
            serde_json::json!({ "argv": startup.command }).to_string(),
        );
    }
    env
}

/// Uid the task container runs as under `Restricted` when the spec names none (the conventional
/// "nonroot" user of distroless images; the agent's init container runs as it in every profile).
pub const RESTRICTED_DEFAULT_UID: i64 = 65532;

/// Capabilities the `Default` profile drops from the container runtime's default set. containerd
/// gives root in a container CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, SETPCAP,
/// NET_BIND_SERVICE and SYS_CHROOT, which ordinary root tasks need (installing packages, switching
/// users, binding a low port, chroot-based tools), plus these four, which they do not:
/// - `NET_RAW`: raw and packet sockets. Task code could read the pod's traffic, the agent's bearer token
///   included, and forge TCP segments into the gateway's connection to the agent. `ping` keeps working
///   where the runtime allows unprivileged ICMP sockets (`net.ipv4.ping_group_range`; containerd 2 does
///   by default).
/// - `MKNOD`: creating device nodes. Package installs do not need it (named pipes do not); it is only
///   ever a way towards a device the device cgroup should keep out of reach.
/// - `AUDIT_WRITE`: writing records into the node's kernel audit log, which is the node's, not the
///   sandbox's (`sudo` only warns without it).
/// - `SETFCAP`: giving files capabilities, and mapping root into a new user namespace (Linux 5.12+):
///   nothing a task needs, and `allowPrivilegeEscalation: false` ignores file capabilities anyway.
///
/// Pod Security `baseline` limits which capabilities may be added; dropping is always admitted.
pub const DEFAULT_PROFILE_DROPPED_CAPABILITIES: [&str; 4] =
    ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP"];

/// The pod's and the task container's security contexts.
pub struct SandboxSecurity {
    /// Pod level: RuntimeDefault seccomp always; the user under `Restricted`.
    pub pod: PodSecurityContext,
    /// The task container.
    pub task: SecurityContext,
}

/// The security contexts of a sandbox's profile (pure). Both profiles forbid privilege escalation and
/// apply the runtime's default seccomp profile; `Default` drops the capabilities no task needs
/// ([`DEFAULT_PROFILE_DROPPED_CAPABILITIES`]), `Restricted` adds a non-root user and drops every
/// capability, which is what Pod Security `restricted` admits.
pub fn sandbox_security(spec: &SandboxSpec, shape: &PodShape) -> SandboxSecurity {
    let security = spec.security.clone().unwrap_or_default();
    let profile = security.profile.unwrap_or(shape.default_security_profile);
    let seccomp = Some(SeccompProfile {
        type_: "RuntimeDefault".to_string(),
        ..SeccompProfile::default()
    });
    match profile {
        SecurityProfile::Default => SandboxSecurity {
            pod: PodSecurityContext {
                seccomp_profile: seccomp,
                run_as_user: security.run_as_user,
                run_as_group: security.run_as_group,
                ..PodSecurityContext::default()
            },
            task: SecurityContext {
                allow_privilege_escalation: Some(false),
                capabilities: Some(Capabilities {
                    drop: Some(
                        DEFAULT_PROFILE_DROPPED_CAPABILITIES
                            .iter()
                            .map(|c| c.to_string())
                            .collect(),
                    ),
                    ..Capabilities::default()
                }),
                ..SecurityContext::default()
            },
        },
        SecurityProfile::Restricted => {
            let uid = security.run_as_user.unwrap_or(RESTRICTED_DEFAULT_UID);
            SandboxSecurity {
                pod: PodSecurityContext {
                    seccomp_profile: seccomp,
                    run_as_non_root: Some(true),
                    run_as_user: Some(uid),
                    run_as_group: Some(security.run_as_group.unwrap_or(uid)),
                    ..PodSecurityContext::default()
                },
                task: SecurityContext {
                    allow_privilege_escalation: Some(false),
                    run_as_non_root: Some(true),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".to_string()]),
                        ..Capabilities::default()
                    }),
                    ..SecurityContext::default()
                },
            }
        }
    }
}

/// The sandbox's Pod, controlled by `owner` and sealed for it under `key`: the task container (the
/// user's image) runs `orchard-agent serve` from [`AGENT_DIR`], accepting the token whose hash
/// `credentials` carry (the token itself never enters the pod: see [`super::token`]). The agent gets
/// there as `shape.agent_injection` says: copied by an init container into an `emptyDir`, or the agent
/// image mounted read-only as an image volume.
pub fn desired_pod(
    sandbox: &Sandbox,
    owner: &OwnerReference,
    shape: &PodShape,
    credentials: &PodCredentials,
    key: &OperatorKey,
) -> Pod {
    let name = sandbox.metadata.name.clone().unwrap_or_default();
    let spec = &sandbox.spec;
    let mut meta = child_meta(sandbox, &name, own_pod_name_of(sandbox), owner, key);
    meta.labels = Some(pod_labels(sandbox, key));
    meta.annotations = Some(credentials.annotations());
    let security = sandbox_security(spec, shape);
    let resources = resource_requirements(spec, shape);
    let (install, agent_volume) = agent_injection(shape, &resources);
    let task = Container {
        name: TASK_CONTAINER.to_string(),
        image: Some(spec.image.clone()),
        image_pull_policy: spec.image_pull_policy.map(|p| format!("{p:?}")),
        command: Some(vec![
            format!("{AGENT_DIR}/orchard-agent"),
            "serve".to_string(),
        ]),
        working_dir: spec.working_dir.clone(),
        env: Some(task_env(sandbox, &name, shape, &credentials.verifier)),
        ports: Some(vec![ContainerPort {
            name: Some(AGENT_PORT_NAME.to_string()),
            container_port: i32::from(shape.agent_port),
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/healthz".to_string()),
                port: IntOrString::String(AGENT_PORT_NAME.to_string()),
                ..HTTPGetAction::default()
            }),
            period_seconds: Some(1),
            failure_threshold: Some(3),
            timeout_seconds: Some(1),
            ..Probe::default()
        }),
        resources: Some(resources),
        security_context: Some(security.task),
        volume_mounts: Some(vec![VolumeMount {
            name: AGENT_VOLUME.to_string(),
            mount_path: AGENT_DIR.to_string(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    let mut pod = Pod {
        metadata: meta,
        spec: Some(PodSpec {
            init_containers: install.map(|install| vec![install]),
            containers: vec![task],
            // A crashed agent means lost sandbox state: fail the sandbox instead of restarting silently.
            restart_policy: Some("Never".to_string()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(shape.termination_grace_seconds),
            security_context: Some(security.pod),
            runtime_class_name: spec.runtime_class_name.clone(),
            // The spec's node selector as it is (Kubernetes ANDs it with the affinity).
            node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
            // Any one of the GPU types will do: one required term each.
            affinity: gpu::require_any(None, gpu::type_terms(spec, &shape.gpu.types)),
            tolerations: tolerations(spec, shape),
            priority_class_name: spec.priority_class_name.clone(),
            image_pull_secrets: (!spec.image_pull_secrets.is_empty()).then(|| {
                spec.image_pull_secrets
                    .iter()
                    .map(|s| LocalObjectReference {
                        name: s.name.clone(),
                    })
                    .collect()
            }),
            volumes: Some(vec![agent_volume]),
            ..PodSpec::default()
        }),
        status: None,
    };
    seal(&mut pod, key);
    pod
}

/// `requirements` without resource `name` (pure).
fn without_resource(requirements: &ResourceRequirements, name: &str) -> ResourceRequirements {
    let drop = |amounts: &Option<BTreeMap<String, Quantity>>| {
        amounts.clone().map(|mut amounts| {
            amounts.remove(name);
            amounts
        })
    };
    ResourceRequirements {
        limits: drop(&requirements.limits),
        requests: drop(&requirements.requests),
        ..requirements.clone()
    }
}

/// The init container that installs the agent (none with an image volume), given the task container's
/// resources, and the volume the task container finds the agent in (pure).
fn agent_injection(
    shape: &PodShape,
    task_resources: &ResourceRequirements,
) -> (Option<Container>, Volume) {
    match shape.agent_injection {
        AgentInjection::ImageVolume => (
            None,
            Volume {
                name: AGENT_VOLUME.to_string(),
                image: Some(ImageVolumeSource {
                    reference: Some(shape.agent_image.clone()),
                    pull_policy: Some("IfNotPresent".to_string()),
                }),
                ..Volume::default()
            },
        ),
        AgentInjection::InitContainer => (
            Some(Container {
                name: INSTALL_CONTAINER.to_string(),
                image: Some(shape.agent_image.clone()),
                command: Some(vec![
                    "/orchard-agent".to_string(),
                    "install".to_string(),
                    AGENT_DIR.to_string(),
                ]),
                volume_mounts: Some(vec![VolumeMount {
                    name: AGENT_VOLUME.to_string(),
                    mount_path: AGENT_DIR.to_string(),
                    ..VolumeMount::default()
                }]),
                // The task container's own budget: a pod reserves the larger of its init container
                // and its app containers, so a fixed install budget above a small sandbox's would
                // reserve more than the sandbox asked for (50m for a 5m sandbox: ten times fewer
                // sandboxes per node). Without its GPUs: copying a file needs none, and a device
                // plugin would otherwise allocate devices to it too.
                resources: Some(without_resource(task_resources, &shape.gpu.resource)),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    read_only_root_filesystem: Some(true),
                    run_as_non_root: Some(true),
                    run_as_user: Some(65532),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".to_string()]),
                        ..Capabilities::default()
                    }),
                    ..SecurityContext::default()
                }),
                ..Container::default()
            }),
            Volume {
                name: AGENT_VOLUME.to_string(),
                empty_dir: Some(EmptyDirVolumeSource {
                    size_limit: Some(Quantity("64Mi".to_string())),
                    ..EmptyDirVolumeSource::default()
                }),
                ..Volume::default()
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plumbing::ownership::sealed;
    use crate::pod::fixtures::*;
    use crate::pod::policy::desired_egress_policy;
    use orchard_api::EgressPolicy;
    use orchard_api::ROLLOUT_GROUP_LABEL;
    use orchard_api::ROLLOUT_QUEUE_LABEL;
    use orchard_api::SANDBOX_LABEL;
    use orchard_api::SANDBOX_POD_LABEL;
    use orchard_api::STRIDE_LABEL;
    use orchard_api::{
        EnvVar as SandboxEnv, ImagePullPolicy, NetworkSpec, SandboxResources, SecretName,
        StartupSpec,
    };

    #[test]
    fn pod_injects_the_agent_through_an_init_container() {
        let pod = desired_pod(&minimal(), &owner(), &shape(), &credentials(), &key());
        let spec = pod.spec.as_ref().unwrap();
        let init = &spec.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            init.image.as_deref(),
            Some("ghcr.io/orchard-env/orchard-agent:test")
        );
        assert_eq!(
            init.command.as_ref().unwrap(),
            &["/orchard-agent", "install", "/opt/orchard",]
        );
        let task = &spec.containers[0];
        assert_eq!(task.image.as_deref(), Some("python:3.11"));
        assert_eq!(
            task.command.as_ref().unwrap(),
            &["/opt/orchard/orchard-agent", "serve"]
        );
        assert_eq!(
            env_value(&pod, "ORCHARD_AGENT_LISTEN").as_deref(),
            Some("[::]:9090")
        );
        let probe = task
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(probe.path.as_deref(), Some("/healthz"));
        assert_eq!(probe.port, IntOrString::String("agent".into()));
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 1);
        assert!(volumes[0].empty_dir.is_some());
    }

    #[test]
    fn an_image_volume_brings_the_agent_without_an_init_container() {
        let by_volume = PodShape {
            agent_injection: AgentInjection::ImageVolume,
            ..shape()
        };
        let pod = desired_pod(&minimal(), &owner(), &by_volume, &credentials(), &key());
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.init_containers, None);
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 1);
        let image = volumes[0].image.as_ref().expect("an image volume");
        assert_eq!(
            image.reference.as_deref(),
            Some("ghcr.io/orchard-env/orchard-agent:test")
        );
        assert_eq!(image.pull_policy.as_deref(), Some("IfNotPresent"));
        assert!(volumes[0].empty_dir.is_none());
        let task = &spec.containers[0];
        assert_eq!(
            task.command.as_ref().unwrap(),
            &["/opt/orchard/orchard-agent", "serve"]
        );
        let mount = &task.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (
                mount.name.as_str(),
                mount.mount_path.as_str(),
                mount.read_only
            ),
            (volumes[0].name.as_str(), "/opt/orchard", Some(true))
        );
        // Everything else is the init-container pod's.
        let classic = desired_pod(&minimal(), &owner(), &shape(), &credentials(), &key());
        assert_eq!(classic.spec.as_ref().unwrap().containers, spec.containers);
    }

    #[test]
    fn the_pod_carries_the_tokens_hash_and_nonce_and_never_the_token() {
        let key = crate::plumbing::operator_key::OperatorKey::new(&[5; 32]).unwrap();
        let credentials = crate::pod::token::credentials(&key, "ns", "s1", "abcd");
        let pod = desired_pod(&minimal(), &owner(), &shape(), &credentials, &key);
        assert_eq!(
            env_value(&pod, "ORCHARD_AGENT_TOKEN_SHA256"),
            Some(credentials.verifier.clone())
        );
        let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
        assert!(annotations.remove(orchard_api::SEAL_ANNOTATION).is_some());
        assert_eq!(annotations, credentials.annotations());
        let token = crate::pod::token::token_of(&key, &pod).unwrap();
        let text = serde_json::to_string(&pod).unwrap();
        assert!(
            !text.contains(&token),
            "the token itself is nowhere in the pod"
        );
        let spec = pod.spec.as_ref().unwrap();
        assert!(
            spec.volumes.iter().flatten().all(|v| v.secret.is_none()),
            "no Secret volume"
        );
        assert!(
            env_value(&pod, "ORCHARD_AGENT_TOKEN").is_none()
                && env_value(&pod, "ORCHARD_AGENT_TOKEN_FILE").is_none()
        );
    }

    #[test]
    fn pod_is_hardened_and_owned() {
        let pod = desired_pod(&minimal(), &owner(), &shape(), &credentials(), &key());
        assert_eq!(
            pod.metadata.owner_references.as_ref().unwrap(),
            &vec![owner()]
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(SANDBOX_LABEL).map(String::as_str), Some("s1"));
        assert_eq!(
            labels.get(SANDBOX_POD_LABEL).map(String::as_str),
            Some("true")
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(
            spec.security_context
                .as_ref()
                .unwrap()
                .seccomp_profile
                .as_ref()
                .unwrap()
                .type_,
            "RuntimeDefault"
        );
        for container in spec
            .containers
            .iter()
            .chain(spec.init_containers.as_ref().unwrap())
        {
            assert_eq!(
                container
                    .security_context
                    .as_ref()
                    .unwrap()
                    .allow_privilege_escalation,
                Some(false),
                "{}",
                container.name
            );
        }
    }

    #[test]
    fn resources_default_and_requests_equal_limits() {
        let pod = desired_pod(&minimal(), &owner(), &shape(), &credentials(), &key());
        let spec = pod.spec.unwrap();
        let resources = spec.containers[0].resources.clone().unwrap();
        assert_eq!(resources.requests, resources.limits);
        assert_eq!(
            spec.init_containers.unwrap()[0].resources.as_ref(),
            Some(&resources),
            "the install container reserves nothing beyond the sandbox's own budget"
        );
        let limits = resources.limits.unwrap();
        assert_eq!(limits["cpu"], Quantity("1".into()));
        assert_eq!(limits["memory"], Quantity("2Gi".into()));
        assert!(!limits.contains_key("ephemeral-storage"));

        let custom = sandbox(SandboxSpec {
            image: "x".into(),
            resources: Some(SandboxResources {
                cpu: Some(Quantity("250m".into())),
                memory: None,
                ephemeral_storage: Some(Quantity("5Gi".into())),
                gpu: None,
            }),
            ..SandboxSpec::default()
        });
        let resources = resource_requirements(&custom.spec, &shape());
        assert_eq!(resources.requests, resources.limits);
        let limits = resources.limits.unwrap();
        assert_eq!(limits["cpu"], Quantity("250m".into()));
        assert_eq!(limits["memory"], Quantity("2Gi".into()));
        assert_eq!(limits["ephemeral-storage"], Quantity("5Gi".into()));
    }

    #[test]
    fn pods_tolerate_a_lost_node_for_node_lost_seconds_unless_the_spec_says_otherwise() {
        let lost = PodShape {
            node_lost_seconds: Some(30),
            ..shape()
        };
        let keys = |s: &Sandbox| {
            desired_pod(s, &owner(), &lost, &credentials(), &key())
                .spec
                .and_then(|p| p.tolerations)
                .unwrap_or_default()
                .into_iter()
                .map(|t| (t.key.unwrap_or_default(), t.toleration_seconds))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys(&minimal()),
            [
                ("node.kubernetes.io/unreachable".to_string(), Some(30)),
                ("node.kubernetes.io/not-ready".to_string(), Some(30)),
            ]
        );
        let mut own = minimal();
        own.spec.tolerations = vec![Toleration {
            key: Some("node.kubernetes.io/unreachable".into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(600),
            value: None,
        }];
        assert_eq!(
            keys(&own),
            [
                ("node.kubernetes.io/unreachable".to_string(), Some(600)),
                ("node.kubernetes.io/not-ready".to_string(), Some(30)),
            ]
        );
        let plain = desired_pod(&minimal(), &owner(), &shape(), &credentials(), &key());
        assert_eq!(plain.spec.and_then(|p| p.tolerations), None);
    }

    #[test]
    fn a_gpu_sandbox_requests_its_gpus_tolerates_gpu_nodes_and_picks_any_listed_type() {
        let gpu_shape = PodShape {
            gpu: crate::pod::gpu::shape_from_flags(&crate::pod::gpu::GpuFlags {
                gpu_types: vec![
                    "h100=nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3".into(),
                    "a100=nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB".into(),
                ],
                ..Default::default()
            })
            .expect("flags"),
            ..shape()
        };
        let mut s = minimal();
        s.spec.node_selector = BTreeMap::from([("pool".into(), "gpu".into())]);
        s.spec.resources = serde_json::from_value(serde_json::json!({
            "memory": "8Gi", "gpu": {"count": 2, "types": ["H100", "a100"]}
        }))
        .expect("resources JSON");
        let pod = desired_pod(&s, &owner(), &gpu_shape, &credentials(), &key());
        let spec = pod.spec.expect("spec");
        let task = spec.containers[0].resources.clone().expect("resources");
        assert_eq!(task.requests, task.limits);
        let limits = task.limits.expect("limits");
        assert_eq!(limits["nvidia.com/gpu"], Quantity("2".into()));
        assert_eq!(limits["memory"], Quantity("8Gi".into()));
        assert_eq!(limits["cpu"], Quantity("1".into()));
        let install = spec.init_containers.clone().expect("install")[0]
            .resources
            .clone()
            .expect("install resources");
        for amounts in [
            install.limits.expect("limits"),
            install.requests.expect("requests"),
        ] {
            assert!(!amounts.contains_key("nvidia.com/gpu"), "{amounts:?}");
            assert_eq!(amounts["memory"], Quantity("8Gi".into()));
        }
        assert_eq!(
            serde_json::to_value(&spec.tolerations).expect("JSON"),
            serde_json::json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
        );
        assert_eq!(
            serde_json::to_value(&spec.affinity).expect("JSON"),
            serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-SXM4-80GB"]}]},
                {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]}
            ]}}})
        );
        assert_eq!(
            spec.node_selector,
            Some(BTreeMap::from([("pool".into(), "gpu".into())])),
            "the node selector stays as it is"
        );
        // Without GPUs: none of it.
        let plain = desired_pod(&minimal(), &owner(), &gpu_shape, &credentials(), &key())
            .spec
            .expect("spec");
        assert_eq!(plain.affinity, None);
        assert_eq!(plain.tolerations, None);
        let limits = plain.containers[0]
            .resources
            .clone()
            .expect("r")
            .limits
            .expect("l");
        assert!(!limits.contains_key("nvidia.com/gpu"));
        // Any type, another vendor's resource, no toleration.
        let mut any = minimal();
        any.spec.resources =
            serde_json::from_value(serde_json::json!({"gpu": {"count": 1}})).expect("JSON");
        let amd = PodShape {
            gpu: crate::pod::gpu::GpuShape {
                resource: "amd.com/gpu".into(),
                toleration: false,
                ..Default::default()
            },
            ..shape()
        };
        let spec = desired_pod(&any, &owner(), &amd, &credentials(), &key())
            .spec
            .expect("spec");
        let limits = spec.containers[0]
            .resources
            .clone()
            .expect("r")
            .limits
            .expect("l");
        assert_eq!(limits["amd.com/gpu"], Quantity("1".into()));
        assert_eq!(spec.affinity, None);
        assert_eq!(spec.tolerations, None);
    }

    #[test]
    fn scheduling_fields_pass_through() {
        let spec = SandboxSpec {
            image: "x".into(),
            image_pull_policy: Some(ImagePullPolicy::IfNotPresent),
            image_pull_secrets: vec![SecretName {
                name: "regcred".into(),
            }],
            runtime_class_name: Some("gvisor".into()),
            node_selector: BTreeMap::from([("pool".into(), "sandbox".into())]),
            tolerations: vec![Toleration {
                key: Some("sandbox".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Toleration::default()
            }],
            priority_class_name: Some("rollouts".into()),
            working_dir: Some("/workspace".into()),
            ..SandboxSpec::default()
        };
        let pod = desired_pod(&sandbox(spec), &owner(), &shape(), &credentials(), &key());
        let pod_spec = pod.spec.unwrap();
        assert_eq!(pod_spec.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(pod_spec.node_selector.unwrap()["pool"], "sandbox");
        assert_eq!(
            pod_spec.tolerations.unwrap()[0].key.as_deref(),
            Some("sandbox")
        );
        assert_eq!(pod_spec.priority_class_name.as_deref(), Some("rollouts"));
        assert_eq!(pod_spec.image_pull_secrets.unwrap()[0].name, "regcred");
        assert_eq!(
            pod_spec.containers[0].image_pull_policy.as_deref(),
            Some("IfNotPresent")
        );
        assert_eq!(
            pod_spec.containers[0].working_dir.as_deref(),
            Some("/workspace")
        );
    }

    #[test]
    fn user_env_cannot_override_agent_settings_and_startup_is_passed() {
        let spec = SandboxSpec {
            image: "x".into(),
            env: vec![
                SandboxEnv {
                    name: "TASK".into(),
                    value: "fix-bug".into(),
                },
                SandboxEnv {
                    name: "ORCHARD_AGENT_TOKEN".into(),
                    value: "stolen".into(),
                },
            ],
            startup: Some(StartupSpec {
                command: vec!["/usr/bin/Xvfb".into(), ":1".into()],
            }),
            ..SandboxSpec::default()
        };
        let pod = desired_pod(&sandbox(spec), &owner(), &shape(), &credentials(), &key());
        assert_eq!(env_value(&pod, "TASK").as_deref(), Some("fix-bug"));
        assert_eq!(env_value(&pod, "ORCHARD_AGENT_TOKEN"), None);
        assert_eq!(env_value(&pod, "ORCHARD_SANDBOX").as_deref(), Some("s1"));
        assert_eq!(
            env_value(&pod, "ORCHARD_AGENT_STARTUP").as_deref(),
            Some(r#"{"argv":["/usr/bin/Xvfb",":1"]}"#)
        );
    }

    #[test]
    fn the_agent_is_told_its_canaries_only_when_its_policies_deny_them() {
        let canary: std::net::SocketAddr = "10.250.0.1:6443".parse().expect("address");
        let gated = PodShape {
            policy_canaries: PolicyCanaries {
                addresses: vec![canary],
                denied_to_open_egress: false,
            },
            ..shape()
        };
        let with_egress = |egress: EgressPolicy| {
            let mut s = minimal();
            s.spec.network = Some(NetworkSpec {
                egress,
                ..NetworkSpec::default()
            });
            s
        };
        let deny = desired_pod(&minimal(), &owner(), &gated, &credentials(), &key());
        assert_eq!(
            env_value(&deny, CANARY_VARIABLE).as_deref(),
            Some("10.250.0.1:6443")
        );
        // --egress-allow-api-server: an AllowAll sandbox may reach the API server; nothing to probe.
        let open = desired_pod(
            &with_egress(EgressPolicy::AllowAll),
            &owner(),
            &gated,
            &credentials(),
            &key(),
        );
        assert_eq!(env_value(&open, CANARY_VARIABLE), None);
        // Enforcement not awaited: no variable at all.
        let off = desired_pod(&minimal(), &owner(), &shape(), &credentials(), &key());
        assert_eq!(env_value(&off, CANARY_VARIABLE), None);
        // A user's variable of the same name never reaches the agent.
        let mut spoofed = minimal();
        spoofed.spec.env.push(SandboxEnv {
            name: CANARY_VARIABLE.into(),
            value: "127.0.0.1:1".into(),
        });
        let pod = desired_pod(&spoofed, &owner(), &shape(), &credentials(), &key());
        assert_eq!(env_value(&pod, CANARY_VARIABLE), None);
    }

    #[test]
    fn group_labels_are_copied_onto_the_children_of_sealed_trajectories_only() {
        let mut s = minimal();
        s.metadata.labels = Some(BTreeMap::from([
            (ROLLOUT_GROUP_LABEL.into(), "g".into()),
            (STRIDE_LABEL.into(), "1".into()),
            (ROLLOUT_QUEUE_LABEL.into(), "q".into()),
            ("unrelated".into(), "x".into()),
        ]));
        // A Sandbox somebody labelled so themselves, even with a controller reference to a group:
        // its Pod holds no queue slot.
        s.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "orchard.dev/v1alpha1".into(),
            kind: "RolloutGroup".into(),
            name: "g".into(),
            uid: "uid-g".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        for sandbox in [minimal_with_labels(&s), s.clone()] {
            let pod = desired_pod(&sandbox, &owner(), &shape(), &credentials(), &key());
            let labels = pod.metadata.labels.unwrap();
            for label in [ROLLOUT_GROUP_LABEL, STRIDE_LABEL, ROLLOUT_QUEUE_LABEL] {
                assert!(!labels.contains_key(label), "{label}: {labels:?}");
            }
        }
        // A trajectory the operator created for its group (sealed for the group).
        seal(&mut s, &key());
        let pod = desired_pod(&s, &owner(), &shape(), &credentials(), &key());
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels[ROLLOUT_GROUP_LABEL], "g");
        assert_eq!(labels[STRIDE_LABEL], "1");
        assert_eq!(labels[ROLLOUT_QUEUE_LABEL], "q");
        assert!(!labels.contains_key("unrelated"));
    }

    #[test]
    fn pods_and_egress_policies_are_sealed_for_their_owner() {
        let k = key();
        let pod = desired_pod(&minimal(), &owner(), &shape(), &credentials(), &k);
        assert_eq!(sealed(&pod, &k), Some("uid-1"));
        assert_eq!(
            pod.metadata.annotations.as_ref().unwrap()[orchard_api::SEAL_ANNOTATION],
            k.seal("Pod", "ns", "s1", "uid-1")
        );
        let mut allow_all = minimal();
        allow_all.spec.network = Some(NetworkSpec {
            egress: EgressPolicy::AllowAll,
            allow: vec![],
            ..NetworkSpec::default()
        });
        let policy = desired_egress_policy(&allow_all, &owner(), &policy_shape(), &k)
            .expect("AllowAll has a policy");
        assert_eq!(sealed(&policy, &k), Some("uid-1"));
        assert_eq!(
            policy.metadata.annotations.as_ref().unwrap()[orchard_api::SEAL_ANNOTATION],
            k.seal("NetworkPolicy", "ns", "s1-egress", "uid-1")
        );
    }

    #[test]
    fn the_default_profile_keeps_the_image_user_and_forbids_escalation() {
        let pod = desired_pod(&minimal(), &owner(), &shape(), &credentials(), &key());
        let spec = pod.spec.expect("spec");
        let pod_security = spec.security_context.expect("pod securityContext");
        assert_eq!(pod_security.run_as_non_root, None);
        assert_eq!(pod_security.run_as_user, None);
        assert_eq!(
            pod_security.seccomp_profile.map(|p| p.type_).as_deref(),
            Some("RuntimeDefault")
        );
        let task = spec.containers[0].security_context.clone().expect("task");
        assert_eq!(task.allow_privilege_escalation, Some(false));
        assert_eq!(task.privileged, None);
        assert_eq!(task.run_as_non_root, None);
    }

    #[test]
    fn the_default_profile_drops_raw_sockets_and_other_capabilities_no_task_needs() {
        let spec = desired_pod(&minimal(), &owner(), &shape(), &credentials(), &key())
            .spec
            .expect("spec");
        let task = spec.containers[0].security_context.clone().expect("task");
        let capabilities = task.capabilities.expect("capabilities");
        assert_eq!(
            capabilities.drop,
            Some(vec![
                "NET_RAW".to_string(),
                "MKNOD".to_string(),
                "AUDIT_WRITE".to_string(),
                "SETFCAP".to_string()
            ])
        );
        // Pod Security `baseline` refuses any capability added beyond its list; none is added.
        assert_eq!(capabilities.add, None);
        // What root tasks need to install packages and switch users stays.
        for kept in [
            "CHOWN",
            "DAC_OVERRIDE",
            "FOWNER",
            "FSETID",
            "SETUID",
            "SETGID",
            "KILL",
            "NET_BIND_SERVICE",
            "SYS_CHROOT",
            "SETPCAP",
        ] {
            assert!(
                !capabilities.drop.iter().flatten().any(|c| c == kept),
                "{kept}"
            );
        }
    }

    #[test]
    fn the_restricted_profile_is_what_pod_security_restricted_admits() {
        for (security, uid, gid) in [
            (
                orchard_api::SecuritySpec {
                    profile: Some(SecurityProfile::Restricted),
                    ..Default::default()
                },
                RESTRICTED_DEFAULT_UID,
                RESTRICTED_DEFAULT_UID,
            ),
            (
                orchard_api::SecuritySpec {
                    profile: Some(SecurityProfile::Restricted),
                    run_as_user: Some(1000),
                    run_as_group: Some(100),
                },
                1000,
                100,
            ),
        ] {
            let mut s = minimal();
            s.spec.security = Some(security);
            let spec = desired_pod(&s, &owner(), &shape(), &credentials(), &key())
                .spec
                .expect("spec");
            let pod_security = spec.security_context.expect("pod securityContext");
            assert_eq!(pod_security.run_as_non_root, Some(true));
            assert_eq!(pod_security.run_as_user, Some(uid));
            assert_eq!(pod_security.run_as_group, Some(gid));
            assert_eq!(
                pod_security.seccomp_profile.map(|p| p.type_).as_deref(),
                Some("RuntimeDefault")
            );
            for container in spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
            {
                let c = container
                    .security_context
                    .clone()
                    .expect("container securityContext");
                assert_eq!(
                    c.allow_privilege_escalation,
                    Some(false),
                    "{}",
                    container.name
                );
                assert_eq!(
                    c.capabilities.and_then(|c| c.drop),
                    Some(vec!["ALL".to_string()]),
                    "{}",
                    container.name
                );
                assert_ne!(c.run_as_user, Some(0), "{}", container.name);
            }
        }
    }

    #[test]
    fn the_operator_default_profile_applies_when_the_spec_sets_none() {
        let mut restricted = shape();
        restricted.default_security_profile = SecurityProfile::Restricted;
        let spec = desired_pod(&minimal(), &owner(), &restricted, &credentials(), &key())
            .spec
            .expect("spec");
        assert_eq!(
            spec.security_context.and_then(|c| c.run_as_non_root),
            Some(true)
        );
        let mut s = minimal();
        s.spec.security = Some(orchard_api::SecuritySpec {
            profile: Some(SecurityProfile::Default),
            ..Default::default()
        });
        let spec = desired_pod(&s, &owner(), &restricted, &credentials(), &key())
            .spec
            .expect("spec");
        assert_eq!(spec.security_context.and_then(|c| c.run_as_non_root), None);
    }

    #[test]
    fn the_task_container_names_the_egress_proxy_unless_the_user_did() {
        let with_proxy = PodShape {
            egress_proxy_url: Some("http://10.0.0.40:3128".into()),
            ..shape()
        };
        let mut sandbox = minimal();
        sandbox.spec.env.push(SandboxEnv {
            name: "NO_PROXY".into(),
            value: "localhost,10.9.0.0/16".into(),
        });
        let pod = desired_pod(&sandbox, &owner(), &with_proxy, &credentials(), &key());
        for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            assert_eq!(
                env_value(&pod, name).as_deref(),
                Some("http://10.0.0.40:3128"),
                "{name}"
            );
        }
        assert_eq!(env_value(&pod, "no_proxy").as_deref(), Some(NO_PROXY));
        assert_eq!(
            env_value(&pod, "NO_PROXY").as_deref(),
            Some("localhost,10.9.0.0/16"),
            "the user's own"
        );
        let without = desired_pod(&minimal(), &owner(), &shape(), &credentials(), &key());
        assert_eq!(env_value(&without, "HTTPS_PROXY"), None);
    }
}
