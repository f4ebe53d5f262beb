//! SandboxPools on the real node: warm members claimed by concurrent Sandboxes, each member by
//! exactly one (also when the operator is SIGKILLed in the middle of the claims), the pool refilling,
//! a claimed sandbox under its own egress policy and name, cold starts when the pool is empty, and a
//! RolloutGroup whose trajectories come from a pool.
//!
//! One test runs the scenarios in sequence: the operator kill would disturb concurrent tests.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use orchard_operator::api::{
    CLAIMED_FROM_LABEL, POOL_LABEL, RolloutGroup, SANDBOX_LABEL, Sandbox, SandboxPool,
};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::gateway::Caller;
use orchard_testcluster::test_support::rollouts::{
    GROUP_TIMEOUT, group, is_complete, reward_script,
};
use orchard_testcluster::wait;
use serde_json::{Value, json};

const READY: Duration = Duration::from_secs(180);

fn env() -> &'static TestEnv {
    TestEnv::shared_real()
}

fn ready(s: Option<&Sandbox>) -> bool {
    s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Waits until pool `name` has `count` Ready members.
async fn filled(pools: &Api<SandboxPool>, name: &str, count: i32) -> SandboxPool {
    wait::until(
        pools,
        name,
        "members Ready",
        READY,
        move |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.ready_replicas == count && s.replicas == count)
        },
    )
    .await
}

/// Creates sandboxes `names` at once from `spec` and waits until all are Ready; returns them.
async fn create_all(api: &Api<Sandbox>, names: &[String], spec: &Value) -> Vec<Sandbox> {
    let creates = names.iter().map(|name| {
        let api = api.clone();
        let object: Sandbox = serde_json::from_value(json!({
            "apiVersion": "orchard.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": name}, "spec": spec,
        }))
        .expect("sandbox JSON");
        async move {
            api.create(&PostParams::default(), &object)
                .await
                .expect("create sandbox")
        }
    });
    join_all(creates).await;
    ready_all(api, names).await
}

async fn ready_all(api: &Api<Sandbox>, names: &[String]) -> Vec<Sandbox> {
    join_all(
        names
            .iter()
            .map(|name| async move { wait::until(api, name, "Ready", READY, ready).await }),
    )
    .await
}

fn pod_name(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.pod_name.clone())
        .unwrap_or_default()
}

/// Each sandbox runs in a pod of its own, controlled by it alone; returns how many came warm from
/// `pool` (the others started cold, in a pod named after the sandbox).
async fn assert_one_pod_each(pods: &Api<Pod>, sandboxes: &[Sandbox], pool: &str) -> usize {
    let names: BTreeSet<String> = sandboxes.iter().map(pod_name).collect();
    assert_eq!(names.len(), sandboxes.len(), "no pod is shared: {names:?}");
    let mut warm = 0;
    for sandbox in sandboxes {
        let pod = pods
            .get(&pod_name(sandbox))
            .await
            .expect("the sandbox's pod");
        let controllers: Vec<_> = pod
            .owner_references()
            .iter()
            .filter(|r| r.controller == Some(true))
            .collect();
        assert_eq!(controllers.len(), 1, "one controller: {controllers:?}");
        assert_eq!(
            Some(controllers[0].uid.as_str()),
            sandbox.meta().uid.as_deref(),
            "pod {} is {}'s",
            pod.name_any(),
            sandbox.name_any()
        );
        let labels = pod.labels();
        assert_eq!(labels.get(SANDBOX_LABEL), Some(&sandbox.name_any()));
        assert!(
            !labels.contains_key(POOL_LABEL),
            "out of the pool: {labels:?}"
        );
        if pod.name_any() == sandbox.name_any() {
            assert!(!labels.contains_key(CLAIMED_FROM_LABEL));
        } else {
            assert!(pod.name_any().starts_with(&format!("{pool}-")));
            assert_eq!(
                labels.get(CLAIMED_FROM_LABEL).map(String::as_str),
                Some(pool)
            );
            warm += 1;
        }
    }
    warm
}

async fn delete_all(api: &Api<Sandbox>, sandboxes: &[Sandbox]) {
    for s in sandboxes {
        let _ = api.delete(&s.name_any(), &DeleteParams::default()).await;
    }
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

#[tokio::test]
async fn warm_pools_on_the_real_node() {
    let env = env();
    let ns = env.namespace("pool").await;
    let client = env.client().await;
    let image = env.node.real().image("busybox");
    let pools: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let admin = Caller::user(env, "admin");
    let pool: SandboxPool = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool",
        "metadata": {"name": "py"},
        "spec": {"replicas": 8, "template": {"image": image, "network": {"egress": "AllowAll"}}},
    }))
    .expect("pool JSON");
    pools
        .create(&PostParams::default(), &pool)
        .await
        .expect("create pool");
    let full = filled(&pools, "py", 8).await;
    assert_eq!(
        full.status.as_ref().and_then(|s| s.selector.as_deref()),
        Some("orchard.dev/pool=py")
    );

    // 8 concurrent creators, 8 Ready members: every sandbox gets its own, the pool refills.
    let started = Instant::now();
    let spec = json!({"pool": "py", "network": {"egress": "AllowList", "allow": [{"cidr": "192.0.2.0/24", "ports": [{"port": 443}]}]}});
    let claimed = create_all(&sandboxes, &names("warm", 8), &spec).await;
    println!("8 claims Ready in {:?}", started.elapsed());
    assert_eq!(
        assert_one_pod_each(&pods, &claimed, "py").await,
        8,
        "all warm"
    );
    // The claimed sandbox answers under its own name, and its own egress policy selects its pod.
    let answer = admin
        .exec(
            &ns,
            "warm-0",
            json!({"argv": ["/bin/sh", "-c", "printf %s \"$ORCHARD_SANDBOX\""]}),
        )
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.body["stdout"], "warm-0",
        "ORCHARD_SANDBOX names the sandbox"
    );
    let pod = pods.get(&pod_name(&claimed[0])).await.expect("pod");
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let selecting: Vec<String> = policies
        .list(&ListParams::default())
        .await
        .expect("policies")
        .items
        .into_iter()
        .filter(|p| {
            let selector = p.spec.as_ref().and_then(|s| s.pod_selector.as_ref());
            selector
                .and_then(|s| s.match_labels.as_ref())
                .is_some_and(|want| want.iter().all(|(k, v)| pod.labels().get(k) == Some(v)))
        })
        .map(|p| p.name_any())
        .collect();
    assert_eq!(
        selecting,
        vec![
            "orchard-sandbox-baseline".to_string(),
            "warm-0-egress".to_string()
        ],
        "the baseline and the sandbox's own egress policy select the claimed pod, nothing of the pool's"
    );
    let own = policies.get("warm-0-egress").await.expect("own policy");
    let rule = serde_json::to_string(&own.spec).unwrap_or_default();
    assert!(rule.contains("192.0.2.0/24"), "its own allow-list: {rule}");
    // The pool writes its status at most once per 250 ms, so right after the claims it can still
    // show the members it had before them: wait for a status that counts them and is full again.
    let refilled = wait::until(
        &pools,
        "py",
        "the 8 claims counted and the pool refilled",
        READY,
        |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.claimed_total >= 8 && s.ready_replicas == 8 && s.replicas == 8)
        },
    )
    .await;
    let status = refilled.status.expect("status");
    assert!(status.claimed_last_minute >= 8, "{status:?}");
    delete_all(&sandboxes, &claimed).await;

    // 20 concurrent claims on 8 members: 8 (or more, if a refill is Ready in time) warm, the rest
    // cold, none shared.
    let twenty = create_all(&sandboxes, &names("burst", 20), &json!({"pool": "py"})).await;
    let warm = assert_one_pod_each(&pods, &twenty, "py").await;
    println!("20 claims on 8 members: {warm} warm, {} cold", 20 - warm);
    assert!((8..20).contains(&warm), "8 warm and the rest cold: {warm}");
    delete_all(&sandboxes, &twenty).await;
    filled(&pools, "py", 8).await;

    // The operator is SIGKILLed while 8 sandboxes claim: after the restart each has its own pod.
    let crash = names("crash", 8);
    let creates = crash.iter().map(|name| {
        let api = sandboxes.clone();
        let object: Sandbox = serde_json::from_value(json!({
            "apiVersion": "orchard.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": name}, "spec": {"pool": "py"},
        }))
        .expect("sandbox JSON");
        async move {
            api.create(&PostParams::default(), &object)
                .await
                .expect("create")
        }
    });
    let kill = async {
        tokio::time::sleep(Duration::from_millis(40)).await;
        env.operator().kill();
    };
    futures::join!(join_all(creates), kill);
    env.operator().restart().await.expect("restart");
    let survived = ready_all(&sandboxes, &crash).await;
    let warm = assert_one_pod_each(&pods, &survived, "py").await;
    println!("killed during 8 claims: {warm} warm after the restart");
    // Every member the pool ever had is either its own or one sandbox's: none has two controllers.
    for pod in pods.list(&ListParams::default()).await.expect("pods").items {
        let controllers = pod
            .owner_references()
            .iter()
            .filter(|r| r.controller == Some(true))
            .count();
        assert!(
            controllers <= 1,
            "{}: {controllers} controllers",
            pod.name_any()
        );
    }
    delete_all(&sandboxes, &survived).await;

    // Whenever the spec differs from the template, the sandbox starts cold (or waits, by setting).
    let own_image = create_all(
        &sandboxes,
        &["cold-env".to_string()],
        &json!({"pool": "py", "env": [{"name": "A", "value": "1"}]}),
    )
    .await;
    assert_eq!(
        assert_one_pod_each(&pods, &own_image, "py").await,
        0,
        "cold"
    );
    delete_all(&sandboxes, &own_image).await;
    let waiting: Sandbox = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": "waits"},
        "spec": {"pool": "py", "whenPoolEmpty": "Wait", "workingDir": "/tmp"},
    }))
    .expect("json");
    sandboxes
        .create(&PostParams::default(), &waiting)
        .await
        .expect("create");
    let stalled = wait::until(
        &sandboxes,
        "waits",
        "Stalled",
        READY,
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                st.conditions.iter().any(|c| {
                    c.type_ == "Stalled" && c.status == "True" && c.reason == "PoolTemplateMismatch"
                })
            })
        },
    )
    .await;
    let message = stalled.status.and_then(|s| s.message).unwrap_or_default();
    println!("a mismatching sandbox that waits: {message}");
    assert!(
        pods.get_opt("waits").await.expect("get").is_none(),
        "no cold start"
    );

    // A RolloutGroup whose template names the pool draws its trajectories from it.
    let claims_before = filled(&pools, "py", 8)
        .await
        .status
        .map_or(0, |s| s.claimed_total);
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let template = json!({"spec": {"pool": "py", "run": {
        "command": ["/bin/sh", "-c", reward_script(7, 50, None, None)],
        "timeoutSeconds": 60, "resultPath": "result.json"}}});
    groups
        .create(
            &PostParams::default(),
            &group(
                "prompt-1",
                json!({"groupSize": 2, "maxTrajectories": 6, "stride": 2, "template": template}),
            ),
        )
        .await
        .expect("create group");
    wait::until(&groups, "prompt-1", "Complete", GROUP_TIMEOUT, is_complete).await;
    let done = groups.get("prompt-1").await.expect("group");
    orchard_testcluster::test_support::rollouts::assert_matches_engine(&done);
    // Recorded from a run for its fixed seed (`Recorded`): the same script, seed and names as
    // `real_node.rs`'s group, whose members are pinned there too.
    orchard_testcluster::test_support::rollouts::assert_recorded(
        &done,
        &orchard_testcluster::test_support::rollouts::Recorded {
            selection: orchard_operator::api::Selection::Balanced,
            positives: 1,
            members: &["prompt-1-0", "prompt-1-1"],
        },
    );
    // The pool's status counts the claims at its next pass (at most 250 ms later): the runs here end
    // within milliseconds, so the group can complete before that.
    let counted = wait::until(
        &pools,
        "py",
        "the first stride's claims counted",
        Duration::from_secs(10),
        |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.claimed_total >= claims_before + 2)
        },
    )
    .await;
    let claims_after = counted.status.map_or(0, |s| s.claimed_total);
    assert!(
        claims_after >= claims_before + 2,
        "the first stride came from the pool: {claims_before} -> {claims_after} claims"
    );

    // Scaling through the scale subresource resizes the pool.
    pools
        .patch_scale(
            "py",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .expect("scale down through the scale subresource");
    filled(&pools, "py", 2).await;
    env.delete_namespace(&ns).await;
}
