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
//! Only what the operator made counts: a Sandbox or Pod carries the operator's seal for its owner
//! (`plumbing::ownership`). Anyone may label a Sandbox or Pod of their own with a queue's name; it holds
//! none of that queue's slots (the operator passes the label on to a Sandbox's Pod only from a sealed
//! trajectory, `pod::spec`).
//!
//! Slots admitted but not yet visible in the caches are the book's reservations (`book`).
//!
//! A group with a `retry` policy also holds a slot for each trajectory its status lists without an
//! outcome ([`retrying`]): between an attempt that ran out of memory and its retry, the trajectory
//! has no unfinished Sandbox and perhaps no Pod, but its slot must not go to another group, since
//! the retry is created without asking the queue again. So such a trajectory's slot is held from
//! admission until its group records its outcome (and its Pod is gone).

use crate::plumbing::cached_pod::CachedPod;
use std::collections::BTreeSet;

use crate::plumbing::operator_key::OperatorKey;
use crate::plumbing::ownership::sealed;
use orchard_api::{
    ROLLOUT_QUEUE_LABEL, RolloutGroup, RolloutPhase, SANDBOX_LABEL, Sandbox, SandboxPhase,
};

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

/// Whether `object` is one the operator made (sealed under `key`) and is labelled with queue `queue`
/// of `queue_namespace`.
pub fn in_queue<K: kube::Resource<DynamicType = ()>>(
    object: &K,
    queue_namespace: &str,
    queue: &str,
    key: &OperatorKey,
) -> bool {
    let meta = object.meta();
    meta.namespace.as_deref() == Some(queue_namespace)
        && meta
            .labels
            .as_ref()
            .and_then(|l| l.get(ROLLOUT_QUEUE_LABEL))
            .is_some_and(|v| v == queue)
        && sealed(object, key).is_some()
}

/// Names of the trajectories holding a slot of queue `queue` in `namespace` (seals verified with
/// `key`).
pub fn holders<'a>(
    namespace: &str,
    queue: &str,
    sandboxes: impl IntoIterator<Item = &'a Sandbox>,
    pods: impl IntoIterator<Item = &'a CachedPod>,
    key: &OperatorKey,
) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = sandboxes
        .into_iter()
        .filter(|s| in_queue(*s, namespace, queue, key))
        .filter(|s| !finished(s))
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    names.extend(
        pods.into_iter()
            .filter(|p| in_queue(*p, namespace, queue, key))
            .filter_map(|p| p.metadata.labels.as_ref()?.get(SANDBOX_LABEL).cloned()),
    );
    names
}

/// Names of the trajectories that groups with a `retry` policy on queue `queue` in `namespace` list
/// without an outcome (running, or between an attempt and its retry). A group that is complete,
/// failed or being deleted holds nothing this way (its Sandboxes and Pods still count above).
pub fn retrying<'a>(
    namespace: &str,
    queue: &str,
    groups: impl IntoIterator<Item = &'a RolloutGroup>,
) -> BTreeSet<String> {
    groups
        .into_iter()
        .filter(|g| g.metadata.namespace.as_deref() == Some(namespace))
        .filter(|g| g.spec.queue.as_deref() == Some(queue) && g.spec.retry.is_some())
        .filter(|g| g.metadata.deletion_timestamp.is_none())
        .filter_map(|g| g.status.as_ref())
        .filter(|s| !matches!(s.phase, Some(RolloutPhase::Complete | RolloutPhase::Failed)))
        .flat_map(|s| s.trajectories.iter())
        .filter(|r| r.status.is_none() && r.reason.is_none())
        .map(|r| r.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::plumbing::mock_api::test_token_key;
    use crate::plumbing::ownership::seal;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use orchard_api::{SandboxSpec, SandboxStatus, TrajectoryResult, TrajectoryStatus};

    fn owned_by(kind: &str, name: &str) -> Option<Vec<OwnerReference>> {
        Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller: Some(true),
            ..OwnerReference::default()
        }])
    }

    fn labels(queue: &str, sandbox: &str) -> Option<BTreeMap<String, String>> {
        Some(BTreeMap::from([
            (ROLLOUT_QUEUE_LABEL.to_string(), queue.to_string()),
            (SANDBOX_LABEL.to_string(), sandbox.to_string()),
        ]))
    }

    /// A trajectory Sandbox the operator made for group `g`.
    fn sandbox(name: &str, queue: &str, status: Option<SandboxStatus>) -> Sandbox {
        let mut sandbox = Sandbox {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("rl".into()),
                labels: labels(queue, name),
                owner_references: owned_by("RolloutGroup", "g"),
                ..ObjectMeta::default()
            },
            spec: SandboxSpec::default(),
            status,
        };
        seal(&mut sandbox, &test_token_key());
        sandbox
    }

    /// The Pod the operator made for Sandbox `name`.
    fn pod(name: &str, queue: &str, namespace: &str) -> CachedPod {
        let mut pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                labels: labels(queue, name),
                owner_references: owned_by("Sandbox", name),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        seal(&mut pod, &test_token_key());
        CachedPod::from(&pod)
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
        let held = holders("rl", "q", sandboxes.iter(), pods.iter(), &test_token_key());
        assert_eq!(
            held.into_iter().collect::<Vec<_>>(),
            ["g-0", "g-1", "g-9"],
            "g-2 and g-3 are finished with their pods gone; other queues and namespaces do not count"
        );
    }

    #[test]
    fn a_retrying_groups_unfinished_trajectories_hold_their_slots() {
        use orchard_api::{RetryPolicy, RolloutGroupStatus, TrajectoryRecord};
        let group = |name: &str, queue: &str, retry: bool, phase: RolloutPhase| {
            let mut g: RolloutGroup = serde_json::from_value(serde_json::json!({
                "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutGroup",
                "metadata": {"name": name, "namespace": "rl"},
                "spec": {"queue": queue, "template": {"spec": {"image": "i"}}},
            }))
            .expect("a group");
            g.spec.retry = retry.then_some(RetryPolicy {
                max_attempts: 3,
                on_oom: None,
                on_eviction: true,
            });
            let mut done = TrajectoryRecord::launched(format!("{name}-1"), 0);
            done.status = Some(orchard_api::TrajectoryStatus::Completed);
            let mut cancelled = TrajectoryRecord::launched(format!("{name}-2"), 0);
            cancelled.reason = Some("Cancelled".into());
            let mut waiting = TrajectoryRecord::launched(format!("{name}-3"), 0);
            waiting.previous_attempts = vec![orchard_api::AttemptRecord {
                reason: "PodDeleted".into(),
                message: None,
                memory: None,
                cpu: None,
            }];
            g.status = Some(RolloutGroupStatus {
                phase: Some(phase),
                trajectories: vec![
                    TrajectoryRecord::launched(format!("{name}-0"), 0),
                    done,
                    cancelled,
                    waiting,
                ],
                ..RolloutGroupStatus::default()
            });
            g
        };
        let mut deleting = group("d", "q", true, RolloutPhase::Generating);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        let mut elsewhere = group("e", "q", true, RolloutPhase::Generating);
        elsewhere.metadata.namespace = Some("other".into());
        let groups = [
            group("a", "q", true, RolloutPhase::Generating),
            group("b", "q", false, RolloutPhase::Generating),
            group("c", "q", true, RolloutPhase::Complete),
            group("f", "q", true, RolloutPhase::Failed),
            group("o", "other", true, RolloutPhase::Generating),
            deleting,
            elsewhere,
        ];
        assert_eq!(
            retrying("rl", "q", groups.iter())
                .into_iter()
                .collect::<Vec<_>>(),
            ["a-0", "a-3"],
            "running and waiting for a retry hold; finished, cancelled, no policy, done, failed, other queues, deleting and other namespaces do not"
        );
    }

    #[test]
    fn labelled_objects_the_operator_did_not_make_hold_no_slot() {
        let key = test_token_key();
        // A user's own Sandbox and Pod labelled with the queue's name: no controller, or a forged
        // controller reference to a group or Sandbox, but no seal.
        let mut bare = sandbox("mine-0", "q", None);
        bare.metadata.owner_references = None;
        bare.metadata.annotations = None;
        let mut forged = sandbox("g-5", "q", None);
        forged.metadata.annotations = None;
        let mut copied = sandbox("g-6", "q", None);
        copied.metadata.annotations = sandbox("g-0", "q", None).metadata.annotations;
        let mut planted = pod("mine-1", "q", "rl");
        planted.metadata.annotations = None;
        let held = holders("rl", "q", [&bare, &forged, &copied], [&planted], &key);
        assert!(held.is_empty(), "{held:?}");
        assert_eq!(
            holders("rl", "q", [&sandbox("g-0", "q", None)], [], &key)
                .into_iter()
                .collect::<Vec<_>>(),
            ["g-0"]
        );
    }
}
