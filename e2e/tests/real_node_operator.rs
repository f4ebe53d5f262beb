//! The operator's own failures and access checks against real containers (kubelet, containerd, runc),
//! where the hollow node could hide a difference: a real pod keeps running while the operator is dead
//! and must be adopted, not recreated, and a stream from a real agent must be cut when its caller
//! loses access. The binary has an operator of its own (it is killed here) with a short
//! authorisation cache, and runs one test at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use orchard_operator::api::{RolloutGroup, Selection, TrajectoryStatus};
use orchard_testcluster::env::{EnvOptions, NodeKind, TestEnv};
use orchard_testcluster::test_support::gateway::{Caller, TickingStream, grant, trainer_rules};
use orchard_testcluster::test_support::rollouts::{
    GROUP_TIMEOUT, Recorded, assert_each_trajectory_once, assert_matches_engine, assert_recorded,
    check_outcomes, children, group, is_complete, reward_script, template,
};
use orchard_testcluster::wait;
use serde_json::json;

/// Seconds the gateway reuses an authorisation decision; streams re-check their caller this often.
const AUTH_TTL_SECONDS: u64 = 2;

/// One test at a time: one of them kills the operator.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn env() -> &'static TestEnv {
    static ENV: OnceLock<TestEnv> = OnceLock::new();
    ENV.get_or_init(|| {
        TestEnv::start_named_on_own_thread(
            "real-operator",
            EnvOptions {
                node: NodeKind::Real,
                operator_args: vec![format!(
                    "--gateway-auth-cache-ttl-seconds={AUTH_TTL_SECONDS}"
                )],
                ..EnvOptions::default()
            },
        )
    })
}

/// Every UID each pod name of `ns` had, from a watch started now: a pod deleted and made again under
/// its name shows two.
fn watch_pod_uids(
    client: &kube::Client,
    ns: &str,
) -> Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> {
    let seen = Arc::new(Mutex::new(BTreeMap::<String, BTreeSet<String>>::new()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let record = seen.clone();
    tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) = event else {
                continue;
            };
            record
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(pod.name_any())
                .or_default()
                .insert(pod.uid().unwrap_or_default());
        }
    });
    seen
}

/// Trajectory pods of group `name` whose task container runs.
async fn running_trajectory_pods(client: &kube::Client, ns: &str, name: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("orchard.dev/rollout-group={name}");
    let Ok(list) = pods
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
    else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_trajectory_containers_are_adopted_after_an_operator_crash() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let client = env.client().await;
    let ns = env.namespace("real-crash").await;
    let pod_uids = watch_pod_uids(&client, &ns);
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), &ns);
    let (seed, pass) = (5151, 50);
    // Each trajectory runs 3 s, long enough to be running in a real container when the operator dies.
    let mut spec = template(&reward_script(seed, pass, None, Some(3)), 60);
    spec["spec"]["image"] = json!(env.node.real().image("busybox"));
    groups
        .create(
            &PostParams::default(),
            &group(
                "crashy",
                json!({"groupSize": 2, "maxTrajectories": 6, "stride": 2,
                       "template": spec, "cleanup": "Keep"}),
            ),
        )
        .await
        .expect("create group");
    let running = wait::poll(
        "the first stride running in real containers",
        Duration::from_secs(120),
        || async {
            let running = running_trajectory_pods(&client, &ns, "crashy").await;
            (running.len() >= 2).then_some(running)
        },
    )
    .await;
    env.operator().kill();
    // The containers go on without the operator; it comes back while they run.
    env.operator().restart().await.expect("operator restarts");

    let done = wait::until(&groups, "crashy", "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.clone().expect("status");
    let names = assert_each_trajectory_once(&status);
    assert!(
        status
            .trajectories
            .iter()
            .all(|t| t.status != Some(TrajectoryStatus::Aborted)),
        "the crash aborted nothing: {status:?}"
    );
    let kids: BTreeSet<String> = children(&client, &ns, "crashy")
        .await
        .iter()
        .map(|k| k.name_any())
        .collect();
    assert_eq!(
        kids.len(),
        names.len(),
        "one sandbox per launched trajectory: {kids:?}"
    );
    check_outcomes(&status, seed, pass, |_| false);
    assert_matches_engine(&done);
    // Recorded from a run of this test for its fixed seed (`Recorded`).
    assert_recorded(
        &done,
        &Recorded {
            selection: Selection::Balanced,
            positives: 1,
            members: &["crashy-3", "crashy-0"],
        },
    );
    let seen = pod_uids.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for pod in &running {
        let name = pod.name_any();
        assert_eq!(
            seen.get(&name).map(BTreeSet::len),
            Some(1),
            "{name}, running when the operator died, was adopted, not made again: {seen:?}"
        );
        assert!(
            status
                .trajectories
                .iter()
                .any(|t| t.name == name && t.reward.is_some()),
            "{name}'s result was recorded: {status:?}"
        );
    }
    assert!(
        seen.values().all(|uids| uids.len() == 1),
        "no pod made twice under one name: {seen:?}"
    );
    env.delete_namespace(&ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_from_a_real_container_ends_soon_after_access_is_revoked() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    let ns = env.namespace("real-revoke").await;
    grant(env, &ns, "alice", "trainer", trainer_rules()).await;
    let alice = Caller::user(env, "alice");
    let name = alice
        .create_sandbox(&ns, json!({"image": env.node.real().image("busybox")}))
        .await;
    alice.wait_ready(&ns, &name).await;
    let mut stream = TickingStream::start(&alice, &ns, &name).await;
    Api::<RoleBinding>::namespaced(env.client().await, &ns)
        .delete("trainer", &DeleteParams::default())
        .await
        .expect("delete the role binding");
    let revoked = Instant::now();
    // A correctness bound, not a measurement: two cache lifetimes and a margin for this machine.
    let limit = Duration::from_secs(AUTH_TTL_SECONDS * 2 + 4);
    assert!(
        stream.ends_within(limit).await,
        "the stream still runs {limit:?} after revocation"
    );
    eprintln!(
        "stream from a real container ended {:?} after the RoleBinding was deleted (TTL {AUTH_TTL_SECONDS} s)",
        revoked.elapsed()
    );
    stream.assert_revoked();
    let again = alice
        .exec(&ns, &name, json!({"command": "echo still"}))
        .await;
    assert_eq!(again.status, 403, "a new call is refused: {again:?}");
    env.delete_namespace(&ns).await;
}
