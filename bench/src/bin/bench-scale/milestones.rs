//! When the driver's watches first saw each step of a sandbox's start (Sandbox, Pod created, bound,
//! running, Ready), and the percentiles of the steps in between.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use orchard_testcluster::proc_stats::percentile;

/// When the driver's watches first saw each step of one sandbox's start.
#[derive(Default, Clone, Copy)]
pub(crate) struct Milestones {
    pub(crate) sandbox_seen: Option<Instant>,
    pub(crate) pod_created: Option<Instant>,
    pub(crate) pod_bound: Option<Instant>,
    pub(crate) container_running: Option<Instant>,
    pub(crate) pod_ready: Option<Instant>,
    pub(crate) sandbox_ready: Option<Instant>,
}

pub(crate) async fn track_milestones(
    kube: kube::Client,
    milestones: Arc<std::sync::Mutex<BTreeMap<String, Milestones>>>,
    pods_cache: kube::runtime::reflector::store::Writer<k8s_openapi::api::core::v1::Pod>,
) {
    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::{WatchStreamExt, watcher};
    use orchard_operator::api::Sandbox;
    let sandboxes = watcher(
        kube::Api::<Sandbox>::namespaced(kube.clone(), "default"),
        watcher::Config::default(),
    )
    .boxed();
    let pods = watcher(
        kube::Api::<Pod>::namespaced(kube, "default"),
        watcher::Config::default(),
    )
    .reflect(pods_cache)
    .boxed();
    enum Seen {
        Sandbox(Box<Sandbox>),
        Pod(Box<Pod>),
    }
    let mut events = std::pin::pin!(futures::stream::select(
        sandboxes.filter_map(|e| async move {
            match e {
                Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => {
                    Some(Seen::Sandbox(Box::new(s)))
                }
                _ => None,
            }
        }),
        pods.filter_map(|e| async move {
            match e {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    Some(Seen::Pod(Box::new(p)))
                }
                _ => None,
            }
        }),
    ));
    while let Some(seen) = events.next().await {
        let now = Instant::now();
        let mut all = milestones.lock().unwrap_or_else(|p| p.into_inner());
        match seen {
            Seen::Sandbox(s) => {
                let m = all
                    .entry(s.metadata.name.clone().unwrap_or_default())
                    .or_default();
                m.sandbox_seen.get_or_insert(now);
                let ready = s.status.as_ref().is_some_and(|st| {
                    st.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
                if ready {
                    m.sandbox_ready.get_or_insert(now);
                }
            }
            Seen::Pod(p) => {
                let m = all
                    .entry(p.metadata.name.clone().unwrap_or_default())
                    .or_default();
                m.pod_created.get_or_insert(now);
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                    m.pod_bound.get_or_insert(now);
                }
                let running = p
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                    });
                if running {
                    m.container_running.get_or_insert(now);
                }
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if ready {
                    m.pod_ready.get_or_insert(now);
                }
            }
        }
    }
}

/// One step of a sandbox's start: from one milestone to the next.
pub(crate) type Step = fn(&Milestones) -> Option<(Instant, Instant)>;

/// The steps of a sandbox's start, by name, in order.
pub(crate) fn milestone_steps() -> [(&'static str, Step); 5] {
    [
        (
            "Sandbox created -> Pod created (operator: egress policy if any, Pod)",
            |m| Some((m.sandbox_seen?, m.pod_created?)),
        ),
        ("Pod created -> Pod bound (scheduling)", |m| {
            Some((m.pod_created?, m.pod_bound?))
        }),
        (
            "Pod bound -> task container running (volumes, image, agent install, container start)",
            |m| Some((m.pod_bound?, m.container_running?)),
        ),
        (
            "task container running -> Pod Ready (agent start, readiness probe, status)",
            |m| Some((m.container_running?, m.pod_ready?)),
        ),
        ("Pod Ready -> Sandbox Ready (operator: status)", |m| {
            Some((m.pod_ready?, m.sandbox_ready?))
        }),
    ]
}

/// p50 and p99 (seconds) of each step.
pub(crate) fn milestone_percentiles(
    all: &BTreeMap<String, Milestones>,
) -> Vec<(&'static str, f64, f64)> {
    milestone_steps()
        .into_iter()
        .map(|(name, step)| {
            let mut values: Vec<f64> = all
                .values()
                .filter_map(step)
                .map(|(a, b)| b.saturating_duration_since(a).as_secs_f64())
                .collect();
            values.sort_by(f64::total_cmp);
            (name, percentile(&values, 50.0), percentile(&values, 99.0))
        })
        .collect()
}

pub(crate) fn milestone_table(steps: &[(&str, f64, f64)]) -> String {
    let mut table = String::from("| step | p50 | p99 |\n|---|---|---|\n");
    for (name, p50, p99) in steps {
        table.push_str(&format!("| {name} | {p50:.2} s | {p99:.2} s |\n"));
    }
    table
}
