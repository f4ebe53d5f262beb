//! What the cache keeps of a Pod's status: [`CachedPodStatus`], with [`CachedContainerStatus`] for
//! each container. Same field paths as `PodStatus` and `ContainerStatus` for what is kept, so a
//! reader written against those reads these unchanged.
//!
//! Kept: the phase, its reason and message, `podIP`, the conditions a reader looks at
//! ([`KEPT_CONDITIONS`]), and of each container its name, image, image ID, container ID, readiness,
//! restart count, state and last state. Dropped while decoding (never allocated): the other
//! addresses, the QoS class, start time, resize and resource-claim state, ephemeral containers, the
//! conditions no reader looks at (`Initialized`, `ContainersReady`, `PodReadyToStartContainers`),
//! and each container's resources, user, mounts and `started`. A `PodStatus` is 592 bytes before
//! any of its contents and a `ContainerStatus` 752; these are a fraction of that.

use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, PodCondition, PodStatus};
use serde::{Deserialize, Deserializer, Serialize};

/// The Pod condition types some reader looks at (`pod::conditions`, `pod::health`,
/// `pod::disruption`, `sandbox::status`); the cache keeps no others.
pub const KEPT_CONDITIONS: &[&str] = &["Ready", "PodScheduled", "DisruptionTarget"];

/// What the cache keeps of a Pod's status (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why the Pod is in this phase (e.g. `Evicted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable message about the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Pod's IP address.
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// The conditions of the types in [`KEPT_CONDITIONS`].
    #[serde(
        default,
        deserialize_with = "kept_conditions",
        skip_serializing_if = "Option::is_none"
    )]
    pub conditions: Option<Vec<PodCondition>>,
    /// The containers' statuses.
    #[serde(
        default,
        deserialize_with = "exact_list",
        skip_serializing_if = "Option::is_none"
    )]
    pub container_statuses: Option<Vec<CachedContainerStatus>>,
    /// The init containers' statuses.
    #[serde(
        default,
        deserialize_with = "exact_list",
        skip_serializing_if = "Option::is_none"
    )]
    pub init_container_statuses: Option<Vec<CachedContainerStatus>>,
}

/// What the cache keeps of a container's status.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedContainerStatus {
    /// The container's name.
    #[serde(default)]
    pub name: String,
    /// The image it runs, as the runtime reports it.
    #[serde(default)]
    pub image: String,
    /// The image's ID (digest) as the runtime reports it.
    #[serde(default, rename = "imageID")]
    pub image_id: String,
    /// `<runtime>://<id>` of the container, once created.
    #[serde(
        default,
        rename = "containerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
    /// Whether it passed its readiness probe.
    #[serde(default)]
    pub ready: bool,
    /// How often it was restarted.
    #[serde(default)]
    pub restart_count: i32,
    /// What it is doing now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ContainerState>,
    /// How its previous run ended, if it ran before (boxed: most containers never restart, and a
    /// `ContainerState` is 200 bytes even when empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state: Option<Box<ContainerState>>,
}

impl From<PodStatus> for CachedPodStatus {
    /// What the cache would keep of `status` (for a Pod the API server returned to a write, and for
    /// tests).
    fn from(status: PodStatus) -> Self {
        let statuses = |list: Option<Vec<ContainerStatus>>| {
            list.map(|list| list.into_iter().map(CachedContainerStatus::from).collect())
        };
        CachedPodStatus {
            phase: status.phase,
            reason: status.reason,
            message: status.message,
            pod_ip: status.pod_ip,
            conditions: status.conditions.map(keep_read_conditions),
            container_statuses: statuses(status.container_statuses),
            init_container_statuses: statuses(status.init_container_statuses),
        }
    }
}

impl From<ContainerStatus> for CachedContainerStatus {
    fn from(status: ContainerStatus) -> Self {
        CachedContainerStatus {
            name: status.name,
            image: status.image,
            image_id: status.image_id,
            container_id: status.container_id,
            ready: status.ready,
            restart_count: status.restart_count,
            state: status.state,
            last_state: status.last_state.map(Box::new),
        }
    }
}

/// `conditions` of the types in [`KEPT_CONDITIONS`], the list no longer than they are (pure).
fn keep_read_conditions(mut conditions: Vec<PodCondition>) -> Vec<PodCondition> {
    conditions.retain(|c| KEPT_CONDITIONS.contains(&c.type_.as_str()));
    conditions.shrink_to_fit();
    conditions
}

fn kept_conditions<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<PodCondition>>, D::Error> {
    Ok(Option::<Vec<PodCondition>>::deserialize(d)?.map(keep_read_conditions))
}

/// A list decoded with no room reserved beyond its contents (a decoded list of one reserves four).
pub(super) fn exact_list<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(d)?.map(|mut list| {
        list.shrink_to_fit();
        list
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status_json() -> serde_json::Value {
        json!({
            "phase": "Running", "podIP": "10.64.0.1", "podIPs": [{"ip": "10.64.0.1"}],
            "hostIP": "10.0.0.1", "qosClass": "Guaranteed", "startTime": "2026-11-29T10:00:00Z",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "PodScheduled", "status": "True"},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
            ],
            "initContainerStatuses": [{"name": "install", "image": "agent:1", "imageID": "sha256:a",
                                       "ready": true, "restartCount": 0,
                                       "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
            "containerStatuses": [{"name": "sandbox", "image": "busybox", "imageID": "sha256:b",
                                   "containerID": "containerd://c1", "ready": true, "restartCount": 1,
                                   "started": true,
                                   "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                                   "resources": {"limits": {"memory": "2Gi"}},
                                   "state": {"running": {"startedAt": "2026-11-29T10:00:01Z"}},
                                   "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
        })
    }

    #[test]
    fn the_watch_and_a_written_status_keep_the_same() {
        let decoded: CachedPodStatus = serde_json::from_value(status_json()).expect("status");
        let full: PodStatus = serde_json::from_value(status_json()).expect("pod status");
        assert_eq!(decoded, CachedPodStatus::from(full));
        let written = serde_json::to_value(&decoded).expect("JSON");
        let again: CachedPodStatus = serde_json::from_value(written).expect("reads back");
        assert_eq!(again, decoded);
    }

    #[test]
    fn what_the_readers_use_is_kept() {
        let status: CachedPodStatus = serde_json::from_value(status_json()).expect("status");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.64.0.1"));
        let types: Vec<&str> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, ["Ready", "PodScheduled", "DisruptionTarget"]);
        let task = &status.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(
            (
                task.name.as_str(),
                task.image.as_str(),
                task.image_id.as_str()
            ),
            ("sandbox", "busybox", "sha256:b")
        );
        assert_eq!(task.container_id.as_deref(), Some("containerd://c1"));
        assert_eq!((task.ready, task.restart_count), (true, 1));
        assert!(task.state.as_ref().is_some_and(|s| s.running.is_some()));
        let last = task.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        assert_eq!(last.map(|t| t.exit_code), Some(137));
        let install = &status.init_container_statuses.as_ref().expect("init")[0];
        assert!(
            install
                .state
                .as_ref()
                .is_some_and(|s| s.terminated.is_some())
        );
    }

    #[test]
    fn lists_take_no_more_room_than_their_contents() {
        let status: CachedPodStatus = serde_json::from_value(status_json()).expect("status");
        let conditions = status.conditions.as_ref().expect("conditions");
        assert_eq!(conditions.capacity(), conditions.len());
        let statuses = status.container_statuses.as_ref().expect("statuses");
        assert_eq!(statuses.capacity(), 1);
    }

    #[test]
    fn a_compact_status_is_smaller_than_the_full_one() {
        assert!(
            std::mem::size_of::<CachedPodStatus>() * 3 < std::mem::size_of::<PodStatus>(),
            "{} bytes",
            std::mem::size_of::<CachedPodStatus>()
        );
        assert!(
            std::mem::size_of::<CachedContainerStatus>() * 2
                < std::mem::size_of::<ContainerStatus>(),
            "{} bytes",
            std::mem::size_of::<CachedContainerStatus>()
        );
    }
}
