//! `bench-scale` (`make bench-scale`): the paper's headline lifecycle at scale on the local cluster.
//! N sandboxes (default 1,000) go through create -> wait Ready -> 4 execs through the gateway -> delete,
//! with bounded client concurrency, in R rounds on one cluster (default 3; each waits for a quiet
//! machine first). Reports success rate, the median and spread over the rounds of the end-to-end time,
//! create->Ready and exec latency percentiles over every sandbox, API writes per sandbox, CPU seconds
//! and memory per component (etcd, kube-apiserver, kube-controller-manager, operator, local node,
//! agents, this driver), and each round on its own.
//!
//! ```text
//! bench-scale [--sandboxes N] [--concurrency C] [--execs E] [--rounds R] [--real-node] [--audit]
//!             [--apiserver-profile PATH] [--json PATH] [--write-doc docs/BENCHMARKS.md] [-- OPERATOR_FLAGS...]
//! ```
//! `--apiserver-profile` saves kube-apiserver's own CPU profile (Go's pprof format, from its
//! `/debug/pprof/profile`) of the first round's first 15 s to PATH; read it with
//! `go tool pprof -top -cum PATH`.
//! The cluster runs in a separate `orchard-local-cluster` process so each component's CPU is its own;
//! `--real-node` gives it the real node (every sandbox a container; default image: the busybox image
//! built here). `--json` writes a summary that `bench-real` puts side by side.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use orchard_testcluster::cluster_process::ClusterProcess;
use orchard_testcluster::control_plane::client_from_kubeconfig;
use orchard_testcluster::operator_process::metric_sum;
use orchard_testcluster::proc_stats::{
    cgroup_cpu_seconds, cpu_seconds, machine_busy_seconds, peak_rss_bytes, percentile,
    reaped_children_cpu_seconds, rss_bytes,
};
use serde_json::json;

mod batch;
mod milestones;
mod report;

use batch::{Outcome, agent_pids, lifecycle};
use milestones::{Milestones, milestone_percentiles, milestone_table, track_milestones};
use report::{Round, cpu_table, mean_latencies, mib, round_table};

/// How long the benchmark waits for a quiet machine before it runs anyway (and says so).
const QUIET_WAIT: Duration = Duration::from_secs(90);
/// The CPU table's row of the hollow node's sandbox processes.
const SANDBOX_PROCESSES: &str = "sandboxes' processes (agent installs, agents, their commands)";
/// The span of kube-apiserver's CPU profile (`--apiserver-profile`): from the first round's start,
/// shorter than the round itself, so it samples the API server under load only.
const PROFILE_SECONDS: u32 = 15;

/// Saves kube-apiserver's CPU profile over the next [`PROFILE_SECONDS`] to `path` (kube-apiserver
/// serves Go's pprof at `/debug/pprof/profile` to cluster administrators).
async fn save_apiserver_profile(kube: kube::Client, path: PathBuf) -> Result<(), String> {
    use futures::AsyncReadExt;
    let request = http::Request::get(format!("/debug/pprof/profile?seconds={PROFILE_SECONDS}"))
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let mut body = kube
        .request_stream(request)
        .await
        .map_err(|e| format!("GET /debug/pprof/profile: {e}"))?;
    let mut profile = Vec::new();
    body.read_to_end(&mut profile)
        .await
        .map_err(|e| format!("reading the profile: {e}"))?;
    std::fs::write(&path, &profile).map_err(|e| format!("{}: {e}", path.display()))
}

struct Args {
    sandboxes: usize,
    concurrency: usize,
    execs: usize,
    rounds: usize,
    image: Option<String>,
    real_node: bool,
    /// Turn on the API server's audit log and print every write per sandbox by who sent it (costs
    /// the API server a file write per request: for attribution runs, not for timing).
    audit: bool,
    /// Where to save kube-apiserver's CPU profile of the first round (`--apiserver-profile`).
    apiserver_profile: Option<PathBuf>,
    json: Option<PathBuf>,
    write_doc: Option<PathBuf>,
    operator_args: Vec<String>,
}

fn usage() -> ! {
    eprintln!(
        "usage: bench-scale [--sandboxes N] [--concurrency C] [--execs E] [--rounds R] [--image I] [--real-node] [--audit] [--apiserver-profile PATH] [--json PATH] [--write-doc PATH] [-- OPERATOR_FLAGS...]"
    );
    std::process::exit(2);
}

fn parse_args() -> Args {
    let mut args = Args {
        sandboxes: 1000,
        concurrency: 250,
        execs: 4,
        rounds: 3,
        image: None,
        real_node: false,
        audit: false,
        apiserver_profile: None,
        json: None,
        write_doc: None,
        operator_args: Vec::new(),
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
            "--concurrency" => args.concurrency = number(it.next()),
            "--execs" => args.execs = number(it.next()),
            "--rounds" => args.rounds = number(it.next()),
            "--image" => args.image = Some(it.next().unwrap_or_else(|| usage())),
            "--real-node" => args.real_node = true,
            "--audit" => args.audit = true,
            "--apiserver-profile" => {
                args.apiserver_profile = Some(PathBuf::from(it.next().unwrap_or_else(|| usage())))
            }
            "--json" => args.json = Some(PathBuf::from(it.next().unwrap_or_else(|| usage()))),
            "--write-doc" => {
                args.write_doc = Some(PathBuf::from(it.next().unwrap_or_else(|| usage())))
            }
            "--" => args.operator_args.extend(it.by_ref()),
            _ => usage(),
        }
    }
    args
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = parse_args();
    eprintln!("starting the local cluster...");
    let cluster = ClusterProcess::start_with(
        "bench-scale",
        args.real_node,
        args.audit,
        &args.operator_args,
    )
    .await
    .unwrap_or_else(|e| {
        eprintln!("bench-scale: cannot start orchard-local-cluster: {e}");
        std::process::exit(1)
    });
    let info = cluster.info.clone();
    let gateway = info["gatewayURL"].as_str().unwrap_or_default().to_string();
    let image = args.image.clone().unwrap_or_else(|| {
        info["node"]["images"]["busybox"]
            .as_str()
            .unwrap_or("busybox:1.36")
            .to_string()
    });
    let metrics_url = info["metricsURL"].as_str().unwrap_or_default().to_string();
    let token = info["adminToken"].as_str().unwrap_or_default().to_string();
    let kubeconfig = PathBuf::from(info["kubeconfig"].as_str().unwrap_or_default());
    let mut pids: BTreeMap<String, u32> = info["pids"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), u32::try_from(v.as_u64()?).ok()?)))
                .collect()
        })
        .unwrap_or_default();
    pids.insert("bench driver (client)".into(), std::process::id());
    // On the real node, cgroups account the pods' containers and each node component with the
    // processes it starts (short-lived ones such as runc and the CNI plugins included).
    let cpu_files: BTreeMap<String, PathBuf> = info["cpuUsageFiles"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| Some((k.clone(), PathBuf::from(v.as_str()?))))
                .collect()
        })
        .unwrap_or_default();
    // On the hollow node, every sandbox's processes (the agent's install, the agent, the commands it
    // runs) are children of the local node's process, which reaps them: its reaped children's CPU
    // is theirs once they have exited, as every one of a round has when its pods are gone.
    let sandbox_processes_of = match (cpu_files.is_empty(), pids.get("local-node")) {
        (true, Some(pid)) => Some(*pid),
        _ => None,
    };
    let read_cpu = || -> BTreeMap<String, f64> {
        pids.iter()
            .filter_map(|(k, p)| Some((k.clone(), cpu_seconds(*p)?)))
            .chain(
                cpu_files
                    .iter()
                    .filter_map(|(k, f)| Some((k.clone(), cgroup_cpu_seconds(f)?))),
            )
            .chain(sandbox_processes_of.and_then(|pid| {
                Some((
                    SANDBOX_PROCESSES.to_string(),
                    reaped_children_cpu_seconds(pid)?,
                ))
            }))
            .collect()
    };
    let kube = client_from_kubeconfig(&kubeconfig)
        .await
        .unwrap_or_else(|e| {
            eprintln!("bench-scale: {e}");
            std::process::exit(1)
        });
    let operator_metrics = || {
        let url = metrics_url.clone();
        async move { reqwest::get(&url).await.ok()?.text().await.ok() }
    };
    let apiserver_writes = || {
        let kube = kube.clone();
        async move {
            let text = kube
                .request_text(http::Request::get("/metrics").body(Vec::new()).ok()?)
                .await
                .ok()?;
            Some(
                ["POST", "PUT", "PATCH", "DELETE"]
                    .iter()
                    .map(|verb| metric_sum(&text, "apiserver_request_total", &[("verb", verb)]))
                    .sum::<f64>(),
            )
        }
    };
    // Sample memory while the load runs.
    let peak_agents = Arc::new(AtomicU64::new(0));
    let peak_agent_rss = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (peak_agents, peak_agent_rss) = (peak_agents.clone(), peak_agent_rss.clone());
        tokio::spawn(async move {
            loop {
                let agents = agent_pids();
                let rss: u64 = agents.iter().filter_map(|p| rss_bytes(*p)).sum();
                peak_agents.fetch_max(agents.len() as u64, Ordering::Relaxed);
                peak_agent_rss.fetch_max(rss, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };

    let http = orchard_testcluster::gateway_http_builder()
        .pool_max_idle_per_host(args.concurrency)
        .timeout(Duration::from_secs(330))
        .build()
        .unwrap_or_else(|e| {
            eprintln!("bench-scale: http client: {e}");
            std::process::exit(1)
        });
    let milestones = Arc::new(std::sync::Mutex::new(BTreeMap::<String, Milestones>::new()));
    // The tracker's pod watch also keeps a cache of the pods, which tells when a round's pods are
    // gone without listing every pod from the API server four times a second.
    let (pods, pods_writer) = kube::runtime::reflector::store();
    let tracker = tokio::spawn(track_milestones(
        kube.clone(),
        milestones.clone(),
        pods_writer,
    ));
    let mut rounds: Vec<Round> = Vec::new();
    for round in 0..args.rounds {
        // The cluster's start-up load, or the previous round's, settles first (bounded wait; the
        // report says when it did not).
        let machine = orchard_bench_support::Machine::settle(QUIET_WAIT);
        let writes_before = operator_metrics()
            .await
            .map(|m| metric_sum(&m, "orchard_api_writes_total", &[]))
            .unwrap_or(0.0);
        let all_writes_before = apiserver_writes().await.unwrap_or(0.0);
        let cpu_before = read_cpu();
        let machine_before = machine_busy_seconds();
        eprintln!(
            "round {} of {}: {} sandboxes with concurrency {} ...",
            round + 1,
            args.rounds,
            args.sandboxes,
            args.concurrency
        );
        let started = Instant::now();
        let profile = match (&args.apiserver_profile, round) {
            (Some(path), 0) => Some(tokio::spawn(save_apiserver_profile(
                kube.clone(),
                path.clone(),
            ))),
            _ => None,
        };
        let outcomes: Vec<Outcome> = futures::stream::iter(0..args.sandboxes)
            .map(|i| {
                lifecycle(
                    &http,
                    &gateway,
                    &token,
                    format!("bench-{round}-{i}"),
                    &image,
                    args.execs,
                )
            })
            .buffer_unordered(args.concurrency)
            .collect()
            .await;
        let end_to_end = started.elapsed();
        if let (Some(profile), Some(path)) = (profile, &args.apiserver_profile) {
            match profile.await {
                Ok(Ok(())) => eprintln!(
                    "kube-apiserver's CPU profile of round 1's first {PROFILE_SECONDS} s: {} (`go tool pprof -top -cum {}`)",
                    path.display(),
                    path.display()
                ),
                Ok(Err(error)) => eprintln!("bench-scale: no kube-apiserver profile: {error}"),
                Err(error) => eprintln!("bench-scale: no kube-apiserver profile: {error}"),
            }
        }
        let prefix = format!("bench-{round}-");
        loop {
            let left = pods
                .state()
                .iter()
                .filter(|p| {
                    p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&prefix))
                })
                .count();
            if left == 0 || started.elapsed() > end_to_end + Duration::from_secs(300) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let cleaned = started.elapsed();
        let cpu_after = read_cpu();
        let machine_busy = machine_busy_seconds()
            .zip(machine_before)
            .map(|(after, before)| after - before);
        let cpu: BTreeMap<String, f64> = cpu_after
            .iter()
            .map(|(k, after)| (k.clone(), after - cpu_before.get(k).copied().unwrap_or(0.0)))
            .collect();
        let operator_writes = operator_metrics()
            .await
            .map(|m| metric_sum(&m, "orchard_api_writes_total", &[]))
            .unwrap_or(0.0)
            - writes_before;
        let all_writes = apiserver_writes().await.unwrap_or(0.0) - all_writes_before;
        let result = Round {
            outcomes,
            end_to_end,
            cleaned,
            operator_writes,
            all_writes,
            cpu,
            machine_busy,
            machine: machine.report(),
        };
        eprintln!(
            "round {}: {}/{} ok, last delete answered after {:.1} s, all pods gone after {:.1} s; machine: {}",
            round + 1,
            result.ok(),
            args.sandboxes,
            end_to_end.as_secs_f64(),
            cleaned.as_secs_f64(),
            result.machine
        );
        rounds.push(result);
    }
    sampler.abort();
    tracker.abort();
    let steps = milestone_percentiles(&milestones.lock().unwrap_or_else(|p| p.into_inner()));
    let breakdown = milestone_table(&steps);

    let gateway_latency = operator_metrics()
        .await
        .map(|m| mean_latencies(&m, "orchard_gateway_request_duration_seconds", "route"))
        .unwrap_or_default();
    let apiserver_metrics = kube
        .request_text(
            http::Request::get("/metrics")
                .body(Vec::new())
                .unwrap_or_default(),
        )
        .await
        .unwrap_or_default();
    let apiserver_latency = mean_latencies(
        &apiserver_metrics,
        "apiserver_request_duration_seconds",
        "resource_verb",
    );
    // Time requests waited in API Priority and Fairness queues before they ran, per priority level.
    let apiserver_queueing = mean_latencies(
        &apiserver_metrics,
        "apiserver_flowcontrol_request_wait_duration_seconds",
        "priority_level",
    );
    let operator_peak = pids
        .get("orchard-operator")
        .and_then(|p| peak_rss_bytes(*p))
        .unwrap_or(0) as f64;

    let outcomes: Vec<&Outcome> = rounds.iter().flat_map(|r| r.outcomes.iter()).collect();
    let end_to_end: Vec<f64> = rounds.iter().map(|r| r.end_to_end.as_secs_f64()).collect();
    let cleaned: Vec<f64> = rounds.iter().map(|r| r.cleaned.as_secs_f64()).collect();
    let end_to_end_median = orchard_bench_support::median(&end_to_end).unwrap_or(f64::NAN);
    let ok = outcomes.iter().filter(|o| o.ok).count();
    // Failures grouped by the start of their message; the first one of each group in full.
    let mut errors: BTreeMap<String, (usize, String)> = BTreeMap::new();
    for o in outcomes.iter().filter(|o| !o.ok) {
        let message = o.error.clone().unwrap_or_default();
        let key: String = message.chars().take(60).collect();
        errors.entry(key).or_insert((0, message)).0 += 1;
    }
    let mut ready: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.ok)
        .map(|o| o.ready_ms)
        .collect();
    let mut create: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.ok)
        .map(|o| o.create_ms)
        .collect();
    let mut exec: Vec<f64> = outcomes
        .iter()
        .flat_map(|o| o.exec_ms.iter().copied())
        .collect();
    let mut delete: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.ok)
        .map(|o| o.delete_ms)
        .collect();
    for v in [&mut ready, &mut create, &mut exec, &mut delete] {
        v.sort_by(f64::total_cmp);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    // Per sandbox: over every round's sandboxes.
    let n = (args.sandboxes * args.rounds) as f64;
    let secs = |v: f64| format!("{v:.1} s");
    let mut table = String::new();
    table.push_str(&format!(
        "| metric | this run ({} rounds: median (lowest–highest), or over every sandbox) | Orchard paper (8 nodes x 32 vCPU) |\n|---|---|---|\n",
        args.rounds
    ));
    table.push_str(&format!(
        "| sandboxes per round (create -> Ready -> {} execs -> delete) | {} | 1,000 |\n",
        args.execs, args.sandboxes
    ));
    table.push_str(&format!(
        "| success, all rounds | {ok}/{} ({:.1} %) | 100 % |\n",
        outcomes.len(),
        100.0 * ok as f64 / n
    ));
    table.push_str(&format!(
        "| end-to-end time (last delete answered) | {} | 26 s |\n",
        orchard_bench_support::median_spread(&end_to_end, secs)
    ));
    table.push_str(&format!(
        "| all pods gone (garbage collection done) | {} | — |\n",
        orchard_bench_support::median_spread(&cleaned, secs)
    ));
    table.push_str(&format!(
        "| create -> Ready p50 / p99 / mean | {:.2} / {:.2} / {:.2} s | mean 11.75 s |\n",
        percentile(&ready, 50.0) / 1e3,
        percentile(&ready, 99.0) / 1e3,
        mean(&ready) / 1e3
    ));
    table.push_str(&format!(
        "| exec through the gateway p50 / p99 / mean | {:.1} / {:.1} / {:.1} ms | mean 280 ms |\n",
        percentile(&exec, 50.0),
        percentile(&exec, 99.0),
        mean(&exec)
    ));
    table.push_str(&format!(
        "| create request p50 / p99; delete request p50 / p99 | {:.1} / {:.1} ms; {:.1} / {:.1} ms | — |\n",
        percentile(&create, 50.0),
        percentile(&create, 99.0),
        percentile(&delete, 50.0),
        percentile(&delete, 99.0)
    ));
    table.push_str(&format!(
        "| operator API writes per sandbox | {:.2} | — |\n",
        rounds.iter().map(|r| r.operator_writes).sum::<f64>() / n
    ));
    table.push_str(&format!(
        "| all API writes per sandbox (operator, node, GC, driver) | {:.2} | — |\n",
        rounds.iter().map(|r| r.all_writes).sum::<f64>() / n
    ));
    table.push_str(&format!(
        "| operator peak RSS | {} | — |\n",
        mib(operator_peak)
    ));
    let agents = peak_agents.load(Ordering::Relaxed).max(1);
    table.push_str(&format!(
        "| agents at peak; their total RSS (per agent) | {agents}; {} ({}) | — |\n",
        mib(peak_agent_rss.load(Ordering::Relaxed) as f64),
        mib(peak_agent_rss.load(Ordering::Relaxed) as f64 / agents as f64)
    ));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let (cpu, rows, machine_busy) = cpu_table(&rounds, mean(&cleaned), cpus);
    let round_table = round_table(&rounds, args.sandboxes);
    let command = format!(
        "make bench-scale BENCH_SANDBOXES={} BENCH_CONCURRENCY={} BENCH_ROUNDS={}",
        args.sandboxes, args.concurrency, args.rounds
    );
    let mut latency = String::from("| where | mean latency | requests |\n|---|---|---|\n");
    for (label, mean_s, count) in gateway_latency.iter().filter(|(_, _, c)| *c >= 10.0) {
        latency.push_str(&format!(
            "| gateway `{label}` | {:.1} ms | {count:.0} |\n",
            mean_s * 1e3
        ));
    }
    let mut api_rows: Vec<_> = apiserver_latency
        .iter()
        .filter(|(l, _, c)| *c >= 0.1 * n && !l.contains("WATCH"))
        .cloned()
        .collect();
    api_rows.sort_by(|a, b| (b.1 * b.2).total_cmp(&(a.1 * a.2)));
    for (label, mean_s, count) in &api_rows {
        latency.push_str(&format!(
            "| kube-apiserver {label} | {:.1} ms | {count:.0} ({:.2} per sandbox) |\n",
            mean_s * 1e3,
            count / n
        ));
    }
    for (level, mean_s, count) in apiserver_queueing.iter().filter(|(_, _, c)| *c >= 0.1 * n) {
        latency.push_str(&format!(
            "| kube-apiserver queueing (priority and fairness) at level `{level}` | {:.1} ms | {count:.0} |\n",
            mean_s * 1e3
        ));
    }
    println!("{table}\n{round_table}\n{cpu}\n{breakdown}\n{latency}");
    if args.audit {
        let log = PathBuf::from(info["logs"].as_str().unwrap_or_default()).join("audit.log");
        match std::fs::read_to_string(&log) {
            Ok(text) => {
                let rows = orchard_bench::audit_summary::summarize(&text);
                println!(
                    "Every write of the run by sender (kube-apiserver audit log {}):\n\n{}",
                    log.display(),
                    orchard_bench::audit_summary::table(&rows, args.sandboxes)
                );
            }
            Err(err) => eprintln!("bench-scale: cannot read {}: {err}", log.display()),
        }
    }
    if !errors.is_empty() {
        println!("errors:");
        for (count, first) in errors.values() {
            println!("  {count} x {first}");
        }
    }
    if let Some(path) = &args.write_doc {
        let section = format!(
            "## Scale\n\nCommand: `{command}` (release build; the local cluster of `docs/TESTING.md` on this machine: 2 cores, 24 GiB; everything — etcd, kube-apiserver, kube-controller-manager, the operator, the local node, {} agents and this driver — shares the two cores). The same batch runs {} times on one cluster, each round after a wait for a quiet machine; times are the median over the rounds with the lowest and highest in brackets, latencies are over every sandbox of every round.\n\n{table}\nEach round:\n\n{round_table}\nWhere the CPU goes (from a round's first create until every pod was gone, the mean of the rounds; each component's own CPU seconds from `/proc/<pid>/stat`, its sandboxes' processes from the local node's reaped children in the same file, and the whole machine's busy time from `/proc/stat`):\n\n{cpu}\nWhere create -> Ready goes (first time the driver's watches saw each milestone; p50 / p99 of the step, every round):\n\n{breakdown}\nWhere the latency goes (means over the run, from the gateway's and kube-apiserver's own histograms; the busiest kube-apiserver requests by total time):\n\n{latency}",
            args.sandboxes, args.rounds,
        );
        if let Err(err) = orchard_bench::docs::write_section(path, "## Scale", &section) {
            eprintln!("bench-scale: cannot write {}: {err}", path.display());
        }
    }
    if let Some(path) = &args.json {
        let summary = json!({
            "node": if args.real_node { "real" } else { "hollow" },
            "image": image,
            "sandboxes": args.sandboxes,
            "rounds": args.rounds,
            "concurrency": args.concurrency,
            "execs": args.execs,
            "ok": ok,
            "attempted": outcomes.len(),
            "endToEndSeconds": end_to_end_median,
            "readySeconds": {"p50": percentile(&ready, 50.0) / 1e3, "p99": percentile(&ready, 99.0) / 1e3},
            "execMilliseconds": {"p50": percentile(&exec, 50.0), "p99": percentile(&exec, 99.0)},
            "steps": steps.iter().map(|(name, p50, p99)| json!({"step": name, "p50": p50, "p99": p99})).collect::<Vec<_>>(),
            "errors": errors.values().map(|(count, first)| json!({"count": count, "first": first})).collect::<Vec<_>>(),
            "machine": rounds.iter().map(|r| r.machine.as_str()).collect::<Vec<_>>().join(" | "),
            "cpuSeconds": rows.iter().map(|(name, seconds)| json!({"component": name, "seconds": seconds})).collect::<Vec<_>>(),
            "machineBusySeconds": machine_busy,
        });
        if let Err(err) = std::fs::write(path, summary.to_string()) {
            eprintln!("bench-scale: cannot write {}: {err}", path.display());
        }
    }
    drop(cluster);
    if ok != outcomes.len() {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests;
