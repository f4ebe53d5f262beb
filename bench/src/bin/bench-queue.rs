//! `bench-queue` (`make bench-queue`): many RolloutGroups at once, with and without a RolloutQueue and
//! with and without launch jitter, on one local cluster in the same run. G groups (default 64) of Nmax
//! 16 (stride 8, N 8) whose runners sleep a little and report a seeded reward: all at once without
//! jitter (`launchJitterSeconds: 0`), all at once with jitter J (default 1 s, the default of the
//! field), and through a queue of Q slots (default 128, jitter J), in R rounds (default 3; the order
//! rotates each round, so a trend in the machine's load falls on each). Reports, per configuration,
//! the median and spread over the rounds of the time until the last group is recorded, the most
//! trajectory pods that existed at once, the sandbox-seconds (summed lifetimes of the trajectory pods,
//! from a pod watch) per admitted group, the most trajectory pods created within one second, and the
//! API server's own view of the herd: the most mutating requests in flight and the most requests
//! waiting in its priority-and-fairness queues (sampled every 100 ms from its `/metrics`), and the p99
//! of its `POST pods` latency (from the histogram's buckets before and after), plus the selection mix.
//!
//! ```text
//! bench-queue [--groups G] [--slots Q] [--sleep S] [--jitter J] [--rounds R] [--real-node] [--write-doc docs/BENCHMARKS.md]
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
    /// `launchJitterSeconds` of the jittered configurations.
    jitter: f64,
    rounds: u32,
    real_node: bool,
    write_doc: Option<std::path::PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench-queue [--groups G] [--slots Q] [--sleep S] [--jitter J] [--rounds R] [--real-node] [--write-doc PATH]"
    );
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut args = Args {
        groups: 64,
        slots: 128,
        sleep: 2,
        jitter: 1.0,
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
            "--jitter" => {
                args.jitter = it
                    .next()
                    .and_then(|v| v.parse::<f64>().ok())
                    .filter(|j| (0.0..=60.0).contains(j))
                    .unwrap_or_else(|| usage())
            }
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
    /// Most trajectory pods first seen within one second.
    most_pods_per_second: usize,
    /// What kube-apiserver said during the run.
    apiserver: ApiServerLoad,
}

/// The API server's view of a run, from its `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct ApiServerLoad {
    /// Most mutating requests in flight at once (`apiserver_current_inflight_requests`).
    most_mutating: f64,
    /// Most requests waiting in priority-and-fairness queues
    /// (`apiserver_flowcontrol_current_inqueue_requests`, summed over priority levels).
    most_queued: f64,
    /// p99 of `POST pods` (`apiserver_request_duration_seconds`), in seconds, from the buckets'
    /// increase over the run (the upper bound of the bucket the 99th percentile falls in).
    post_pods_p99: Option<f64>,
}

/// The sum of the samples of `metric` whose labels contain every one of `labels` (pure).
fn metric_sum(text: &str, metric: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name_labels, value) = l.rsplit_once(' ')?;
            let name = name_labels.split('{').next()?;
            (name == metric && labels.iter().all(|want| name_labels.contains(want)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The cumulative buckets `le -> count` of histogram `metric` for the samples with `labels` (pure).
fn buckets(text: &str, metric: &str, labels: &[&str]) -> BTreeMap<String, f64> {
    let bucket = format!("{metric}_bucket");
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(&bucket)) {
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        if !labels.iter().all(|want| name_labels.contains(want)) {
            continue;
        }
        let Some(le) = name_labels
            .split("le=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        *out.entry(le.to_string()).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    out
}

/// The upper bound of the bucket quantile `q` of the increase from `before` to `after` falls in
/// (pure); `None` without observations.
fn quantile_bound(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    q: f64,
) -> Option<f64> {
    let mut rows: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            (bound, n - before.get(le).copied().unwrap_or(0.0))
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = rows.last()?.1;
    if total <= 0.0 {
        return None;
    }
    rows.into_iter()
        .find(|(_, n)| *n >= q * total)
        .map(|(bound, _)| bound)
}

async fn scrape(client: &Client) -> Option<String> {
    let request = http::Request::get("/metrics").body(Vec::new()).ok()?;
    client.request_text(request).await.ok()
}

const POST_PODS: [&str; 2] = ["verb=\"POST\"", "resource=\"pods\""];
const REQUEST_DURATION: &str = "apiserver_request_duration_seconds";

/// Samples the API server every 100 ms until `stop` is set; returns the most in flight and queued.
fn sample_apiserver(
    client: &Client,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(f64, f64)> {
    let client = client.clone();
    tokio::spawn(async move {
        let (mut mutating, mut queued) = (0.0f64, 0.0f64);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(text) = scrape(&client).await {
                mutating = mutating.max(metric_sum(
                    &text,
                    "apiserver_current_inflight_requests",
                    &["request_kind=\"mutating\""],
                ));
                queued = queued.max(metric_sum(
                    &text,
                    "apiserver_flowcontrol_current_inqueue_requests",
                    &[],
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (mutating, queued)
    })
}

/// The most of `instants` within any window of one second (pure).
fn most_within_a_second(instants: &[Instant]) -> usize {
    let mut sorted = instants.to_vec();
    sorted.sort();
    let mut most = 0;
    let mut start = 0;
    for end in 0..sorted.len() {
        while sorted[end].duration_since(sorted[start]) >= Duration::from_secs(1) {
            start += 1;
        }
        most = most.max(end - start + 1);
    }
    most
}

/// Pod lifetimes in a namespace, from a watch: first seen to deleted.
#[derive(Default)]
struct PodClock {
    alive: BTreeMap<String, Instant>,
    most: usize,
    seconds: f64,
    /// When each trajectory pod was first seen.
    created: Vec<Instant>,
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
                    let now = Instant::now();
                    if let std::collections::btree_map::Entry::Vacant(entry) =
                        clock.alive.entry(p.name_any())
                    {
                        entry.insert(now);
                        clock.created.push(now);
                    }
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

/// One configuration: a queue of so many slots (or none), and the groups' `launchJitterSeconds`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Config {
    queue: Option<i32>,
    jitter: f64,
}

/// The label of a configuration (pure).
fn label(config: Config) -> String {
    let jitter = format!("jitter {} s", config.jitter);
    match config.queue {
        Some(q) => format!("queue of {q}, {jitter}"),
        None => format!("no queue, {jitter}"),
    }
}

/// The configurations of round `round` (from 0) in the order they run, rotated by one each round
/// (pure): without a queue and without jitter, without a queue with `jitter`, and through a queue of
/// `slots` with `jitter`.
fn round_order(round: u32, slots: i32, jitter: f64) -> [Config; 3] {
    let mut configs = [
        Config {
            queue: None,
            jitter: 0.0,
        },
        Config {
            queue: None,
            jitter,
        },
        Config {
            queue: Some(slots),
            jitter,
        },
    ];
    configs.rotate_left((round % 3) as usize);
    configs
}

async fn run(client: &Client, args: &Args, config: Config, round: u32) -> Run {
    let queue = config.queue;
    let label = label(config);
    let ns = &format!(
        "bench-{}-j{}-{round}",
        if queue.is_some() {
            "queued"
        } else {
            "unqueued"
        },
        (config.jitter * 1000.0) as u64
    );
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
    let pods_before = scrape(client).await.unwrap_or_default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_apiserver(client, stop.clone());
    let started = Instant::now();
    for g in 0..args.groups {
        let mut spec = json!({
            "groupSize": 8, "maxTrajectories": 16, "stride": 8,
            "launchJitterSeconds": config.jitter,
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
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (most_mutating, most_queued) = sampler.await.unwrap_or_default();
    let pods_after = scrape(client).await.unwrap_or_default();
    let apiserver = ApiServerLoad {
        most_mutating,
        most_queued,
        post_pods_p99: quantile_bound(
            &buckets(&pods_before, REQUEST_DURATION, &POST_PODS),
            &buckets(&pods_after, REQUEST_DURATION, &POST_PODS),
            0.99,
        ),
    };
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
    let (most_pods, pod_seconds, most_pods_per_second) = {
        let clock = clock.lock().unwrap_or_else(|p| p.into_inner());
        (
            clock.most,
            clock.seconds,
            most_within_a_second(&clock.created),
        )
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
        most_pods_per_second,
        apiserver,
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
        for config in round_order(round, args.slots, args.jitter) {
            eprintln!(
                "round {} of {}: {} groups, {}...",
                round + 1,
                args.rounds,
                args.groups,
                label(config)
            );
            let result = run(&client, &args, config, round).await;
            eprintln!(
                "{}: last group after {:.1} s, at most {} pods, {:.0} sandbox-seconds, at most {} pods created within 1 s, API server {:?}",
                result.label,
                result.seconds,
                result.most_pods,
                result.pod_seconds,
                result.most_pods_per_second,
                result.apiserver
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
    // The runs' pod watches outlive the cluster and retry against its closed port: a runtime
    // shutdown waited on them (the process lingered after its report), so end here.
    std::process::exit(0);
}

/// The doc section: one row per configuration with the median (min–max) over its rounds, then each
/// run's machine (pure).
fn doc_section(args: &Args, runs: &[Run]) -> String {
    use orchard_bench_support::median_spread;
    let node = if args.real_node { "real" } else { "hollow" };
    let mut section = format!(
        "## Queues\n\n{} RolloutGroups (N 8, Nmax 16, stride 8; each runner sleeps {} s, then reports a seeded reward with a 30 % pass rate) submitted at once on the {node} node: without a queue and without launch jitter (`launchJitterSeconds: 0`), without a queue with {} s of jitter, and through a `Fair` RolloutQueue with the same jitter, on the same cluster in {} rounds (the order rotates each round; `make bench-queue`). Each cell is the median over the rounds with the lowest and highest in brackets. The API server's columns are its own `/metrics`: the most mutating requests in flight and the most requests waiting in its priority-and-fairness queues (sampled every 100 ms), and the bucket bound of the p99 of `POST pods` over the run.\n\n| run | rounds | last group recorded | most trajectory pods at once | most pods created within 1 s | API server: most mutating requests in flight | most requests queued | `POST pods` p99 (bucket bound) | sandbox-seconds per admitted group | selections (all rounds) |\n|---|---|---|---|---|---|---|---|---|---|\n",
        args.groups, args.sleep, args.jitter, args.rounds
    );
    for config in round_order(0, args.slots, args.jitter) {
        let label = label(config);
        let mine: Vec<&Run> = runs.iter().filter(|r| r.label == label).collect();
        let seconds: Vec<f64> = mine.iter().map(|r| r.seconds).collect();
        let most: Vec<usize> = mine.iter().map(|r| r.most_pods).collect();
        let per_second: Vec<usize> = mine.iter().map(|r| r.most_pods_per_second).collect();
        let mutating: Vec<f64> = mine.iter().map(|r| r.apiserver.most_mutating).collect();
        let queued: Vec<f64> = mine.iter().map(|r| r.apiserver.most_queued).collect();
        let p99: Vec<f64> = mine
            .iter()
            .filter_map(|r| r.apiserver.post_pods_p99)
            .collect();
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
        let p99 = if p99.is_empty() {
            "no sample".to_string()
        } else {
            median_spread(&p99, |v| format!("{v} s"))
        };
        section.push_str(&format!(
            "| {label} | {} | {} | {} | {} | {} | {} | {p99} | {} | {} |\n",
            mine.len(),
            median_spread(&seconds, |v| format!("{v:.1} s")),
            median_spread(&most, |v| v.to_string()),
            median_spread(&per_second, |v| v.to_string()),
            median_spread(&mutating, |v| format!("{v:.0}")),
            median_spread(&queued, |v| format!("{v:.0}")),
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
        "\nSandbox-seconds are the summed lifetimes of the trajectory pods (first seen to deleted, from a pod watch). A queued group with `cleanup: Delete` deletes each finished trajectory as soon as its outcome is recorded (docs/QUEUES.md), while an unqueued group keeps its finished trajectories until it completes; that, and hundreds of pods competing for the same cores, is most of the difference. A group waits for the last trajectory of each stride (`StrideBoundary`), and with jitter that one starts up to the jitter later, so with runners this short jitter lengthens every stride by up to its own length; what it buys is a lower peak of pod creations and of mutating requests in flight. Every configuration shares the machine with whatever else runs: read them with the machine lines.\n",
    );
    section
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_rotate_the_order() {
        let order = |round| round_order(round, 128, 1.0).map(label);
        assert_eq!(
            order(0),
            [
                "no queue, jitter 0 s",
                "no queue, jitter 1 s",
                "queue of 128, jitter 1 s"
            ]
        );
        assert_eq!(order(1)[0], "no queue, jitter 1 s");
        assert_eq!(order(2)[0], "queue of 128, jitter 1 s");
        assert_eq!(order(3), order(0));
    }

    #[test]
    fn the_api_servers_metrics_are_read_from_its_text() {
        let before = "# HELP x\napiserver_request_duration_seconds_bucket{component=\"apiserver\",resource=\"pods\",verb=\"POST\",le=\"0.05\"} 10\napiserver_request_duration_seconds_bucket{component=\"apiserver\",resource=\"pods\",verb=\"POST\",le=\"0.1\"} 10\napiserver_request_duration_seconds_bucket{component=\"apiserver\",resource=\"pods\",verb=\"POST\",le=\"+Inf\"} 10\n";
        let after = "apiserver_request_duration_seconds_bucket{component=\"apiserver\",resource=\"pods\",verb=\"POST\",le=\"0.05\"} 100\napiserver_request_duration_seconds_bucket{component=\"apiserver\",resource=\"pods\",verb=\"POST\",le=\"0.1\"} 109\napiserver_request_duration_seconds_bucket{component=\"apiserver\",resource=\"pods\",verb=\"POST\",le=\"+Inf\"} 110\napiserver_request_duration_seconds_bucket{component=\"apiserver\",resource=\"sandboxes\",verb=\"POST\",le=\"+Inf\"} 999\napiserver_current_inflight_requests{request_kind=\"mutating\"} 7\napiserver_current_inflight_requests{request_kind=\"readOnly\"} 3\napiserver_flowcontrol_current_inqueue_requests{priority_level=\"a\"} 2\napiserver_flowcontrol_current_inqueue_requests{priority_level=\"b\"} 1\n";
        let (b, a) = (
            buckets(before, REQUEST_DURATION, &POST_PODS),
            buckets(after, REQUEST_DURATION, &POST_PODS),
        );
        assert_eq!(quantile_bound(&b, &a, 0.5), Some(0.05));
        assert_eq!(
            quantile_bound(&b, &a, 0.99),
            Some(0.1),
            "99 of 100 within 0.1 s"
        );
        assert_eq!(quantile_bound(&a, &a, 0.99), None, "no new observation");
        assert_eq!(
            metric_sum(
                after,
                "apiserver_current_inflight_requests",
                &["request_kind=\"mutating\""]
            ),
            7.0
        );
        assert_eq!(
            metric_sum(after, "apiserver_flowcontrol_current_inqueue_requests", &[]),
            3.0
        );
    }

    #[test]
    fn the_most_within_a_second_slides_over_the_instants() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(most_within_a_second(&[]), 0);
        assert_eq!(
            most_within_a_second(&[at(0), at(100), at(900), at(1500), at(1600), at(1700)]),
            4
        );
    }

    fn run(config: Config, seconds: f64, admitted: usize) -> Run {
        Run {
            label: label(config),
            seconds,
            most_pods: 100,
            pod_seconds: 1000.0,
            admitted,
            selections: BTreeMap::from([("Balanced".to_string(), admitted)]),
            load_before: "0.5".into(),
            load_after: "2.0".into(),
            machine: "2 CPUs".into(),
            most_pods_per_second: 40,
            apiserver: ApiServerLoad {
                most_mutating: 12.0,
                most_queued: 0.0,
                post_pods_p99: Some(0.1),
            },
        }
    }

    #[test]
    fn each_configuration_gets_its_median_and_spread() {
        let args = Args {
            groups: 4,
            slots: 128,
            sleep: 2,
            jitter: 1.0,
            rounds: 3,
            real_node: false,
            write_doc: None,
        };
        let [bare, jittered, queued] = round_order(0, 128, 1.0);
        let runs = [
            run(bare, 20.0, 4),
            run(jittered, 21.0, 4),
            run(queued, 30.0, 4),
            run(bare, 24.0, 4),
            run(queued, 33.0, 4),
            run(jittered, 25.0, 4),
            run(bare, 22.0, 4),
            run(jittered, 23.0, 4),
            run(queued, 31.0, 4),
        ];
        let section = doc_section(&args, &runs);
        assert!(
            section.contains("| no queue, jitter 0 s | 3 | 22.0 s (20.0 s–24.0 s) | 100 (100–100) | 40 (40–40) | 12 (12–12) | 0 (0–0) | 0.1 s (0.1 s–0.1 s) | 250.0 (250.0–250.0) | Balanced 12 |"),
            "{section}"
        );
        assert!(
            section.contains("| queue of 128, jitter 1 s | 3 | 31.0 s (30.0 s–33.0 s) |"),
            "{section}"
        );
        assert!(
            section.contains("- 9. queue of 128, jitter 1 s: 2 CPUs"),
            "{section}"
        );
    }
}
