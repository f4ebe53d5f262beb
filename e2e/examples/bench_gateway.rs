//! `make bench-gateway`: the latency the gateway adds to an exec, and sandbox create -> Ready through
//! the Python SDK, on the local cluster (real control plane, local node, release operator).
//!
//! Exec of `true` is timed at the client, directly to the agent (pod IP, sandbox token) and through the
//! gateway (bearer token, TokenReview/SubjectAccessReview cached, heartbeat coalescing, proxy), at
//! concurrency 1 and 64, alternating the two paths in rounds so drift on a shared machine hits both.
//! Prints a table; with `--write-doc PATH` replaces the `## Gateway` section of that Markdown file.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use orchard_bench_support::Machine;
use orchard_bench_support::median_spread;
use orchard_e2e::binaries::workspace_root;
use orchard_e2e::env::{EnvOptions, TestEnv};
use serde_json::{Value, json};

const WARMUP: usize = 100;
const SEQUENTIAL: usize = 1000;
const CONCURRENT_WORKERS: usize = 64;
const PER_WORKER: usize = 40;
const ROUNDS: usize = 3;
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

struct Row {
    concurrency: usize,
    direct: Vec<Duration>,
    gateway: Vec<Duration>,
    wall_direct: Duration,
    wall_gateway: Duration,
    /// Per round: the p50 the gateway added (ms), and both paths' exec/s.
    rounds: Vec<(f64, f64, f64)>,
}

async fn measure(
    http: &reqwest::Client,
    direct: &Target,
    gateway: &Target,
    workers: usize,
    per_worker: usize,
) -> Row {
    let mut row = Row {
        concurrency: workers,
        direct: Vec::new(),
        gateway: Vec::new(),
        wall_direct: Duration::ZERO,
        wall_gateway: Duration::ZERO,
        rounds: Vec::new(),
    };
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let mut direct_round = run(http, direct, workers, per_worker / ROUNDS).await;
        let wall_direct = started.elapsed();
        let started = Instant::now();
        let mut gateway_round = run(http, gateway, workers, per_worker / ROUNDS).await;
        let wall_gateway = started.elapsed();
        let rate = |samples: &[Duration], wall: Duration| samples.len() as f64 / wall.as_secs_f64();
        let added = percentile(&mut gateway_round, 0.5).as_secs_f64()
            - percentile(&mut direct_round, 0.5).as_secs_f64();
        row.rounds.push((
            added * 1000.0,
            rate(&direct_round, wall_direct),
            rate(&gateway_round, wall_gateway),
        ));
        row.direct.extend(direct_round);
        row.gateway.extend(gateway_round);
        row.wall_direct += wall_direct;
        row.wall_gateway += wall_gateway;
    }
    row
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
    let http = reqwest::Client::builder()
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
    let agent_token =
        orchard_e2e::test_support::sandboxes::token_of(&env.client().await, &namespace, "bench")
            .await;

    let direct = Target {
        url: format!("{endpoint}/v1/exec"),
        token: agent_token,
    };
    let through = Target {
        url: format!("{gateway}/v1/namespaces/{namespace}/sandboxes/bench/exec"),
        token: admin_token,
    };
    run(&http, &direct, 1, WARMUP).await;
    run(&http, &through, 1, WARMUP).await;
    let sequential = measure(&http, &direct, &through, 1, SEQUENTIAL).await;
    let concurrent = measure(&http, &direct, &through, CONCURRENT_WORKERS, PER_WORKER).await;

    let sdk = sdk_create_ready(&env, &namespace);
    let machine = machine.report();
    env.delete_namespace(&namespace).await;
    env.stop().await;

    let mut table = String::from(
        "| exec `true`, keep-alive clients | direct to the agent | through the gateway | added by the gateway |\n|---|---|---|---|\n",
    );
    for row in [sequential, concurrent] {
        let Row {
            concurrency,
            mut direct,
            mut gateway,
            wall_direct,
            wall_gateway,
            rounds,
        } = row;
        let count = direct.len();
        for (label, p) in [("p50", 0.5), ("p99", 0.99)] {
            let d = percentile(&mut direct, p);
            let g = percentile(&mut gateway, p);
            table.push_str(&format!(
                "| {label}, concurrency {concurrency} | {} | {} | {} |\n",
                ms(d),
                ms(g),
                signed_ms(g, d)
            ));
        }
        table.push_str(&format!(
            "| exec/s, concurrency {concurrency} ({count} calls per path) | {:.0} | {:.0} | {:+.1} % |\n",
            count as f64 / wall_direct.as_secs_f64(),
            gateway.len() as f64 / wall_gateway.as_secs_f64(),
            100.0 * (wall_direct.as_secs_f64() / wall_gateway.as_secs_f64() - 1.0)
        ));
        let added: Vec<f64> = rounds.iter().map(|r| r.0).collect();
        let loss: Vec<f64> = rounds.iter().map(|r| 100.0 * (r.2 / r.1 - 1.0)).collect();
        table.push_str(&format!(
            "| per round ({ROUNDS}), concurrency {concurrency}: p50 added by the gateway; throughput change | | | {}; {} |\n",
            median_spread(&added, |v| format!("{v:+.2} ms")),
            median_spread(&loss, |v| format!("{v:+.1} %"))
        ));
    }
    let seconds = |key: &str| sdk[key].as_f64().unwrap_or(f64::NAN);
    table.push_str(&format!(
        "| Sandbox create -> Ready through the SDK (`client.create(image=...)`, {} sandboxes one after another): p50 / p90 / max | {:.2} s / {:.2} s / {:.2} s | | |\n",
        sdk["count"], seconds("p50"), seconds("p90"), seconds("max")
    ));
    table.push_str(&format!(
        "| Sandbox create -> Ready through the SDK, {} at once (asyncio): p50 / max | {:.2} s / {:.2} s | | |\n",
        sdk["count"], seconds("concurrent_p50"), seconds("concurrent_max")
    ));
    println!("\n{table}");
    let section = format!(
        "## Gateway\n\nCommand: `make bench-gateway` (builds the release operator and the static agent, creates the SDK venv, runs `cargo run --release -p orchard-e2e --example bench_gateway -- --write-doc docs/BENCHMARKS.md`). \
One local cluster (real kube-apiserver and etcd, the local node running each agent as a process on a loopback pod IP, the release operator); one sandbox; \
keep-alive HTTP clients on the same machine. \"Direct\" posts `{{\"argv\": [\"true\"]}}` to `http://<podIP>:9090/v1/exec` with the sandbox token; \"through the gateway\" posts the same body to \
`/v1/namespaces/<ns>/sandboxes/bench/exec` with a bearer token, so it adds TokenReview/SubjectAccessReview (cached 10 s), the cache lookups, the coalesced heartbeat and the proxy hop. \
{WARMUP} warm-up calls per path, then {ROUNDS} alternating rounds per path; concurrency 64 is {CONCURRENT_WORKERS} workers x {PER_WORKER} calls. \
Create -> Ready is timed in Python around `client.create(image=\"busybox\")` (POST, then the gateway's watch-driven wait), sandboxes deleted after each. \
Each round runs both paths; the per-round rows give the median over the rounds and the spread. Machine: {machine}; the cluster, the agent and the client share it, so at concurrency 64 both paths queue on process spawns.\n\n{table}"
    );
    if let Some(doc) = doc {
        orchard_e2e::docs::write_section(&doc, "## Gateway", &section)
            .expect("write the benchmark doc");
        println!("wrote the Gateway section of {}", doc.display());
    }
}
