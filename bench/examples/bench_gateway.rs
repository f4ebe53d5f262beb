//! `make bench-gateway`: the latency the gateway adds to an exec, and sandbox create -> Ready through
//! the Python SDK, on the local cluster (real control plane, local node, release operator).
//!
//! Exec of `true` is timed at the client on three paths: directly to the agent (pod IP, sandbox
//! token), through a plain TCP relay to the agent (bytes copied between two sockets, no HTTP: the
//! least any proxy hop in its own process costs on this machine), and through the gateway (bearer
//! token, TokenReview/SubjectAccessReview cached, heartbeat coalescing, proxy), at concurrency 1 and
//! 64, the paths alternating in rounds (the order rotating each round) so drift on a shared machine
//! hits all. Prints a table; with `--write-doc PATH` replaces the `## Gateway` section of that
//! Markdown file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use orchard_bench_support::Machine;
use orchard_bench_support::median_spread;
use orchard_testcluster::binaries::workspace_root;
use orchard_testcluster::env::{EnvOptions, TestEnv};
use orchard_testcluster::proc_stats::cpu_seconds;
use serde_json::{Value, json};

const WARMUP: usize = 100;
const SEQUENTIAL: usize = 1000;
const CONCURRENT_WORKERS: usize = 64;
const PER_WORKER: usize = 500;
const ROUNDS: usize = 5;
const SDK_SANDBOXES: usize = 20;

/// Where an exec goes and with which bearer token.
#[derive(Clone)]
struct Target {
    url: String,
    token: String,
}

async fn exec_once(http: &reqwest::Client, path: &Target) -> Duration {
    let started = Instant::now();
    let response = http
        .post(&path.url)
        .bearer_auth(&path.token)
        .json(&json!({"argv": ["true"]}))
        .send()
        .await
        .expect("exec request");
    let status = response.status();
    let body = response.bytes().await.expect("exec body");
    assert!(status.is_success(), "exec failed: {status} {body:?}");
    started.elapsed()
}

async fn run(
    http: &reqwest::Client,
    path: &Target,
    workers: usize,
    per_worker: usize,
) -> Vec<Duration> {
    let tasks = (0..workers).map(|_| {
        let http = http.clone();
        let path = path.clone();
        tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_worker);
            for _ in 0..per_worker {
                samples.push(exec_once(&http, &path).await);
            }
            samples
        })
    });
    let mut all = Vec::new();
    for task in futures::future::join_all(tasks).await {
        all.extend(task.expect("worker"));
    }
    all
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let index = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[index.min(samples.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn signed_ms(later: Duration, earlier: Duration) -> String {
    let delta = later.as_secs_f64() - earlier.as_secs_f64();
    format!("{:+.2} ms", delta * 1000.0)
}

/// The paths measured, in the order of the table's columns.
const PATHS: [&str; 3] = [
    "direct to the agent",
    "through a TCP relay",
    "through the gateway",
];

/// One concurrency's samples on every path (indexed as [`PATHS`]).
struct Row {
    concurrency: usize,
    samples: [Vec<Duration>; 3],
    wall: [Duration; 3],
    /// The operator's CPU seconds while each path ran (its background work on the paths that do not
    /// pass through it).
    operator_cpu: [f64; 3],
    /// Per round and path: the p50 (seconds) and exec/s.
    rounds: Vec<[(f64, f64); 3]>,
}

/// `workers` x `per_worker` execs on every path, in [`ROUNDS`] rounds; the order of the paths rotates
/// each round, so no path always runs first or last. `operator` is the operator's process, whose
/// CPU is counted around every run.
async fn measure(
    http: &reqwest::Client,
    targets: &[Target; 3],
    workers: usize,
    per_worker: usize,
    operator: u32,
) -> Row {
    let mut row = Row {
        concurrency: workers,
        samples: Default::default(),
        wall: [Duration::ZERO; 3],
        operator_cpu: [0.0; 3],
        rounds: Vec::new(),
    };
    let cpu = || cpu_seconds(operator).expect("the operator is running");
    for round in 0..ROUNDS {
        let mut this_round = [(0.0, 0.0); 3];
        for offset in 0..PATHS.len() {
            let path = (round + offset) % PATHS.len();
            let (started, cpu_before) = (Instant::now(), cpu());
            let mut samples = run(http, &targets[path], workers, per_worker / ROUNDS).await;
            let wall = started.elapsed();
            row.operator_cpu[path] += cpu() - cpu_before;
            this_round[path] = (
                percentile(&mut samples, 0.5).as_secs_f64(),
                samples.len() as f64 / wall.as_secs_f64(),
            );
            row.samples[path].extend(samples);
            row.wall[path] += wall;
        }
        row.rounds.push(this_round);
    }
    row
}

/// A plain TCP relay to `upstream`, on a runtime of its own (two workers, as the operator has on
/// this machine): each accepted connection gets one to `upstream`, and bytes are copied both ways
/// with no HTTP parsing, TCP_NODELAY on both sides as the gateway sets it. What any proxy hop in a
/// process of its own costs at least. Returns the address it listens on.
fn start_relay(upstream: SocketAddr) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("relay listener");
    let address = listener.local_addr().expect("relay address");
    listener
        .set_nonblocking(true)
        .expect("non-blocking relay listener");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("relay runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("relay listener");
            while let Ok((mut client, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(mut agent) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = agent.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut agent).await;
                });
            }
        });
    });
    address
}

/// The table of every row: latency and throughput per path, and what the relay and the gateway add
/// to the direct path (pure).
fn table(rows: &[Row]) -> String {
    let mut table = format!(
        "| exec `true`, keep-alive clients | {} | {} | {} | added by the relay | added by the gateway |\n|---|---|---|---|---|---|\n",
        PATHS[0], PATHS[1], PATHS[2]
    );
    for row in rows {
        let concurrency = row.concurrency;
        let mut samples = row.samples.clone();
        for (label, p) in [("p50", 0.5), ("p99", 0.99)] {
            let [d, r, g] = [0, 1, 2].map(|path| percentile(&mut samples[path], p));
            table.push_str(&format!(
                "| {label}, concurrency {concurrency} | {} | {} | {} | {} | {} |\n",
                ms(d),
                ms(r),
                ms(g),
                signed_ms(r, d),
                signed_ms(g, d)
            ));
        }
        let rate = |path: usize| row.samples[path].len() as f64 / row.wall[path].as_secs_f64();
        let change = |path: usize| 100.0 * (rate(path) / rate(0) - 1.0);
        table.push_str(&format!(
            "| exec/s, concurrency {concurrency} ({} calls per path) | {:.0} | {:.0} | {:.0} | {:+.1} % | {:+.1} % |\n",
            row.samples[0].len(),
            rate(0),
            rate(1),
            rate(2),
            change(1),
            change(2)
        ));
        let cpu_per_1000 =
            |path: usize| 1000.0 * row.operator_cpu[path] / row.samples[path].len() as f64;
        table.push_str(&format!(
            "| the operator's CPU per 1,000 execs, concurrency {concurrency} | {:.3} s | {:.3} s | {:.3} s | | {:+.3} s |\n",
            cpu_per_1000(0),
            cpu_per_1000(1),
            cpu_per_1000(2),
            cpu_per_1000(2) - cpu_per_1000(0)
        ));
        let added = |path: usize| -> Vec<f64> {
            row.rounds
                .iter()
                .map(|round| (round[path].0 - round[0].0) * 1000.0)
                .collect()
        };
        let loss = |path: usize| -> Vec<f64> {
            row.rounds
                .iter()
                .map(|round| 100.0 * (round[path].1 / round[0].1 - 1.0))
                .collect()
        };
        table.push_str(&format!(
            "| per round ({ROUNDS}), concurrency {concurrency}: p50 added; throughput change | | | | {}; {} | {}; {} |\n",
            median_spread(&added(1), |v| format!("{v:+.2} ms")),
            median_spread(&loss(1), |v| format!("{v:+.1} %")),
            median_spread(&added(2), |v| format!("{v:+.2} ms")),
            median_spread(&loss(2), |v| format!("{v:+.1} %"))
        ));
    }
    table
}

fn sdk_create_ready(env: &TestEnv, namespace: &str) -> Value {
    let python = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
        .join(".cache/orchard/sdk-venv/bin/python");
    let root = workspace_root();
    let output = std::process::Command::new(python)
        .arg(root.join("sdk/python/bench/create_ready.py"))
        .arg(SDK_SANDBOXES.to_string())
        .env("PYTHONPATH", root.join("sdk/python/src"))
        .env("ORCHARD_GATEWAY_URL", env.operator().gateway_url())
        .env("ORCHARD_TOKEN", &env.control_plane.tokens["admin"])
        .env("ORCHARD_NAMESPACE", namespace)
        .output()
        .expect("run the SDK benchmark (make sdk-venv first)");
    assert!(
        output.status.success(),
        "create_ready.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("create_ready.py prints JSON")
}

/// How long the benchmark waits for a quiet machine before it runs anyway (and says so).
const QUIET_WAIT: Duration = Duration::from_secs(120);

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let doc = orchard_bench_support::write_doc_arg(&args);
    let machine = Machine::settle(QUIET_WAIT);
    let env = TestEnv::start("bench-gateway", EnvOptions::default())
        .await
        .expect("local cluster");
    let namespace = env.namespace("bench").await;
    let admin_token = env.control_plane.tokens["admin"].clone();
    let gateway = env.operator().gateway_url();
    let http = orchard_testcluster::gateway_http_builder()
        .pool_max_idle_per_host(256)
        .build()
        .expect("HTTP client");

    let created: Value = http
        .post(format!("{gateway}/v1/namespaces/{namespace}/sandboxes"))
        .bearer_auth(&admin_token)
        .json(&json!({"name": "bench", "image": "busybox", "ttlSeconds": 3600}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("create JSON");
    assert_eq!(created["metadata"]["name"], "bench", "{created}");
    let ready: Value = http
        .get(format!(
            "{gateway}/v1/namespaces/{namespace}/sandboxes/bench/wait?timeoutSeconds=120"
        ))
        .bearer_auth(&admin_token)
        .send()
        .await
        .expect("wait")
        .json()
        .await
        .expect("wait JSON");
    let endpoint = ready["status"]["agentEndpoint"]
        .as_str()
        .expect("agent endpoint")
        .to_string();
    let agent_token = orchard_testcluster::test_support::sandboxes::token_of(
        &env.client().await,
        &namespace,
        "bench",
    )
    .await;

    let agent_address: SocketAddr = endpoint
        .trim_start_matches("http://")
        .parse()
        .expect("the agent endpoint is http://<ip>:<port>");
    let relay = start_relay(agent_address);
    let targets = [
        Target {
            url: format!("{endpoint}/v1/exec"),
            token: agent_token.clone(),
        },
        Target {
            url: format!("http://{relay}/v1/exec"),
            token: agent_token,
        },
        Target {
            url: format!("{gateway}/v1/namespaces/{namespace}/sandboxes/bench/exec"),
            token: admin_token,
        },
    ];
    for target in &targets {
        run(&http, target, 1, WARMUP).await;
    }
    let operator = env.operator().pid().expect("the operator's process");
    let sequential = measure(&http, &targets, 1, SEQUENTIAL, operator).await;
    let concurrent = measure(&http, &targets, CONCURRENT_WORKERS, PER_WORKER, operator).await;

    let sdk = sdk_create_ready(&env, &namespace);
    let machine = machine.report();
    env.delete_namespace(&namespace).await;
    env.stop().await;

    let mut table = table(&[sequential, concurrent]);
    let seconds = |key: &str| sdk[key].as_f64().unwrap_or(f64::NAN);
    table.push_str(&format!(
        "| Sandbox create -> Ready through the SDK (`client.create(image=...)`, {} sandboxes one after another): p50 / p90 / max | {:.2} s / {:.2} s / {:.2} s | | | | |\n",
        sdk["count"], seconds("p50"), seconds("p90"), seconds("max")
    ));
    table.push_str(&format!(
        "| Sandbox create -> Ready through the SDK, {} at once (asyncio): p50 / max | {:.2} s / {:.2} s | | | | |\n",
        sdk["count"], seconds("concurrent_p50"), seconds("concurrent_max")
    ));
    println!("\n{table}");
    let section = format!(
        "## Gateway\n\nCommand: `make bench-gateway` (builds the release operator and the static agent, creates the SDK venv, runs `cargo run --release -p orchard-bench --example bench_gateway -- --write-doc docs/BENCHMARKS.md`). \
One local cluster (real kube-apiserver and etcd, the local node running each agent as a process on a loopback pod IP, the release operator); one sandbox; \
keep-alive HTTP clients on the same machine. \"Direct\" posts `{{\"argv\": [\"true\"]}}` to `http://<podIP>:9090/v1/exec` with the sandbox token; \"through a TCP relay\" sends the same request \
through a plain TCP relay to the agent (a runtime of its own with two workers in the benchmark's process, bytes copied both ways by `copy_bidirectional`, no HTTP): \
the least any proxy hop costs here, whatever it does, so what the gateway adds beyond it is what its HTTP handling, authorisation, lookups and heartbeat cost; \
\"through the gateway\" posts the same body to \
`/v1/namespaces/<ns>/sandboxes/bench/exec` with a bearer token, so it adds TokenReview/SubjectAccessReview (cached 10 s), the cache lookups, the coalesced heartbeat and the proxy hop. \
{WARMUP} warm-up calls per path, then {ROUNDS} rounds in which every path runs once, the order rotating each round; concurrency 64 is {CONCURRENT_WORKERS} workers x {PER_WORKER} calls per path. \
The operator's CPU is its user + system time (`/proc/<pid>/stat`) while each path ran, per 1,000 execs: on the direct and relay paths the exec does not pass through it, so that is its background work, and the gateway's own cost is the difference. \
Create -> Ready is timed in Python around `client.create(image=\"busybox\")` (POST, then the gateway's watch-driven wait), sandboxes deleted after each. \
The per-round rows give the median over the rounds and the spread. Machine: {machine}; the cluster, the agent and the client share it, so at concurrency 64 every path queues on process spawns.\n\n{table}"
    );
    if let Some(doc) = doc {
        orchard_bench::docs::write_section(&doc, "## Gateway", &section)
            .expect("write the benchmark doc");
        println!("wrote the Gateway section of {}", doc.display());
    }
}
