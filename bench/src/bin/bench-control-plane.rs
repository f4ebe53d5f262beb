//! `bench-control-plane` (`make bench-control-plane`): the control plane at scale on KWOK nodes
//! (docs/TESTING.md, "KWOK nodes"), in one run on one cluster, phase after phase:
//!
//! 1. ramp: for each rate of `--ramp` (default 25,50,75), 15 seconds of creates at that rate on the
//!    empty cluster, then deleted: where create -> Ready starts to grow;
//! 2. sustained: S Sandboxes (default 10,000) created at R a second (default 100), each timed from
//!    the driver's create call to its watch seeing Ready; they stay;
//! 3. burst: B (default 1,000) created at once, then deleted;
//! 4. claims: a SandboxPool of C members (default 1,000), then C Sandboxes claiming them at R a
//!    second: agent-sandbox's gate measures claims;
//! 5. expiry: the S sandboxes of phase 1 all given the same heartbeat and a shorter timeout, so they
//!    time out in the same second: lateness of each deletion;
//! 6. groups: G RolloutGroups (default 200, groupSize 8, maxTrajectories 16) through one RolloutQueue
//!    of 1,024 slots, the driver recording each Ready trajectory's result through the gateway as a
//!    harness would;
//! 7. held: H Sandboxes (default 50,000) created as fast as the cluster takes them and held: the
//!    operator's, kube-apiserver's and etcd's memory; then the operator SIGKILLed and started again,
//!    timed until it has reconciled every Sandbox once.
//!
//! Then, on a second cluster with kube-apiserver's audit log of every request (it costs the API
//! server a file write per request, so no figure above comes from it): A sandboxes (default 1,000) at
//! R a second, created, Ready and deleted, and the requests per sandbox by sender.
//!
//! The driver also watches every Pod, so each create -> Ready is split into the operator's part
//! (create -> Pod seen, Pod seen Ready -> Sandbox seen Ready) and kube-scheduler's and KWOK's; and
//! each phase's CPU seconds are read for every process of the cluster and the driver.
//!
//! The machine is waited on for quiet first (`orchard-bench-support`) and reported. Each phase runs
//! once: the run takes about half an hour.
//!
//! ```text
//! bench-control-plane [--nodes N] [--sandboxes S] [--rate R] [--ramp R1,R2,...] [--burst B]
//!                     [--claims C] [--groups G] [--held H] [--audit A] [--write-doc docs/BENCHMARKS.md]
//! ```
//! A count of 0 (or an empty `--ramp`) leaves its phase out.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use orchard_bench::cache_heap::{items_of, per_object};
use orchard_bench::control_plane::{
    CacheHeap, Costs, Creation, Groups, HEADING, Held, Latencies, Report, Requests, render,
};
use orchard_bench::docs::thousands;
use orchard_bench_support::Machine;
use orchard_operator::api::{
    HEARTBEAT_ANNOTATION, RolloutGroup, RolloutQueue, Sandbox, SandboxPool, Selection,
};
use orchard_operator::plumbing::cached_pod::CachedPod;
use orchard_testcluster::env::{EnvOptions, NodeKind, TestEnv};
use orchard_testcluster::operator_process::metric_sum;
use orchard_testcluster::proc_stats::{cpu_seconds, peak_rss_bytes, rss_bytes};
use orchard_testcluster::test_support::gateway::{Caller, sandbox_path};
use orchard_testcluster::test_support::rollouts::{group, is_complete};
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use serde_json::json;

/// How long the run waits for a quiet machine before it starts anyway (and says so).
const QUIET_WAIT: Duration = Duration::from_secs(120);
/// How long each rate of the ramp lasts.
const RAMP_SECONDS: f64 = 15.0;
/// Creates in flight at once in a paced phase.
const IN_FLIGHT: usize = 256;
/// Creates in flight at once while the held sandboxes are created as fast as the cluster takes them.
const HELD_IN_FLIGHT: usize = 64;
/// The held sandboxes are created this many at a time ...
const HELD_CHUNK: usize = 500;
/// ... while at most this many created are not yet Ready.
const HELD_AHEAD: usize = 1000;
/// The sustained phase's heartbeat timeout: long enough that none expires before phase 5.
const HOLD_HEARTBEAT_SECONDS: i64 = 7200;
/// Held objects of each kind decoded to measure what one takes in the operator's caches.
const CACHE_SAMPLE: usize = 1000;
/// The counting allocator (mimalloc, as the operator), for what one object takes in a watch cache.
#[global_allocator]
static ALLOCATOR: orchard_bench::alloc::Counting = orchard_bench::alloc::Counting;
/// Phase 5: the shared heartbeat lies this far ahead (the operator ignores heartbeats more than 60 s
/// in the future) ...
const EXPIRY_BEAT_AHEAD: i64 = 50;
/// ... and the timeout the sandboxes get with it.
const EXPIRY_TIMEOUT_SECONDS: i64 = 60;

struct Args {
    nodes: u16,
    sandboxes: usize,
    rate: f64,
    ramp: Vec<f64>,
    burst: usize,
    claims: usize,
    groups: usize,
    held: usize,
    audit: usize,
    write_doc: Option<std::path::PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench-control-plane [--nodes N] [--sandboxes S] [--rate R] [--ramp R1,R2,...] [--burst B] [--claims C] [--groups G] [--held H] [--audit A] [--write-doc PATH]"
    );
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut args = Args {
        nodes: 100,
        sandboxes: 10_000,
        rate: 100.0,
        ramp: vec![25.0, 50.0, 75.0],
        burst: 1000,
        claims: 1000,
        groups: 200,
        held: 50_000,
        audit: 1000,
        write_doc: None,
    };
    let mut it = std::env::args().skip(1);
    let count = |v: Option<String>| {
        v.and_then(|v| v.parse::<usize>().ok())
            .unwrap_or_else(|| usage())
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--nodes" => {
                args.nodes = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| *n > 0)
                    .unwrap_or_else(|| usage())
            }
            "--sandboxes" => args.sandboxes = count(it.next()),
            "--rate" => {
                args.rate = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|r: &f64| *r > 0.0)
                    .unwrap_or_else(|| usage())
            }
            "--ramp" => {
                let text = it.next().unwrap_or_else(|| usage());
                args.ramp = text
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| p.parse::<f64>().ok().filter(|r| *r > 0.0))
                    .collect::<Option<Vec<_>>>()
                    .unwrap_or_else(|| usage());
            }
            "--burst" => args.burst = count(it.next()),
            "--claims" => args.claims = count(it.next()),
            "--groups" => args.groups = count(it.next()),
            "--held" => args.held = count(it.next()),
            "--audit" => args.audit = count(it.next()),
            "--write-doc" => {
                args.write_doc = Some(it.next().map(Into::into).unwrap_or_else(|| usage()))
            }
            _ => usage(),
        }
    }
    args
}

fn fail(what: impl std::fmt::Display) -> ! {
    eprintln!("bench-control-plane: {what}");
    std::process::exit(1)
}

fn say(what: impl std::fmt::Display) {
    eprintln!("[{}] {what}", Timestamp::now().strftime("%H:%M:%S"));
}

/// What the driver's watch of every Sandbox saw, by `namespace/name`.
#[derive(Default)]
struct Seen {
    /// When each was first seen Ready.
    ready: HashMap<String, Instant>,
    /// The last `status.expiresAt` of each.
    expires: HashMap<String, Timestamp>,
    /// When each was seen deleted.
    deleted: HashMap<String, Timestamp>,
    /// Sandboxes that exist.
    live: HashSet<String>,
    /// When each Pod was first seen (by `namespace/name`, a sandbox's Pod has its name).
    pod_seen: HashMap<String, Instant>,
    /// When each Pod was first seen Ready.
    pod_ready: HashMap<String, Instant>,
}

type Shared = Arc<Mutex<Seen>>;

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

fn lock(seen: &Shared) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|p| p.into_inner())
}

/// Watches every Pod into `seen` (when each was first seen, and first seen Ready).
fn watch_pods(client: Client, seen: Shared) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Pod> = Api::all(client);
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let now = Instant::now();
            if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = event {
                let k = key(&p.namespace().unwrap_or_default(), &p.name_any());
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let mut seen = lock(&seen);
                seen.pod_seen.entry(k.clone()).or_insert(now);
                if ready {
                    seen.pod_ready.entry(k).or_insert(now);
                }
            }
        }
    })
}

/// Watches every Sandbox into `seen`; Ready trajectories of namespace `groups_ns` also go to `ready_tx`.
fn watch_sandboxes(
    client: Client,
    seen: Shared,
    groups_ns: String,
    ready_tx: tokio::sync::mpsc::UnboundedSender<String>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<Sandbox> = Api::all(client);
        let mut events = watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let now = Instant::now();
            match event {
                Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => {
                    let ns = s.namespace().unwrap_or_default();
                    let k = key(&ns, &s.name_any());
                    let mut seen = lock(&seen);
                    seen.live.insert(k.clone());
                    if let Some(at) = s.status.as_ref().and_then(|st| st.expires_at.as_ref()) {
                        seen.expires.insert(k.clone(), at.0);
                    }
                    if is_ready(Some(&s)) && !seen.ready.contains_key(&k) {
                        seen.ready.insert(k, now);
                        if ns == groups_ns {
                            let _ = ready_tx.send(s.name_any());
                        }
                    }
                }
                Ok(watcher::Event::Delete(s)) => {
                    let k = key(&s.namespace().unwrap_or_default(), &s.name_any());
                    let mut seen = lock(&seen);
                    seen.live.remove(&k);
                    seen.deleted.insert(k, Timestamp::now());
                }
                Ok(_) => {}
                Err(err) => say(format!("sandbox watch: {err} (it restarts)")),
            }
        }
    })
}

/// The processes whose costs are measured: the operator, kube-apiserver, etcd, then kube-scheduler,
/// KWOK and kube-controller-manager, then this driver.
struct Pids {
    operator: u32,
    apiserver: u32,
    etcd: u32,
    others: [u32; 3],
}

/// CPU seconds of each of [`Pids`]' processes, in its order.
type Cpu = [f64; 7];

impl Pids {
    fn of(env: &TestEnv) -> Self {
        let plane = env.control_plane.pids();
        let of = |name: &str| plane.get(name).copied().unwrap_or(0);
        let kwok = env.node.kwok().pids();
        Self {
            operator: env.operator().pid().unwrap_or_else(|| fail("no operator")),
            apiserver: of("kube-apiserver"),
            etcd: of("etcd"),
            others: [kwok[0].1, kwok[1].1, of("kube-controller-manager")],
        }
    }

    fn cpu(&self) -> Cpu {
        let [a, b, c] = self.others;
        [
            self.operator,
            self.apiserver,
            self.etcd,
            a,
            b,
            c,
            std::process::id(),
        ]
        .map(|pid| cpu_seconds(pid).unwrap_or(0.0))
    }

    fn costs_since(&self, before: Cpu) -> Costs {
        let now = self.cpu();
        let d = |i: usize| now[i] - before[i];
        Costs {
            operator_cpu: d(0),
            apiserver_cpu: d(1),
            etcd_cpu: d(2),
            others_cpu: d(3) + d(4) + d(5),
            driver_cpu: d(6),
            operator_rss: rss_bytes(self.operator).unwrap_or(0),
        }
    }
}

/// Creates the Sandboxes `prefix-<i>` for each `i` of `range` in `ns` with `spec`, at `rate` a second
/// (0: as fast as `in_flight` creates at a time go), and returns when each create was sent, by key.
async fn create_paced(
    client: &Client,
    ns: &str,
    prefix: &str,
    (range, rate, in_flight): (std::ops::Range<usize>, f64, usize),
    spec: serde_json::Value,
) -> Vec<(String, Instant)> {
    let api: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let start = Instant::now();
    let first = range.start;
    futures::stream::iter(range)
        .map(|i| {
            let api = api.clone();
            let spec = spec.clone();
            let due = if rate > 0.0 {
                start + Duration::from_secs_f64((i - first) as f64 / rate)
            } else {
                start
            };
            async move {
                tokio::time::sleep_until(due.into()).await;
                let name = format!("{prefix}-{i}");
                let sent = Instant::now();
                let mut attempts = 0;
                loop {
                    match api
                        .create(&PostParams::default(), &sandbox(&name, spec.clone()))
                        .await
                    {
                        Ok(_) => break,
                        // The API server sheds load with 429 and 5xx under a burst: a client retries.
                        Err(kube::Error::Api(status))
                            if (status.code == 429 || status.code >= 500) && attempts < 20 =>
                        {
                            attempts += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(err) => fail(format!("create {ns}/{name}: {err}")),
                    }
                }
                (key(ns, &name), sent)
            }
        })
        .buffer_unordered(in_flight.max(1))
        .collect()
        .await
}

/// Waits until every key of `sent` has been seen Ready (at most `timeout`) and returns the phase's
/// figures.
async fn ready_phase(
    seen: &Shared,
    label: String,
    rate: f64,
    sent: &[(String, Instant)],
    timeout: Duration,
    pids: &Pids,
    cpu_before: Cpu,
) -> Creation {
    let deadline = Instant::now() + timeout;
    loop {
        let missing = {
            let seen = lock(seen);
            sent.iter()
                .filter(|(k, _)| !seen.ready.contains_key(k))
                .count()
        };
        if missing == 0 {
            break;
        }
        if Instant::now() > deadline {
            fail(format!(
                "{label}: {missing} of {} not Ready within {timeout:?}",
                sent.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let costs = pids.costs_since(cpu_before);
    let seen = lock(seen);
    let mut by_sent: Vec<&(String, Instant)> = sent.iter().collect();
    by_sent.sort_by_key(|(_, at)| *at);
    let latency = |items: &[&(String, Instant)]| {
        Latencies::of(
            items
                .iter()
                .map(|(k, at)| seen.ready[k].duration_since(*at).as_secs_f64())
                .collect(),
        )
    };
    let first = by_sent.first().map(|(_, at)| *at);
    let last_sent = by_sent.last().map(|(_, at)| *at);
    let last_ready = sent.iter().map(|(k, _)| seen.ready[k]).max();
    let span = |end: Option<Instant>| match (first, end) {
        (Some(a), Some(b)) if b > a => b.duration_since(a).as_secs_f64(),
        _ => f64::NAN,
    };
    let n = sent.len() as f64;
    let tenth = by_sent.len() - by_sent.len() / 10;
    let shares: Option<Vec<f64>> = sent
        .iter()
        .map(|(k, at)| {
            let pod_seen = seen.pod_seen.get(k)?;
            let pod_ready = seen.pod_ready.get(k)?;
            let sandbox_ready = seen.ready[k];
            Some(
                pod_seen.saturating_duration_since(*at).as_secs_f64()
                    + sandbox_ready
                        .saturating_duration_since(*pod_ready)
                        .as_secs_f64(),
            )
        })
        .collect();
    Creation {
        label,
        rate,
        sent_rate: if rate > 0.0 {
            n / span(last_sent).max(1e-9)
        } else {
            0.0
        },
        ready_rate: n / span(last_ready),
        latency: latency(&by_sent),
        last_tenth: latency(&by_sent[tenth.min(by_sent.len().saturating_sub(1))..]),
        operator_share: shares.map(Latencies::of),
        costs,
    }
}

/// What a timed creation phase needs: the client, the driver's watch and the processes measured.
struct Timed<'a> {
    client: &'a Client,
    seen: &'a Shared,
    pids: &'a Pids,
}

impl Timed<'_> {
    /// Says `label`, creates the Sandboxes `prefix-<i>` of `range` in `ns` with `spec` at `rate` a
    /// second (`in_flight` at a time), waits at most `timeout` until each is Ready and adds the phase
    /// to `report`; returns when each create was sent.
    async fn run(
        &self,
        report: &mut Report,
        ns: &str,
        (prefix, range, rate, in_flight): (&str, std::ops::Range<usize>, f64, usize),
        spec: serde_json::Value,
        (label, timeout): (String, Duration),
    ) -> Vec<(String, Instant)> {
        say(&label);
        let before = self.pids.cpu();
        let sent = create_paced(self.client, ns, prefix, (range, rate, in_flight), spec).await;
        let phase = ready_phase(self.seen, label, rate, &sent, timeout, self.pids, before).await;
        say(format!("{phase:?}"));
        report.creations.push(phase);
        sent
    }
}

/// Deletes every Sandbox of `ns` and waits until their Pods are gone.
async fn clear(client: &Client, ns: &str) {
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    if let Err(err) = sandboxes
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
    {
        fail(format!("delete the sandboxes of {ns}: {err}"));
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let left = pods
            .list_metadata(&ListParams::default().limit(1))
            .await
            .map(|l| l.items.len())
            .unwrap_or(1);
        if left == 0 {
            return;
        }
        if Instant::now() > deadline {
            fail(format!("the pods of {ns} are not gone after 600 s"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn namespace(env: &TestEnv, name: &str) -> String {
    let ns = env.namespace(name).await;
    say(format!("namespace {ns}"));
    ns
}

/// Phase 5: every sandbox of `keys` (namespace `ns`) gets the heartbeat `now + EXPIRY_BEAT_AHEAD`
/// and the timeout `EXPIRY_TIMEOUT_SECONDS`, so all are due in the same second; returns the lateness
/// of each deletion.
async fn expiry(client: &Client, seen: &Shared, ns: &str, names: &[String]) -> Latencies {
    let beat = Timestamp::now()
        .saturating_add(SignedDuration::from_secs(EXPIRY_BEAT_AHEAD))
        .unwrap_or_else(|_| Timestamp::now());
    let beat_text = beat.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let due: Timestamp = beat_text.parse().unwrap_or(beat);
    let due = due
        .saturating_add(SignedDuration::from_secs(EXPIRY_TIMEOUT_SECONDS))
        .unwrap_or(due);
    let api: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let patch = json!({
        "metadata": {"annotations": {HEARTBEAT_ANNOTATION: beat_text}},
        "spec": {"lifecycle": {"heartbeatTimeoutSeconds": EXPIRY_TIMEOUT_SECONDS}},
    });
    let started = Instant::now();
    futures::stream::iter(names.iter())
        .map(|name| {
            let (api, patch) = (api.clone(), patch.clone());
            async move {
                if let Err(err) = api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    fail(format!("heartbeat {ns}/{name}: {err}"));
                }
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    say(format!(
        "expiry: {} heartbeats written in {:.1} s; all due at {due}",
        names.len(),
        started.elapsed().as_secs_f64()
    ));
    if Timestamp::now() > due {
        say(
            "expiry: the heartbeats were written after the deadline: the lateness includes the writes",
        );
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let gone = {
            let seen = lock(seen);
            names
                .iter()
                .filter(|n| seen.deleted.contains_key(&key(ns, n)))
                .count()
        };
        if gone == names.len() {
            break;
        }
        if Instant::now() > deadline {
            fail(format!("expiry: {gone} of {} deleted", names.len()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let seen = lock(seen);
    Latencies::of(
        names
            .iter()
            .map(|n| {
                let k = key(ns, n);
                let expected = seen.expires.get(&k).copied().unwrap_or(due);
                seen.deleted[&k].duration_since(expected).as_secs_f64()
            })
            .collect(),
    )
}

/// Phase 6: RolloutGroups through one queue, results recorded through the gateway.
async fn groups_phase(
    env: &TestEnv,
    client: &Client,
    ns: &str,
    count: usize,
    mut ready_rx: tokio::sync::mpsc::UnboundedReceiver<String>,
    pids: &Pids,
) -> Groups {
    const SIZE: u32 = 8;
    const MAX: u32 = 16;
    const SLOTS: u32 = 1024;
    let queues: Api<RolloutQueue> = Api::namespaced(client.clone(), ns);
    let queue: RolloutQueue = serde_json::from_value(json!({
        "apiVersion": "orchard.dev/v1alpha1", "kind": "RolloutQueue",
        "metadata": {"name": "q"}, "spec": {"maxRunningTrajectories": SLOTS},
    }))
    .unwrap_or_else(|e| fail(format!("queue JSON: {e}")));
    if let Err(err) = queues.create(&PostParams::default(), &queue).await {
        fail(format!("create the queue: {err}"));
    }
    // The harness: each Ready trajectory's result, reward 1 or 0 from its name's hash.
    let caller = Caller::user(env, "admin");
    let harness_ns = ns.to_string();
    let harness = tokio::spawn(async move {
        let mut posts = futures::stream::FuturesUnordered::new();
        loop {
            tokio::select! {
                name = ready_rx.recv() => {
                    let Some(name) = name else { break };
                    let caller = caller.clone();
                    let ns = harness_ns.clone();
                    posts.push(async move {
                        let reward = if fnv(&name).is_multiple_of(2) { 1.0 } else { 0.0 };
                        let answer = caller
                            .post(&sandbox_path(&ns, &name, "/result"), json!({"reward": reward, "status": "completed"}))
                            .await;
                        // 404: the group finished and deleted the trajectory first.
                        if answer.status != 200 && answer.status != 404 && answer.status != 409 {
                            say(format!("result of {name}: {} {}", answer.status, answer.body));
                        }
                    });
                }
                Some(()) = posts.next(), if !posts.is_empty() => {}
            }
        }
    });
    let groups: Api<RolloutGroup> = Api::namespaced(client.clone(), ns);
    let before = pids.cpu();
    let started = Instant::now();
    futures::stream::iter(0..count)
        .map(|i| {
            let groups = groups.clone();
            async move {
                let g = group(
                    &format!("g{i}"),
                    json!({"groupSize": SIZE, "maxTrajectories": MAX, "stride": SIZE, "queue": "q",
                           "template": {"spec": {"image": "busybox"}}}),
                );
                if let Err(err) = groups.create(&PostParams::default(), &g).await {
                    fail(format!("create group g{i}: {err}"));
                }
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let deadline = Instant::now() + Duration::from_secs(900);
    let list = loop {
        let list = groups
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| fail(format!("list groups: {e}")));
        let done = list.items.iter().filter(|g| is_complete(Some(g))).count();
        if done == count {
            break list;
        }
        if Instant::now() > deadline {
            fail(format!("groups: {done} of {count} Complete after 900 s"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    harness.abort();
    let status = |g: &RolloutGroup| g.status.clone().unwrap_or_default();
    Groups {
        groups: count,
        size: SIZE,
        max_trajectories: MAX,
        slots: SLOTS,
        seconds,
        trajectories: list
            .items
            .iter()
            .map(|g| u64::try_from(status(g).trajectories_launched).unwrap_or(0))
            .sum(),
        balanced: list
            .items
            .iter()
            .filter(|g| status(g).selection == Some(Selection::Balanced))
            .count(),
        dropped: list
            .items
            .iter()
            .filter(|g| status(g).selection == Some(Selection::Dropped))
            .count(),
        costs: pids.costs_since(before),
    }
}

/// FNV-1a of `text` (a fixed reward per name).
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Phase 7: `count` held, their memory, and a restart.
async fn held_phase(
    env: &TestEnv,
    client: &Client,
    seen: &Shared,
    count: usize,
    rss_empty: u64,
) -> Held {
    let ns = namespace(env, "held").await;
    let pids = Pids::of(env);
    // In chunks, never more than HELD_AHEAD created and not yet Ready: the cluster's own pace (past
    // it, KWOK's backlog of pods to make Ready grows until sandboxes reach their startup timeout).
    let mut sent = Vec::with_capacity(count);
    let mut next = 0;
    while next < count {
        let chunk = HELD_CHUNK.min(count - next);
        let created = create_paced(
            client,
            &ns,
            "h",
            (next..next + chunk, 0.0, HELD_IN_FLIGHT),
            json!({"image": "busybox"}),
        )
        .await;
        sent.extend(created);
        next += chunk;
        loop {
            let ready = {
                let seen = lock(seen);
                sent.iter()
                    .filter(|(k, _)| seen.ready.contains_key(k))
                    .count()
            };
            if sent.len() - ready <= HELD_AHEAD {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if next.is_multiple_of(5000) {
            say(format!("held: {next} created"));
        }
    }
    let phase = ready_phase(
        seen,
        format!("{} held", thousands(count)),
        0.0,
        &sent,
        Duration::from_secs(3600),
        &pids,
        pids.cpu(),
    )
    .await;
    say(format!(
        "held: {} Ready; sent {:.0}/s, Ready {:.0}/s",
        phase.latency.count, phase.sent_rate, phase.ready_rate
    ));
    // Settle: the status writes and the watch caches after the last Ready.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss = |pid: u32| rss_bytes(pid).unwrap_or(0);
    let mut held = Held {
        sandboxes: count,
        operator_rss_empty: rss_empty,
        operator_rss: rss(pids.operator),
        apiserver_rss: rss(pids.apiserver),
        etcd_rss: rss(pids.etcd),
        cache_heap: cache_heap(client, &ns).await,
        ..Held::default()
    };
    let total = lock(seen).live.len();
    say(format!(
        "held: restarting the operator among {total} sandboxes"
    ));
    let killed = Instant::now();
    if let Err(err) = env
        .operator()
        .restart_within(Duration::from_secs(900))
        .await
    {
        fail(format!("operator restart: {err}"));
    }
    held.restart_ready = killed.elapsed().as_secs_f64();
    let pid = env
        .operator()
        .pid()
        .unwrap_or_else(|| fail("no operator after restart"));
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let metrics = env.operator().metrics().await.unwrap_or_default();
        let reconciled = metric_sum(
            &metrics,
            "orchard_reconciles_total",
            &[("controller", "sandbox")],
        );
        if reconciled >= total as f64 {
            held.restart_reconciled = killed.elapsed().as_secs_f64();
            held.restart_writes = metric_sum(&metrics, "orchard_api_writes_total", &[]);
            break;
        }
        if Instant::now() > deadline {
            fail(format!(
                "restart: {reconciled} of {total} sandboxes reconciled after 900 s"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    held.restart_cpu = cpu_seconds(pid).unwrap_or(0.0);
    held.restart_peak_rss = peak_rss_bytes(pid).unwrap_or(0);
    held.restart_rss = rss(pid);
    held
}

/// The API server's answer to GET `path`, as JSON.
async fn get_json(client: &Client, path: String) -> Option<serde_json::Value> {
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    let text = client.request_text(request).await.ok()?;
    serde_json::from_str(&text).ok()
}

/// What one held object of `ns` takes in the operator's watch caches, from [`CACHE_SAMPLE`] of
/// each kind (`orchard_bench::cache_heap`).
async fn cache_heap(client: &Client, ns: &str) -> Option<CacheHeap> {
    let pods = get_json(
        client,
        format!("/api/v1/namespaces/{ns}/pods?limit={CACHE_SAMPLE}"),
    )
    .await?;
    let sandboxes = get_json(
        client,
        format!("/apis/orchard.dev/v1alpha1/namespaces/{ns}/sandboxes?limit={CACHE_SAMPLE}"),
    )
    .await?;
    let pods = items_of(&pods, "v1", "Pod");
    let sandboxes = items_of(&sandboxes, "orchard.dev/v1alpha1", "Sandbox");
    Some(CacheHeap {
        sample: pods.len().min(sandboxes.len()),
        pod_whole: per_object::<Pod>(&pods)?,
        pod_cached: per_object::<CachedPod>(&pods)?,
        sandbox: per_object::<Sandbox>(&sandboxes)?,
    })
}

/// A local cluster `name` of `nodes` KWOK nodes (with the API server's audit log of every request,
/// reads too, when `audited`), and the driver's client of it.
async fn kwok_cluster(name: &str, nodes: u16, audited: bool) -> (TestEnv, Client) {
    let env = TestEnv::start(
        name,
        EnvOptions {
            node: NodeKind::Kwok,
            kwok_nodes: nodes,
            audit_log: audited,
            audit_reads: audited,
            ..EnvOptions::default()
        },
    )
    .await
    .unwrap_or_else(|e| fail(format!("the cluster {name}: {e}")));
    let client = env
        .control_plane
        .client_as("orchard-bench")
        .await
        .unwrap_or_else(|e| fail(format!("client: {e}")));
    (env, client)
}

/// The audited cluster: `count` sandboxes at `rate`, create -> Ready -> delete; requests per sandbox.
async fn audited(nodes: u16, count: usize, rate: f64) -> Requests {
    let (env, client) = kwok_cluster("bench-control-plane-audit", nodes, true).await;
    let seen: Shared = Arc::default();
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let watch = watch_sandboxes(client.clone(), seen.clone(), String::new(), tx);
    let ns = namespace(&env, "audited").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let since = Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.%6fZ")
        .to_string();
    let pids = Pids::of(&env);
    let sent = create_paced(
        &client,
        &ns,
        "a",
        (0..count, rate, IN_FLIGHT),
        json!({"image": "busybox"}),
    )
    .await;
    ready_phase(
        &seen,
        String::new(),
        rate,
        &sent,
        Duration::from_secs(600),
        &pids,
        pids.cpu(),
    )
    .await;
    clear(&client, &ns).await;
    // The last deletions' garbage collection and the operator's own clean-up.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let log = env
        .control_plane
        .audit_log()
        .and_then(|path| std::fs::read_to_string(path).ok())
        .unwrap_or_else(|| fail("the audited cluster wrote no audit log"));
    watch.abort();
    env.stop().await;
    Requests {
        phase: format!(
            "{} sandboxes at {rate:.0}/s, each create -> Ready -> delete (the pods gone)",
            thousands(count)
        ),
        sandboxes: count,
        rows: orchard_bench::audit_summary::summarize_requests(&log, &since, true),
    }
}

/// Writes what the run has measured so far (a phase that fails later loses only itself).
fn checkpoint(report: &mut Report, machine: &Machine, args: &Args) {
    report.machine = machine.report();
    if let Some(doc) = &args.write_doc
        && let Err(err) = orchard_bench::docs::write_section(doc, HEADING, &render(report))
    {
        fail(format!("cannot write {}: {err}", doc.display()));
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse_args();
    let machine = Machine::settle(QUIET_WAIT);
    let mut report = Report {
        command: "make bench-control-plane".into(),
        date: Timestamp::now().strftime("%Y-%m-%d").to_string(),
        nodes: args.nodes,
        ..Report::default()
    };
    say(format!(
        "starting the cluster with {} KWOK nodes",
        args.nodes
    ));
    let (env, client) = kwok_cluster("bench-control-plane", args.nodes, false).await;
    let seen: Shared = Arc::default();
    let groups_ns = if args.groups > 0 {
        namespace(&env, "groups").await
    } else {
        String::new()
    };
    let (ready_tx, ready_rx) = tokio::sync::mpsc::unbounded_channel();
    let watches = [
        watch_sandboxes(client.clone(), seen.clone(), groups_ns.clone(), ready_tx),
        watch_pods(client.clone(), seen.clone()),
    ];
    let pids = Pids::of(&env);
    let rss_empty = rss_bytes(pids.operator).unwrap_or(0);
    let timed = Timed {
        client: &client,
        seen: &seen,
        pids: &pids,
    };

    // 1. Ramp, on an empty cluster.
    for rate in &args.ramp {
        let ns = namespace(&env, &format!("ramp-{rate:.0}")).await;
        let count = (rate * RAMP_SECONDS) as usize;
        let label = format!("{} at {rate:.0}/s ({RAMP_SECONDS:.0} s)", thousands(count));
        timed
            .run(
                &mut report,
                &ns,
                ("r", 0..count, *rate, IN_FLIGHT),
                json!({"image": "busybox"}),
                (label, Duration::from_secs(900)),
            )
            .await;
        checkpoint(&mut report, &machine, &args);
        clear(&client, &ns).await;
    }

    // 2. Sustained.
    let sustained_ns = namespace(&env, "sustained").await;
    let mut sustained_names = Vec::new();
    if args.sandboxes > 0 {
        let label = format!("{} at {:.0}/s", thousands(args.sandboxes), args.rate);
        let sent = timed.run(
            &mut report,
            &sustained_ns,
            ("s", 0..args.sandboxes, args.rate, IN_FLIGHT),
            json!({"image": "busybox", "lifecycle": {"heartbeatTimeoutSeconds": HOLD_HEARTBEAT_SECONDS}}),
            (label, Duration::from_secs(1800)),
        )
        .await;
        checkpoint(&mut report, &machine, &args);
        sustained_names = sent
            .iter()
            .map(|(k, _)| k.rsplit('/').next().unwrap_or_default().to_string())
            .collect();
    }

    // 3. Burst.
    if args.burst > 0 {
        let ns = namespace(&env, "burst").await;
        let label = format!(
            "{} at once, {} held",
            thousands(args.burst),
            thousands(args.sandboxes)
        );
        timed
            .run(
                &mut report,
                &ns,
                ("b", 0..args.burst, 0.0, args.burst),
                json!({"image": "busybox"}),
                (label, Duration::from_secs(900)),
            )
            .await;
        checkpoint(&mut report, &machine, &args);
        clear(&client, &ns).await;
    }

    // 4. Claims.
    if args.claims > 0 {
        let ns = namespace(&env, "claims").await;
        let pools: Api<SandboxPool> = Api::namespaced(client.clone(), &ns);
        let pool: SandboxPool = serde_json::from_value(json!({
            "apiVersion": "orchard.dev/v1alpha1", "kind": "SandboxPool",
            "metadata": {"name": "warm"},
            "spec": {"replicas": args.claims, "template": {"image": "busybox"}},
        }))
        .unwrap_or_else(|e| fail(format!("pool JSON: {e}")));
        if let Err(err) = pools.create(&PostParams::default(), &pool).await {
            fail(format!("create the pool: {err}"));
        }
        let filled = Instant::now();
        loop {
            let ready = pools
                .get("warm")
                .await
                .ok()
                .and_then(|p| p.status)
                .map_or(0, |s| s.ready_replicas);
            if ready as usize >= args.claims {
                break;
            }
            if filled.elapsed() > Duration::from_secs(900) {
                fail(format!(
                    "pool: {ready} of {} members Ready after 900 s",
                    args.claims
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        say(format!(
            "pool of {} filled in {:.1} s",
            args.claims,
            filled.elapsed().as_secs_f64()
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let label = format!(
            "{} pool claims at {:.0}/s, {} held",
            thousands(args.claims),
            args.rate,
            thousands(args.sandboxes)
        );
        timed
            .run(
                &mut report,
                &ns,
                ("c", 0..args.claims, args.rate, IN_FLIGHT),
                json!({"pool": "warm"}),
                (label, Duration::from_secs(900)),
            )
            .await;
        checkpoint(&mut report, &machine, &args);
        let _ = pools.delete("warm", &DeleteParams::default()).await;
        clear(&client, &ns).await;
    }

    // 5. Expiry.
    if !sustained_names.is_empty() {
        say(format!("expiry of {}", thousands(sustained_names.len())));
        report.expiry = expiry(&client, &seen, &sustained_ns, &sustained_names).await;
        checkpoint(&mut report, &machine, &args);
        say(format!("{:?}", report.expiry));
    }

    // 6. Groups.
    if args.groups > 0 {
        say(format!("{} RolloutGroups through one queue", args.groups));
        let groups = groups_phase(&env, &client, &groups_ns, args.groups, ready_rx, &pids).await;
        say(format!("{groups:?}"));
        report.groups = Some(groups);
        checkpoint(&mut report, &machine, &args);
    }

    // 7. Held.
    if args.held > 0 {
        say(format!("holding {}", thousands(args.held)));
        let held = held_phase(&env, &client, &seen, args.held, rss_empty).await;
        say(format!("{held:?}"));
        report.held = Some(held);
        checkpoint(&mut report, &machine, &args);
    }
    for watch in watches {
        watch.abort();
    }
    env.stop().await;
    drop(env);

    // The audited cluster.
    if args.audit > 0 {
        say(format!(
            "audited: {} at {:.0}/s",
            thousands(args.audit),
            args.rate
        ));
        report.requests = Some(audited(args.nodes, args.audit, args.rate).await);
    }
    report.machine = machine.report();
    let section = render(&report);
    println!("{section}");
    if let Some(doc) = &args.write_doc {
        if let Err(err) = orchard_bench::docs::write_section(doc, HEADING, &section) {
            fail(format!("cannot write {}: {err}", doc.display()));
        }
        say(format!(
            "wrote the section \"{HEADING}\" of {}",
            doc.display()
        ));
    }
}
