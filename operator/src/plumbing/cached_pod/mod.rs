//! What the operator's cache keeps of a sandbox Pod: [`CachedPod`], decoded straight from the watch,
//! with only the parts any controller or the gateway reads. The cache holds one Pod per sandbox and
//! pool member, so its size is most of the operator's memory per sandbox; `make bench-control-plane`
//! measures both (docs/BENCHMARKS.md, "Control plane at scale").
//!
//! A `CachedPod` has the same field paths as a `Pod` for everything it keeps (`metadata`,
//! `spec.nodeName`, `spec.containers[].name/image/env`, `spec.initContainers[]` alike, `status`), so
//! a reader written against a Pod reads it unchanged; of a container's resources only the memory
//! limit is kept, as `memory_limit`. It is smaller than a trimmed Pod
//! because `PodSpec` and `Container` are large structs of optional fields (1.4 and 2.1 KiB before
//! any of their contents), and because a decoded list of one container status reserves room for four.
//!
//! Kept: all of `metadata` (the watch drops managed fields), the node name, of each container its
//! name, image, memory limit and the policy-enforcement canary variable ([`CANARY_VARIABLE`]), and of
//! the status what [`CachedPodStatus`] keeps ([`status`]). Everything else the operator writes into a
//! Pod (commands, the rest of the environment, mounts, probes, security contexts, ports, volumes,
//! tolerations, scheduling) is never read back.

mod status;

pub use status::{CachedContainerStatus, CachedPodStatus, KEPT_CONDITIONS};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The agent's variable naming its policy-enforcement canaries (comma-separated socket addresses;
/// `pod::policy_canary`): the one variable the cache keeps.
pub const CANARY_VARIABLE: &str = "ORCHARD_AGENT_EGRESS_CANARY";

/// A sandbox Pod as the operator's cache keeps it (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPod {
    /// The Pod's metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What is kept of its spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<CachedPodSpec>,
    /// What is kept of its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CachedPodStatus>,
}

/// What is kept of a Pod's spec.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    /// The node it is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Its containers.
    #[serde(default, deserialize_with = "kept_containers")]
    pub containers: Vec<CachedContainer>,
    /// Its init containers.
    #[serde(
        default,
        deserialize_with = "status::exact_list",
        skip_serializing_if = "Option::is_none"
    )]
    pub init_containers: Option<Vec<CachedContainer>>,
}

/// What is kept of a container.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedContainer {
    /// Its name.
    pub name: String,
    /// Its image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its memory limit as written (`resources.limits.memory`, e.g. `2Gi`): the one resource a
    /// reader uses (`pod::oom`), kept without the two maps of the rest.
    #[serde(
        default,
        rename = "resources",
        deserialize_with = "memory_limit_of",
        serialize_with = "as_resources",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory_limit: Option<String>,
    /// The policy-enforcement canary variable, when it has one (no other variable is kept).
    #[serde(
        default,
        deserialize_with = "canary_only",
        skip_serializing_if = "Option::is_none"
    )]
    pub env: Option<Vec<EnvVar>>,
}

impl k8s_openapi::Resource for CachedPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = NamespaceResourceScope;
}

impl k8s_openapi::Metadata for CachedPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl From<&Pod> for CachedPod {
    /// What the cache would keep of `pod` (for a Pod the API server returned to a write, before the
    /// watch delivers it, and for tests).
    fn from(pod: &Pod) -> Self {
        let containers = |list: &[Container]| list.iter().map(CachedContainer::from).collect();
        let mut metadata = pod.metadata.clone();
        crate::plumbing::watch::trim_metadata(&mut metadata);
        CachedPod {
            metadata,
            spec: pod.spec.as_ref().map(|spec: &PodSpec| CachedPodSpec {
                node_name: spec.node_name.clone(),
                containers: containers(&spec.containers),
                init_containers: spec.init_containers.as_deref().map(containers),
            }),
            status: pod.status.clone().map(CachedPodStatus::from),
        }
    }
}

impl From<&Container> for CachedContainer {
    fn from(container: &Container) -> Self {
        CachedContainer {
            name: container.name.clone(),
            image: container.image.clone(),
            memory_limit: container.resources.as_ref().and_then(limit_of_memory),
            env: container.env.clone().and_then(canary_of),
        }
    }
}

/// The canary variable of `env`, alone, if it is there.
fn canary_of(env: Vec<EnvVar>) -> Option<Vec<EnvVar>> {
    let kept: Vec<EnvVar> = env
        .into_iter()
        .filter(|v| v.name == CANARY_VARIABLE)
        .collect();
    (!kept.is_empty()).then_some(kept)
}

/// The memory limit of `resources`, if one is written.
fn limit_of_memory(resources: &ResourceRequirements) -> Option<String> {
    let limit = resources.limits.as_ref()?.get("memory")?;
    (!limit.0.is_empty()).then(|| limit.0.clone())
}

fn memory_limit_of<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<ResourceRequirements>::deserialize(d)?
        .as_ref()
        .and_then(limit_of_memory))
}

fn as_resources<S: Serializer>(limit: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    let resources = limit.as_ref().map(|limit| ResourceRequirements {
        limits: Some([("memory".to_string(), Quantity(limit.clone()))].into()),
        ..ResourceRequirements::default()
    });
    resources.serialize(s)
}

fn canary_only<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<EnvVar>>, D::Error> {
    Ok(Option::<Vec<EnvVar>>::deserialize(d)?.and_then(canary_of))
}

fn kept_containers<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<CachedContainer>, D::Error> {
    Ok(status::exact_list(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const TASK_CONTAINER: &str = "sandbox";

    fn pod_json() -> serde_json::Value {
        json!({
            "metadata": {"name": "s1", "labels": {"a": "b"}, "annotations": {"n": "1"}},
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
            "status": {"podIP": "10.64.0.1", "podIPs": [{"ip": "10.64.0.1"}], "phase": "Pending",
                       "qosClass": "Guaranteed",
                       "conditions": [{"type": "PodScheduled", "status": "True"}],
                       "containerStatuses": [{"name": TASK_CONTAINER, "image": "busybox", "imageID": "",
                                              "ready": false, "restartCount": 0,
                                              "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                                              "state": {"waiting": {"reason": "ErrImagePull", "message": "no"}}}]},
        })
    }

    fn pod() -> Pod {
        serde_json::from_value(pod_json()).expect("pod JSON")
    }

    fn cached() -> CachedPod {
        serde_json::from_value(pod_json()).expect("cached pod JSON")
    }

    #[test]
    fn the_watch_and_a_written_pod_keep_the_same() {
        assert_eq!(cached(), CachedPod::from(&pod()));
        let written = serde_json::to_value(cached()).expect("JSON");
        assert_eq!(
            written["spec"]["containers"][0]["resources"],
            json!({"limits": {"memory": "2Gi"}})
        );
        let again: CachedPod = serde_json::from_value(written).expect("a cached pod");
        assert_eq!(again, cached(), "what it writes reads back the same");
    }

    #[test]
    fn what_the_readers_use_is_kept() {
        let (cached, original) = (cached(), pod());
        assert_eq!(cached.metadata, original.metadata);
        let spec = cached.spec.as_ref().expect("spec");
        let task = &spec.containers[0];
        assert_eq!(task.name, TASK_CONTAINER);
        assert_eq!(task.memory_limit.as_deref(), Some("2Gi"));
        let canary = &task.env.as_ref().expect("the canary")[0];
        assert_eq!(
            (canary.name.as_str(), canary.value.as_deref()),
            (CANARY_VARIABLE, Some("10.0.0.1:6443"))
        );
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.containers[0].image.as_deref(), Some("busybox"));
        let init = spec.init_containers.as_ref().expect("init");
        assert_eq!(init[0].image.as_deref(), Some("agent:1"));
        let status = cached.status.as_ref().expect("status");
        assert_eq!(status.pod_ip.as_deref(), Some("10.64.0.1"));
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        let task = &status.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(
            task.state,
            original
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c[0].state.clone())
        );
    }

    #[test]
    fn what_nobody_reads_is_dropped() {
        let cached = cached();
        let task = &cached.spec.as_ref().expect("spec").containers[0];
        assert_eq!(
            task.env.as_ref().map(|e| e.len()),
            Some(1),
            "only the canary"
        );
        let written = serde_json::to_value(&cached).expect("JSON");
        for dropped in ["podIPs", "qosClass"] {
            assert_eq!(written["status"].get(dropped), None, "{dropped}");
        }
        assert_eq!(
            written["status"]["containerStatuses"][0].get("volumeMounts"),
            None
        );
        let statuses = cached
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref());
        assert_eq!(
            statuses.map(Vec::capacity),
            Some(1),
            "no room beyond the one"
        );
    }

    #[test]
    fn a_container_without_the_canary_keeps_no_environment() {
        let container = Container {
            name: "c".into(),
            env: Some(vec![EnvVar {
                name: "X".into(),
                value: Some("1".into()),
                ..EnvVar::default()
            }]),
            ..Container::default()
        };
        assert_eq!(CachedContainer::from(&container).env, None);
    }
}
