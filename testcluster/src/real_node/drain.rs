//! Node maintenance as `kubectl cordon` and `kubectl drain` do it, for tests on several real nodes:
//! cordon (`spec.unschedulable`), then every pod on the node evicted through the Eviction API (so
//! PodDisruptionBudgets are honoured: a refused eviction, 429, is tried again), then a wait until the
//! evicted pods are gone. Like `kubectl drain --ignore-daemonsets`, mirror pods and DaemonSet pods stay.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};

use crate::error::{E2eError, Result};

/// Marks node `name` unschedulable (`true`, `kubectl cordon`) or schedulable again (`false`,
/// `kubectl uncordon`).
pub async fn cordon(client: &Client, name: &str, unschedulable: bool) -> Result<()> {
    Api::<Node>::all(client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await?;
    Ok(())
}

/// Whether `kubectl drain --ignore-daemonsets` leaves `pod` where it is: a mirror pod (the kubelet's
/// static pods) or a pod of a DaemonSet (pure).
pub fn drain_skips(pod: &Pod) -> bool {
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    let daemon = pod
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|owners| {
            owners
                .iter()
                .any(|o| o.controller == Some(true) && o.kind == "DaemonSet")
        });
    mirror || daemon
}

/// `namespace/name` of a pod (pure).
fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Cordons node `name` and evicts every pod on it ([`drain_skips`] aside), trying a refused eviction
/// again every second, until no such pod is left on the node or `timeout` passes. Returns the pods
/// evicted (`namespace/name`), in order. Pods that controllers create meanwhile elsewhere are theirs;
/// the cordon keeps new ones off this node.
pub async fn drain(client: &Client, name: &str, timeout: Duration) -> Result<Vec<String>> {
    cordon(client, name, true).await?;
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={name}"));
    let deadline = Instant::now() + timeout;
    let mut evicted: Vec<String> = Vec::new();
    let mut refused = String::new();
    loop {
        let left: Vec<Pod> = pods
            .list(&on_node)
            .await?
            .items
            .into_iter()
            .filter(|pod| !drain_skips(pod))
            .collect();
        if left.is_empty() {
            return Ok(evicted);
        }
        if Instant::now() >= deadline {
            let names: BTreeSet<String> = left.iter().map(key).collect();
            return Err(E2eError::NotReady {
                component: format!("drain of node {name}"),
                seconds: timeout.as_secs(),
                detail: format!("pods left: {names:?}; last refusal: {refused}"),
            });
        }
        for pod in &left {
            let pod_key = key(pod);
            // An evicted pod may take its grace period to go: one eviction is enough.
            if evicted.contains(&pod_key) || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let (Some(namespace), Some(pod_name)) = (
                pod.metadata.namespace.as_deref(),
                pod.metadata.name.as_deref(),
            ) else {
                continue;
            };
            let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
            match api.evict(pod_name, &EvictParams::default()).await {
                Ok(_) => evicted.push(pod_key),
                // Gone already.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                // A PodDisruptionBudget says not now (429), as `kubectl drain` is told; try again.
                Err(kube::Error::Api(status)) if status.code == 429 => {
                    refused = format!("{pod_key}: {}", status.message);
                }
                Err(err) => return Err(err.into()),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn drain_leaves_mirror_and_daemonset_pods_and_evicts_the_rest() {
        let mirror = pod(
            serde_json::json!({"metadata": {"name": "m", "annotations": {
            "kubernetes.io/config.mirror": "x"}}}),
        );
        let daemon = pod(
            serde_json::json!({"metadata": {"name": "d", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u", "controller": true}]}}),
        );
        let replica = pod(
            serde_json::json!({"metadata": {"name": "r", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}]}}),
        );
        let sandbox = pod(serde_json::json!({"metadata": {"name": "s", "namespace": "ns"}}));
        assert!(drain_skips(&mirror));
        assert!(drain_skips(&daemon));
        assert!(!drain_skips(&replica));
        assert!(!drain_skips(&sandbox));
        assert_eq!(key(&sandbox), "ns/s");
    }
}
