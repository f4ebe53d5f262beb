//! What a pool's template means for the Sandboxes that name the pool (pure): the spec a Sandbox runs
//! with (its own fields, the template's where it leaves them unset), the part of a spec that shapes
//! the Pod, its stable hash (stamped on every member), and which pod-shaping fields differ.

use crate::plumbing::cached_pod::CachedPod;
use k8s_openapi::api::core::v1::Pod;
use orchard_api::{LifecycleSpec, NetworkSpec, POOL_DEFAULTS_ANNOTATION, SandboxSpec};
use serde::{Deserialize, Serialize};

/// A pool template's defaults that do not shape the Pod, recorded on the Pod of a sandbox of the pool
/// (annotation `orchard.dev/pool-defaults`) when it claims a member or starts cold.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct PoolDefaults {
    /// The template's `network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkSpec>,
    /// The template's `lifecycle`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<LifecycleSpec>,
}

/// The defaults of `template`.
pub fn defaults_of(template: &SandboxSpec) -> PoolDefaults {
    PoolDefaults {
        network: template.network.clone(),
        lifecycle: template.lifecycle.clone(),
    }
}

/// `defaults` as the annotation's value.
pub fn defaults_annotation(defaults: &PoolDefaults) -> String {
    serde_json::to_string(defaults).unwrap_or_else(|_| "{}".into())
}

/// Records `defaults` on `pod` (a cold start from a pool).
pub fn record_defaults(pod: &mut Pod, defaults: &PoolDefaults) {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            POOL_DEFAULTS_ANNOTATION.to_string(),
            defaults_annotation(defaults),
        );
}

/// The defaults `pod` recorded; `None` if it recorded none (or they do not parse: then the live
/// template's apply).
pub fn recorded_defaults(pod: &CachedPod) -> Option<PoolDefaults> {
    let text = pod
        .metadata
        .annotations
        .as_ref()?
        .get(POOL_DEFAULTS_ANNOTATION)?;
    serde_json::from_str(text).ok()
}

/// `spec` with every field it leaves unset taken from the pool's `template` (`run`, `pool` and
/// `whenPoolEmpty` are the Sandbox's own: a template has none).
pub fn effective_spec(spec: &SandboxSpec, template: &SandboxSpec) -> SandboxSpec {
    fn pick<T: Clone>(own: &Option<T>, template: &Option<T>) -> Option<T> {
        own.clone().or_else(|| template.clone())
    }
    fn pick_vec<T: Clone>(own: &[T], template: &[T]) -> Vec<T> {
        if own.is_empty() { template } else { own }.to_vec()
    }
    // The image comes from one place: the sandbox's own `image` or `fromSnapshot` (mutually
    // exclusive), else the template's.
    let own_image = !spec.image.is_empty() || spec.from_snapshot.is_some();
    let source = if own_image { spec } else { template };
    SandboxSpec {
        image: source.image.clone(),
        from_snapshot: source.from_snapshot.clone(),
        image_pull_policy: pick(&spec.image_pull_policy, &template.image_pull_policy),
        image_pull_secrets: pick_vec(&spec.image_pull_secrets, &template.image_pull_secrets),
        resources: pick(&spec.resources, &template.resources),
        env: pick_vec(&spec.env, &template.env),
        working_dir: pick(&spec.working_dir, &template.working_dir),
        network: pick(&spec.network, &template.network),
        lifecycle: pick(&spec.lifecycle, &template.lifecycle),
        runtime_class_name: pick(&spec.runtime_class_name, &template.runtime_class_name),
        node_selector: if spec.node_selector.is_empty() {
            template.node_selector.clone()
        } else {
            spec.node_selector.clone()
        },
        tolerations: pick_vec(&spec.tolerations, &template.tolerations),
        priority_class_name: pick(&spec.priority_class_name, &template.priority_class_name),
        startup: pick(&spec.startup, &template.startup),
        run: spec.run.clone(),
        security: pick(&spec.security, &template.security),
        pool: spec.pool.clone(),
        when_pool_empty: spec.when_pool_empty,
        retry: spec.retry.clone(),
    }
}

/// The fields of `spec` that shape a sandbox's Pod (everything a running Pod cannot change); the
/// others (`network`, `lifecycle`, `run`, `pool`, `whenPoolEmpty`, `retry`) are cleared. GPU types are
/// written as the Pod uses them (lower-case, sorted, each once): `[H100, a100]` and `[a100, h100]`
/// make the same Pod.
pub fn pod_shaping(spec: &SandboxSpec) -> SandboxSpec {
    let mut resources = spec.resources.clone();
    if let Some(gpu) = resources.as_mut().and_then(|r| r.gpu.as_mut()) {
        gpu.types = gpu.type_names().into_iter().collect();
    }
    SandboxSpec {
        network: None,
        lifecycle: None,
        run: None,
        pool: None,
        when_pool_empty: None,
        retry: None,
        resources,
        ..spec.clone()
    }
}

/// A stable 16-hex-digit hash of the pod-shaping fields of `spec` (FNV-1a over their canonical JSON:
/// the same on every replica and every version of the operator, unlike std's hasher).
pub fn template_hash(spec: &SandboxSpec) -> String {
    let canonical = serde_json::to_vec(&pod_shaping(spec)).unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in canonical {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The pod-shaping fields in which `effective` differs from `template`, by their API names (empty:
/// a member of the pool is this sandbox's Pod).
pub fn mismatches(effective: &SandboxSpec, template: &SandboxSpec) -> Vec<&'static str> {
    let (a, b) = (pod_shaping(effective), pod_shaping(template));
    let mut fields = Vec::new();
    let mut differs = |name: &'static str, same: bool| {
        if !same {
            fields.push(name);
        }
    };
    differs("image", a.image == b.image);
    differs("fromSnapshot", a.from_snapshot == b.from_snapshot);
    differs(
        "imagePullPolicy",
        a.image_pull_policy == b.image_pull_policy,
    );
    differs(
        "imagePullSecrets",
        a.image_pull_secrets == b.image_pull_secrets,
    );
    differs("resources", a.resources == b.resources);
    differs("env", a.env == b.env);
    differs("workingDir", a.working_dir == b.working_dir);
    differs(
        "runtimeClassName",
        a.runtime_class_name == b.runtime_class_name,
    );
    differs("nodeSelector", a.node_selector == b.node_selector);
    differs("tolerations", a.tolerations == b.tolerations);
    differs(
        "priorityClassName",
        a.priority_class_name == b.priority_class_name,
    );
    differs("startup", a.startup == b.startup);
    differs("security", a.security == b.security);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::{
        EgressPolicy, EnvVar, LifecycleSpec, NetworkSpec, PoolFallback, RunSpec, SecurityProfile,
        SecuritySpec,
    };

    fn template() -> SandboxSpec {
        SandboxSpec {
            image: "python:3.11".into(),
            env: vec![EnvVar {
                name: "A".into(),
                value: "1".into(),
            }],
            network: Some(NetworkSpec {
                egress: EgressPolicy::AllowAll,
                allow: vec![],
                ..NetworkSpec::default()
            }),
            lifecycle: Some(LifecycleSpec {
                ttl_seconds: Some(600),
                heartbeat_timeout_seconds: None,
            }),
            ..SandboxSpec::default()
        }
    }

    #[test]
    fn unset_fields_come_from_the_template_and_set_ones_win() {
        let own = SandboxSpec {
            pool: Some("p".into()),
            when_pool_empty: Some(PoolFallback::Wait),
            network: Some(NetworkSpec::default()),
            run: Some(RunSpec {
                command: vec!["true".into()],
                timeout_seconds: 5,
                result_path: "/r".into(),
            }),
            ..SandboxSpec::default()
        };
        let effective = effective_spec(&own, &template());
        assert_eq!(effective.image, "python:3.11");
        assert_eq!(effective.env, template().env);
        assert_eq!(effective.lifecycle, template().lifecycle, "a default");
        assert_eq!(effective.network, Some(NetworkSpec::default()), "its own");
        assert_eq!(effective.run, own.run);
        assert_eq!(effective.pool.as_deref(), Some("p"));
        assert_eq!(effective.when_pool_empty, Some(PoolFallback::Wait));
        assert!(mismatches(&effective, &template()).is_empty());
        assert_eq!(template_hash(&effective), template_hash(&template()));
    }

    #[test]
    fn a_differing_pod_field_is_named_and_changes_the_hash() {
        let own = SandboxSpec {
            image: "busybox".into(),
            security: Some(SecuritySpec {
                profile: Some(SecurityProfile::Restricted),
                ..SecuritySpec::default()
            }),
            pool: Some("p".into()),
            ..SandboxSpec::default()
        };
        let effective = effective_spec(&own, &template());
        assert_eq!(
            mismatches(&effective, &template()),
            vec!["image", "security"]
        );
        assert_ne!(template_hash(&effective), template_hash(&template()));
    }

    #[test]
    fn gpus_are_resources_and_the_types_spelling_and_order_do_not_matter() {
        let with_gpu = |gpu: serde_json::Value| {
            let mut spec = template();
            spec.resources = serde_json::from_value(serde_json::json!({"cpu": "2", "gpu": gpu}))
                .expect("resources JSON");
            spec
        };
        let pool = with_gpu(serde_json::json!({"count": 1, "types": ["h100", "a100"]}));
        let same = with_gpu(serde_json::json!({"count": 1, "types": ["A100", "H100"]}));
        assert!(mismatches(&same, &pool).is_empty());
        assert_eq!(template_hash(&same), template_hash(&pool));
        for other in [
            serde_json::json!({"count": 2, "types": ["h100", "a100"]}),
            serde_json::json!({"count": 1, "types": ["h100"]}),
            serde_json::json!({"count": 1}),
        ] {
            let differs = with_gpu(other.clone());
            assert_eq!(mismatches(&differs, &pool), vec!["resources"], "{other}");
            assert_ne!(template_hash(&differs), template_hash(&pool), "{other}");
        }
        let mut no_gpu = template();
        no_gpu.resources = serde_json::from_value(serde_json::json!({"cpu": "2"})).expect("JSON");
        assert_eq!(mismatches(&no_gpu, &pool), vec!["resources"]);
        // A sandbox that leaves resources unset takes the template's, GPUs included.
        let own = SandboxSpec {
            pool: Some("p".into()),
            ..SandboxSpec::default()
        };
        assert!(mismatches(&effective_spec(&own, &pool), &pool).is_empty());
        // A template without GPUs hashes as before GPUs existed (members keep their hash).
        assert_eq!(
            serde_json::to_string(&pod_shaping(&no_gpu).resources).expect("JSON"),
            r#"{"cpu":"2"}"#
        );
    }

    #[test]
    fn defaults_round_trip_through_the_pod() {
        let mut pod = Pod::default();
        assert_eq!(recorded_defaults(&CachedPod::from(&pod)), None);
        let defaults = defaults_of(&template());
        record_defaults(&mut pod, &defaults);
        assert_eq!(recorded_defaults(&CachedPod::from(&pod)), Some(defaults));
    }

    #[test]
    fn network_lifecycle_and_run_do_not_change_the_hash() {
        let mut other = template();
        other.network = None;
        other.lifecycle = None;
        other.pool = Some("x".into());
        assert_eq!(template_hash(&other), template_hash(&template()));
        assert_eq!(template_hash(&template()).len(), 16);
        other.working_dir = Some("/w".into());
        assert_ne!(template_hash(&other), template_hash(&template()));
    }
}
