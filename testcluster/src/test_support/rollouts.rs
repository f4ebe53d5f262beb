//! Helpers shared by the RolloutGroup end-to-end tests.

use std::time::Duration;

use kube::api::{Api, ListParams};
use orchard_api::{
    RolloutGroup, RolloutGroupStatus, Sandbox, Selection, TrajectoryRecord, TrajectoryStatus,
};
use orchard_bar::{self as bar, Progress, Step};
use orchard_operator::rollout::observe::bar_trajectory;
use orchard_operator::rollout::params::bar_params;
use serde_json::json;

pub const GROUP_TIMEOUT: Duration = Duration::from_secs(180);

/// A runner that draws reward 1 with probability `pass_percent`% from a seeded LCG over the
/// trajectory index, with length 50..449; `abort_when` (a shell arithmetic test on `i`) exits without a
/// result; `sleep` delays the result.
pub fn reward_script(
    seed: u64,
    pass_percent: u64,
    abort_when: Option<&str>,
    sleep: Option<u32>,
) -> String {
    let mut script = String::from("i=${ORCHARD_SANDBOX##*-}\n");
    script.push_str(&format!(
        "x=$(( (i * 1103515245 + {seed}) % 2147483648 ))\n"
    ));
    if let Some(condition) = abort_when {
        script.push_str(&format!(
            "if [ $(( {condition} )) -ne 0 ]; then echo aborting >&2; exit 3; fi\n"
        ));
    }
    if let Some(seconds) = sleep {
        script.push_str(&format!("sleep {seconds}\n"));
    }
    script.push_str(&format!(
        "r=$(( x % 100 < {pass_percent} ))\nlen=$(( 50 + x % 400 ))\n"
    ));
    script.push_str("printf '{\"reward\": %d, \"status\": \"completed\", \"length\": %d}' \"$r\" \"$len\" > result.json\n");
    script
}

/// What the script yields for trajectory `index`: (reward, length), or None when it aborts.
pub fn expected(seed: u64, pass_percent: u64, index: u64) -> (f64, i64) {
    let x = (index * 1_103_515_245 + seed) % 2_147_483_648;
    (
        if x % 100 < pass_percent { 1.0 } else { 0.0 },
        50 + (x % 400) as i64,
    )
}

pub fn group(name: &str, spec: serde_json::Value) -> RolloutGroup {
    serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutGroup",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("valid RolloutGroup JSON")
}

pub fn template(script: &str, timeout_seconds: u32) -> serde_json::Value {
    json!({"spec": {
        "image": "busybox:1.36",
        "run": {"command": ["/bin/sh", "-c", script], "timeoutSeconds": timeout_seconds, "resultPath": "result.json"},
    }})
}

pub fn is_complete(g: Option<&RolloutGroup>) -> bool {
    g.and_then(|g| g.status.as_ref()).is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True")
    })
}

/// Replays BAR over the recorded outcomes, stride by stride (StrideBoundary: the engine decides once
/// each stride is fully terminal), and checks the recorded group is the engine's decision.
pub fn assert_matches_engine(group: &RolloutGroup) {
    let params = bar_params(&group.spec).expect("valid params");
    let status = group.status.as_ref().expect("status");
    let strides = u32::try_from(status.strides_launched).expect("strides");
    let stride_of = |r: &TrajectoryRecord| u32::try_from(r.stride).expect("stride");
    let mut decision = None;
    for k in 0..strides {
        let pool: Vec<bar::Trajectory> = status
            .trajectories
            .iter()
            .filter(|r| stride_of(r) <= k)
            .filter_map(bar_trajectory)
            .collect();
        let launched = (k + 1) * params.stride;
        match bar::next_step(
            &params,
            &Progress {
                launched,
                terminal: &pool,
            },
        ) {
            Step::LaunchStride { stride_index, .. } => {
                assert_eq!(stride_index, k + 1, "the engine launches the next stride");
                assert!(
                    k + 1 < strides,
                    "the engine wanted stride {} but the controller stopped",
                    k + 1
                );
            }
            Step::Finish(d) => {
                assert_eq!(
                    k + 1,
                    strides,
                    "the engine finished after stride {k} but the controller launched more"
                );
                decision = Some(d);
            }
            Step::Wait => {
                panic!("all trajectories of stride {k} are terminal; the engine must not wait")
            }
        }
    }
    let decision = decision.expect("the engine finished the group");
    assert_eq!(
        status.selection.map(|s| format!("{s:?}")),
        Some(format!("{:?}", decision.selection))
    );
    let names: Vec<&str> = status.group.iter().map(|m| m.name.as_str()).collect();
    let expected: Vec<&str> = decision.group.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names, expected,
        "recorded group = engine's group, in rank order"
    );
    assert_eq!(
        status.positives,
        Some(i32::try_from(decision.positives).expect("positives"))
    );
}

/// The group BAR chose for a test's fixed seed, written down as literals from a run of that test.
///
/// [`assert_matches_engine`] replays the same engine with the operator's own conversions
/// (`bar_params`, `bar_trajectory`), so a bug in either shows up on both sides and passes; a recorded
/// group does not move with the code. The seeds are fixed and the runners' outcomes are a pure
/// function of the seed and the trajectory index, so the group is too. When one of these changes,
/// BAR's choice for that seed changed: find out why (the engine's reference tests in
/// `bar/src/reference_tests.rs` say whether the engine is still right) before recording it again.
#[derive(Debug, Clone, Copy)]
pub struct Recorded<'a> {
    /// `status.selection`.
    pub selection: Selection,
    /// `status.positives`.
    pub positives: i32,
    /// `status.group`'s member names, in rank order.
    pub members: &'a [&'a str],
}

/// Asserts `group` recorded exactly `expected` (selection, positives, members in rank order).
pub fn assert_recorded(group: &RolloutGroup, expected: &Recorded<'_>) {
    let name = group.metadata.name.as_deref().unwrap_or_default();
    let status = group.status.as_ref().expect("status");
    let members: Vec<&str> = status.group.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        (status.selection, status.positives, members.as_slice()),
        (
            Some(expected.selection),
            Some(expected.positives),
            expected.members
        ),
        "group {name}: BAR's choice for this seed, recorded from an earlier run, changed (see `Recorded`)"
    );
}

pub fn check_outcomes(
    status: &RolloutGroupStatus,
    seed: u64,
    pass_percent: u64,
    aborts: impl Fn(u64) -> bool,
) {
    for record in &status.trajectories {
        let index: u64 = record
            .name
            .rsplit('-')
            .next()
            .and_then(|i| i.parse().ok())
            .expect("index");
        if record.reason.as_deref() == Some("Cancelled") {
            continue;
        }
        if aborts(index) {
            assert_eq!(record.status, Some(TrajectoryStatus::Aborted), "{record:?}");
            assert_eq!(record.reason.as_deref(), Some("NoResult"), "{record:?}");
        } else {
            let (reward, length) = expected(seed, pass_percent, index);
            assert_eq!(
                record.status,
                Some(TrajectoryStatus::Completed),
                "{record:?}"
            );
            assert_eq!(record.reward, Some(reward), "{record:?}");
            assert_eq!(record.length, Some(length), "{record:?}");
        }
    }
}

pub async fn children(client: &kube::Client, ns: &str, group: &str) -> Vec<Sandbox> {
    let api: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default().labels(&format!("orchard.dev/rollout-group={group}")))
        .await
        .expect("list children")
        .items
}

/// The trajectory names `status` records, each checked to appear once (no trajectory launched twice).
pub fn assert_each_trajectory_once(status: &RolloutGroupStatus) -> Vec<String> {
    let names: Vec<String> = status.trajectories.iter().map(|t| t.name.clone()).collect();
    let unique: std::collections::BTreeSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "no trajectory twice: {names:?}");
    names
}

/// The most pods matching `labels` in `ns` that existed at once, kept up to date by a watch (pods
/// are counted from their first event until their deletion, Terminating ones included).
pub fn watch_pod_peak(
    client: &kube::Client,
    ns: &str,
    labels: &str,
) -> std::sync::Arc<std::sync::Mutex<PodPeak>> {
    use futures::StreamExt;
    use kube::ResourceExt;
    use kube::runtime::watcher;
    let peak = std::sync::Arc::new(std::sync::Mutex::new(PodPeak::default()));
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let config = watcher::Config::default().labels(labels);
    let record = peak.clone();
    tokio::spawn(async move {
        let mut events = watcher(pods, config).boxed();
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let mut peak = record.lock().unwrap_or_else(|p| p.into_inner());
            match event {
                watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                    peak.alive.insert(pod.name_any());
                }
                watcher::Event::Delete(pod) => {
                    peak.alive.remove(&pod.name_any());
                }
                _ => {}
            }
            peak.most = peak.most.max(peak.alive.len());
        }
    });
    peak
}

/// What [`watch_pod_peak`] saw.
#[derive(Debug, Default)]
pub struct PodPeak {
    /// Pods that exist now.
    pub alive: std::collections::BTreeSet<String>,
    /// The most that existed at once.
    pub most: usize,
}

/// Waits until RolloutQueue `name`'s status shows nothing running and nothing waiting.
pub async fn wait_queue_idle(queues: &Api<orchard_api::RolloutQueue>, name: &str) {
    crate::wait::until(
        queues,
        name,
        "idle",
        Duration::from_secs(60),
        |q: Option<&orchard_api::RolloutQueue>| {
            q.and_then(|q| q.status.as_ref())
                .is_some_and(|s| s.running_trajectories == 0 && s.waiting_groups == 0)
        },
    )
    .await;
}
