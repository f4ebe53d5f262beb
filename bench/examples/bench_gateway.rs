//! `make bench-gateway`: the latency the gateway adds to an exec, and sandbox create -> Ready through
//! the Python SDK, on the local cluster (real control plane, local node, release operator).
//!
//! Exec of `true` is timed at the client on five paths: directly to the agent (pod IP, sandbox
//! token), through a plain TCP relay to the agent (bytes copied between two sockets, no HTTP: the
//! least any proxy hop in its own process costs on this machine), through a lean HTTP proxy (each
//! head parsed, one task doing the whole exchange over pooled connections: the least an HTTP-aware
//! hop costs, [`orchard_bench::lean_proxy`]), through a bare HTTP proxy (hyper's
//! HTTP/1.1 server and hyper-util's pooled client, as the gateway has them, and nothing else: the
//! least an HTTP proxy that can authorise each request costs), and through the gateway (bearer
//! token, TokenReview/SubjectAccessReview cached, heartbeat coalescing, proxy), at concurrency 1 and
//! 64, the paths alternating in rounds (the order rotating each round) so drift on a shared machine
//! hits all. Each hop's CPU is read apart: the relay's and the proxies' runtimes run on threads of
//! their own names in this process, the gateway in the operator's. Prints a table; with
//! `--write-doc PATH` replaces the `## Gateway` section of that Markdown file.

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
const SEQUENTIAL: usize = 1400;
const CONCURRENT_WORKERS: usize = 64;
const PER_WORKER: usize = 700;
const ROUNDS: usize = 7;
/// Thread name of the TCP relay's runtime.
const RELAY_THREADS: &str = "tcp-relay";
/// Thread name of the lean HTTP proxy's runtime.
const LEAN_THREADS: &str = "lean-proxy";
/// Thread name of the bare HTTP proxy's runtime.
const PROXY_THREADS: &str = "http-proxy";
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
const PATHS: [&str; 5] = [
    "direct to the agent",
    "through a TCP relay",
    "through a lean HTTP proxy",
    "through a bare HTTP proxy",
    "through the gateway",
];

/// The index in [`PATHS`] of the direct path, the relay and the gateway.
const DIRECT: usize = 0;
const RELAY: usize = 1;
const GATEWAY: usize = 4;

/// One concurrency's samples on every path (indexed as [`PATHS`]).
struct Row {
    concurrency: usize,
    samples: [Vec<Duration>; 5],
    wall: [Duration; 5],
    /// The CPU seconds of each path's own hop while that path ran (nothing for the direct path).
    hop_cpu: [f64; 5],
    /// The CPU seconds of each path's hop while the direct path ran: its background work (the
    /// operator's controllers and watches; nothing for the in-process hops).
    hop_idle_cpu: [f64; 5],
    /// Per round and path: the p50 (seconds) and exec/s.
    rounds: Vec<[(f64, f64); 5]>,
}

/// The CPU seconds so far of each path's hop: none for the direct path, the relay's and the
/// proxies' threads, the operator's process.
fn hop_cpu(operator: u32) -> [f64; 5] {
    let threads = orchard_bench::thread_cpu::by_name();
    let named = |name: &str| threads.get(name).copied().unwrap_or_default();
    [
        0.0,
        named(RELAY_THREADS),
        named(LEAN_THREADS),
        named(PROXY_THREADS),
        cpu_seconds(operator).expect("the operator is running"),
    ]
}

/// `workers` x `per_worker` execs on every path, in [`ROUNDS`] rounds; the order of the paths rotates
/// each round, so no path always runs first or last. `operator` is the operator's process; every
/// hop's CPU is counted around every run.
async fn measure(
    http: &reqwest::Client,
    targets: &[Target; 5],
    workers: usize,
    per_worker: usize,
    operator: u32,
) -> Row {
    let mut row = Row {
        concurrency: workers,
        samples: Default::default(),
        wall: [Duration::ZERO; 5],
        hop_cpu: [0.0; 5],
        hop_idle_cpu: [0.0; 5],
        rounds: Vec::new(),
    };
    for round in 0..ROUNDS {
        let mut this_round = [(0.0, 0.0); 5];
        for offset in 0..PATHS.len() {
            let path = (round + offset) % PATHS.len();
            let (started, cpu_before) = (Instant::now(), hop_cpu(operator));
            let mut samples = run(http, &targets[path], workers, per_worker / ROUNDS).await;
            let wall = started.elapsed();
            let cpu = hop_cpu(operator);
            let used: [f64; 5] = std::array::from_fn(|hop| cpu[hop] - cpu_before[hop]);
            if path == DIRECT {
                for (idle, used) in row.hop_idle_cpu.iter_mut().zip(used) {
                    *idle += used;
                }
            }
            row.hop_cpu[path] += used[path];
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

/// Runs `serve` on a listener on 127.0.0.1 in a thread of its own, on a runtime of its own with two
/// workers (as the operator has on this machine) named `threads`, so its CPU can be read apart.
/// Returns the address it listens on.
fn start_hop<F, Fut>(threads: &'static str, serve: F) -> SocketAddr
where
    F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("hop listener");
    let address = listener.local_addr().expect("hop address");
    listener
        .set_nonblocking(true)
        .expect("non-blocking hop listener");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(threads)
            .enable_all()
            .build()
            .expect("hop runtime");
        runtime.block_on(async move {
            serve(tokio::net::TcpListener::from_std(listener).expect("hop listener")).await
        });
    });
    address
}

/// A plain TCP relay to `upstream` ([`start_hop`], threads [`RELAY_THREADS`]): each accepted
/// connection gets one to `upstream`, and bytes are copied both ways with no HTTP parsing,
/// TCP_NODELAY on both sides as the gateway sets it. What any proxy hop in a process of its own
/// costs at least.
fn start_relay(upstream: SocketAddr) -> SocketAddr {
    start_hop(RELAY_THREADS, move |listener| async move {
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
    })
}

/// A lean HTTP/1.1 reverse proxy to `upstream` ([`start_hop`], threads [`LEAN_THREADS`]):
/// [`orchard_bench::lean_proxy`], one pool of idle connections to `upstream` shared by every client
/// connection.
fn start_lean_proxy(upstream: SocketAddr) -> SocketAddr {
    use orchard_bench::lean_proxy::{Pool, serve_connection};

    start_hop(LEAN_THREADS, move |listener| async move {
        let pool = Pool::default();
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(serve_connection(client, upstream, pool.clone()));
        }
    })
}

/// A bare HTTP/1.1 reverse proxy to `upstream` ([`start_hop`], threads [`PROXY_THREADS`]): hyper's
/// server and hyper-util's pooled client with the settings the gateway gives them (TCP_NODELAY on
/// both sides, 256 idle connections per agent), each request sent on with its method, path, headers
/// and body, each answer streamed back. No authentication, no routing, no header filtering, no
/// time-outs: what any HTTP proxy that can look at a request costs at least.
fn start_http_proxy(upstream: SocketAddr) -> SocketAddr {
    use hyper::body::Incoming;
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    start_hop(PROXY_THREADS, move |listener| async move {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(256)
            .build(connector);
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let client = client.clone();
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                let client = client.clone();
                async move {
                    let (mut parts, body) = request.into_parts();
                    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                    parts.uri = format!("http://{upstream}{path}")
                        .parse()
                        .expect("the agent's URL");
                    client
                        .request(hyper::Request::from_parts(parts, body))
                        .await
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    })
}

/// The table of every row: latency and throughput per path, what each hop adds to the direct path,
/// each hop's CPU, and per round what each HTTP hop costs beyond the relay (pure).
fn table(rows: &[Row]) -> String {
    let mut table = format!(
        "| exec `true`, keep-alive clients | {} | {} | {} | {} | {} | added by the relay | added by the lean HTTP proxy | added by the bare HTTP proxy | added by the gateway |\n|---|---|---|---|---|---|---|---|---|---|\n",
        PATHS[0], PATHS[1], PATHS[2], PATHS[3], PATHS[4]
    );
    let hops = RELAY..=GATEWAY;
    for row in rows {
        let concurrency = row.concurrency;
        let mut samples = row.samples.clone();
        for (label, p) in [("p50", 0.5), ("p99", 0.99)] {
            let at: [Duration; 5] = std::array::from_fn(|path| percentile(&mut samples[path], p));
            let cells: Vec<String> = at.iter().map(|d| ms(*d)).collect();
            let added: Vec<String> = hops
                .clone()
                .map(|hop| signed_ms(at[hop], at[DIRECT]))
                .collect();
            table.push_str(&format!(
                "| {label}, concurrency {concurrency} | {} | {} |\n",
                cells.join(" | "),
                added.join(" | ")
            ));
        }
        let rate = |path: usize| row.samples[path].len() as f64 / row.wall[path].as_secs_f64();
        let rates: Vec<String> = (0..PATHS.len())
            .map(|path| format!("{:.0}", rate(path)))
            .collect();
        let changes: Vec<String> = hops
            .clone()
            .map(|hop| format!("{:+.1} %", 100.0 * (rate(hop) / rate(DIRECT) - 1.0)))
            .collect();
        table.push_str(&format!(
            "| exec/s, concurrency {concurrency} ({} calls per path) | {} | {} |\n",
            row.samples[DIRECT].len(),
            rates.join(" | "),
            changes.join(" | ")
        ));
        let own_cpu = |hop: usize| {
            let calls = |path: usize| row.samples[path].len().max(1) as f64;
            1e6 * (row.hop_cpu[hop] / calls(hop) - row.hop_idle_cpu[hop] / calls(DIRECT))
        };
        let cpu: Vec<String> = hops
            .clone()
            .map(|hop| format!("{:.0} µs", own_cpu(hop)))
            .collect();
        table.push_str(&format!(
            "| the hop's own CPU per exec (user + kernel; its background while the direct path ran subtracted), concurrency {concurrency} | | {} | | | | |\n",
            cpu.join(" | ")
        ));
        let added = |path: usize| -> Vec<f64> {
            row.rounds
                .iter()
                .map(|round| (round[path].0 - round[DIRECT].0) * 1000.0)
                .collect()
        };
        let loss = |path: usize| -> Vec<f64> {
            row.rounds
                .iter()
                .map(|round| 100.0 * (round[path].1 / round[DIRECT].1 - 1.0))
                .collect()
        };
        let per_round: Vec<String> = hops
            .clone()
            .map(|hop| {
                format!(
                    "{}; {}",
                    median_spread(&added(hop), |v| format!("{v:+.2} ms")),
                    median_spread(&loss(hop), |v| format!("{v:+.1} %"))
                )
            })
            .collect();
        table.push_str(&format!(
            "| per round ({ROUNDS}), concurrency {concurrency}: p50 added; throughput change | | | | | | {} |\n",
            per_round.join(" | ")
        ));
        let beyond_relay: Vec<String> = (RELAY + 1..=GATEWAY)
            .map(|hop| {
                let points: Vec<f64> = loss(hop)
                    .iter()
                    .zip(loss(RELAY))
                    .map(|(hop, relay)| hop - relay)
                    .collect();
                median_spread(&points, |v| format!("{v:+.1} points"))
            })
            .collect();
        table.push_str(&format!(
            "| per round ({ROUNDS}), concurrency {concurrency}: throughput change beyond the relay's in the same round | | | | | | | {} |\n",
            beyond_relay.join(" | ")
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
    let lean = start_lean_proxy(agent_address);
    let proxy = start_http_proxy(agent_address);
    let targets = [
        Target {
            url: format!("{endpoint}/v1/exec"),
            token: agent_token.clone(),
        },
        Target {
            url: format!("http://{relay}/v1/exec"),
            token: agent_token.clone(),
        },
        Target {
            url: format!("http://{lean}/v1/exec"),
            token: agent_token.clone(),
        },
        Target {
            url: format!("http://{proxy}/v1/exec"),
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
        "| Sandbox create -> Ready through the SDK (`client.create(image=...)`, {} sandboxes one after another): p50 / p90 / max | {:.2} s / {:.2} s / {:.2} s | | | | | | | | |\n",
        sdk["count"], seconds("p50"), seconds("p90"), seconds("max")
    ));
    table.push_str(&format!(
        "| Sandbox create -> Ready through the SDK, {} at once (asyncio): p50 / max | {:.2} s / {:.2} s | | | | | | | | |\n",
        sdk["count"], seconds("concurrent_p50"), seconds("concurrent_max")
    ));
    println!("\n{table}");
    let section = format!(
        "## Gateway\n\nCommand: `make bench-gateway` (builds the release operator and the static agent, creates the SDK venv, runs `cargo run --release -p orchard-bench --example bench_gateway -- --write-doc docs/BENCHMARKS.md`). \
One local cluster (real kube-apiserver and etcd, the local node running each agent as a process on a loopback pod IP, the release operator); one sandbox; \
keep-alive HTTP clients on the same machine. \"Direct\" posts `{{\"argv\": [\"true\"]}}` to `http://<podIP>:9090/v1/exec` with the sandbox token; \"through a TCP relay\" sends the same request \
through a plain TCP relay to the agent (a runtime of its own with two workers in the benchmark's process, bytes copied both ways by `copy_bidirectional`, no HTTP): \
the least any proxy hop costs here, whatever it does; \
\"through a lean HTTP proxy\" sends it through a proxy of the benchmark's own (`orchard_bench::lean_proxy`, a runtime of its own with two workers): each request's and answer's head parsed with `httparse`, hyper's parser, and the whole exchange done by the task that serves the client's connection over a pool of idle connections to the agent, messages framed by `Content-Length` only: \
the least an HTTP-aware hop costs here, so what the bare HTTP proxy adds beyond it is what hyper's server and hyper-util's client cost over HTTP itself; \
\"through a bare HTTP proxy\" sends it through hyper's HTTP/1.1 server and hyper-util's pooled client (the gateway's, with its settings: TCP_NODELAY, 256 idle connections per agent) on a runtime of its own with two workers in the benchmark's process, \
each request sent on with its method, path, headers and body and each answer streamed back, nothing else (no authentication, routing, header filtering or time-outs): \
the least an HTTP proxy that can authorise each request costs here, so what the gateway adds beyond it is what its authorisation, lookups, limits and heartbeat cost; \
\"through the gateway\" posts the same body to \
`/v1/namespaces/<ns>/sandboxes/bench/exec` with a bearer token, so it adds TokenReview/SubjectAccessReview (cached 10 s), the cache lookups, the coalesced heartbeat and the proxy hop. \
{WARMUP} warm-up calls per path, then {ROUNDS} rounds in which every path runs once, the order rotating each round; concurrency 64 is {CONCURRENT_WORKERS} workers x {PER_WORKER} calls per path. \
Each hop's own CPU per exec: the relay's and the proxies' runtime threads (time on a CPU from `/proc/self/task/*/schedstat`, by thread name) and the operator's process (user + system, `/proc/<pid>/stat`) while their path ran, less what they used while the direct path ran (the operator's controllers and watches; nothing for the others), divided by the execs. \
The last row pairs each round's throughput change with the relay's in the same round, so drift between rounds cancels: the target for the gateway is at most 3 points. \
Create -> Ready is timed in Python around `client.create(image=\"busybox\")` (POST, then the gateway's watch-driven wait), sandboxes deleted after each. \
The per-round rows give the median over the rounds and the spread. Machine: {machine}; the cluster, the agent and the client share it, so at concurrency 64 every path queues on process spawns.\n\n{table}"
    );
    if let Some(doc) = doc {
        orchard_bench::docs::write_section(&doc, "## Gateway", &section)
            .expect("write the benchmark doc");
        println!("wrote the Gateway section of {}", doc.display());
    }
}
