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
use orchard_e2e::cluster_process::ClusterProcess;
use orchard_e2e::control_plane::client_from_kubeconfig;
use orchard_e2e::operator_process::metric_sum;
use orchard_e2e::proc_stats::{
    cgroup_cpu_seconds, cpu_seconds, machine_busy_seconds, peak_rss_bytes, percentile,
    reaped_children_cpu_seconds, rss_bytes,
};
use orchard_e2e::supervise::processes_with_env;
use serde_json::{Value, json};

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

#[derive(Default)]
struct Outcome {
    ok: bool,
    error: Option<String>,
    create_ms: f64,
    ready_ms: f64,
    exec_ms: Vec<f64>,
    delete_ms: f64,
}

/// Sends `request` and reads a successful answer's JSON body (`Null` when there is none); any
/// other answer or a transport error is the failure message of `step`, with the error's causes and
/// how long after sending it came.
async fn send_ok(request: reqwest::RequestBuilder, step: &str) -> Result<Value, String> {
    let sent = Instant::now();
    match request.send().await {
        Ok(r) if r.status().is_success() => Ok(r.json().await.unwrap_or(Value::Null)),
        Ok(r) => Err(format!(
            "{step}: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        )),
        Err(e) => Err(format!(
            "{step}: {} (after {:.1} s)",
            orchard_e2e::with_causes(&e),
            sent.elapsed().as_secs_f64()
        )),
    }
}

async fn lifecycle(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    name: String,
    image: &str,
    execs: usize,
) -> Outcome {
    let mut out = Outcome::default();
    if let Err(error) = run_lifecycle(http, base, token, &name, image, execs, &mut out).await {
        out.error = Some(error);
        // Leave nothing behind for the next round (the failure is counted already).
        let _ = http
            .delete(format!("{base}/v1/namespaces/default/sandboxes/{name}"))
            .bearer_auth(token)
            .send()
            .await;
    } else {
        out.ok = true;
    }
    out
}

async fn run_lifecycle(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    name: &str,
    image: &str,
    execs: usize,
    out: &mut Outcome,
) -> Result<(), String> {
    let sandboxes = format!("{base}/v1/namespaces/default/sandboxes");
    let started = Instant::now();
    send_ok(
        http.post(&sandboxes)
            .bearer_auth(token)
            .json(&json!({"name": name, "image": image})),
        "create",
    )
    .await?;
    out.create_ms = started.elapsed().as_secs_f64() * 1e3;
    let body = send_ok(
        http.get(format!("{sandboxes}/{name}/wait?timeoutSeconds=300"))
            .bearer_auth(token),
        "wait",
    )
    .await?;
    let phase = body
        .pointer("/status/phase")
        .or_else(|| body.get("phase"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if phase != "Ready" {
        return Err(format!("wait: phase {phase:?}: {body}"));
    }
    out.ready_ms = started.elapsed().as_secs_f64() * 1e3;
    for i in 0..execs {
        let t = Instant::now();
        let request =
            json!({"argv": ["/bin/sh", "-c", format!("echo step {i} of $ORCHARD_SANDBOX")]});
        let body = send_ok(
            http.post(format!("{sandboxes}/{name}/exec"))
                .bearer_auth(token)
                .json(&request),
            "exec",
        )
        .await?;
        if body.get("exitCode").and_then(Value::as_i64) != Some(0) {
            return Err(format!("exec: {body}"));
        }
        out.exec_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let t = Instant::now();
    send_ok(
        http.delete(format!("{sandboxes}/{name}"))
            .bearer_auth(token),
        "delete",
    )
    .await?;
    out.delete_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(())
}

fn agent_pids() -> Vec<u32> {
    // The local node marks each pod's agent process (and only it keeps the marker with this value
    // shape); commands inherit it too, so keep processes whose executable is the agent.
    processes_with_env("ORCHARD_E2E_AGENT", None)
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .map(|p| p.to_string_lossy().ends_with("orchard-agent"))
                .unwrap_or(false)
        })
        .collect()
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
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

    let http = orchard_e2e::gateway_http_builder()
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
                let rows = orchard_e2e::audit_summary::summarize(&text);
                println!(
                    "Every write of the run by sender (kube-apiserver audit log {}):\n\n{}",
                    log.display(),
                    orchard_e2e::audit_summary::table(&rows, args.sandboxes)
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
        if let Err(err) = orchard_e2e::docs::write_section(path, "## Scale", &section) {
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

/// One round of the batch.
struct Round {
    outcomes: Vec<Outcome>,
    /// From the first create until the last delete was answered.
    end_to_end: Duration,
    /// Until every pod was gone.
    cleaned: Duration,
    operator_writes: f64,
    /// Every write the API server took (operator, node, garbage collector, driver).
    all_writes: f64,
    /// CPU seconds per component.
    cpu: BTreeMap<String, f64>,
    /// CPU seconds the whole machine was busy (every process and the kernel), if `/proc/stat` was
    /// readable.
    machine_busy: Option<f64>,
    machine: String,
}

impl Round {
    fn ok(&self) -> usize {
        self.outcomes.iter().filter(|o| o.ok).count()
    }
}

/// One row per round: success, times, create -> Ready p50, writes per sandbox, CPU seconds of every
/// component together and of the whole machine, and the machine (pure).
fn round_table(rounds: &[Round], sandboxes: usize) -> String {
    let mut table = String::from(
        "| round | success | end-to-end | all pods gone | create -> Ready p50 | all API writes per sandbox | CPU seconds: all components; the whole machine | machine |\n|---|---|---|---|---|---|---|---|\n",
    );
    for (i, round) in rounds.iter().enumerate() {
        let mut ready: Vec<f64> = round
            .outcomes
            .iter()
            .filter(|o| o.ok)
            .map(|o| o.ready_ms)
            .collect();
        ready.sort_by(f64::total_cmp);
        table.push_str(&format!(
            "| {} | {}/{sandboxes} | {:.1} s | {:.1} s | {:.2} s | {:.2} | {:.1}; {} | {} |\n",
            i + 1,
            round.ok(),
            round.end_to_end.as_secs_f64(),
            round.cleaned.as_secs_f64(),
            percentile(&ready, 50.0) / 1e3,
            round.all_writes / sandboxes.max(1) as f64,
            round.cpu.values().fold(0.0, |total, s| total + s),
            round
                .machine_busy
                .map_or_else(|| "—".to_string(), |s| format!("{s:.1}")),
            round.machine
        ));
    }
    table
}

/// The CPU table: each component's CPU seconds per round (the mean over the rounds) with its share,
/// their total against the core-seconds the mean round had, and the whole machine's busy time with
/// the part no component accounts for (kernel threads, interrupts, processes outside the cluster).
/// Also returns the rows, largest first, and the machine's mean busy seconds per round (pure).
fn cpu_table(
    rounds: &[Round],
    mean_cleaned: f64,
    cpus: usize,
) -> (String, Vec<(String, f64)>, Option<f64>) {
    let mut table =
        String::from("| component | CPU seconds per round (mean) | share |\n|---|---|---|\n");
    let mut summed: BTreeMap<String, f64> = BTreeMap::new();
    for round in rounds {
        for (name, seconds) in &round.cpu {
            *summed.entry(name.clone()).or_default() += seconds;
        }
    }
    let per_round = rounds.len().max(1) as f64;
    let mut rows: Vec<(String, f64)> = summed
        .into_iter()
        .map(|(name, seconds)| (name, seconds / per_round))
        .collect();
    let total: f64 = rows.iter().map(|(_, s)| s).sum();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (name, seconds) in &rows {
        table.push_str(&format!(
            "| {name} | {seconds:.1} | {:.0} % |\n",
            100.0 * seconds / total.max(1e-9)
        ));
    }
    table.push_str(&format!(
        "| **total** ({cpus} cores x {mean_cleaned:.0} s, the mean round = {:.0} core-seconds available) | {total:.1} | |\n",
        cpus as f64 * mean_cleaned
    ));
    let busy: Vec<f64> = rounds.iter().filter_map(|r| r.machine_busy).collect();
    let machine_busy = (busy.len() == rounds.len() && !busy.is_empty())
        .then(|| busy.iter().sum::<f64>() / busy.len() as f64);
    if let Some(machine) = machine_busy {
        table.push_str(&format!(
            "| the whole machine busy (`/proc/stat`: every process and the kernel) | {machine:.1} | |\n\
             | of it not in a component above (kernel threads, interrupts, processes outside the cluster) | {:.1} | {:.0} % of the machine |\n",
            machine - total,
            100.0 * (machine - total) / machine.max(1e-9)
        ));
    }
    (table, rows, machine_busy)
}

/// When the driver's watches first saw each step of one sandbox's start.
#[derive(Default, Clone, Copy)]
struct Milestones {
    sandbox_seen: Option<Instant>,
    pod_created: Option<Instant>,
    pod_bound: Option<Instant>,
    container_running: Option<Instant>,
    pod_ready: Option<Instant>,
    sandbox_ready: Option<Instant>,
}

async fn track_milestones(
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
type Step = fn(&Milestones) -> Option<(Instant, Instant)>;

/// The steps of a sandbox's start, by name, in order.
fn milestone_steps() -> [(&'static str, Step); 5] {
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
fn milestone_percentiles(all: &BTreeMap<String, Milestones>) -> Vec<(&'static str, f64, f64)> {
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

fn milestone_table(steps: &[(&str, f64, f64)]) -> String {
    let mut table = String::from("| step | p50 | p99 |\n|---|---|---|\n");
    for (name, p50, p99) in steps {
        table.push_str(&format!("| {name} | {p50:.2} s | {p99:.2} s |\n"));
    }
    table
}

/// Mean latency per label value of a Prometheus histogram (`_sum` / `_count`), as (label, seconds,
/// count). `label` may be `resource_verb` to combine kube-apiserver's `resource` and `verb` labels.
fn mean_latencies(text: &str, histogram: &str, label: &str) -> Vec<(String, f64, f64)> {
    let label_of = |line: &str, key: &str| -> Option<String> {
        let start = line.find(&format!("{key}=\""))? + key.len() + 2;
        let end = line[start..].find('"')? + start;
        Some(line[start..end].to_string())
    };
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (is_sum, is_count) = (
            line.starts_with(&format!("{histogram}_sum")),
            line.starts_with(&format!("{histogram}_count")),
        );
        if !is_sum && !is_count {
            continue;
        }
        let key = if label == "resource_verb" {
            match (
                label_of(line, "verb"),
                label_of(line, "resource"),
                label_of(line, "subresource"),
            ) {
                (Some(verb), Some(resource), sub) => {
                    let sub = sub
                        .filter(|s| !s.is_empty())
                        .map(|s| format!("/{s}"))
                        .unwrap_or_default();
                    format!("{verb} {resource}{sub}")
                }
                _ => continue,
            }
        } else {
            match label_of(line, label) {
                Some(value) => value,
                None => continue,
            }
        };
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        let entry = sums.entry(key).or_default();
        if is_sum {
            entry.0 += value;
        } else {
            entry.1 += value;
        }
    }
    sums.into_iter()
        .filter(|(_, (_, count))| *count > 0.0)
        .map(|(key, (sum, count))| (key, sum / count, count))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(ok: bool, ready_ms: f64) -> Outcome {
        Outcome {
            ok,
            ready_ms,
            ..Outcome::default()
        }
    }

    #[test]
    fn each_round_gets_its_own_row() {
        let rounds = [
            Round {
                outcomes: vec![outcome(true, 1000.0), outcome(true, 3000.0)],
                end_to_end: Duration::from_millis(20_500),
                cleaned: Duration::from_secs(22),
                operator_writes: 6.0,
                all_writes: 16.0,
                cpu: BTreeMap::from([("etcd".into(), 10.0), ("kube-apiserver".into(), 20.0)]),
                machine_busy: Some(41.0),
                machine: "quiet".into(),
            },
            Round {
                outcomes: vec![outcome(true, 2000.0), outcome(false, 0.0)],
                end_to_end: Duration::from_secs(30),
                cleaned: Duration::from_secs(31),
                operator_writes: 6.0,
                all_writes: 18.0,
                cpu: BTreeMap::new(),
                machine_busy: None,
                machine: "noisy".into(),
            },
        ];
        let table = round_table(&rounds, 2);
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(
            rows,
            [
                "| 1 | 2/2 | 20.5 s | 22.0 s | 3.00 s | 8.00 | 30.0; 41.0 | quiet |",
                "| 2 | 1/2 | 30.0 s | 31.0 s | 2.00 s | 9.00 | 0.0; — | noisy |",
            ]
        );
    }

    fn cpu_round(cpu: &[(&str, f64)], machine_busy: Option<f64>) -> Round {
        Round {
            outcomes: Vec::new(),
            end_to_end: Duration::from_secs(20),
            cleaned: Duration::from_secs(22),
            operator_writes: 0.0,
            all_writes: 0.0,
            cpu: cpu.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            machine_busy,
            machine: String::new(),
        }
    }

    #[test]
    fn the_cpu_table_averages_components_and_shows_what_none_accounts_for() {
        let rounds = [
            cpu_round(
                &[("kube-apiserver", 18.0), (SANDBOX_PROCESSES, 10.0)],
                Some(40.0),
            ),
            cpu_round(
                &[("kube-apiserver", 20.0), (SANDBOX_PROCESSES, 12.0)],
                Some(44.0),
            ),
        ];
        let (table, rows, machine) = cpu_table(&rounds, 22.0, 2);
        assert_eq!(
            rows,
            [
                ("kube-apiserver".to_string(), 19.0),
                (SANDBOX_PROCESSES.to_string(), 11.0)
            ]
        );
        assert_eq!(machine, Some(42.0));
        let lines: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(
            lines,
            [
                "| kube-apiserver | 19.0 | 63 % |",
                "| sandboxes' processes (agent installs, agents, their commands) | 11.0 | 37 % |",
                "| **total** (2 cores x 22 s, the mean round = 44 core-seconds available) | 30.0 | |",
                "| the whole machine busy (`/proc/stat`: every process and the kernel) | 42.0 | |",
                "| of it not in a component above (kernel threads, interrupts, processes outside the cluster) | 12.0 | 29 % of the machine |",
            ]
        );
        // One round without the machine's figure: no machine rows rather than a skewed mean.
        let partial = [cpu_round(&[("etcd", 1.0)], Some(5.0)), cpu_round(&[], None)];
        let (table, _, machine) = cpu_table(&partial, 10.0, 2);
        assert_eq!(machine, None);
        assert!(!table.contains("whole machine"));
    }
}
