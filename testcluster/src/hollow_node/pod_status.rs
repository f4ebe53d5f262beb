//! The pod statuses the local node reports, built as JSON merge patches like a kubelet's (pure).

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// State of one container.
#[derive(Debug, Clone, PartialEq)]
pub enum ContainerState {
    /// Not started: `ContainerCreating`, `PodInitializing`, `ErrImagePull`, `ImagePullBackOff`, ...
    Waiting {
        /// Reason.
        reason: String,
        /// Detail.
        message: Option<String>,
    },
    /// Running since `started_at` (RFC 3339).
    Running {
        /// Start time.
        started_at: String,
    },
    /// Exited.
    Terminated {
        /// Exit code (128 + signal when killed).
        exit_code: i32,
        /// Signal that killed it.
        signal: Option<i32>,
        /// `Completed` or `Error`.
        reason: String,
        /// The end of the container's output when it failed (a kubelet's `FallbackToLogsOnError`).
        message: Option<String>,
        /// Start time.
        started_at: String,
        /// End time.
        finished_at: String,
    },
}

/// One container's line in the pod status.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerView {
    /// Container name.
    pub name: String,
    /// Image reference.
    pub image: String,
    /// State.
    pub state: ContainerState,
    /// Whether its readiness probe passes (init containers: whether they completed).
    pub ready: bool,
}

/// Everything the node reports about one pod.
#[derive(Debug, Clone, PartialEq)]
pub struct PodView {
    /// `Pending`, `Running`, `Succeeded` or `Failed`.
    pub phase: &'static str,
    /// The pod's loopback address once assigned.
    pub pod_ip: Option<String>,
    /// When the node accepted the pod (RFC 3339).
    pub start_time: String,
    /// Pod-level reason (e.g. `Evicted`).
    pub reason: Option<String>,
    /// Pod-level message.
    pub message: Option<String>,
    /// Init containers.
    pub init_containers: Vec<ContainerView>,
    /// App containers.
    pub containers: Vec<ContainerView>,
    /// Time of the last transition, for conditions (RFC 3339).
    pub now: String,
}

fn container_json(c: &ContainerView) -> Value {
    let state = match &c.state {
        ContainerState::Waiting { reason, message } => {
            json!({"waiting": {"reason": reason, "message": message}})
        }
        ContainerState::Running { started_at } => json!({"running": {"startedAt": started_at}}),
        ContainerState::Terminated {
            exit_code,
            signal,
            reason,
            message,
            started_at,
            finished_at,
        } => json!({"terminated": {
            "exitCode": exit_code, "signal": signal, "reason": reason, "message": message,
            "startedAt": started_at, "finishedAt": finished_at
        }}),
    };
    let started = matches!(c.state, ContainerState::Running { .. });
    json!({
        "name": c.name,
        "image": c.image,
        "imageID": format!("local://{}", c.image),
        "ready": c.ready,
        "started": started,
        "restartCount": 0,
        "state": state,
    })
}

fn condition(type_: &str, status: bool, now: &str, reason: Option<&str>) -> Value {
    let mut c = json!({
        "type": type_,
        "status": if status { "True" } else { "False" },
        "lastTransitionTime": now,
    });
    if let Some(reason) = reason {
        c["reason"] = json!(reason);
    }
    c
}

/// Whether `pod`'s `Ready` condition is `True`, as the API server has it.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether every container of `view` is ready.
fn containers_ready(view: &PodView) -> bool {
    !view.containers.is_empty() && view.containers.iter().all(|c| c.ready)
}

/// The `Ready` condition the node reports for `view`.
pub fn reported_ready(view: &PodView) -> bool {
    containers_ready(view) && view.phase == "Running"
}

/// Whether the pod's status in the API, seen at `seen_version` with its `Ready` condition
/// `seen_ready`, must be reported again (pure): someone other than the node changed it after the
/// node's last report (at `reported_version`), and it no longer says what the node does
/// (`own_ready`). A kubelet's status manager does the same: the node-lifecycle controller marks the
/// pods of a node it thinks NotReady not ready, and the kubelet puts its own view back.
pub fn needs_resync(
    seen_version: u64,
    seen_ready: bool,
    reported_version: u64,
    own_ready: bool,
) -> bool {
    seen_version > reported_version && seen_ready != own_ready
}

/// The status merge patch for `view`.
pub fn status_patch(view: &PodView) -> Value {
    let initialized = view.init_containers.iter().all(|c| c.ready);
    let containers_ready = containers_ready(view);
    let ready = reported_ready(view);
    let mut conditions = vec![
        condition("PodScheduled", true, &view.now, None),
        condition(
            "Initialized",
            initialized,
            &view.now,
            (!initialized).then_some("ContainersNotInitialized"),
        ),
        condition(
            "ContainersReady",
            containers_ready,
            &view.now,
            (!containers_ready).then_some("ContainersNotReady"),
        ),
        condition(
            "Ready",
            ready,
            &view.now,
            (!ready).then_some("ContainersNotReady"),
        ),
    ];
    if view.reason.as_deref() == Some("Evicted") {
        conditions.push(condition(
            "DisruptionTarget",
            true,
            &view.now,
            Some("TerminationByKubelet"),
        ));
    }
    let pod_ips: Vec<Value> = view.pod_ip.iter().map(|ip| json!({"ip": ip})).collect();
    json!({
        "status": {
            "phase": view.phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": view.pod_ip,
            "podIPs": pod_ips,
            "startTime": view.start_time,
            "reason": view.reason,
            "message": view.message,
            "conditions": conditions,
            "initContainerStatuses": view.init_containers.iter().map(container_json).collect::<Vec<_>>(),
            "containerStatuses": view.containers.iter().map(container_json).collect::<Vec<_>>(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(phase: &'static str, ready: bool) -> PodView {
        PodView {
            phase,
            pod_ip: Some("127.9.0.1".into()),
            start_time: "2026-01-01T00:00:00Z".into(),
            reason: None,
            message: None,
            init_containers: vec![ContainerView {
                name: "install".into(),
                image: "agent".into(),
                state: ContainerState::Terminated {
                    exit_code: 0,
                    signal: None,
                    reason: "Completed".into(),
                    message: None,
                    started_at: "2026-01-01T00:00:00Z".into(),
                    finished_at: "2026-01-01T00:00:00Z".into(),
                },
                ready: true,
            }],
            containers: vec![ContainerView {
                name: "sandbox".into(),
                image: "python:3.11".into(),
                state: ContainerState::Running {
                    started_at: "2026-01-01T00:00:00Z".into(),
                },
                ready,
            }],
            now: "2026-01-01T00:00:01Z".into(),
        }
    }

    fn cond(patch: &Value, type_: &str) -> String {
        patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .unwrap()["status"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn ready_pod_reports_ready_conditions_and_ip() {
        let patch = status_patch(&view("Running", true));
        assert_eq!(cond(&patch, "Ready"), "True");
        assert_eq!(cond(&patch, "Initialized"), "True");
        assert_eq!(patch["status"]["podIP"], "127.9.0.1");
        assert_eq!(
            patch["status"]["containerStatuses"][0]["state"]["running"]["startedAt"],
            "2026-01-01T00:00:00Z"
        );
    }

    #[test]
    fn failed_pod_is_not_ready() {
        let mut v = view("Failed", true);
        v.reason = Some("Evicted".into());
        let patch = status_patch(&v);
        assert_eq!(cond(&patch, "Ready"), "False");
        assert_eq!(cond(&patch, "DisruptionTarget"), "True");
        assert_eq!(patch["status"]["reason"], "Evicted");
    }

    #[test]
    fn a_status_changed_by_someone_else_is_reported_again() {
        let ready = view("Running", true);
        assert!(reported_ready(&ready));
        // The node-lifecycle controller marked the ready pod not ready after the node's report.
        assert!(needs_resync(12, false, 10, reported_ready(&ready)));
        // An event older than (or the same as) the node's last report says nothing new.
        assert!(!needs_resync(10, false, 10, true));
        assert!(!needs_resync(9, false, 10, true));
        // A newer change that agrees with the node (another field) is left alone.
        assert!(!needs_resync(12, true, 10, true));
        assert!(!reported_ready(&view("Running", false)));
        assert!(needs_resync(12, true, 10, false));
    }
}
