//! `bench-lifecycle` (`make bench-lifecycle`): the timings the end-to-end tests only bound, measured
//! on the hollow node in one run:
//!
//! - heartbeat expiry: S Sandboxes (default 100) created at once with a 4 s heartbeat timeout, so
//!   they all time out within a second or two of each other; each one's lateness is the deletion a
//!   watch saw minus its `status.expiresAt` (p50, p99, max of the round);
//! - leader takeover: two operator processes with leader election (3 s lease, scoped to an empty
//!   namespace so that they only contend for the Lease), the leader SIGKILLed, and in a second pair
//!   the leader's API-server traffic cut by a proxy; the takeover is the standby's `acquireTime` in
//!   the Lease minus the moment of the kill or the cut;
//! - API writes per sandbox lifecycle: W Sandboxes (default 10) applied with the API and W created
//!   through the gateway, each through create -> Ready -> delete, counted by the operator's own
//!   `orchard_api_writes_total`.
//!
//! R rounds (default 3), each after a bounded wait for a quiet machine (`orchard-bench-support`);
//! every figure is the median over the rounds with the lowest and highest in brackets, and the
//! machine of each round is reported with it. The cluster runs in its own process
//! (`orchard-local-cluster`), apart from this driver.
//!
//! ```text
//! bench-lifecycle [--sandboxes S] [--writes W] [--rounds R] [--write-doc docs/BENCHMARKS.md]
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use orchard_operator::api::Sandbox;
use orchard_testcluster::binaries::operator_bin;
use orchard_testcluster::cluster_process::ClusterProcess;
use orchard_testcluster::control_plane::client_from_kubeconfig;
use orchard_testcluster::operator_process::{OperatorProcess, metric_sum};
use orchard_testcluster::proc_stats::percentile;
use orchard_testcluster::tcp_proxy::{TcpProxy, kubeconfig_through, server_address};
use orchard_testcluster::test_support::gateway::Caller;
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

/// How long each round waits for a quiet machine before it runs anyway (and says so).
const QUIET_WAIT: Duration = Duration::from_secs(60);
/// The lease duration of the takeover rounds (the one `leader_election.rs` uses).
const LEASE_SECONDS: u64 = 3;
/// The heading of this benchmark's section of docs/BENCHMARKS.md.
const HEADING: &str = "## Lifecycle: expiry, leader takeover, writes per sandbox";

struct Args {
    sandboxes: usize,
    writes: usize,
    rounds: usize,
    write_doc: Option<PathBuf>,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench-lifecycle [--sandboxes S] [--writes W] [--rounds R] [--write-doc PATH]"
    );
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut args = Args {
        sandboxes: 100,
        writes: 10,
        rounds: 3,
        write_doc: None,
    };
    let mut it = std::env::args().skip(1);
    let number = |v: Option<String>| {
        v.and_then(|v| v.parse::<usize>().ok())
            .filter(|n| *n > 0)
            .unwrap_or_else(|| usage())
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--sandboxes" => args.sandboxes = number(it.next()),
            "--writes" => args.writes = number(it.next()),
            "--rounds" => args.rounds = number(it.next()),
            "--write-doc" => {
                args.write_doc = Some(it.next().map(Into::into).unwrap_or_else(|| usage()))
            }
            _ => usage(),
        }
    }
    args
}

fn fail(what: impl std::fmt::Display) -> ! {
    eprintln!("bench-lifecycle: {what}");
    std::process::exit(1)
}

/// What one round measured.
#[derive(Debug, Clone)]
struct Round {
    /// Expiry lateness, seconds: p50, p99, max, min.
    expiry: [f64; 4],
    /// Takeover after the leader's SIGKILL, seconds.
    takeover_kill: f64,
    /// Takeover after the leader's API-server traffic was cut, seconds.
    takeover_cut: f64,
    /// Operator writes per sandbox: applied with the API, created through the gateway.
    writes: [f64; 2],
    /// The machine during the round (`orchard-bench-support`).
    machine: String,
}

/// The cluster this driver talks to.
struct Cluster {
    client: Client,
    kubeconfig: PathBuf,
    server: String,
    logs: PathBuf,
    gateway: String,
    metrics: String,
    token: String,
}

async fn create_namespace(client: &Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace JSON");
    if let Err(err) = namespaces.create(&PostParams::default(), &namespace).await {
        fail(format!("namespace {name}: {err}"));
    }
}

async fn delete_namespace(client: &Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces.delete(name, &DeleteParams::default()).await;
}

/// Lateness of each of `count` sandboxes created at once in `ns` with a 4 s heartbeat timeout:
/// deletion seen by a watch minus `status.expiresAt`, sorted.
async fn expiry_lateness(client: &Client, ns: &str, count: usize) -> Vec<f64> {
    let api: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    let creates = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let spec = json!({"image": "busybox", "lifecycle": {"heartbeatTimeoutSeconds": 4}});
                if let Err(err) = api
                    .create(&PostParams::default(), &sandbox(&format!("x{i}"), spec))
                    .await
                {
                    fail(format!("create x{i}: {err}"));
                }
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>();
    let observe = async {
        let mut deadlines: HashMap<String, Timestamp> = HashMap::new();
        let mut lateness = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        while lateness.len() < count {
            match tokio::time::timeout_at(deadline, events.next()).await {
                Ok(Some(Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)))) => {
                    if let Some(at) = s.status.as_ref().and_then(|st| st.expires_at.as_ref()) {
                        deadlines.insert(s.name_any(), at.0);
                    }
                }
                Ok(Some(Ok(watcher::Event::Delete(s)))) => {
                    let now = Timestamp::now();
                    let Some(due) = deadlines.get(&s.name_any()) else {
                        fail(format!("{} deleted before it had a deadline", s.name_any()));
                    };
                    lateness.push(now.duration_since(*due).as_secs_f64());
                }
                Ok(Some(_)) => {}
                Ok(None) => fail("the sandbox watch ended"),
                Err(_) => fail(format!(
                    "only {} of {count} sandboxes expired within 300 s",
                    lateness.len()
                )),
            }
        }
        lateness
    };
    let (_, mut lateness) = tokio::join!(creates, observe);
    lateness.sort_by(f64::total_cmp);
    lateness
}

/// Starts an operator with leader election on Lease `default/<lease>` as `identity`, scoped to the
/// empty namespace `scope` (it contends for the Lease and has nothing else to do).
async fn contender(
    cluster: &Cluster,
    kubeconfig: &Path,
    lease: &str,
    identity: &str,
    scope: &str,
) -> OperatorProcess {
    let args = vec![
        "--leader-election".to_string(),
        "--lease-namespace=default".to_string(),
        format!("--lease-name={lease}"),
        format!("--lease-duration-seconds={LEASE_SECONDS}"),
        format!("--identity={identity}"),
        format!("--watch-namespace={scope}"),
    ];
    let binary = operator_bin().unwrap_or_else(|e| fail(e));
    OperatorProcess::start(
        &binary,
        kubeconfig,
        &cluster
            .logs
            .join(format!("orchard-operator-{identity}.log")),
        &args,
    )
    .await
    .unwrap_or_else(|e| fail(format!("operator {identity}: {e}")))
}

/// Waits until Lease `default/<lease>` is held by `identity`; returns its `acquireTime`.
async fn held_by(client: &Client, lease: &str, identity: &str) -> Timestamp {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    wait::poll(
        &format!("{identity} holds the lease {lease}"),
        Duration::from_secs(60),
        || async {
            let spec = leases.get_opt(lease).await.ok()??.spec?;
            (spec.holder_identity.as_deref() == Some(identity)).then_some(spec.acquire_time?.0)
        },
    )
    .await
}

/// The takeover after the leader is SIGKILLed (`cut` false) or cut off from the API server by a
/// proxy (`cut` true): the standby's `acquireTime` minus the moment of the kill or the cut, seconds.
async fn takeover(cluster: &Cluster, round: usize, cut: bool) -> f64 {
    let kind = if cut { "cut" } else { "kill" };
    let lease = format!("bench-{kind}-{round}");
    let scope = format!("bench-leader-{kind}-{round}");
    create_namespace(&cluster.client, &scope).await;
    let proxy = TcpProxy::start(server_address(&cluster.server).unwrap_or_else(|e| fail(e)))
        .await
        .unwrap_or_else(|e| fail(e));
    let through_proxy = cluster.logs.join(format!("kubeconfig-{lease}"));
    kubeconfig_through(&cluster.kubeconfig, &cluster.server, &proxy, &through_proxy)
        .unwrap_or_else(|e| fail(e));
    let leader_identity = format!("{lease}-leader");
    let standby_identity = format!("{lease}-standby");
    let leader = contender(cluster, &through_proxy, &lease, &leader_identity, &scope).await;
    held_by(&cluster.client, &lease, &leader_identity).await;
    let standby = contender(
        cluster,
        &cluster.kubeconfig,
        &lease,
        &standby_identity,
        &scope,
    )
    .await;
    let at = Timestamp::now();
    if cut {
        proxy.cut();
    } else {
        leader.kill();
    }
    let acquired = held_by(&cluster.client, &lease, &standby_identity).await;
    leader.kill();
    standby.kill();
    delete_namespace(&cluster.client, &scope).await;
    acquired.duration_since(at).as_secs_f64()
}

async fn operator_writes(cluster: &Cluster) -> f64 {
    let text = reqwest::get(&cluster.metrics)
        .await
        .and_then(|r| r.error_for_status())
        .unwrap_or_else(|e| fail(format!("operator metrics: {e}")));
    let text = text
        .text()
        .await
        .unwrap_or_else(|e| fail(format!("operator metrics: {e}")));
    metric_sum(&text, "orchard_api_writes_total", &[])
}

/// Operator writes per sandbox of `count` sandboxes in `ns` through create -> Ready -> delete,
/// created through the gateway with `gateway`, else with the API.
async fn writes_per_sandbox(
    cluster: &Cluster,
    ns: &str,
    prefix: &str,
    count: usize,
    gateway: bool,
) -> f64 {
    let api: Api<Sandbox> = Api::namespaced(cluster.client.clone(), ns);
    let caller = Caller::at(&cluster.gateway, Some(&cluster.token));
    let before = operator_writes(cluster).await;
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}{i}")).collect();
    for name in &names {
        if gateway {
            caller
                .create_sandbox(ns, json!({"name": name, "image": "busybox"}))
                .await;
        } else if let Err(err) = api
            .create(
                &PostParams::default(),
                &sandbox(name, json!({"image": "busybox"})),
            )
            .await
        {
            fail(format!("create {name}: {err}"));
        }
    }
    for name in &names {
        wait::until(&api, name, "Ready", Duration::from_secs(120), is_ready).await;
    }
    for name in &names {
        if let Err(err) = api.delete(name, &DeleteParams::default()).await {
            fail(format!("delete {name}: {err}"));
        }
    }
    for name in &names {
        wait::deleted(&api, name, Duration::from_secs(120)).await;
    }
    // Their pods gone too (the warm-up sandbox's stays).
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    wait::poll(
        "pods garbage-collected",
        Duration::from_secs(120),
        || async {
            let left = pods.list(&ListParams::default()).await.ok()?.items.len();
            (left == 1).then_some(())
        },
    )
    .await;
    (operator_writes(cluster).await - before) / count as f64
}

async fn round(cluster: &Cluster, args: &Args, index: usize) -> Round {
    let machine = orchard_bench_support::Machine::settle(QUIET_WAIT);

    let ns = format!("bench-expiry-{index}");
    create_namespace(&cluster.client, &ns).await;
    let lateness = expiry_lateness(&cluster.client, &ns, args.sandboxes).await;
    delete_namespace(&cluster.client, &ns).await;
    let expiry = [
        percentile(&lateness, 50.0),
        percentile(&lateness, 99.0),
        lateness[lateness.len() - 1],
        lateness[0],
    ];
    eprintln!(
        "  expiry lateness of {}: p50 {:.3} s, p99 {:.3} s, max {:.3} s, min {:.3} s",
        args.sandboxes, expiry[0], expiry[1], expiry[2], expiry[3]
    );

    let takeover_kill = takeover(cluster, index, false).await;
    let takeover_cut = takeover(cluster, index, true).await;
    eprintln!("  takeover after SIGKILL {takeover_kill:.2} s, after the cut {takeover_cut:.2} s");

    let ns = format!("bench-writes-{index}");
    create_namespace(&cluster.client, &ns).await;
    // The namespace's baseline policy is a once-per-namespace cost: made before counting.
    let api: Api<Sandbox> = Api::namespaced(cluster.client.clone(), &ns);
    if let Err(err) = api
        .create(
            &PostParams::default(),
            &sandbox("warmup", json!({"image": "busybox"})),
        )
        .await
    {
        fail(format!("create warmup: {err}"));
    }
    wait::until(&api, "warmup", "Ready", Duration::from_secs(120), is_ready).await;
    let applied = writes_per_sandbox(cluster, &ns, "w", args.writes, false).await;
    let through_gateway = writes_per_sandbox(cluster, &ns, "g", args.writes, true).await;
    delete_namespace(&cluster.client, &ns).await;
    eprintln!(
        "  operator writes per sandbox: applied {applied:.2}, through the gateway {through_gateway:.2}"
    );

    Round {
        expiry,
        takeover_kill,
        takeover_cut,
        writes: [applied, through_gateway],
        machine: machine.report(),
    }
}

/// The CPU model and memory of this machine, from `/proc` (for the doc section).
fn machine_description() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory = meminfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemTotal:")?
                .trim()
                .strip_suffix(" kB")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or("?".to_string(), |kib| {
            format!("{:.0} GiB", kib / 1024.0 / 1024.0)
        });
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    format!("{cpus} CPUs ({model}), {memory}")
}

/// The doc section (pure): one row per figure with the median (lowest–highest) over the rounds, then
/// each round's machine.
fn doc_section(args: &Args, rounds: &[Round], date: &str, machine: &str) -> String {
    use orchard_bench_support::median_spread;
    let seconds = |values: Vec<f64>| median_spread(&values, |v| format!("{v:.3} s"));
    let per = |values: Vec<f64>| median_spread(&values, |v| format!("{v:.2}"));
    let column = |i: usize| rounds.iter().map(|r| r.expiry[i]).collect::<Vec<_>>();
    let mut section = format!(
        "{HEADING}\n\nCommand: `make bench-lifecycle` (release build; `bench-lifecycle --sandboxes {} --writes {} --rounds {}`). Run {date} on {machine}, the hollow node's cluster in its own process (`orchard-local-cluster`), everything on the same cores. These are the figures the end-to-end tests only bound (`expiry.rs` and `expiry_load.rs`: never before the deadline, at most 10 s late; `leader_election.rs`: a takeover before two lease durations plus the renew deadline; `api_writes.rs`: at most 4 operator writes per sandbox). {} rounds, each after a wait for a quiet machine; each cell is the median over the rounds with the lowest and highest in brackets.\n\n| what | median (lowest–highest) |\n|---|---|\n",
        args.sandboxes,
        args.writes,
        args.rounds,
        rounds.len()
    );
    let rows = [
        (
            format!("heartbeat expiry of {} sandboxes timing out at once (4 s timeout), lateness p50: deletion seen by a watch minus `status.expiresAt`", args.sandboxes),
            seconds(column(0)),
        ),
        ("the same, p99".to_string(), seconds(column(1))),
        ("the same, max".to_string(), seconds(column(2))),
        ("the same, min (negative: deleted early)".to_string(), seconds(column(3))),
        (
            format!("leader takeover after the leader's SIGKILL ({LEASE_SECONDS} s lease): the standby's `acquireTime` minus the kill"),
            seconds(rounds.iter().map(|r| r.takeover_kill).collect()),
        ),
        (
            "leader takeover after the leader's API-server traffic is cut (a proxy drops it): `acquireTime` minus the cut".to_string(),
            seconds(rounds.iter().map(|r| r.takeover_cut).collect()),
        ),
        (
            format!("operator API writes per sandbox, {} applied with the API, create -> Ready -> delete (`orchard_api_writes_total`)", args.writes),
            per(rounds.iter().map(|r| r.writes[0]).collect()),
        ),
        (
            format!("the same for {} created through the gateway (its POST included)", args.writes),
            per(rounds.iter().map(|r| r.writes[1]).collect()),
        ),
    ];
    for (what, figure) in rows {
        section.push_str(&format!("| {what} | {figure} |\n"));
    }
    section.push_str(&format!(
        "\nA takeover can take less than the lease duration: the Lease blocks the standby for {LEASE_SECONDS} s from the leader's last renewal (every sixth of the duration), not from the kill or the cut.\n"
    ));
    section.push_str("\nThe machine in each round:\n\n");
    for (i, r) in rounds.iter().enumerate() {
        section.push_str(&format!("- {}. {}.\n", i + 1, r.machine));
    }
    section
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    eprintln!("starting the local cluster...");
    let process = ClusterProcess::start("bench-lifecycle", false, &[])
        .await
        .unwrap_or_else(|e| fail(format!("cannot start orchard-local-cluster: {e}")));
    let kubeconfig = PathBuf::from(process.field("kubeconfig"));
    let client = client_from_kubeconfig(&kubeconfig)
        .await
        .unwrap_or_else(|e| fail(e));
    let cluster = Cluster {
        client,
        kubeconfig,
        server: process.field("server"),
        logs: PathBuf::from(process.field("logs")),
        gateway: process.field("gatewayURL"),
        metrics: process.field("metricsURL"),
        token: process.field("adminToken"),
    };
    let started = Instant::now();
    let mut rounds = Vec::new();
    for index in 0..args.rounds {
        eprintln!("round {} of {}...", index + 1, args.rounds);
        rounds.push(round(&cluster, &args, index).await);
    }
    eprintln!(
        "{} rounds in {:.0} s",
        rounds.len(),
        started.elapsed().as_secs_f64()
    );
    drop(process);
    let date = k8s_openapi::jiff::fmt::strtime::format("%Y-%m-%d", Timestamp::now())
        .unwrap_or_else(|_| "?".into());
    let section = doc_section(&args, &rounds, &date, &machine_description());
    println!("{section}");
    if let Some(path) = &args.write_doc
        && let Err(err) = orchard_bench::docs::write_section(path, HEADING, &section)
    {
        fail(format!("cannot write {}: {err}", path.display()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(takeover: f64, writes: f64) -> Round {
        Round {
            expiry: [0.1, 0.3, 0.4, 0.02],
            takeover_kill: takeover,
            takeover_cut: takeover + 1.0,
            writes: [writes, 3.0],
            machine: "2 CPUs".into(),
        }
    }

    #[test]
    fn each_figure_gets_its_median_and_spread_over_the_rounds() {
        let args = Args {
            sandboxes: 100,
            writes: 10,
            rounds: 3,
            write_doc: None,
        };
        let rounds = [round(3.2, 3.0), round(3.0, 3.1), round(3.5, 3.0)];
        let section = doc_section(&args, &rounds, "2026-11-28", "2 CPUs (x), 24 GiB");
        assert!(section.starts_with(HEADING), "{section}");
        assert!(
            section.contains("Run 2026-11-28 on 2 CPUs (x), 24 GiB"),
            "{section}"
        );
        assert!(
            section.contains(
                "the standby's `acquireTime` minus the kill | 3.200 s (3.000 s–3.500 s) |"
            ),
            "{section}"
        );
        assert!(
            section.contains("minus the cut | 4.200 s (4.000 s–4.500 s) |"),
            "{section}"
        );
        assert!(
            section.contains("(`orchard_api_writes_total`) | 3.00 (3.00–3.10) |"),
            "{section}"
        );
        assert!(
            section.contains("the same, p99 | 0.300 s (0.300 s–0.300 s) |"),
            "{section}"
        );
        assert!(section.contains("- 3. 2 CPUs.\n"), "{section}");
    }
}
