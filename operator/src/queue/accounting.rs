//! Who holds a queue's capacity, from the watch caches (pure). Never from memory: an operator that
//! restarts, or a replica that takes over, counts exactly what exists.
//!
//! A trajectory holds a slot of queue `q` (label `orchard.dev/rollout-queue=q`) from admission until
//! both its Sandbox is finished or gone and its Pod is gone:
//! - a labelled Sandbox without an outcome (no result, not Succeeded, Failed or Expired), deleting
//!   or not;
//! - a labelled Pod, Terminating ones included (their containers may still run), whether or not its
//!   Sandbox is still there.
//!
//! Slots admitted but not yet visible in the caches are the book's reservations (`book`).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;

use orchard_api::{ROLLOUT_QUEUE_LABEL, SANDBOX_LABEL, Sandbox, SandboxPhase};

/// Whether a Sandbox's trajectory is over (its pod may still be there).
fn finished(sandbox: &Sandbox) -> bool {
    sandbox.status.as_ref().is_some_and(|s| {
        s.result.is_some()
            || matches!(
                s.phase,
                Some(SandboxPhase::Succeeded | SandboxPhase::Failed | SandboxPhase::Expired)
            )
    })
}

fn in_queue(
    labels: Option<&std::collections::BTreeMap<String, String>>,
    namespace: Option<&str>,
    queue_namespace: &str,
    queue: &str,
) -> bool {
    namespace == Some(queue_namespace)
        && labels
            .and_then(|l| l.get(ROLLOUT_QUEUE_LABEL))
            .is_some_and(|v| v == queue)
}

/// Names of the trajectories holding a slot of queue `queue` in `namespace`.
pub fn holders<'a>(
    namespace: &str,
    queue: &str,
    sandboxes: impl IntoIterator<Item = &'a Sandbox>,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = sandboxes
        .into_iter()
        .filter(|s| {
            in_queue(
                s.metadata.labels.as_ref(),
                s.metadata.namespace.as_deref(),
                namespace,
                queue,
            )
        })
        .filter(|s| !finished(s))
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    names.extend(
        pods.into_iter()
            .filter(|p| {
                in_queue(
                    p.metadata.labels.as_ref(),
                    p.metadata.namespace.as_deref(),
                    namespace,
                    queue,
                )
            })
            .filter_map(|p| p.metadata.labels.as_ref()?.get(SANDBOX_LABEL).cloned()),
    );
    names
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use orchard_api::{SandboxSpec, SandboxStatus, TrajectoryResult, TrajectoryStatus};

    fn labels(queue: &str, sandbox: &str) -> Option<BTreeMap<String, String>> {
        Some(BTreeMap::from([
            (ROLLOUT_QUEUE_LABEL.to_string(), queue.to_string()),
            (SANDBOX_LABEL.to_string(), sandbox.to_string()),
        ]))
    }

    fn sandbox(name: &str, queue: &str, status: Option<SandboxStatus>) -> Sandbox {
        Sandbox {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("rl".into()),
                labels: labels(queue, name),
                ..ObjectMeta::default()
            },
            spec: SandboxSpec::default(),
            status,
        }
    }

    fn pod(name: &str, queue: &str, namespace: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                labels: labels(queue, name),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn with_result() -> Option<SandboxStatus> {
        Some(SandboxStatus {
            result: Some(TrajectoryResult {
                reward: Some(1.0),
                status: TrajectoryStatus::Completed,
                length: None,
                exit_code: None,
                artifact: None,
                reason: None,
                message: None,
            }),
            ..SandboxStatus::default()
        })
    }

    #[test]
    fn unfinished_sandboxes_and_existing_pods_hold_slots() {
        let sandboxes = [
            sandbox("g-0", "q", None),
            sandbox("g-1", "q", with_result()),
            sandbox("g-2", "q", with_result()),
            sandbox(
                "g-3",
                "q",
                Some(SandboxStatus {
                    phase: Some(SandboxPhase::Failed),
                    ..SandboxStatus::default()
                }),
            ),
            sandbox("h-0", "other", None),
        ];
        // g-1 finished but its pod still runs; g-9's Sandbox is gone but its pod terminates.
        let pods = [
            pod("g-1", "q", "rl"),
            pod("g-9", "q", "rl"),
            pod("x-0", "q", "elsewhere"),
        ];
        let held = holders("rl", "q", sandboxes.iter(), pods.iter());
        assert_eq!(
            held.into_iter().collect::<Vec<_>>(),
            ["g-0", "g-1", "g-9"],
            "g-2 and g-3 are finished with their pods gone; other queues and namespaces do not count"
        );
    }
}
