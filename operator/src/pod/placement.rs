//! Placement allow-lists (pure): which priority class, tolerations, runtime class, node selector,
//! image pull Secrets and GPU types a Sandbox may ask for. The Pod inherits these fields as given, and the operator
//! (not the user) creates it, so without a check anyone allowed to create a Sandbox could schedule
//! onto control-plane nodes, tolerate every taint, preempt other workloads with a high
//! PriorityClass, or pull with a registry Secret of the namespace they could not name in a Pod of
//! their own (a trainer with only `create sandboxes` through the gateway). A refused spec fails the
//! Sandbox with reason `PlacementRefused` before any of its children is created.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Toleration;
use orchard_api::SandboxSpec;

use crate::pod::gpu::{self, GpuTypes};

/// What a Sandbox may ask of the scheduler. Checked before its Pod is created: a refused spec fails
/// the Sandbox with reason `PlacementRefused` and nothing is created. Lists are comma-separated.
#[derive(clap::Args, Debug, Clone, PartialEq, Default)]
pub struct PlacementPolicy {
    /// PriorityClasses a sandbox may name in `spec.priorityClassName`; empty: none (sandboxes without one are always accepted).
    #[arg(long, env = "ORCHARD_ALLOWED_PRIORITY_CLASSES", default_value = "")]
    pub allowed_priority_classes: String,

    /// Taint keys a sandbox may tolerate; empty: any key except the control-plane ones and the wildcard.
    #[arg(long, env = "ORCHARD_ALLOWED_TOLERATION_KEYS", default_value = "")]
    pub allowed_toleration_keys: String,

    /// Let a sandbox tolerate every taint (a toleration with an empty key and operator `Exists`).
    #[arg(
        long,
        env = "ORCHARD_ALLOW_WILDCARD_TOLERATIONS",
        default_value_t = false
    )]
    pub allow_wildcard_tolerations: bool,

    /// Let a sandbox tolerate or select control-plane nodes (`node-role.kubernetes.io/control-plane` and `node-role.kubernetes.io/master` in `spec.tolerations` or `spec.nodeSelector`).
    #[arg(
        long,
        env = "ORCHARD_ALLOW_CONTROL_PLANE_PLACEMENT",
        default_value_t = false
    )]
    pub allow_control_plane_placement: bool,

    /// RuntimeClasses a sandbox may name in `spec.runtimeClassName`; empty: any.
    #[arg(long, env = "ORCHARD_ALLOWED_RUNTIME_CLASSES", default_value = "")]
    pub allowed_runtime_classes: String,

    /// Node label keys a sandbox may use in `spec.nodeSelector`; empty: any key except the control-plane ones.
    #[arg(long, env = "ORCHARD_ALLOWED_NODE_SELECTOR_KEYS", default_value = "")]
    pub allowed_node_selector_keys: String,

    /// Secrets (comma-separated names) a sandbox may name in `spec.imagePullSecrets`; empty: none. Sandboxes are created for their authors by the operator, so without this list anyone allowed to create a Sandbox (through the gateway too) could pull with any registry Secret of the namespace.
    #[arg(long, env = "ORCHARD_ALLOWED_IMAGE_PULL_SECRETS", default_value = "")]
    pub allowed_image_pull_secrets: String,
}

/// Reason of a Sandbox whose placement the operator refuses.
pub const REASON: &str = "PlacementRefused";

/// Node-role label keys (and taint keys) of control-plane nodes.
pub const CONTROL_PLANE_KEYS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

/// The operator's placement policy, its lists parsed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// PriorityClasses a sandbox may name (empty: none).
    pub priority_classes: BTreeSet<String>,
    /// Taint keys a sandbox may tolerate (empty: any but the refused ones).
    pub toleration_keys: BTreeSet<String>,
    /// The wildcard toleration (empty key, `Exists`) is allowed.
    pub allow_wildcard_tolerations: bool,
    /// Control-plane tolerations and node selectors are allowed.
    pub allow_control_plane: bool,
    /// RuntimeClasses a sandbox may name (empty: any).
    pub runtime_classes: BTreeSet<String>,
    /// Node label keys a sandbox may select on (empty: any but the control-plane ones).
    pub node_selector_keys: BTreeSet<String>,
    /// Secrets a sandbox may name in `spec.imagePullSecrets` (empty: none).
    pub image_pull_secrets: BTreeSet<String>,
    /// GPU types a sandbox may name in `spec.resources.gpu.types` (the operator's GPU type map,
    /// `--gpu-type`; empty: none).
    pub gpu_types: GpuTypes,
}

/// The non-empty trimmed items of a comma-separated list.
fn list(text: &str) -> BTreeSet<String> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_string)
        .collect()
}

impl Placement {
    /// The policy the command line describes.
    pub fn from_policy(policy: &PlacementPolicy) -> Self {
        Self {
            priority_classes: list(&policy.allowed_priority_classes),
            toleration_keys: list(&policy.allowed_toleration_keys),
            allow_wildcard_tolerations: policy.allow_wildcard_tolerations,
            allow_control_plane: policy.allow_control_plane_placement,
            runtime_classes: list(&policy.allowed_runtime_classes),
            node_selector_keys: list(&policy.allowed_node_selector_keys),
            image_pull_secrets: list(&policy.allowed_image_pull_secrets),
            gpu_types: GpuTypes::new(),
        }
    }

    /// This policy with the GPU type map `types`.
    pub fn with_gpu_types(self, types: GpuTypes) -> Self {
        Self {
            gpu_types: types,
            ..self
        }
    }
}

/// How an administrator changes one setting: the flag, its environment variable and the Helm value.
struct Setting {
    flag: &'static str,
    env: &'static str,
    helm: &'static str,
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--{} (env {}, Helm value {})",
            self.flag, self.env, self.helm
        )
    }
}

const PRIORITY_CLASSES: Setting = Setting {
    flag: "allowed-priority-classes",
    env: "ORCHARD_ALLOWED_PRIORITY_CLASSES",
    helm: "placement.allowedPriorityClasses",
};
const TOLERATION_KEYS: Setting = Setting {
    flag: "allowed-toleration-keys",
    env: "ORCHARD_ALLOWED_TOLERATION_KEYS",
    helm: "placement.allowedTolerationKeys",
};
const WILDCARD: Setting = Setting {
    flag: "allow-wildcard-tolerations",
    env: "ORCHARD_ALLOW_WILDCARD_TOLERATIONS",
    helm: "placement.allowWildcardTolerations",
};
const CONTROL_PLANE: Setting = Setting {
    flag: "allow-control-plane-placement",
    env: "ORCHARD_ALLOW_CONTROL_PLANE_PLACEMENT",
    helm: "placement.allowControlPlane",
};
const RUNTIME_CLASSES: Setting = Setting {
    flag: "allowed-runtime-classes",
    env: "ORCHARD_ALLOWED_RUNTIME_CLASSES",
    helm: "placement.allowedRuntimeClasses",
};
const NODE_SELECTOR_KEYS: Setting = Setting {
    flag: "allowed-node-selector-keys",
    env: "ORCHARD_ALLOWED_NODE_SELECTOR_KEYS",
    helm: "placement.allowedNodeSelectorKeys",
};

const IMAGE_PULL_SECRETS: Setting = Setting {
    flag: "allowed-image-pull-secrets",
    env: "ORCHARD_ALLOWED_IMAGE_PULL_SECRETS",
    helm: "placement.allowedImagePullSecrets",
};

/// `a, b` of a list, or `none` when it is empty.
fn shown(items: &BTreeSet<String>) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

fn is_control_plane(key: &str) -> bool {
    CONTROL_PLANE_KEYS.contains(&key)
}

/// Why the priority class is refused, if it is.
fn priority_class(name: Option<&str>, placement: &Placement) -> Option<String> {
    let name = name.filter(|n| !n.is_empty())?;
    (!placement.priority_classes.contains(name)).then(|| {
        format!(
            "spec.priorityClassName {name:?} is not allowed (allowed: {}); add it to {PRIORITY_CLASSES}",
            shown(&placement.priority_classes)
        )
    })
}

/// Why toleration number `index` is refused, if it is.
fn toleration(index: usize, toleration: &Toleration, placement: &Placement) -> Option<String> {
    let key = toleration.key.as_deref().unwrap_or_default();
    let field = format!("spec.tolerations[{index}]");
    if key.is_empty() {
        // An empty key with `Exists` tolerates every taint (the API server refuses any other operator).
        return (!placement.allow_wildcard_tolerations).then(|| {
            format!(
                "{field} (empty key, operator Exists) tolerates every taint, control-plane taints included; allow it with {WILDCARD}"
            )
        });
    }
    if is_control_plane(key) && !placement.allow_control_plane {
        return Some(format!(
            "{field} tolerates the control-plane taint {key:?}; allow it with {CONTROL_PLANE}"
        ));
    }
    let listed = placement.toleration_keys.is_empty()
        || placement.toleration_keys.contains(key)
        || (is_control_plane(key) && placement.allow_control_plane);
    (!listed).then(|| {
        format!(
            "{field} tolerates taint key {key:?}, which is not allowed (allowed: {}); add it to {TOLERATION_KEYS}",
            shown(&placement.toleration_keys)
        )
    })
}

/// Why the runtime class is refused, if it is.
fn runtime_class(name: Option<&str>, placement: &Placement) -> Option<String> {
    let name = name.filter(|n| !n.is_empty())?;
    (!placement.runtime_classes.is_empty() && !placement.runtime_classes.contains(name)).then(
        || {
            format!(
                "spec.runtimeClassName {name:?} is not allowed (allowed: {}); add it to {RUNTIME_CLASSES}",
                shown(&placement.runtime_classes)
            )
        },
    )
}

/// Why selecting nodes by label `key` = `value` is refused, if it is.
fn node_selector(key: &str, value: &str, placement: &Placement) -> Option<String> {
    if is_control_plane(key) && !placement.allow_control_plane {
        return Some(format!(
            "spec.nodeSelector {key:?}={value:?} selects control-plane nodes; allow it with {CONTROL_PLANE}"
        ));
    }
    let listed = placement.node_selector_keys.is_empty()
        || placement.node_selector_keys.contains(key)
        || (is_control_plane(key) && placement.allow_control_plane);
    (!listed).then(|| {
        format!(
            "spec.nodeSelector key {key:?} is not allowed (allowed: {}); add it to {NODE_SELECTOR_KEYS}",
            shown(&placement.node_selector_keys)
        )
    })
}

/// Why image pull Secret number `index`, `name`, is refused, if it is.
fn image_pull_secret(index: usize, name: &str, placement: &Placement) -> Option<String> {
    (!placement.image_pull_secrets.contains(name)).then(|| {
        format!(
            "spec.imagePullSecrets[{index}] {name:?} is not allowed (allowed: {}); add it to {IMAGE_PULL_SECRETS}",
            shown(&placement.image_pull_secrets)
        )
    })
}

/// Every reason the operator refuses the spec's placement, in field order (empty: accepted).
pub fn refusals(spec: &SandboxSpec, placement: &Placement) -> Vec<String> {
    let priority = priority_class(spec.priority_class_name.as_deref(), placement);
    let tolerations = spec
        .tolerations
        .iter()
        .enumerate()
        .filter_map(|(i, t)| toleration(i, t, placement));
    let runtime = runtime_class(spec.runtime_class_name.as_deref(), placement);
    let selectors = spec
        .node_selector
        .iter()
        .filter_map(|(k, v)| node_selector(k, v, placement));
    let pull_secrets = spec
        .image_pull_secrets
        .iter()
        .enumerate()
        .filter_map(|(i, secret)| image_pull_secret(i, &secret.name, placement));
    let gpu_types = gpu::refusal(spec, &placement.gpu_types);
    priority
        .into_iter()
        .chain(tolerations)
        .chain(runtime)
        .chain(selectors)
        .chain(pull_secrets)
        .chain(gpu_types)
        .collect()
}

/// The spec's placement is accepted, or the message of a `PlacementRefused` failure.
pub fn check(spec: &SandboxSpec, placement: &Placement) -> Result<(), String> {
    let refused = refusals(spec, placement);
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the operator refuses this sandbox's placement: {}",
            refused.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        serde_json::from_value(serde_json::json!({"image": "python:3.11"}))
            .expect("a minimal spec parses")
    }

    fn toleration_of(key: &str, operator: &str) -> Toleration {
        Toleration {
            key: Some(key.to_string()).filter(|k| !k.is_empty()),
            operator: Some(operator.to_string()),
            effect: Some("NoSchedule".to_string()),
            ..Toleration::default()
        }
    }

    fn policy(edit: impl FnOnce(&mut PlacementPolicy)) -> Placement {
        let mut policy = PlacementPolicy::default();
        edit(&mut policy);
        Placement::from_policy(&policy)
    }

    #[test]
    fn an_ordinary_spec_passes_the_defaults() {
        let mut spec = spec();
        spec.tolerations = vec![toleration_of("pool", "Exists")];
        spec.node_selector = [("pool".to_string(), "sandboxes".to_string())].into();
        spec.runtime_class_name = Some("gvisor".into());
        assert_eq!(check(&spec, &Placement::default()), Ok(()));
    }

    #[test]
    fn image_pull_secrets_need_the_allow_list() {
        let mut spec = spec();
        spec.image_pull_secrets = serde_json::from_value(serde_json::json!([
            {"name": "regcred"}, {"name": "team-registry"}
        ]))
        .unwrap();
        let refused = check(&spec, &Placement::default()).unwrap_err();
        assert!(
            refused.contains("spec.imagePullSecrets[0] \"regcred\""),
            "{refused}"
        );
        assert!(refused.contains("spec.imagePullSecrets[1] \"team-registry\""));
        assert!(refused.contains("--allowed-image-pull-secrets"));
        assert!(refused.contains("placement.allowedImagePullSecrets"));
        let one = policy(|p| p.allowed_image_pull_secrets = "regcred".into());
        let refused = check(&spec, &one).unwrap_err();
        assert!(!refused.contains("regcred\" is"), "{refused}");
        assert!(refused.contains("team-registry"));
        let both = policy(|p| p.allowed_image_pull_secrets = "regcred, team-registry".into());
        assert_eq!(check(&spec, &both), Ok(()));
    }

    #[test]
    fn priority_classes_need_the_allow_list() {
        let mut spec = spec();
        spec.priority_class_name = Some("system-node-critical".into());
        let refused = check(&spec, &Placement::default()).unwrap_err();
        assert!(refused.contains("spec.priorityClassName \"system-node-critical\""));
        assert!(refused.contains("allowed: none"));
        assert!(refused.contains("--allowed-priority-classes"));
        assert!(refused.contains("placement.allowedPriorityClasses"));
        let allowed = policy(|p| p.allowed_priority_classes = "low, system-node-critical".into());
        assert_eq!(check(&spec, &allowed), Ok(()));
        let other = policy(|p| p.allowed_priority_classes = "low".into());
        assert!(check(&spec, &other).unwrap_err().contains("allowed: low"));
        spec.priority_class_name = Some(String::new());
        assert_eq!(check(&spec, &Placement::default()), Ok(()));
    }

    #[test]
    fn control_plane_tolerations_are_refused_unless_allowed() {
        for key in CONTROL_PLANE_KEYS {
            let mut spec = spec();
            spec.tolerations = vec![
                toleration_of("pool", "Exists"),
                toleration_of(key, "Exists"),
            ];
            let refused = check(&spec, &Placement::default()).unwrap_err();
            assert!(refused.contains("spec.tolerations[1]"), "{refused}");
            assert!(refused.contains(key));
            assert!(refused.contains("--allow-control-plane-placement"));
            let allowed = policy(|p| p.allow_control_plane_placement = true);
            assert_eq!(check(&spec, &allowed), Ok(()));
            // Allowing control-plane placement also passes a key allow-list that does not name it.
            let listed = policy(|p| {
                p.allow_control_plane_placement = true;
                p.allowed_toleration_keys = "pool".into();
            });
            assert_eq!(check(&spec, &listed), Ok(()));
        }
    }

    #[test]
    fn the_wildcard_toleration_is_refused_unless_allowed() {
        let mut spec = spec();
        spec.tolerations = vec![Toleration {
            operator: Some("Exists".into()),
            ..Toleration::default()
        }];
        let refused = check(&spec, &Placement::default()).unwrap_err();
        assert!(refused.contains("spec.tolerations[0] (empty key, operator Exists)"));
        assert!(refused.contains("--allow-wildcard-tolerations"));
        let allowed = policy(|p| p.allow_wildcard_tolerations = true);
        assert_eq!(check(&spec, &allowed), Ok(()));
    }

    #[test]
    fn toleration_keys_follow_the_allow_list() {
        let mut spec = spec();
        spec.tolerations = vec![
            toleration_of("pool", "Equal"),
            toleration_of("gpu", "Exists"),
        ];
        let listed = policy(|p| p.allowed_toleration_keys = "pool".into());
        let refused = check(&spec, &listed).unwrap_err();
        assert!(refused.contains("spec.tolerations[1] tolerates taint key \"gpu\""));
        assert!(refused.contains("allowed: pool"));
        assert!(refused.contains("--allowed-toleration-keys"));
        assert!(!refused.contains("tolerations[0]"));
        let both = policy(|p| p.allowed_toleration_keys = "pool,gpu".into());
        assert_eq!(check(&spec, &both), Ok(()));
    }

    #[test]
    fn runtime_classes_follow_the_allow_list_when_one_is_set() {
        let mut spec = spec();
        spec.runtime_class_name = Some("runc".into());
        assert_eq!(check(&spec, &Placement::default()), Ok(()));
        let listed = policy(|p| p.allowed_runtime_classes = "gvisor,kata".into());
        let refused = check(&spec, &listed).unwrap_err();
        assert!(refused.contains("spec.runtimeClassName \"runc\""));
        assert!(refused.contains("allowed: gvisor, kata"));
        assert!(refused.contains("--allowed-runtime-classes"));
        spec.runtime_class_name = Some("kata".into());
        assert_eq!(check(&spec, &listed), Ok(()));
    }

    #[test]
    fn node_selectors_may_not_pick_control_plane_nodes_and_follow_the_allow_list() {
        let mut spec = spec();
        spec.node_selector = [(CONTROL_PLANE_KEYS[0].to_string(), String::new())].into();
        let refused = check(&spec, &Placement::default()).unwrap_err();
        assert!(refused.contains("spec.nodeSelector \"node-role.kubernetes.io/control-plane\""));
        assert!(refused.contains("--allow-control-plane-placement"));
        let allowed = policy(|p| p.allow_control_plane_placement = true);
        assert_eq!(check(&spec, &allowed), Ok(()));

        spec.node_selector = [("zone".to_string(), "a".to_string())].into();
        let listed = policy(|p| p.allowed_node_selector_keys = "pool".into());
        let refused = check(&spec, &listed).unwrap_err();
        assert!(refused.contains("spec.nodeSelector key \"zone\""));
        assert!(refused.contains("--allowed-node-selector-keys"));
    }

    #[test]
    fn gpu_types_must_be_in_the_operators_map() {
        let mut spec = spec();
        spec.resources = serde_json::from_value(serde_json::json!({
            "gpu": {"count": 1, "types": ["h100", "V100"]}
        }))
        .expect("resources JSON");
        let map = crate::pod::gpu::shape_from_flags(&crate::pod::gpu::GpuFlags {
            gpu_types: vec!["h100=nvidia.com/gpu.product=H100".into()],
            ..Default::default()
        })
        .expect("flags")
        .types;
        let refused = check(&spec, &Placement::default().with_gpu_types(map.clone()))
            .expect_err("v100 is unknown");
        assert!(
            refused.starts_with("the operator refuses this sandbox's placement: spec.resources.gpu.types: unknown GPU type \"v100\" (known: h100)"),
            "{refused}"
        );
        assert!(refused.contains("--gpu-type"), "{refused}");
        spec.resources = serde_json::from_value(serde_json::json!({
            "gpu": {"count": 1, "types": ["H100"]}
        }))
        .expect("resources JSON");
        assert_eq!(
            check(&spec, &Placement::default().with_gpu_types(map)),
            Ok(())
        );
    }

    #[test]
    fn every_refusal_is_reported_at_once() {
        let mut spec = spec();
        spec.priority_class_name = Some("high".into());
        spec.tolerations = vec![toleration_of(CONTROL_PLANE_KEYS[1], "Exists")];
        spec.node_selector = [(CONTROL_PLANE_KEYS[1].to_string(), String::new())].into();
        assert_eq!(refusals(&spec, &Placement::default()).len(), 3);
    }
}
