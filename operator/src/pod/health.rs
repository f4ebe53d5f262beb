//! What a sandbox Pod's status says (pure): whether it is scheduled and Ready, why it failed for good
//! (image pulls, crashes, OOM kills (`oom`), evictions), and a one-line summary of what it said last.

use crate::plumbing::cached_pod::{CachedContainerStatus as ContainerStatus, CachedPod};
use k8s_openapi::jiff::Timestamp;

pub use crate::pod::conditions::{pod_condition, pod_ready};
pub use crate::pod::failure::Failure;
use crate::pod::naming::{INSTALL_CONTAINER, TASK_CONTAINER};

/// Container waiting reasons that mean the container will not start without outside help.
const START_FAILURES: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// What a pod's status says about why it is not Ready (pure): not scheduled (the scheduler's
/// message), or the task container waiting (reason and message, e.g. `ErrImagePull`), or its last
/// termination; empty when it says nothing.
pub fn pod_state_summary(pod: &CachedPod) -> String {
    let Some(status) = pod.status.as_ref() else {
        return String::new();
    };
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    if let Some(condition) = unscheduled {
        return format!(
            "not scheduled: {}",
            condition.message.as_deref().unwrap_or("no reason given")
        );
    }
    let task = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find(|c| {
            c.state.as_ref().is_some_and(|s| s.waiting.is_some())
                || c.name == crate::pod::naming::TASK_CONTAINER
        });
    let Some(container) = task else {
        return String::new();
    };
    let state = container.state.as_ref();
    if let Some(waiting) = state.and_then(|s| s.waiting.as_ref()) {
        let reason = waiting.reason.as_deref().unwrap_or("waiting");
        return match waiting.message.as_deref().filter(|m| !m.is_empty()) {
            Some(message) => format!("container {} {reason}: {message}", container.name),
            None => format!("container {} {reason}", container.name),
        };
    }
    let terminated = state.and_then(|s| s.terminated.as_ref()).or_else(|| {
        container
            .last_state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
    });
    if let Some(terminated) = terminated {
        return format!(
            "container {} exited with code {} ({})",
            container.name,
            terminated.exit_code,
            terminated.reason.as_deref().unwrap_or("no reason given")
        );
    }
    if state.is_some_and(|s| s.running.is_some()) {
        return format!("container {} running, not Ready", container.name);
    }
    String::new()
}

fn container_status<'a>(
    statuses: Option<&'a Vec<ContainerStatus>>,
    name: &str,
) -> Option<&'a ContainerStatus> {
    statuses?.iter().find(|s| s.name == name)
}

fn pod_image(pod: &CachedPod, container: &str) -> String {
    let spec = pod.spec.as_ref();
    spec.and_then(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .find(|c| c.name == container)
            .and_then(|c| c.image.clone())
    })
    .unwrap_or_default()
}

/// What an image pull error says when the image cannot be had by waiting: it does not exist, the
/// registry refuses us, or it has no build for this platform.
const PERMANENT_PULL_ERRORS: &[&str] = &[
    "not found",
    "manifest unknown",
    "name unknown",
    "unauthorized",
    "denied",
    "forbidden",
    "no match for platform",
    "invalid reference",
];

/// Whether an image pull error will stay (pure). Others (the kubelet's pull rate limit, a registry
/// that is briefly unreachable or overloaded) are retried by the kubelet: the sandbox waits, and the
/// startup timeout ends the wait if they never clear.
pub fn permanent_pull_error(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    PERMANENT_PULL_ERRORS.iter().any(|m| message.contains(m))
}

fn start_failure(pod: &CachedPod, status: &ContainerStatus, what: &str) -> Option<Failure> {
    let waiting = status.state.as_ref()?.waiting.as_ref()?;
    let reason = waiting.reason.as_deref()?;
    if !START_FAILURES.contains(&reason) {
        return None;
    }
    let detail = waiting.message.clone().unwrap_or_default();
    if matches!(reason, "ErrImagePull" | "ImagePullBackOff") && !permanent_pull_error(&detail) {
        return None;
    }
    let message = if reason.contains("Image") {
        format!(
            "image pull failed for `{}` ({what}): {detail}",
            pod_image(pod, &status.name)
        )
    } else {
        format!("{what} cannot start: {detail}")
    };
    Some(Failure::new(
        reason,
        message.trim_end_matches([':', ' ']).to_string(),
    ))
}

fn exit_description(status: &ContainerStatus) -> Option<String> {
    let terminated = status.state.as_ref()?.terminated.as_ref()?;
    let mut text = format!("exit code {}", terminated.exit_code);
    if let Some(signal) = terminated.signal {
        text.push_str(&format!(", signal {signal}"));
    }
    if let Some(reason) = &terminated.reason {
        text.push_str(&format!(", {reason}"));
    }
    if let Some(message) = terminated.message.as_deref().filter(|m| !m.is_empty()) {
        text.push_str(&format!(": {message}"));
    }
    Some(text)
}

/// Whether the Pod can no longer serve the sandbox, and why. `None` while it is healthy or starting.
pub fn pod_failure(pod: &CachedPod) -> Option<Failure> {
    let status = pod.status.as_ref()?;
    let init = container_status(status.init_container_statuses.as_ref(), INSTALL_CONTAINER);
    let task = container_status(status.container_statuses.as_ref(), TASK_CONTAINER);
    if status.phase.as_deref() == Some("Failed")
        && let Some(reason) = status.reason.as_deref().filter(|r| !r.is_empty())
    {
        let message = status
            .message
            .clone()
            .unwrap_or_else(|| format!("pod failed: {reason}"));
        return Some(Failure::new(reason, message));
    }
    // Evicted, preempted, lost with its node, or deleted: what follows (the agent's graceful exit)
    // is not the cause.
    if let Some(failure) = crate::pod::disruption::disruption_failure(pod) {
        return Some(failure);
    }
    if let Some(init) = init {
        if let Some(failure) = start_failure(pod, init, "agent injector init container") {
            return Some(failure);
        }
        if let Some(terminated) = init.state.as_ref().and_then(|s| s.terminated.as_ref())
            && terminated.exit_code != 0
        {
            return Some(Failure::new(
                "AgentInstallFailed",
                format!(
                    "installing the agent into the pod failed ({})",
                    exit_description(init).unwrap_or_default()
                ),
            ));
        }
    }
    if let Some(task) = task {
        if let Some(failure) = start_failure(pod, task, "task container") {
            return Some(failure);
        }
        if let Some(failure) = crate::pod::oom::oom_failure(pod) {
            return Some(failure);
        }
        if let Some(exit) = exit_description(task) {
            return Some(Failure::new(
                "AgentExited",
                format!(
                    "the agent in the task container stopped ({exit}); the sandbox's state is lost"
                ),
            ));
        }
    }
    match status.phase.as_deref() {
        Some("Failed") => Some(Failure::new(
            "PodFailed",
            status
                .message
                .clone()
                .unwrap_or_else(|| "the pod failed".to_string()),
        )),
        Some("Succeeded") => Some(Failure::new(
            "AgentExited",
            "the agent exited; the sandbox's state is lost",
        )),
        _ => None,
    }
}

/// Whether the pod is bound to a node, with the scheduler's reason when it is not.
pub fn scheduling(pod: &CachedPod) -> (bool, String, String) {
    if pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
    {
        return (true, "Scheduled".into(), String::new());
    }
    match pod_condition(pod, "PodScheduled") {
        Some(c) if c.status == "False" => (
            false,
            c.reason.clone().unwrap_or_else(|| "Unschedulable".into()),
            c.message.clone().unwrap_or_default(),
        ),
        _ => (
            false,
            "PodPending".into(),
            "waiting for the scheduler".into(),
        ),
    }
}

/// Since when the task container of `pod` runs (pure).
pub fn task_running_since(pod: &CachedPod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == crate::pod::naming::TASK_CONTAINER)?
        .state
        .as_ref()?
        .running
        .as_ref()?
        .started_at
        .as_ref()
        .map(|t| t.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::fixtures::{pod, with_pod_condition, with_task_state};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, PodCondition,
    };

    #[test]
    fn what_a_pod_last_said_is_summarised() {
        let unscheduled = with_pod_condition(
            pod(None, None, false),
            PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                message: Some("0/3 nodes are available: 3 Insufficient memory.".into()),
                ..Default::default()
            },
        );
        assert_eq!(
            pod_state_summary(&unscheduled),
            "not scheduled: 0/3 nodes are available: 3 Insufficient memory."
        );
        let pulling = with_task_state(
            pod(Some("n"), None, false),
            ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ImagePullBackOff".into()),
                    message: Some("Back-off pulling image \"x\"".into()),
                }),
                ..Default::default()
            },
        );
        assert_eq!(
            pod_state_summary(&pulling),
            "container sandbox ImagePullBackOff: Back-off pulling image \"x\""
        );
        let exited = with_task_state(
            pod(Some("n"), None, false),
            ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 127,
                    reason: Some("Error".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        assert_eq!(
            pod_state_summary(&exited),
            "container sandbox exited with code 127 (Error)"
        );
        assert_eq!(pod_state_summary(&CachedPod::default()), "");
    }
}
