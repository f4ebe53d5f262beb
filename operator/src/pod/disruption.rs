//! A sandbox Pod taken away by the cluster rather than failed by its task (pure): evicted by a drain,
//! preempted, or deleted with its node (a spot reclaim, a machine gone), and what to do about a Pod
//! stuck terminating on a node that no longer answers.
//!
//! Kubernetes says why it disrupts a Pod with the Pod's `DisruptionTarget` condition, set before the
//! Pod is deleted; the agent's graceful exit that follows (exit code 0) is then not the cause. A node
//! that stops answering is tainted `node.kubernetes.io/unreachable` (or `not-ready`) `NoExecute`; the
//! taint-eviction controller deletes its Pods once their toleration of that taint runs out. The
//! operator gives sandbox Pods a toleration of [`LOST_NODE_TAINTS`] for `--node-lost-seconds` (the
//! cluster's default is 300 s: too long for a rollout to wait). Their deletion cannot finish while
//! the node's kubelet is gone, so a Pod deleted that way still holds its name: a sandbox of the same
//! name (a retried trajectory) would wait for it until the Node object is deleted.
//! [`stuck_on_lost_node`] says when the operator removes it at once (grace period 0): the node has
//! not answered for the node controller's grace period and then for the toleration, so nothing on it
//! can terminate gracefully, and if it comes back its kubelet kills what the API server no longer
//! has.

use crate::plumbing::cached_pod::CachedPod;
use k8s_openapi::api::core::v1::{Node, Toleration};

use crate::pod::failure::Failure;

/// The Pod condition type Kubernetes sets on a Pod it is about to disrupt.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// The `DisruptionTarget` reason of the taint-eviction controller (a `NoExecute` taint).
pub const BY_TAINT_MANAGER: &str = "DeletionByTaintManager";
/// The `DisruptionTarget` reason of the pod garbage collector (the Pod's Node was deleted).
pub const BY_POD_GC: &str = "DeletionByPodGC";
/// The `DisruptionTarget` reason of an eviction through the Eviction API (a drain).
pub const BY_EVICTION_API: &str = "EvictionByEvictionAPI";
/// The `DisruptionTarget` reason of a preemption by the scheduler.
pub const BY_PREEMPTION: &str = "PreemptionByScheduler";
/// The `DisruptionTarget` reason of the kubelet (node pressure, a node shutting down).
pub const BY_KUBELET: &str = "TerminationByKubelet";

/// The sandbox's failure reason when its node was lost with its Pod.
pub const NODE_LOST: &str = "NodeLost";
/// The sandbox's failure reason when its Pod was evicted.
pub const EVICTED: &str = "Evicted";
/// The sandbox's failure reason when its Pod was preempted.
pub const PREEMPTED: &str = "Preempted";
/// The sandbox's failure reason when its Pod was deleted by someone other than the operator.
pub const POD_DELETED: &str = "PodDeleted";

/// The taints a node that stops answering gets (`NoExecute`), which sandbox Pods tolerate for
/// `--node-lost-seconds`.
pub const LOST_NODE_TAINTS: [&str; 2] = [
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/not-ready",
];

/// Why `pod` was taken away, when Kubernetes is disrupting or deleting it (pure): its
/// `DisruptionTarget` condition, else a deletion in progress (the operator deletes a sandbox's Pod
/// only after the sandbox's status is terminal, so a deletion seen here is someone else's).
pub fn disruption_failure(pod: &CachedPod) -> Option<Failure> {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or("its node");
    let condition = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == DISRUPTION_TARGET && c.status == "True")
        });
    let Some(condition) = condition else {
        return pod.metadata.deletion_timestamp.as_ref().map(|_| {
            Failure::new(
                POD_DELETED,
                "the sandbox's pod was deleted from outside the operator; its state is lost",
            )
        });
    };
    let said = condition
        .message
        .as_deref()
        .filter(|m| !m.is_empty())
        .map(|m| format!(" (Kubernetes: {m})"))
        .unwrap_or_default();
    let failure = match condition.reason.as_deref().unwrap_or_default() {
        BY_POD_GC => Failure::new(
            NODE_LOST,
            format!(
                "node {node} is gone and the pod garbage collector deleted the sandbox's pod; its state is lost{said}"
            ),
        ),
        BY_TAINT_MANAGER if !node_marked_pod_ready(pod) => Failure::new(
            NODE_LOST,
            format!(
                "node {node} stopped answering and the sandbox's pod was deleted once its toleration of the node's unreachable/not-ready taint ran out; its state is lost{said}"
            ),
        ),
        BY_TAINT_MANAGER => Failure::new(
            EVICTED,
            format!(
                "node {node} was given a NoExecute taint the sandbox's pod does not tolerate, and the pod was deleted; its state is lost{said}"
            ),
        ),
        BY_EVICTION_API => Failure::new(
            EVICTED,
            format!(
                "the sandbox's pod was evicted from node {node} through the Eviction API (a node drain, or another eviction); its state is lost{said}"
            ),
        ),
        BY_PREEMPTION => Failure::new(
            PREEMPTED,
            format!(
                "the scheduler preempted the sandbox's pod on node {node} for a pod of higher priority; its state is lost{said}"
            ),
        ),
        BY_KUBELET => Failure::new(
            EVICTED,
            format!(
                "the kubelet of node {node} ended the sandbox's pod (node pressure or a node shutdown); its state is lost{said}"
            ),
        ),
        other => Failure::new(
            EVICTED,
            format!(
                "Kubernetes is disrupting the sandbox's pod on node {node} ({other}); its state is lost{said}"
            ),
        ),
    };
    Some(failure)
}

/// The failure of a sandbox whose Pod is gone (pure): `NodeLost` when the node it ran on (`node`) is
/// gone (`node_state` `None`: its Node object deleted) or not Ready, else `PodDeleted`. `node_state`
/// is `Some(None)` for a node the operator may not read: then the deletion is all it knows.
pub fn gone_failure(node: Option<&str>, node_state: Option<Option<&Node>>) -> Failure {
    let deleted = || {
        Failure::new(
            POD_DELETED,
            "the sandbox's pod was deleted from outside the operator; its state is lost",
        )
    };
    let (Some(node), Some(state)) = (node, node_state) else {
        return deleted();
    };
    match state {
        None => Failure::new(
            NODE_LOST,
            format!(
                "node {node} is gone (its Node object was deleted) and the sandbox's pod with it; its state is lost"
            ),
        ),
        Some(n) if !node_ready(n) => Failure::new(
            NODE_LOST,
            format!(
                "node {node} stopped answering and the sandbox's pod was removed from it; its state is lost"
            ),
        ),
        Some(_) => deleted(),
    }
}

/// Whether `node`'s `Ready` condition is `True`.
fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `pod`'s `Ready` condition is still `True`: the node controller sets it `False` on every pod
/// of a node that stops answering, so a pod deleted by a taint while still Ready was on a live node.
fn node_marked_pod_ready(pod: &CachedPod) -> bool {
    crate::pod::conditions::pod_ready(pod)
}

/// Whether `pod` is being deleted because its node was lost, so that only a removal with grace period
/// 0 ends it (pure). Only a Pod the taint-eviction controller or the pod garbage collector deleted on
/// a node that marked it not Ready qualifies: a live kubelet finishes its Pods' deletions itself.
pub fn stuck_on_lost_node(pod: &CachedPod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && disruption_failure(pod).is_some_and(|f| f.reason == NODE_LOST)
}

/// The tolerations of the lost-node taints a sandbox Pod gets (pure): `NoExecute` for `seconds`,
/// except for a taint `existing` already tolerates with effect `NoExecute` (or any effect): the
/// spec's own choice stands. None when `seconds` is `None`.
pub fn lost_node_tolerations(seconds: Option<i64>, existing: &[Toleration]) -> Vec<Toleration> {
    let Some(seconds) = seconds else {
        return Vec::new();
    };
    LOST_NODE_TAINTS
        .iter()
        .filter(|key| {
            !existing.iter().any(|t| {
                t.key.as_deref() == Some(**key)
                    && t.effect.as_deref().is_none_or(|e| e == "NoExecute")
            })
        })
        .map(|key| Toleration {
            key: Some((*key).to_string()),
            operator: Some("Exists".to_string()),
            effect: Some("NoExecute".to_string()),
            toleration_seconds: Some(seconds),
            value: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::api::core::v1::{PodCondition, PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn pod(conditions: &[(&str, &str, &str)], deleted_at: Option<Timestamp>) -> CachedPod {
        CachedPod::from(&Pod {
            metadata: kube::api::ObjectMeta {
                name: Some("p".into()),
                deletion_timestamp: deleted_at.map(Time),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node-2".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(type_, status, reason)| PodCondition {
                            type_: (*type_).into(),
                            status: (*status).into(),
                            reason: Some((*reason).into()),
                            message: Some("Taint manager: deleting due to NoExecute taint".into()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        })
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("time")
    }

    #[test]
    fn a_healthy_pod_is_not_disrupted() {
        assert_eq!(
            disruption_failure(&pod(&[("Ready", "True", "")], None)),
            None
        );
        assert!(!stuck_on_lost_node(&pod(&[], None)));
    }

    #[test]
    fn each_disruption_says_what_took_the_pod() {
        let cases = [
            (BY_EVICTION_API, "True", EVICTED, "Eviction API"),
            (BY_PREEMPTION, "True", PREEMPTED, "preempted"),
            (BY_KUBELET, "True", EVICTED, "kubelet of node node-2"),
            (BY_POD_GC, "True", NODE_LOST, "node node-2 is gone"),
            (BY_TAINT_MANAGER, "False", NODE_LOST, "stopped answering"),
            (BY_TAINT_MANAGER, "True", EVICTED, "NoExecute taint"),
            ("SomethingNew", "True", EVICTED, "(SomethingNew)"),
        ];
        for (reason, ready, expected, says) in cases {
            let failure = disruption_failure(&pod(
                &[("Ready", ready, ""), (DISRUPTION_TARGET, "True", reason)],
                Some(at(0)),
            ))
            .expect("a disruption");
            assert_eq!(failure.reason, expected, "{reason}");
            assert!(
                failure.message.contains(says),
                "{reason}: {}",
                failure.message
            );
            assert!(
                failure.message.contains("Kubernetes: Taint manager"),
                "{reason}"
            );
        }
    }

    #[test]
    fn a_deletion_without_a_disruption_condition_is_someone_elses_delete() {
        let failure =
            disruption_failure(&pod(&[("Ready", "True", "")], Some(at(0)))).expect("deleted");
        assert_eq!(failure.reason, POD_DELETED);
        let withdrawn = pod(&[(DISRUPTION_TARGET, "False", BY_EVICTION_API)], None);
        assert_eq!(
            disruption_failure(&withdrawn),
            None,
            "a condition set False is no disruption"
        );
    }

    #[test]
    fn only_a_pod_deleted_with_its_lost_node_is_removed_at_once() {
        let lost = pod(
            &[
                ("Ready", "False", ""),
                (DISRUPTION_TARGET, "True", BY_TAINT_MANAGER),
            ],
            Some(at(5)),
        );
        assert!(stuck_on_lost_node(&lost));
        let gone_node = pod(&[(DISRUPTION_TARGET, "True", BY_POD_GC)], Some(at(0)));
        assert!(stuck_on_lost_node(&gone_node));
        for live in [
            pod(
                &[
                    ("Ready", "True", ""),
                    (DISRUPTION_TARGET, "True", BY_TAINT_MANAGER),
                ],
                Some(at(0)),
            ),
            pod(&[(DISRUPTION_TARGET, "True", BY_EVICTION_API)], Some(at(0))),
            pod(&[("Ready", "False", "")], Some(at(0))),
            pod(
                &[
                    ("Ready", "False", ""),
                    (DISRUPTION_TARGET, "True", BY_TAINT_MANAGER),
                ],
                None,
            ),
        ] {
            assert!(!stuck_on_lost_node(&live), "{:?}", live.status);
        }
    }

    #[test]
    fn a_pod_gone_with_its_node_is_node_lost_else_deleted() {
        let node = |ready: &str| Node {
            status: Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (ready, unknown) = (node("True"), node("Unknown"));
        let reason =
            |name: Option<&str>, state: Option<Option<&Node>>| gone_failure(name, state).reason;
        assert_eq!(
            reason(Some("n2"), Some(None)),
            NODE_LOST,
            "its Node deleted"
        );
        assert_eq!(reason(Some("n2"), Some(Some(&unknown))), NODE_LOST);
        assert_eq!(reason(Some("n2"), Some(Some(&ready))), POD_DELETED);
        assert_eq!(reason(Some("n2"), None), POD_DELETED, "Nodes unreadable");
        assert_eq!(reason(None, Some(None)), POD_DELETED, "never scheduled");
        assert!(
            gone_failure(Some("n2"), Some(None))
                .message
                .contains("node n2 is gone")
        );
    }

    #[test]
    fn lost_node_tolerations_leave_the_specs_own_alone() {
        assert!(lost_node_tolerations(None, &[]).is_empty());
        let both = lost_node_tolerations(Some(30), &[]);
        assert_eq!(both.len(), 2);
        assert!(both.iter().all(|t| t.toleration_seconds == Some(30)
            && t.effect.as_deref() == Some("NoExecute")
            && t.operator.as_deref() == Some("Exists")));
        let own = Toleration {
            key: Some(LOST_NODE_TAINTS[0].into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: Some(600),
            value: None,
        };
        let added = lost_node_tolerations(Some(30), std::slice::from_ref(&own));
        assert_eq!(added.len(), 1);
        assert_eq!(added[0].key.as_deref(), Some(LOST_NODE_TAINTS[1]));
        let other_effect = Toleration {
            effect: Some("NoSchedule".into()),
            ..own
        };
        assert_eq!(lost_node_tolerations(Some(30), &[other_effect]).len(), 2);
    }
}
