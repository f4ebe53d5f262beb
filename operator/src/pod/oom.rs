//! Whether the kernel's out-of-memory killer ended a sandbox's task container (pure), and the failure
//! that says so: which container, its memory limit, and the field that raises it.
//!
//! The agent raises every command's OOM score so that a command over the limit is killed, not the
//! agent (agent/src/exec/oom.rs); the task container itself ends `OOMKilled` when the agent is killed
//! anyway: the agent's own memory, or a kubelet that kills the whole container on any OOM kill in it
//! (cgroup v2 `memory.oom.group`).

use crate::plumbing::cached_pod::CachedContainerStatus;
use crate::plumbing::cached_pod::CachedPod;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated};

use crate::pod::failure::Failure;
use crate::pod::naming::TASK_CONTAINER;

/// The container status reason (and the sandbox's failure reason) of a container the OOM killer ended.
pub const OOM_KILLED: &str = "OOMKilled";

/// The termination of `status` that was an OOM kill: the current one, or the last one of a container
/// that was started again (pure).
fn oom_termination(status: &CachedContainerStatus) -> Option<&ContainerStateTerminated> {
    fn killed(state: Option<&ContainerState>) -> Option<&ContainerStateTerminated> {
        state
            .and_then(|s| s.terminated.as_ref())
            .filter(|t| t.reason.as_deref() == Some(OOM_KILLED))
    }
    killed(status.state.as_ref()).or_else(|| killed(status.last_state.as_deref()))
}

/// The memory limit of `container` in `pod`'s spec, as written there (e.g. `2Gi`).
pub fn memory_limit(pod: &CachedPod, container: &str) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == container)?
        .memory_limit
        .clone()
}

/// The failure of a sandbox whose task container the OOM killer ended, if it did (pure).
///
/// The message names the container, its memory limit (when the Pod sets one) and what to change:
/// `spec.resources.memory` of the Sandbox (or of its SandboxPool's template).
pub fn oom_failure(pod: &CachedPod) -> Option<Failure> {
    let status = pod
        .status
        .as_ref()?
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == TASK_CONTAINER)?;
    let terminated = oom_termination(status)?;
    let limit = match memory_limit(pod, TASK_CONTAINER) {
        Some(limit) => format!("its memory limit of {limit}"),
        None => "the memory available to it (it has no memory limit)".to_string(),
    };
    Some(Failure::new(
        OOM_KILLED,
        format!(
            "the task container `{TASK_CONTAINER}` was killed by the kernel's out-of-memory killer (exit code {}): the sandbox used more than {limit}, and its agent and state are lost; raise `spec.resources.memory` (of the Sandbox, or of its SandboxPool's template), or make the task use less memory",
            terminated.exit_code
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::fixtures::{pod, with_task_state};

    fn terminated(reason: &str) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: 137,
                reason: Some(reason.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn with_memory_limit(mut p: CachedPod, limit: &str) -> CachedPod {
        if let Some(spec) = p.spec.as_mut() {
            spec.containers[0].memory_limit = Some(limit.into());
        }
        p
    }

    #[test]
    fn an_oom_killed_task_container_names_itself_its_limit_and_the_field_to_raise() {
        let p = with_memory_limit(
            with_task_state(pod(Some("n"), None, false), terminated(OOM_KILLED)),
            "64Mi",
        );
        let failure = oom_failure(&p).expect("an OOM kill");
        assert_eq!(failure.reason, "OOMKilled");
        for part in [
            "`sandbox`",
            "memory limit of 64Mi",
            "exit code 137",
            "spec.resources.memory",
        ] {
            assert!(
                failure.message.contains(part),
                "{part}: {}",
                failure.message
            );
        }
    }

    #[test]
    fn a_container_without_a_limit_says_so() {
        let p = with_task_state(pod(Some("n"), None, false), terminated(OOM_KILLED));
        let failure = oom_failure(&p).expect("an OOM kill");
        assert!(
            failure.message.contains("it has no memory limit"),
            "{}",
            failure.message
        );
    }

    #[test]
    fn the_last_termination_counts_and_other_ends_do_not() {
        let mut restarted = with_task_state(
            pod(Some("n"), None, false),
            ContainerState {
                running: Some(Default::default()),
                ..Default::default()
            },
        );
        if let Some(statuses) = restarted
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
        {
            statuses[0].last_state = Some(Box::new(terminated(OOM_KILLED)));
        }
        assert_eq!(
            oom_failure(&restarted).map(|f| f.reason),
            Some("OOMKilled".to_string())
        );
        let crashed = with_task_state(pod(Some("n"), None, false), terminated("Error"));
        assert_eq!(oom_failure(&crashed), None);
        assert_eq!(oom_failure(&pod(Some("n"), None, true)), None);
    }
}
