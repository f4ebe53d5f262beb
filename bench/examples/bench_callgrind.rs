//! `make bench-callgrind`: instructions executed per unit of work on the hot paths, counted by valgrind's
//! callgrind. Counts are user-space instructions of one process (the kernel's work in system calls and
//! the scheduler is not in them), and they barely move with the machine's load, so a change to a hot
//! path shows as a change of the count where a timing would drown in noise.
//!
//! - the agent (standalone, as `make bench-agent` runs it): `GET /healthz` (the HTTP floor: hyper,
//!   axum, the router) and `POST /v1/exec {"argv": ["true"]}` with the bearer token, keep-alive;
//! - the operator's gateway: the same exec through `/v1/namespaces/<ns>/sandboxes/<name>/exec` on the
//!   local cluster (TokenReview and SubjectAccessReview answers cached, as for any caller that calls
//!   more than once in 10 s), counting the operator process only;
//! - the operator's controllers: one Sandbox's life (create -> Ready -> delete -> Sandbox and Pod gone) on the local
//!   cluster's hollow node, `SANDBOXES` at once, per sandbox; and the operator's idle background work
//!   per second, to size what the other rows carry of it.
//!
//! Prints a table; with `--write-doc PATH` replaces the `## Instruction counts` section of that file.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use orchard_bench::callgrind::{Counted, Row, check_tools, table};
use orchard_operator::api::Sandbox;
use orchard_testcluster::binaries::{agent_bin, operator_bin, target_dir};
use orchard_testcluster::env::{EnvOptions, TestEnv};
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

const WARMUP: usize = 50;
const REQUESTS: usize = 500;
const SANDBOXES: usize = 20;
const IDLE: Duration = Duration::from_secs(10);
const AGENT_TOKEN: &str = "bench-callgrind-token";

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Option<serde_json::Value>,
) {
    let request = http.request(method, url).bearer_auth(token);
    let request = match body {
        Some(body) => request.json(&body),
        None => request,
    };
    let response = request.send().await.expect("request");
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    assert!(status.is_success(), "{url}: {status} {text}");
}

/// `count` calls one after another on one keep-alive connection.
async fn calls(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Option<serde_json::Value>,
    count: usize,
) {
    for _ in 0..count {
        call(http, method.clone(), url, token, body.clone()).await;
    }
}

/// Starts the agent under callgrind on a free loopback port; returns the child and its base URL.
fn start_agent(counted: &Counted, root: &Path) -> (Child, String) {
    let mut child = Command::new(&counted.wrapper)
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .env("ORCHARD_AGENT_TOKEN", AGENT_TOKEN)
        .env("ORCHARD_AGENT_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agent under callgrind");
    let stderr = child.stderr.take().expect("agent stderr");
    let address = orchard_bench_support::listen_address(stderr, Duration::from_secs(120))
        .expect("the agent's listen address");
    (child, format!("http://{address}"))
}

/// The rows of a run of this example in a child process with other binaries (the baseline), read
/// from its `--rows` output (`label<TAB>total<TAB>unit<TAB>count` per line).
fn baseline_rows(operator: Option<String>, agent: Option<String>) -> Vec<Row> {
    let mut command = Command::new(std::env::current_exe().expect("this example's path"));
    command.arg("--rows");
    if let Some(operator) = operator {
        command.env("ORCHARD_OPERATOR_BIN", operator);
    }
    if let Some(agent) = agent {
        command.env("ORCHARD_AGENT_BIN", agent);
    }
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .expect("run the baseline");
    assert!(output.status.success(), "the baseline run failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(Row::from_line)
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let doc = orchard_bench_support::write_doc_arg(&args);
    let rows_only = args.iter().any(|a| a == "--rows");
    if let Err(missing) = check_tools() {
        eprintln!("bench-callgrind: {missing}");
        std::process::exit(2);
    }
    let baseline_operator = std::env::var("ORCHARD_BASELINE_OPERATOR_BIN").ok();
    let baseline_agent = std::env::var("ORCHARD_BASELINE_AGENT_BIN").ok();
    let baseline = (!rows_only && (baseline_operator.is_some() || baseline_agent.is_some()))
        .then(|| baseline_rows(baseline_operator.clone(), baseline_agent.clone()));
    let dir = target_dir().join(format!("e2e/bench-callgrind-{}", std::process::id()));
    let agent = Counted::prepare(&dir, "agent", &agent_bin().expect("agent binary"))
        .expect("agent wrapper");
    let operator = Counted::prepare(&dir, "operator", &operator_bin().expect("operator binary"))
        .expect("operator wrapper");
    // SAFETY: no other thread exists yet (the runtime is built below; the baseline ran as a child
    // process); the harness reads it to start the operator.
    unsafe { std::env::set_var("ORCHARD_OPERATOR_BIN", &operator.wrapper) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let rows = runtime.block_on(measure(&dir, &agent, &operator));
    if rows_only {
        for row in &rows {
            println!("{}", row.to_line());
        }
        return;
    }

    let table = table(&rows, baseline.as_deref());
    println!("\n{table}");
    println!(
        "callgrind's dumps (agent.cg.<n> and operator.cg.<n>, numbered in the order of the rows) are in {}; `callgrind_annotate --inclusive=yes <dump>` shows where the instructions went",
        dir.display()
    );
    let baseline_note = match (&baseline_operator, &baseline_agent) {
        (None, None) => String::new(),
        (operator, agent) => format!(
            " The baseline column is the same measurement, in the same run, of the binaries in `ORCHARD_BASELINE_OPERATOR_BIN` ({}) and `ORCHARD_BASELINE_AGENT_BIN` ({}).",
            operator
                .as_deref()
                .map_or("not set: this build's", |_| "set"),
            agent.as_deref().map_or("not set: this build's", |_| "set")
        ),
    };
    let section = format!(
        "## Instruction counts\n\nCommand: `make bench-callgrind` (installs valgrind 3.19 from Debian, builds the release operator and the static agent, runs \
`cargo run --release -p orchard-bench --example bench_callgrind -- --write-doc docs/BENCHMARKS.md`). Each process runs under \
`valgrind --tool=callgrind`; its counters are zeroed after {WARMUP} warm-up calls and dumped after the measured ones \
(`callgrind_control`), and the table divides the instructions executed in between by the work done. These are user-space \
instructions of that process only: system calls count as the instructions around them, the kernel's work (spawning `true`, \
TCP on loopback, waking threads) is not in them, and neither are other processes (kube-apiserver for the controllers). \
Unlike timings they barely move with the machine's load, which makes them the figure to compare before and after a change \
of a hot path. The agent runs standalone as in `make bench-agent` ({REQUESTS} calls, one keep-alive connection); the \
gateway and the controllers run on the local cluster (hollow node): {REQUESTS} execs through the gateway with a bearer \
token (its TokenReview and SubjectAccessReview answers cached, as for any caller that calls again within 10 s), \
{SANDBOXES} Sandboxes `{{image: busybox}}` created at once through the Kubernetes API, waited Ready, deleted and waited gone with their Pods. \
The idle row is the operator's background work per second with one Ready sandbox (measured before the gateway row), of which the \
other operator rows carry a share for the seconds they last under callgrind. The Sandbox-life row also moves between runs of the same binary, by up to a fifth: how many new TLS connections to the API server the burst of 20 opens depends on timing, and a handshake \
costs about half a million instructions.{baseline_note}\n\n{table}"
    );
    if let Some(doc) = doc {
        orchard_bench::docs::write_section(&doc, "## Instruction counts", &section)
            .expect("write the benchmark doc");
        println!("wrote the Instruction counts section of {}", doc.display());
    }
}

async fn measure(dir: &std::path::Path, agent: &Counted, operator: &Counted) -> Vec<Row> {
    let http = orchard_testcluster::gateway_http_builder()
        .pool_max_idle_per_host(4)
        .build()
        .expect("HTTP client");
    let mut rows = Vec::new();
    let exec_body = json!({"argv": ["true"]});

    // The agent, standalone.
    let root = dir.join("agent-root");
    std::fs::create_dir_all(&root).expect("agent root");
    let (mut agent_child, base) = start_agent(agent, &root);
    let health = format!("{base}/healthz");
    let exec = format!("{base}/v1/exec");
    for (label, method, url, body) in [
        (
            "agent: `GET /healthz` (HTTP floor)",
            reqwest::Method::GET,
            &health,
            None,
        ),
        (
            "agent: `POST /v1/exec` `true`",
            reqwest::Method::POST,
            &exec,
            Some(exec_body.clone()),
        ),
    ] {
        calls(
            &http,
            method.clone(),
            url,
            AGENT_TOKEN,
            body.clone(),
            WARMUP,
        )
        .await;
        agent.zero().expect("zero the agent");
        calls(&http, method, url, AGENT_TOKEN, body, REQUESTS).await;
        rows.push(Row::new(
            label,
            agent.dump().expect("dump the agent"),
            "request",
            REQUESTS,
        ));
    }
    // SAFETY: plain signal to our own child.
    unsafe { libc::kill(agent_child.id() as i32, libc::SIGTERM) };
    let _ = agent_child.wait();

    // The operator on the local cluster.
    let env = TestEnv::start("bench-callgrind", EnvOptions::default())
        .await
        .expect("local cluster (operator under callgrind)");
    let namespace = env.namespace("bench").await;
    let admin = env.control_plane.tokens["admin"].clone();
    let gateway = env.operator().gateway_url();
    call(
        &http,
        reqwest::Method::POST,
        &format!("{gateway}/v1/namespaces/{namespace}/sandboxes"),
        &admin,
        Some(json!({"name": "bench", "image": "busybox", "ttlSeconds": 3600})),
    )
    .await;
    call(
        &http,
        reqwest::Method::GET,
        &format!("{gateway}/v1/namespaces/{namespace}/sandboxes/bench/wait?timeoutSeconds=300"),
        &admin,
        None,
    )
    .await;
    let through = format!("{gateway}/v1/namespaces/{namespace}/sandboxes/bench/exec");
    calls(
        &http,
        reqwest::Method::POST,
        &through,
        &admin,
        Some(exec_body.clone()),
        WARMUP,
    )
    .await;
    operator.zero().expect("zero the operator");
    tokio::time::sleep(IDLE).await;
    rows.push(Row::new(
        "operator: idle (watches, timers)",
        operator.dump().expect("dump the operator"),
        "second",
        IDLE.as_secs() as usize,
    ));
    operator.zero().expect("zero the operator");
    calls(
        &http,
        reqwest::Method::POST,
        &through,
        &admin,
        Some(exec_body),
        REQUESTS,
    )
    .await;
    rows.push(Row::new(
        "operator: gateway exec (`POST .../sandboxes/{name}/exec`, proxied to the agent)",
        operator.dump().expect("dump the operator"),
        "request",
        REQUESTS,
    ));

    let client = env.client().await;
    let sandboxes: Api<Sandbox> = Api::namespaced(client, &namespace);
    let names: Vec<String> = (0..SANDBOXES).map(|i| format!("life-{i}")).collect();
    operator.zero().expect("zero the operator");
    for name in &names {
        sandboxes
            .create(
                &PostParams::default(),
                &sandbox(name, json!({"image": "busybox"})),
            )
            .await
            .expect("create a sandbox");
    }
    for name in &names {
        wait::until(
            &sandboxes,
            name,
            "Ready",
            Duration::from_secs(300),
            is_ready,
        )
        .await;
    }
    for name in &names {
        sandboxes
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete a sandbox");
    }
    let pods: Api<Pod> = Api::namespaced(env.client().await, &namespace);
    for name in &names {
        wait::deleted(&sandboxes, name, Duration::from_secs(300)).await;
        wait::deleted(&pods, name, Duration::from_secs(300)).await;
    }
    rows.push(Row::new(
        "operator: controllers, one Sandbox's life (create -> Ready -> delete -> Sandbox and Pod gone)",
        operator.dump().expect("dump the operator"),
        "sandbox",
        SANDBOXES,
    ));

    env.delete_namespace(&namespace).await;
    env.stop().await;
    rows
}
