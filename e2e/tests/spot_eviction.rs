//! A node taken away in the middle of a RolloutGroup's stride, on two real nodes (`orchard-node`,
//! `orchard-node-2`) with the operator installed by its chart on the first: a drain (every pod evicted
//! through the Eviction API), then a spot reclaim (the node's kubelet, containerd and containers
//! SIGKILLed, its packets dropped, its Node object left as it was).
//!
//! In each phase two groups run the same seeded runners (20 s each) with every trajectory of their
//! first stride on the second node (the first node is cordoned while they are placed): one retries
//! evicted and lost trajectories (`retry.onEviction`), one does not. Then:
//! - the retrying group's trajectories are relaunched on the first node under the same names (attempt
//!   2, the earlier attempt's reason `Evicted` or `NodeLost` in `previousAttempts`) and complete with
//!   the rewards their runner yields;
//! - the other group's trajectories are aborted (`SandboxFailed`, the sandbox's reason `Evicted` or
//!   `NodeLost`) and BAR backfills them with its next stride;
//! - each group records exactly the group the BAR engine chooses from its recorded outcomes, and no
//!   trajectory is recorded twice;
//! - after the reclaim, a SandboxPool whose members were on the lost node refills on the first, and
//!   no pod of the namespace stays bound to the lost node (the operator removes pods its node will
//!   never finish deleting), though the Node object is still there.
//!
//! The chart sets `sandboxDefaults.nodeLostSeconds` to 5: a sandbox pod tolerates the lost node's
//! taints for 5 s after the node-lifecycle controller marks it NotReady (5 s here).

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use orchard_operator::api::{
    RolloutGroup, Sandbox, SandboxPool, TrajectoryRecord, TrajectoryStatus,
};
use orchard_testcluster::chart_install::{ChartRelease, ReleaseOptions};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::real_node::drain::{cordon, drain};
use orchard_testcluster::test_support::nodes::{
    FIRST, HOSTNAME, SECOND, create_pool, members_ready, two_real_nodes,
};
use orchard_testcluster::test_support::rollouts::{
    assert_each_trajectory_once, assert_matches_engine, children, expected, group, is_complete,
    reward_script,
};
use orchard_testcluster::wait;
use serde_json::json;

/// The runners' seed and pass rate: rewards are a pure function of these and the trajectory index.
const SEED: u64 = 4_242;
const PASS_PERCENT: u64 = 50;
/// How long each runner works before it writes its result.
const RUN_SECONDS: u32 = 20;
/// Long enough for a retried or backfilled stride on a busy two-core machine.
const GROUP_TIMEOUT: Duration = Duration::from_secs(240);

fn env() -> &'static TestEnv {
    static ENV: OnceLock<TestEnv> = OnceLock::new();
    ENV.get_or_init(|| two_real_nodes("spot_eviction"))
}

fn phase(started: Instant, what: &str) {
    eprintln!("[{:>6.1} s] {what}", started.elapsed().as_secs_f64());
}

/// A group of N 4, Nmax 8 in strides of 4 whose runners sleep [`RUN_SECONDS`] and then write the
/// seeded reward; `retry` retries evicted and lost trajectories.
fn rollout(name: &str, image: &str, retry: bool) -> RolloutGroup {
    let mut spec = json!({
        "groupSize": 4, "maxTrajectories": 8, "stride": 4,
        "template": {"spec": {
            "image": image,
            "resources": {"cpu": "50m", "memory": "32Mi"},
            "run": {
                "command": ["/bin/sh", "-c", reward_script(SEED, PASS_PERCENT, None, Some(RUN_SECONDS))],
                "timeoutSeconds": 120, "resultPath": "result.json",
            },
        }},
        "cleanup": "Keep",
    });
    if retry {
        spec["retry"] = json!({"maxAttempts": 3, "onEviction": true});
    }
    group(name, spec)
}

fn index_of(name: &str) -> u64 {
    name.rsplit('-')
        .next()
        .and_then(|i| i.parse().ok())
        .expect("a trajectory name ends in its index")
}

/// Creates `names` (retrying and not, in that order) while the first node is cordoned, so that their
/// first strides land on the second node; waits until every trajectory of those strides runs there.
/// Returns the trajectory names placed on the second node, per group.
async fn launch_on_second(
    client: &kube::Client,
    ns: &str,
    image: &str,
    names: [&str; 2],
) -> BTreeMap<String, Vec<String>> {
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), ns);
    cordon(client, FIRST, true)
        .await
        .expect("cordon the first node");
    for (name, retry) in [(names[0], true), (names[1], false)] {
        groups
            .create(&PostParams::default(), &rollout(name, image, retry))
            .await
            .expect("create group");
    }
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let placed = wait::poll(
        "both groups' first strides Ready on the second node",
        Duration::from_secs(120),
        || async {
            let all = sandboxes.list(&ListParams::default()).await.ok()?.items;
            let mut placed: BTreeMap<String, Vec<String>> = BTreeMap::new();
            let ours = |s: &&Sandbox| {
                s.labels()
                    .get("orchard.dev/rollout-group")
                    .is_some_and(|g| names.contains(&g.as_str()))
            };
            for s in all.iter().filter(ours) {
                let status = s.status.as_ref()?;
                let ready = status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if !ready || status.node_name.as_deref() != Some(SECOND) {
                    return None;
                }
                let group = s.labels().get("orchard.dev/rollout-group")?.clone();
                placed.entry(group).or_default().push(s.name_any());
            }
            (placed.len() == 2 && placed.values().all(|v| v.len() == 4)).then_some(placed)
        },
    )
    .await;
    cordon(client, FIRST, false)
        .await
        .expect("uncordon the first node");
    placed
}

/// The group once Complete, checked against the BAR engine and for trajectories recorded twice.
async fn completed(client: &kube::Client, ns: &str, name: &str) -> RolloutGroup {
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), ns);
    let done = wait::until(&groups, name, "Complete", GROUP_TIMEOUT, is_complete).await;
    let status = done.status.as_ref().expect("status");
    assert_each_trajectory_once(status);
    assert_matches_engine(&done);
    eprintln!(
        "{name}: selection {:?}, positives {:?}, strides {}, launched {}, group {:?}",
        status.selection,
        status.positives,
        status.strides_launched,
        status.trajectories_launched,
        status
            .group
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>()
    );
    done
}

fn by_name(sandboxes: Vec<Sandbox>) -> BTreeMap<String, Sandbox> {
    sandboxes.into_iter().map(|s| (s.name_any(), s)).collect()
}

fn record<'a>(group: &'a RolloutGroup, name: &str) -> &'a TrajectoryRecord {
    group
        .status
        .as_ref()
        .and_then(|s| s.trajectories.iter().find(|t| t.name == name))
        .unwrap_or_else(|| panic!("{name} recorded"))
}

/// A trajectory that completed with the reward and length its runner yields.
fn assert_completed_as_seeded(record: &TrajectoryRecord) {
    let (reward, length) = expected(SEED, PASS_PERCENT, index_of(&record.name));
    assert_eq!(
        (record.status, record.reward, record.length),
        (
            Some(TrajectoryStatus::Completed),
            Some(reward),
            Some(length)
        ),
        "{record:?}"
    );
}

/// The retrying group: the trajectories that were on the lost or drained node completed on the
/// first node as attempt 2 after an attempt that ended `reason`; the others as attempt 1.
async fn assert_retried_elsewhere(
    client: &kube::Client,
    ns: &str,
    done: &RolloutGroup,
    moved: &[String],
    reason: &str,
) {
    let status = done.status.as_ref().expect("status");
    let sandboxes = by_name(children(client, ns, &done.name_any()).await);
    for record in &status.trajectories {
        assert_completed_as_seeded(record);
        if moved.contains(&record.name) {
            assert_eq!(record.attempts, 2, "{record:?}");
            let previous = record
                .previous_attempts
                .first()
                .expect("an earlier attempt");
            assert_eq!(previous.reason, reason, "{record:?}");
            let sandbox = &sandboxes[&record.name];
            assert_eq!(
                sandbox.status.as_ref().and_then(|s| s.node_name.as_deref()),
                Some(FIRST),
                "{} retried on the surviving node",
                record.name
            );
        } else {
            assert!(record.attempts <= 1, "{record:?}");
        }
    }
    assert_eq!(
        status.trajectories_launched,
        status.trajectories.len() as i32,
        "a retry is not a new trajectory"
    );
}

/// The group without retries: the trajectories of the lost or drained node were aborted, their
/// sandboxes failed with `reason` (kept: the groups' cleanup is `Keep`), the others completed as
/// seeded.
async fn assert_aborted_and_backfilled(
    client: &kube::Client,
    ns: &str,
    done: &RolloutGroup,
    moved: &[String],
    reason: &str,
) {
    let status = done.status.as_ref().expect("status");
    let sandboxes = by_name(children(client, ns, &done.name_any()).await);
    for name in moved {
        let record = record(done, name);
        assert_eq!(
            (record.status, record.reason.as_deref()),
            (Some(TrajectoryStatus::Aborted), Some("SandboxFailed")),
            "{record:?}"
        );
        let failed = sandboxes[name].status.clone().unwrap_or_default();
        assert_eq!(
            failed.reason.as_deref(),
            Some(reason),
            "{name}: {:?}",
            failed.message
        );
        eprintln!("{name}: {reason}: {}", failed.message.unwrap_or_default());
    }
    for record in status
        .trajectories
        .iter()
        .filter(|r| !moved.contains(&r.name))
    {
        assert_completed_as_seeded(record);
    }
    assert!(
        status.strides_launched >= 2,
        "four aborted trajectories leave stride 1 without a balanced group: BAR launches stride 2"
    );
}

#[tokio::test]
async fn a_node_drained_or_reclaimed_mid_stride_retries_or_backfills_its_trajectories() {
    let started = Instant::now();
    let env = env();
    let client = env.client().await;
    phase(started, "two real nodes Ready");
    let release = env
        .on_env_runtime(async {
            let options = ReleaseOptions {
                values: vec![
                    (
                        format!("nodeSelector.{}", HOSTNAME.replace('.', "\\.")),
                        FIRST.into(),
                    ),
                    ("sandboxDefaults.nodeLostSeconds".into(), "5".into()),
                ],
                ..ReleaseOptions::default()
            };
            ChartRelease::install(env, &options)
                .await
                .unwrap_or_else(|e| panic!("helm install: {e}"))
        })
        .await;
    for pod in release.pods(&client).await.expect("operator pods") {
        assert_eq!(
            pod.spec.and_then(|s| s.node_name).as_deref(),
            Some(FIRST),
            "the operator runs on the node that stays"
        );
    }
    let ns = env.namespace("spot").await;
    let busybox = env.node.real().image("busybox");
    phase(started, "chart installed on the first node");

    // A drain of the second node in the middle of both groups' first strides.
    let placed = launch_on_second(&client, &ns, &busybox, ["drain-retry", "drain-plain"]).await;
    phase(started, &format!("first strides on {SECOND}: {placed:?}"));
    let evicted = drain(&client, SECOND, Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("drain: {e}"));
    phase(
        started,
        &format!("{SECOND} drained: evicted {} pods", evicted.len()),
    );
    let retried = completed(&client, &ns, "drain-retry").await;
    assert_retried_elsewhere(&client, &ns, &retried, &placed["drain-retry"], "Evicted").await;
    let backfilled = completed(&client, &ns, "drain-plain").await;
    assert_aborted_and_backfilled(&client, &ns, &backfilled, &placed["drain-plain"], "Evicted")
        .await;
    phase(started, "drain: retried on the first node, and backfilled");
    cordon(&client, SECOND, false).await.expect("uncordon");

    // A spot reclaim of the second node in the middle of two new groups' first strides, with a
    // SandboxPool's members there too.
    let pools: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    cordon(&client, FIRST, true).await.expect("cordon");
    create_pool(&pools, "warm", 2, &busybox, ("50m", "32Mi")).await;
    members_ready(&pods, "warm", 2, &[SECOND], Duration::from_secs(120)).await;
    let placed = launch_on_second(&client, &ns, &busybox, ["reclaim-retry", "reclaim-plain"]).await;
    phase(
        started,
        &format!("pool members and first strides on {SECOND}: {placed:?}"),
    );
    let reclaimed = Instant::now();
    env.on_env_runtime(async {
        crate::env()
            .node
            .real_named(SECOND)
            .reclaim()
            .await
            .unwrap_or_else(|e| panic!("reclaim: {e}"))
    })
    .await;
    phase(started, &format!("{SECOND} reclaimed"));
    let retried = completed(&client, &ns, "reclaim-retry").await;
    phase(
        started,
        &format!(
            "reclaim-retry complete {:.1} s after the reclaim",
            reclaimed.elapsed().as_secs_f64()
        ),
    );
    assert_retried_elsewhere(&client, &ns, &retried, &placed["reclaim-retry"], "NodeLost").await;
    let backfilled = completed(&client, &ns, "reclaim-plain").await;
    assert_aborted_and_backfilled(
        &client,
        &ns,
        &backfilled,
        &placed["reclaim-plain"],
        "NodeLost",
    )
    .await;
    members_ready(&pods, "warm", 2, &[FIRST], Duration::from_secs(120)).await;
    phase(
        started,
        "reclaim: retried, backfilled, the pool refilled on the first node",
    );

    // Nothing of the namespace stays bound to the lost node, whose Node object is still there.
    let node = Api::<Node>::all(client.clone())
        .get(SECOND)
        .await
        .expect("the lost Node is still there");
    assert!(
        node.spec.and_then(|s| s.taints).is_some_and(|t| t
            .iter()
            .any(|t| t.key.starts_with("node.kubernetes.io/unreachable"))),
        "the lost node is tainted unreachable"
    );
    let left = wait::poll(
        "no pod of the namespace bound to the lost node",
        Duration::from_secs(30),
        || async {
            let on_lost: Vec<String> = pods
                .list(&ListParams::default().fields(&format!("spec.nodeName={SECOND}")))
                .await
                .ok()?
                .items
                .iter()
                .map(|p| p.name_any())
                .collect();
            on_lost.is_empty().then_some(on_lost)
        },
    )
    .await;
    assert!(left.is_empty());
    env.delete_namespace(&ns).await;
    phase(started, "done");
}
