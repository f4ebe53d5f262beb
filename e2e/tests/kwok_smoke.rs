//! The KWOK mode of the local cluster (`orchard_testcluster::kwok`): 100 fake nodes whose pods run
//! nothing, and the operator with `--simulated-agent`. What the scale benchmark
//! (`make bench-control-plane`) relies on, checked small: sandboxes become Ready on KWOK nodes with
//! KWOK's pod IPs, a pool's member is claimed, a RolloutGroup completes from results recorded through
//! the gateway, heartbeat expiry deletes, and deletions leave no pod behind.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use orchard_operator::api::{RolloutGroup, Sandbox, SandboxPool};
use orchard_testcluster::env::{EnvOptions, NodeKind, TestEnv};
use orchard_testcluster::test_support::gateway::{Caller, sandbox_path};
use orchard_testcluster::test_support::nodes::create_pool;
use orchard_testcluster::test_support::rollouts::{group, is_complete};
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

const SANDBOXES: usize = 300;
const TIMEOUT: Duration = Duration::from_secs(120);

fn env() -> TestEnv {
    TestEnv::start_named_on_own_thread(
        "kwok-smoke",
        EnvOptions {
            node: NodeKind::Kwok,
            kwok_nodes: 100,
            ..EnvOptions::default()
        },
    )
}

async fn ready_count(api: &Api<Sandbox>) -> usize {
    api.list(&ListParams::default())
        .await
        .expect("list sandboxes")
        .items
        .iter()
        .filter(|s| is_ready(Some(s)))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_pools_groups_and_expiry_run_on_kwok_nodes() {
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("kwok").await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // Many at once: every one Ready, on KWOK nodes, with an address from KWOK's range.
    futures::stream::iter(0..SANDBOXES)
        .map(|i| {
            let api = sandboxes.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &sandbox(&format!("s{i}"), json!({"image": "busybox"})),
                )
                .await
                .expect("create sandbox");
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    wait::poll("every sandbox Ready", TIMEOUT, || async {
        (ready_count(&sandboxes).await == SANDBOXES).then_some(())
    })
    .await;
    let listed = pods.list(&ListParams::default()).await.expect("list pods");
    let nodes: BTreeSet<String> = listed
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert!(
        nodes.iter().all(|n| n.starts_with("kwok-node-")),
        "{nodes:?}"
    );
    for pod in &listed.items {
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        assert!(
            ip.starts_with("10.6"),
            "pod {} has IP {ip:?}",
            pod.name_any()
        );
    }

    // A pool's member is claimed: the simulated agent takes the claimed member's identity.
    let pools: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
    create_pool(&pools, "warm", 2, "busybox", ("100m", "256Mi")).await;
    wait::until(
        &pools,
        "warm",
        "2 members Ready",
        TIMEOUT,
        |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.ready_replicas == 2)
        },
    )
    .await;
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox("claimer", json!({"pool": "warm"})),
        )
        .await
        .expect("create claimer");
    let claimed = wait::until(&sandboxes, "claimer", "Ready", TIMEOUT, is_ready).await;
    let pod = claimed
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .unwrap_or_default();
    assert!(pod.starts_with("warm-"), "claimed pod {pod:?}");

    // A RolloutGroup completes from results a harness records through the gateway.
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    groups
        .create(
            &PostParams::default(),
            &group(
                "g",
                json!({"groupSize": 4, "maxTrajectories": 8, "stride": 4,
                       "template": {"spec": {"image": "busybox"}}}),
            ),
        )
        .await
        .expect("create group");
    let caller = Caller::user(&env, "admin");
    let selector = format!("{}=g", orchard_operator::api::ROLLOUT_GROUP_LABEL);
    let mut recorded = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while recorded.len() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} trajectories became Ready: {recorded:?}",
            recorded.len()
        );
        let list = sandboxes
            .list(&ListParams::default().labels(&selector))
            .await
            .expect("list trajectories");
        for trajectory in list.items.iter().filter(|s| is_ready(Some(s))) {
            let name = trajectory.name_any();
            if recorded.contains(&name) {
                continue;
            }
            // Alternating rewards: the first stride of four is balanced.
            let reward = if recorded.len() % 2 == 0 { 1.0 } else { 0.0 };
            let answer = caller
                .post(
                    &sandbox_path(&ns, &name, "/result"),
                    json!({"reward": reward, "status": "completed"}),
                )
                .await;
            assert_eq!(answer.status, 200, "{}", answer.body);
            recorded.insert(name);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let done = wait::until(&groups, "g", "Complete", TIMEOUT, is_complete).await;
    let status = done.status.expect("group status");
    assert_eq!(status.group.len(), 4, "{:?}", status.group);
    assert_eq!(status.positive_trajectories, 2, "{status:?}");

    // Heartbeat expiry deletes on KWOK nodes too.
    sandboxes
        .create(
            &PostParams::default(),
            &sandbox(
                "short",
                json!({"image": "busybox", "lifecycle": {"heartbeatTimeoutSeconds": 3}}),
            ),
        )
        .await
        .expect("create short");
    wait::deleted(&sandboxes, "short", Duration::from_secs(60)).await;

    // Deleting the sandboxes deletes their pods (KWOK removes a deleted pod at once).
    sandboxes
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete sandboxes");
    wait::poll("every sandbox pod gone", TIMEOUT, || async {
        let left = pods
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items
            .into_iter()
            .filter(|p| !p.name_any().starts_with("warm-"))
            .count();
        (left == 0).then_some(())
    })
    .await;
    env.stop().await;
}
