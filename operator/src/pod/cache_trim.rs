//! What the operator's cache keeps of a sandbox Pod (pure): the parts any controller or the gateway
//! reads, not the whole Pod. The cache holds one Pod per sandbox and pool member, so its size is the
//! operator's memory per sandbox; `make bench-control-plane` measures it (docs/BENCHMARKS.md,
//! "Control plane at scale").
//!
//! Kept: all of `metadata` (labels, annotations, owners, the deletion mark) except managed fields,
//! all of `status`, the node name, and of each container its name, image, resources and the
//! policy-enforcement canary variable ([`CANARY_VARIABLE`]). Dropped: commands, arguments, the rest of
//! the environment, mounts, probes, security contexts, ports, volumes, tolerations and the other
//! scheduling fields the operator writes but never reads back.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::pod::policy_canary::CANARY_VARIABLE;

/// `container` with only its name, image, resources and canary variable.
fn trim_container(container: &mut Container) {
    let kept = Container {
        name: std::mem::take(&mut container.name),
        image: container.image.take(),
        resources: container.resources.take(),
        env: container
            .env
            .take()
            .map(|env| {
                env.into_iter()
                    .filter(|v| v.name == CANARY_VARIABLE)
                    .collect::<Vec<_>>()
            })
            .filter(|env| !env.is_empty()),
        ..Container::default()
    };
    *container = kept;
}

/// Drops from `pod` what no reader of the operator's Pod cache uses (see the module documentation).
pub fn trim_cached_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    for container in spec.containers.iter_mut() {
        trim_container(container);
    }
    for container in spec.init_containers.iter_mut().flatten() {
        trim_container(container);
    }
    spec.volumes = None;
    spec.tolerations = None;
    spec.affinity = None;
    spec.security_context = None;
    spec.dns_config = None;
    spec.host_aliases = None;
    spec.readiness_gates = None;
    spec.topology_spread_constraints = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::health::pod_state_summary;
    use crate::pod::naming::TASK_CONTAINER;
    use crate::pod::oom::memory_limit;
    use crate::pod::policy_canary::awaits_enforcement;
    use serde_json::json;

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "s1", "labels": {"a": "b"}, "annotations": {"n": "1"},
                         "managedFields": [{"manager": "x"}]},
            "spec": {
                "nodeName": "n1",
                "initContainers": [{"name": "install", "image": "agent:1", "command": ["cp"],
                                    "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
                "containers": [{"name": TASK_CONTAINER, "image": "busybox", "command": ["/orchard/agent"],
                                "args": ["serve"],
                                "env": [{"name": "ORCHARD_SANDBOX", "value": "s1"},
                                        {"name": CANARY_VARIABLE, "value": "10.0.0.1:6443"}],
                                "resources": {"limits": {"memory": "2Gi"}},
                                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 9090}},
                                "securityContext": {"runAsUser": 0}}],
                "volumes": [{"name": "v", "emptyDir": {}}],
                "tolerations": [{"key": "k", "operator": "Exists"}],
            },
            "status": {"podIP": "10.64.0.1", "phase": "Pending",
                       "containerStatuses": [{"name": TASK_CONTAINER, "image": "busybox", "imageID": "",
                                              "ready": false, "restartCount": 0,
                                              "state": {"waiting": {"reason": "ErrImagePull", "message": "no"}}}]},
        }))
        .expect("pod JSON")
    }

    #[test]
    fn what_the_readers_use_survives_the_trim() {
        let mut trimmed = pod();
        trim_cached_pod(&mut trimmed);
        let original = pod();
        assert_eq!(trimmed.metadata.labels, original.metadata.labels);
        assert_eq!(trimmed.metadata.annotations, original.metadata.annotations);
        assert_eq!(trimmed.metadata.managed_fields, None);
        assert_eq!(trimmed.status, original.status);
        assert_eq!(
            memory_limit(&trimmed, TASK_CONTAINER),
            Some("2Gi".to_string())
        );
        assert!(awaits_enforcement(&trimmed) && awaits_enforcement(&original));
        assert_eq!(pod_state_summary(&trimmed), pod_state_summary(&original));
        let spec = trimmed.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.containers[0].image.as_deref(), Some("busybox"));
        assert_eq!(
            spec.init_containers.as_ref().expect("init")[0]
                .image
                .as_deref(),
            Some("agent:1")
        );
    }

    #[test]
    fn what_nobody_reads_is_dropped() {
        let mut trimmed = pod();
        trim_cached_pod(&mut trimmed);
        let spec = trimmed.spec.expect("spec");
        let task = &spec.containers[0];
        assert_eq!(task.command, None);
        assert_eq!(task.args, None);
        assert_eq!(task.readiness_probe, None);
        assert_eq!(task.security_context, None);
        assert_eq!(
            task.env.as_ref().map(|e| e.len()),
            Some(1),
            "only the canary"
        );
        assert_eq!(spec.init_containers.expect("init")[0].volume_mounts, None);
        assert_eq!(spec.volumes, None);
        assert_eq!(spec.tolerations, None);
        let size = |p: &Pod| serde_json::to_vec(&p.spec).map(|v| v.len()).unwrap_or(0);
        let mut again = pod();
        trim_cached_pod(&mut again);
        assert!(
            size(&again) * 2 < size(&pod()),
            "the trim halves this pod's spec: {} of {} bytes",
            size(&again),
            size(&pod())
        );
    }
}
