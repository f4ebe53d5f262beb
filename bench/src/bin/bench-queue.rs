//! `bench-queue` (`make bench-queue`): many RolloutGroups at once, with and without a RolloutQueue, on
//! one local cluster in the same run. G groups (default 64) of Nmax 16 (stride 8, N 8) whose runners
//! sleep a little and report a seeded reward; all at once, and through a queue of Q slots (default
//! 128), in R alternating rounds (default 3; the order flips each round, so a trend in the machine's
//! load falls on both). Reports, per configuration, the median and spread over the rounds of the time
//! until the last group is recorded, the most trajectory pods that existed at once, and the
//! sandbox-seconds (summed lifetimes of the trajectory pods, from a pod watch) per admitted group,
//! plus the selection mix.
//!
//! ```text
//! bench-queue [--groups G] [--slots Q] [--sleep S] [--rounds R] [--real-node] [--write-doc docs/BENCHMARKS.md]
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use orchard_operator::api::{RolloutGroup, RolloutQueue};
use orchard_testcluster::cluster_process::{ClusterProcess, load_average};
use orchard_testcluster::control_plane::client_from_kubeconfig;
use orchard_testcluster::test_support::rollouts::{group, is_complete, reward_script, template};
use serde_json::json;

/// How long each run waits for a quiet machine before it starts anyway (and says so).
const QUIET_WAIT: Duration = Duration::from_secs(90);

struct Args {
    groups: usize,
    slots: i32,
    sleep: u32,
    rounds: u32,
    real_node: bool,
    write_doc: Option<std::path::PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench-queue [--groups G] [--slots Q] [--sleep S] [--rounds R] [--real-node] [--write-doc PATH]"
    );
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut args = Args {
        groups: 64,
        slots: 128,
        sleep: 2,
        rounds: 3,
        real_node: false,
        write_doc: None,
    };
    let mut it = std::env::args().skip(1);
    let number = |v: Option<String>| {
        v.and_then(|v| v.parse::<u32>().ok())
            .filter(|n| *n > 0)
            .unwrap_or_else(|| usage())
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--groups" => args.groups = number(it.next()) as usize,
            "--slots" => args.slots = i32::try_from(number(it.next())).unwrap_or_else(|_| usage()),
            "--sleep" => args.sleep = number(it.next()),
            "--rounds" => args.rounds = number(it.next()),
            "--real-node" => args.real_node = true,
            "--write-doc" => {
                args.write_doc = Some(it.next().map(Into::into).unwrap_or_else(|| usage()))
            }
            _ => usage(),
        }
    }
    args
}

/// What one run measured.
struct Run {
    label: String,
    seconds: f64,
    most_pods: usize,
    pod_seconds: f64,
    admitted: usize,
    selections: BTreeMap<String, usize>,
    load_before: String,
    load_after: String,
    /// The machine during the run: quiet wait, load, CPU steal (`orchard-bench-support`).
    machine: String,
}

/// Pod lifetimes in a namespace, from a watch: first seen to deleted.
#[derive(Default)]
struct PodClock {
    alive: BTreeMap<String, Instant>,
    most: usize,
    seconds: f64,
}

fn watch_pods(client: &Client, ns: &str) -> Arc<Mutex<PodClock>> {
    let clock = Arc::new(Mutex::new(PodClock::default()));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let config = watcher::Config::default().labels("orchard.dev/rollout-group");
    let record = clock.clone();
    tokio::spawn(async move {
        let mut events = watcher(pods, config).boxed();
        while let Some(event) = events.next().await {
            let Ok(event) = event else { continue };
            let mut clock = record.lock().unwrap_or_else(|p| p.into_inner());
            match event {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => {
                    clock.alive.entry(p.name_any()).or_insert_with(Instant::now);
                }
                watcher::Event::Delete(p) => {
                    if let Some(start) = clock.alive.remove(&p.name_any()) {
                        clock.seconds += start.elapsed().as_secs_f64();
                    }
                }
                _ => {}
            }
            clock.most = clock.most.max(clock.alive.len());
        }
    });
    clock
}

/// The label of a configuration (pure).
fn label(queue: Option<i32>) -> String {
    match queue {
        Some(q) => format!("queue of {q}"),
        None => "no queue".to_string(),
    }
}

/// The configurations of round `round` (from 0) in the order they run: unqueued first in even
/// rounds, queued first in odd ones (pure).
fn round_order(round: u32, slots: i32) -> [Option<i32>; 2] {
    if round.is_multiple_of(2) {
        [None, Some(slots)]
    } else {
        [Some(slots), None]
    }
}

async fn run(client: &Client, args: &Args, queue: Option<i32>, round: u32) -> Run {
    let label = label(queue);
    let ns = &if queue.is_some() {
        format!("bench-queued-{round}")
    } else {
        format!("bench-unqueued-{round}")
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace JSON");
    if let Err(err) = namespaces.create(&PostParams::default(), &namespace).await {
        eprintln!("bench-queue: namespace {ns}: {err}");
        std::process::exit(1);
    }
    if let Some(slots) = queue {
        let queues: Api<RolloutQueue> = Api::namespaced(client.clone(), ns);
        let object: RolloutQueue = serde_json::from_value(json!({
            "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutQueue",
            "metadata": {"name": "bench"},
            "spec": {"maxRunningTrajectories": slots, "admission": "Fair"},
        }))
        .expect("queue JSON");
        if let Err(err) = queues.create(&PostParams::default(), &object).await {
            eprintln!("bench-queue: queue: {err}");
            std::process::exit(1);
        }
    }
    let clock = watch_pods(client, ns);
    // Wait (bounded) for the previous run's, or the cluster start's, load to settle.
    let machine = orchard_bench_support::Machine::settle(QUIET_WAIT);
    let load_before = load_average();
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    for g in 0..args.groups {
        let mut spec = json!({
            "groupSize": 8, "maxTrajectories": 16, "stride": 8,
            "template": template(&reward_script(7_000 + g as u64 * 31, 30, None, Some(args.sleep)), 120),
        });
        if queue.is_some() {
            spec["queue"] = json!("bench");
        }
        if let Err(err) = groups
            .create(&PostParams::default(), &group(&format!("g{g}"), spec))
            .await
        {
            eprintln!("bench-queue: group g{g}: {err}");
            std::process::exit(1);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(900);
    let done = loop {
        let list = groups.list(&ListParams::default()).await.map(|l| l.items);
        if let Ok(items) = &list
            && items.iter().filter(|g| is_complete(Some(g))).count() == args.groups
        {
            break list.unwrap_or_default();
        }
        if Instant::now() > deadline {
            eprintln!("bench-queue: {label}: not every group completed within 900 s");
            std::process::exit(1);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    // Wait until every trajectory pod is gone, so its whole lifetime is counted.
    while !clock
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .alive
        .is_empty()
    {
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let load_after = load_average();
    let mut selections = BTreeMap::new();
    for g in &done {
        let selection = g
            .status
            .as_ref()
            .and_then(|s| s.selection)
            .map_or("?".to_string(), |s| format!("{s:?}"));
        *selections.entry(selection).or_insert(0) += 1;
    }
    let admitted = args.groups - selections.get("Dropped").copied().unwrap_or(0);
    let (most_pods, pod_seconds) = {
        let clock = clock.lock().unwrap_or_else(|p| p.into_inner());
        (clock.most, clock.seconds)
    };
    let _ = namespaces.delete(ns, &DeleteParams::default()).await;
    Run {
        label,
        seconds,
        most_pods,
        pod_seconds,
        admitted,
        selections,
        load_before,
        load_after,
        machine: machine.report(),
    }
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    eprintln!("starting the local cluster...");
    let cluster = ClusterProcess::start("bench-queue", args.real_node, &[])
        .await
        .unwrap_or_else(|e| {
            eprintln!("bench-queue: {e}");
            std::process::exit(1)
        });
    let kubeconfig = std::path::PathBuf::from(cluster.field("kubeconfig"));
    let client = client_from_kubeconfig(&kubeconfig)
        .await
        .unwrap_or_else(|e| {
            eprintln!("bench-queue: {e}");
            std::process::exit(1)
        });
    let mut runs = Vec::new();
    for round in 0..args.rounds {
        for queue in round_order(round, args.slots) {
            eprintln!(
                "round {} of {}: {} groups, {}...",
                round + 1,
                args.rounds,
                args.groups,
                label(queue)
            );
            let result = run(&client, &args, queue, round).await;
            eprintln!(
                "{}: last group after {:.1} s, at most {} pods, {:.0} sandbox-seconds",
                result.label, result.seconds, result.most_pods, result.pod_seconds
            );
            runs.push(result);
        }
    }
    drop(cluster);
    let section = doc_section(&args, &runs);
    println!("{section}");
    if let Some(path) = &args.write_doc
        && let Err(err) = orchard_bench::docs::write_section(path, "## Queues", &section)
    {
        eprintln!("bench-queue: cannot write {}: {err}", path.display());
        std::process::exit(1);
    }
}

/// The doc section: one row per configuration with the median (min–max) over its rounds, then each
/// run's machine (pure).
fn doc_section(args: &Args, runs: &[Run]) -> String {
    use orchard_bench_support::median_spread;
    let node = if args.real_node { "real" } else { "hollow" };
    let mut section = format!(
        "## Queues\n\n{} RolloutGroups (N 8, Nmax 16, stride 8; each runner sleeps {} s, then reports a seeded reward with a 30 % pass rate) submitted at once on the {node} node, without a queue and through a `Fair` RolloutQueue, on the same cluster in {} alternating rounds (the order flips each round; `make bench-queue`). Each cell is the median over the rounds with the lowest and highest in brackets.\n\n| run | rounds | last group recorded | most trajectory pods at once | sandbox-seconds | per admitted group | selections (all rounds) |\n|---|---|---|---|---|---|---|\n",
        args.groups, args.sleep, args.rounds
    );
    for queue in [None, Some(args.slots)] {
        let label = label(queue);
        let mine: Vec<&Run> = runs.iter().filter(|r| r.label == label).collect();
        let seconds: Vec<f64> = mine.iter().map(|r| r.seconds).collect();
        let most: Vec<usize> = mine.iter().map(|r| r.most_pods).collect();
        let pod_seconds: Vec<f64> = mine.iter().map(|r| r.pod_seconds).collect();
        let per_group: Vec<f64> = mine
            .iter()
            .map(|r| r.pod_seconds / r.admitted.max(1) as f64)
            .collect();
        let mut mix: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &mine {
            for (k, v) in &r.selections {
                *mix.entry(k).or_insert(0) += v;
            }
        }
        let mix: Vec<String> = mix.iter().map(|(k, v)| format!("{k} {v}")).collect();
        section.push_str(&format!(
            "| {label} | {} | {} | {} | {} | {} | {} |\n",
            mine.len(),
            median_spread(&seconds, |v| format!("{v:.1} s")),
            median_spread(&most, |v| v.to_string()),
            median_spread(&pod_seconds, |v| format!("{v:.0}")),
            median_spread(&per_group, |v| format!("{v:.1}")),
            mix.join(", "),
        ));
    }
    section.push_str("\nThe machine in each run, in order:\n\n");
    for (i, r) in runs.iter().enumerate() {
        section.push_str(&format!(
            "- {}. {}: {}; load average {} before, {} after the groups.\n",
            i + 1,
            r.label,
            r.machine,
            r.load_before,
            r.load_after
        ));
    }
    section.push_str(
        "\nSandbox-seconds are the summed lifetimes of the trajectory pods (first seen to deleted, from a pod watch). A queued group with `cleanup: Delete` deletes each finished trajectory as soon as its outcome is recorded (docs/QUEUES.md), while an unqueued group keeps its finished trajectories until it completes; that, and hundreds of pods competing for the same cores, is most of the difference. Both configurations share the machine with whatever else runs: read them with the machine lines.\n",
    );
    section
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_the_order() {
        assert_eq!(round_order(0, 128), [None, Some(128)]);
        assert_eq!(round_order(1, 128), [Some(128), None]);
        assert_eq!(round_order(2, 128), [None, Some(128)]);
    }

    fn run(queue: Option<i32>, seconds: f64, admitted: usize) -> Run {
        Run {
            label: label(queue),
            seconds,
            most_pods: 100,
            pod_seconds: 1000.0,
            admitted,
            selections: BTreeMap::from([("Balanced".to_string(), admitted)]),
            load_before: "0.5".into(),
            load_after: "2.0".into(),
            machine: "2 CPUs".into(),
        }
    }

    #[test]
    fn each_configuration_gets_its_median_and_spread() {
        let args = Args {
            groups: 4,
            slots: 128,
            sleep: 2,
            rounds: 3,
            real_node: false,
            write_doc: None,
        };
        let runs = [
            run(None, 20.0, 4),
            run(Some(128), 30.0, 4),
            run(Some(128), 33.0, 4),
            run(None, 24.0, 4),
            run(None, 22.0, 4),
            run(Some(128), 31.0, 4),
        ];
        let section = doc_section(&args, &runs);
        assert!(
            section.contains("| no queue | 3 | 22.0 s (20.0 s–24.0 s) | 100 (100–100) | 1000 (1000–1000) | 250.0 (250.0–250.0) | Balanced 12 |"),
            "{section}"
        );
        assert!(
            section.contains("| queue of 128 | 3 | 31.0 s (30.0 s–33.0 s) |"),
            "{section}"
        );
        assert!(section.contains("- 6. queue of 128: 2 CPUs"), "{section}");
    }
}
