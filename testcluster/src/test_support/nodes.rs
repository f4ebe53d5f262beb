//! Helpers of the tests that run on two real nodes (`multi_node.rs`, `spot_eviction.rs`): their names,
//! the cluster, and what their pods and pool members say.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};

use crate::env::{EnvOptions, NodeKind, TestEnv};
use crate::wait;
use orchard_api::{POOL_LABEL, SandboxPool};

/// The first real node (it carries the host's Service route: never reclaim it).
pub const FIRST: &str = "orchard-node";
/// The second real node.
pub const SECOND: &str = "orchard-node-2";
/// The node label every node has, naming it.
pub const HOSTNAME: &str = "kubernetes.io/hostname";

/// Starts cluster `name` of two real nodes with NetworkPolicies enforced and no operator process
/// (the tests install the chart), on a thread of its own.
pub fn two_real_nodes(name: &str) -> TestEnv {
    TestEnv::start_named_on_own_thread(
        name,
        EnvOptions {
            operator: false,
            node: NodeKind::Real,
            real_nodes: 2,
            enforce_network_policies: true,
            ..EnvOptions::default()
        },
    )
}

pub use crate::hollow_node::pod_status::pod_ready;

/// The node `pod` is bound to (empty when none).
pub fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

/// The nodes of pool `pool`'s member pods once there are `count` of them Ready, none being deleted,
/// all on nodes in `allowed`.
pub async fn members_ready(
    pods: &Api<Pod>,
    pool: &str,
    count: usize,
    allowed: &[&str],
    timeout: Duration,
) -> Vec<String> {
    let selector = format!("{POOL_LABEL}={pool}");
    wait::poll(
        &format!("{count} Ready members of pool {pool} on {allowed:?}"),
        timeout,
        || async {
            let members = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?
                .items;
            let live: Vec<&Pod> = members
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            let nodes: Vec<String> = live.iter().map(|p| node_of(p)).collect();
            (live.len() == count
                && live.iter().all(|p| pod_ready(p))
                && nodes.iter().all(|n| allowed.contains(&n.as_str())))
            .then_some(nodes)
        },
    )
    .await
}

/// Creates SandboxPool `name` of `replicas` members of `image`, each asking for `cpu` and `memory`.
pub async fn create_pool(
    pools: &Api<SandboxPool>,
    name: &str,
    replicas: i32,
    image: &str,
    (cpu, memory): (&str, &str),
) {
    let pool: SandboxPool = serde_json::from_value(serde_json::json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "template": {
            "image": image, "resources": {"cpu": cpu, "memory": memory}}},
    }))
    .expect("pool JSON");
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create pool");
}
