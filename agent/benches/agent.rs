//! `make bench-agent`: measures the release (static) agent over loopback HTTP with keep-alive clients —
//! exec round trip of `true` (p50/p99 at concurrency 1 and 32), file upload/download MiB/s, idle RSS,
//! binary size — and the same exec against a minimal FastAPI agent in the same run. Prints a markdown
//! table and, with `--write-doc PATH`, replaces the `## Agent` section of that file.
//!
//! Environment: `ORCHARD_AGENT_BIN` (the agent to measure), `ORCHARD_BENCH_PYTHON` (a Python with
//! fastapi+uvicorn; the FastAPI column is left out without it).

use orchard_bench_support::{Machine, median, median_spread};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
#[path = "agent/floors.rs"]
mod floors;
use floors::{direct_spawn_p50, direct_write_mib_per_second, rss_kib, tree_rss_kib};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::{Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = BoxBody<Bytes, BoxError>;
type HttpClient = Client<HttpConnector, Body>;

const TOKEN: &str = "bench-token";
const EXEC_REQUESTS: usize = 2000;
const FILE_MIB: usize = 256;

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_agent(binary: &Path, root: &Path) -> Server {
    let mut child = Command::new(binary)
        .args(["serve", "--listen", "127.0.0.1:0", "--root"])
        .arg(root)
        .env("ORCHARD_AGENT_TOKEN", TOKEN)
        .env("ORCHARD_AGENT_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start orchard-agent");
    let stderr = child.stderr.take().expect("piped stderr");
    let address = orchard_bench_support::listen_address(stderr, Duration::from_secs(30))
        .expect("agent address");
    Server {
        child,
        base: format!("http://{address}"),
    }
}

fn start_fastapi(python: &str) -> Option<Server> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/fastapi_agent.py");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .ok()?
        .local_addr()
        .ok()?
        .port();
    let child = Command::new(python)
        .arg(&script)
        .arg(port.to_string())
        .env("BENCH_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .ok()?;
    let server = Server {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Some(server)
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

async fn exec_once(client: &HttpClient, base: &str) -> Duration {
    let started = Instant::now();
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("{base}/v1/exec"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .header("Content-Type", "application/json")
        .body(full(&b"{\"argv\":[\"true\"]}"[..]))
        .unwrap();
    let response = client.request(request).await.expect("exec request");
    assert!(
        response.status().is_success(),
        "exec failed: {}",
        response.status()
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(
        body.windows(12).any(|window| window == b"\"exitCode\":0"),
        "unexpected exec response"
    );
    started.elapsed()
}

struct Latencies {
    p50: Duration,
    p99: Duration,
    per_second: f64,
}

impl Latencies {
    /// The quantiles and rate of `all`, the latencies of requests that took `elapsed` together.
    fn of(mut all: Vec<Duration>, elapsed: Duration) -> Self {
        all.sort();
        let at = |quantile: f64| all[((all.len() as f64 * quantile) as usize).min(all.len() - 1)];
        Self {
            p50: at(0.50),
            p99: at(0.99),
            per_second: all.len() as f64 / elapsed.as_secs_f64(),
        }
    }
}

async fn measure_exec(base: &str, concurrency: usize) -> Latencies {
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http();
    let client = Arc::new(client);
    for _ in 0..100 {
        exec_once(&client, base).await;
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..concurrency {
        let client = Arc::clone(&client);
        let base = base.to_string();
        let count = EXEC_REQUESTS / concurrency + usize::from(worker < EXEC_REQUESTS % concurrency);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(count);
            for _ in 0..count {
                latencies.push(exec_once(&client, &base).await);
            }
            latencies
        }));
    }
    let mut all = Vec::with_capacity(EXEC_REQUESTS);
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    Latencies::of(all, started.elapsed())
}

/// p50 of `GET /healthz` at concurrency 1 on a keep-alive connection: the HTTP round trip to the agent
/// with no command behind it (the floor under an exec request, besides the spawn).
async fn measure_round_trip_p50(base: &str) -> Duration {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let once = || async {
        let started = Instant::now();
        let request = Request::builder()
            .uri(format!("{base}/healthz"))
            .body(full(""))
            .unwrap();
        let response = client.request(request).await.expect("healthz request");
        assert!(
            response.status().is_success(),
            "healthz: {}",
            response.status()
        );
        response.into_body().collect().await.unwrap();
        started.elapsed()
    };
    for _ in 0..100 {
        once().await;
    }
    let mut all = Vec::with_capacity(EXEC_REQUESTS);
    for _ in 0..EXEC_REQUESTS {
        all.push(once().await);
    }
    all.sort();
    all[all.len() / 2]
}

/// A `POST` of JSON `body` to the agent at `base` + `path`; the answer's body.
async fn post_json(client: &HttpClient, base: &str, path: &str, body: String) -> Bytes {
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("{base}{path}"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .header("Content-Type", "application/json")
        .body(full(body))
        .unwrap();
    let response = client.request(request).await.expect("agent request");
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(status.is_success(), "{path}: {status} {body:?}");
    body
}

/// p50 and p99 of running `command` in one shell session (`sh`), one run at a time: what a harness
/// that keeps a shell pays per command, beside a plain exec.
async fn measure_session_runs(base: &str, command: &str) -> Latencies {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let created = post_json(
        &client,
        base,
        "/v1/sessions",
        r#"{"shell":"/bin/sh"}"#.into(),
    )
    .await;
    let id = serde_json::from_slice::<serde_json::Value>(&created).expect("session JSON")["id"]
        .as_str()
        .expect("session id")
        .to_string();
    let path = format!("/v1/sessions/{id}/run");
    let body = serde_json::json!({ "command": command }).to_string();
    let once = || async {
        let started = Instant::now();
        let answer = post_json(&client, base, &path, body.clone()).await;
        assert!(
            answer.windows(12).any(|window| window == b"\"exitCode\":0"),
            "unexpected session run answer"
        );
        started.elapsed()
    };
    for _ in 0..100 {
        once().await;
    }
    let started = Instant::now();
    let mut all = Vec::with_capacity(EXEC_REQUESTS);
    for _ in 0..EXEC_REQUESTS {
        all.push(once().await);
    }
    let elapsed = started.elapsed();
    let request = Request::builder()
        .method(Method::DELETE)
        .uri(format!("{base}/v1/sessions/{id}"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .body(full(""))
        .unwrap();
    client.request(request).await.expect("delete the session");
    Latencies::of(all, elapsed)
}

async fn measure_files(base: &str) -> (f64, f64) {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let chunk = Bytes::from(vec![0xA5u8; 1024 * 1024]);
    let stream = futures::stream::iter(
        (0..FILE_MIB).map(move |_| Ok::<_, BoxError>(Frame::data(chunk.clone()))),
    );
    let started = Instant::now();
    let request = Request::builder()
        .method(Method::PUT)
        .uri(format!("{base}/v1/files?path=bench.bin"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap();
    let response = client.request(request).await.expect("upload");
    assert_eq!(response.status(), 201);
    response.into_body().collect().await.unwrap();
    let upload = FILE_MIB as f64 / started.elapsed().as_secs_f64();

    let started = Instant::now();
    let request = Request::builder()
        .uri(format!("{base}/v1/files?path=bench.bin"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .body(full(""))
        .unwrap();
    let response = client.request(request).await.expect("download");
    let mut body = response.into_body();
    let mut received = 0usize;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            received += data.len();
        }
    }
    assert_eq!(received, FILE_MIB * 1024 * 1024);
    let download = FILE_MIB as f64 / started.elapsed().as_secs_f64();
    (upload, download)
}

fn ms(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1000.0)
}

fn write_section(doc: &Path, section: &str) {
    let existing = std::fs::read_to_string(doc).unwrap_or_else(|_| "# Benchmarks\n".to_string());
    let mut output = String::new();
    let mut skipping = false;
    let mut replaced = false;
    for line in existing.lines() {
        if line.trim_end() == "## Agent" {
            skipping = true;
            replaced = true;
            output.push_str(section);
            continue;
        }
        if skipping && line.starts_with("## ") {
            skipping = false;
        }
        if !skipping {
            output.push_str(line);
            output.push('\n');
        }
    }
    if !replaced {
        if !output.ends_with("\n\n") {
            output.push('\n');
        }
        output.push_str(section);
    }
    std::fs::write(doc, output).expect("write the benchmark doc");
}

/// Rounds of the compared paths (agent, FastAPI, the spawn floors), alternated so that drift on a shared
/// machine hits each path alike; each figure is the median over the rounds, with the spread.
const ROUNDS: usize = 3;
/// How long the benchmark waits for a quiet machine before it runs anyway (and says so).
const QUIET_WAIT: Duration = Duration::from_secs(120);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let doc = orchard_bench_support::write_doc_arg(&args);
    let Ok(binary) = std::env::var("ORCHARD_AGENT_BIN") else {
        eprintln!("set ORCHARD_AGENT_BIN to the agent to measure (make bench-agent does)");
        std::process::exit(2);
    };
    let binary = PathBuf::from(binary);
    let root = std::env::temp_dir().join(format!("orchard-bench-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let machine = Machine::settle(QUIET_WAIT);
    let disk = direct_write_mib_per_second(&root, FILE_MIB);
    let size = std::fs::metadata(&binary)
        .map(|metadata| metadata.len())
        .unwrap_or(0);
    let agent = start_agent(&binary, &root);
    let python = std::env::var("ORCHARD_BENCH_PYTHON").ok();
    let fastapi = python.as_deref().and_then(start_fastapi);
    std::thread::sleep(Duration::from_millis(500));
    let idle_rss = rss_kib(agent.child.id());
    let python_idle_rss = fastapi
        .as_ref()
        .map(|server| tree_rss_kib(server.child.id()));
    // Rounds: every path once per round, in the same order, so slow phases of the machine hit all.
    let (mut floor, mut floor_fork, mut round_trip) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rust_1, mut rust_32, mut python_1, mut python_32) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut session_builtin, mut session_process) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        eprintln!("bench-agent: round {} of {ROUNDS}", round + 1);
        floor.push(direct_spawn_p50(&root, true));
        floor_fork.push(direct_spawn_p50(&root, false));
        runtime.block_on(async {
            round_trip.push(measure_round_trip_p50(&agent.base).await);
            rust_1.push(measure_exec(&agent.base, 1).await);
            rust_32.push(measure_exec(&agent.base, 32).await);
            session_builtin.push(measure_session_runs(&agent.base, "true").await);
            session_process.push(measure_session_runs(&agent.base, "/bin/true").await);
            if let Some(server) = &fastapi {
                python_1.push(measure_exec(&server.base, 1).await);
                python_32.push(measure_exec(&server.base, 32).await);
            }
        });
    }
    let (upload, download) = runtime.block_on(measure_files(&agent.base));
    let loaded_rss = rss_kib(agent.child.id());
    drop(agent);
    drop(fastapi);
    let _ = std::fs::remove_dir_all(&root);
    let machine = machine.report();
    // The agent's own cost per exec: agent p50 minus the floor, round by round.
    let overhead: Vec<f64> = rust_1
        .iter()
        .zip(&floor)
        .map(|(agent, floor)| (agent.p50.as_secs_f64() - floor.as_secs_f64()) * 1000.0)
        .collect();
    // What is left of it besides the HTTP round trip, round by round.
    let handling: Vec<f64> = overhead
        .iter()
        .zip(&round_trip)
        .map(|(overhead, trip)| overhead - trip.as_secs_f64() * 1000.0)
        .collect();
    let mut table = String::new();
    table.push_str("| metric | orchard-agent (Rust, static) | FastAPI + uvicorn (Python) | ratio |\n|---|---|---|---|\n");
    let latency = |values: Vec<Duration>| median_spread(&values, ms);
    let rate = |values: Vec<f64>| median_spread(&values, |v| format!("{v:.0}"));
    let ratio = |rust: Option<f64>, python: Option<f64>| match (rust, python) {
        (Some(rust), Some(python)) if rust > 0.0 => format!("{:.1}x", python / rust),
        _ => "n/a".into(),
    };
    let p50 = |l: &Vec<Latencies>| l.iter().map(|l| l.p50).collect::<Vec<_>>();
    let p99 = |l: &Vec<Latencies>| l.iter().map(|l| l.p99).collect::<Vec<_>>();
    let per_second = |l: &Vec<Latencies>| l.iter().map(|l| l.per_second).collect::<Vec<_>>();
    let secs = |d: Vec<Duration>| median(&d).map(|d| d.as_secs_f64());
    let python_or = |values: &Vec<Latencies>, text: String| {
        if values.is_empty() {
            "n/a".to_string()
        } else {
            text
        }
    };
    for (name, rust, python) in [
        (
            "exec `true` p50, concurrency 1",
            p50(&rust_1),
            p50(&python_1),
        ),
        (
            "exec `true` p99, concurrency 1",
            p99(&rust_1),
            p99(&python_1),
        ),
        (
            "exec `true` p50, concurrency 32",
            p50(&rust_32),
            p50(&python_32),
        ),
        (
            "exec `true` p99, concurrency 32",
            p99(&rust_32),
            p99(&python_32),
        ),
    ] {
        let python_text = python_or(&python_1, latency(python.clone()));
        let factor = ratio(secs(rust.clone()), secs(python));
        table.push_str(&format!(
            "| {name} | {} | {python_text} | {factor} |\n",
            latency(rust)
        ));
    }
    // A session run beside a plain exec, same rounds.
    let exec_p50 = secs(p50(&rust_1));
    for (name, runs) in [
        (
            "session run `true` p50 (one `sh` session; a builtin, no process started)",
            &session_builtin,
        ),
        (
            "session run `/bin/true` p50 (one `sh` session; the shell starts the process)",
            &session_process,
        ),
    ] {
        let versus = match (secs(p50(runs)), exec_p50) {
            (Some(run), Some(exec)) if exec > 0.0 => format!("{:.2}x exec `true` p50", run / exec),
            _ => "n/a".into(),
        };
        table.push_str(&format!(
            "| {name} | {} | | {versus} |\n",
            latency(p50(runs))
        ));
    }
    table.push_str(&format!(
        "| spawn `true` directly, no HTTP (the floor: posix_spawn, own process group), p50 | {} | | |\n",
        latency(floor)
    ));
    table.push_str(&format!(
        "| the agent's own cost per exec (agent p50 minus the floor, per round) | {} | | |\n",
        median_spread(&overhead, |v| format!("{v:.2} ms"))
    ));
    table.push_str(&format!(
        "| HTTP round trip to the agent, no command (`GET /healthz`, concurrency 1), p50 | {} | | |\n",
        latency(round_trip)
    ));
    table.push_str(&format!(
        "| the agent's exec handling besides the HTTP round trip (own cost minus the round trip, per round) | {} | | |\n",
        median_spread(&handling, |v| format!("{v:.2} ms"))
    ));
    table.push_str(&format!(
        "| spawn `true` directly with fork + setsid instead, p50 | {} | | |\n",
        latency(floor_fork)
    ));
    for (name, rust, python) in [
        (
            "exec/s, concurrency 1",
            per_second(&rust_1),
            per_second(&python_1),
        ),
        (
            "exec/s, concurrency 32",
            per_second(&rust_32),
            per_second(&python_32),
        ),
    ] {
        let python_text = python_or(&python_1, rate(python.clone()));
        let factor = match (median(&rust), median(&python)) {
            (Some(r), Some(p)) if p > 0.0 => format!("{:.1}x", r / p),
            _ => "n/a".into(),
        };
        table.push_str(&format!(
            "| {name} | {} | {python_text} | {factor} |\n",
            rate(rust)
        ));
    }
    let python_idle = python_idle_rss
        .map(|kib| format!("{:.1} MiB", kib as f64 / 1024.0))
        .unwrap_or("n/a".into());
    let ratio_idle = python_idle_rss
        .map(|kib| format!("{:.1}x", kib as f64 / idle_rss.max(1) as f64))
        .unwrap_or("n/a".into());
    table.push_str(&format!(
        "| idle RSS | {:.1} MiB | {python_idle} | {ratio_idle} |\n",
        idle_rss as f64 / 1024.0
    ));
    table.push_str(&format!(
        "| RSS after the runs below | {:.1} MiB | | |\n",
        loaded_rss as f64 / 1024.0
    ));
    table.push_str(&format!(
        "| upload {FILE_MIB} MiB (PUT /v1/files) | {upload:.0} MiB/s | | |\n"
    ));
    table.push_str(&format!(
        "| download {FILE_MIB} MiB (GET /v1/files) | {download:.0} MiB/s | | |\n"
    ));
    table.push_str(&format!(
        "| write {FILE_MIB} MiB to disk directly, no HTTP (the floor under uploads) | {disk:.0} MiB/s | | |\n"
    ));
    table.push_str(&format!(
        "| binary size | {:.2} MiB ({size} bytes, static, stripped) | | |\n",
        size as f64 / 1048576.0
    ));

    let section = format!(
        "## Agent\n\n\
         Command: `make bench-agent` (builds the static agent with `make agent`, creates the FastAPI venv, runs\n\
         `cargo bench -p orchard-agent --bench agent`). Loopback HTTP with keep-alive clients, bearer token on;\n\
         {EXEC_REQUESTS} exec requests per row and round after 100 warm-up requests; the FastAPI baseline\n\
         (`agent/bench/fastapi_agent.py`, fastapi 0.115.12 + uvicorn 0.34.2, one worker) runs the same argv\n\
         in its own session and captures output. {ROUNDS} rounds, each running every path once in the same\n\
         order (the spawn floors, the agent, FastAPI), so drift on the machine hits all of them; every figure\n\
         is the median over the rounds with the spread (min–max) in brackets, ratios are of medians. The\n\
         \"spawn `true` directly\" row starts `true` the way the agent does (posix_spawn into a new process\n\
         group, three pipes) and waits for it: the agent's own cost per exec is the difference to the\n\
         concurrency-1 p50, taken round by round; of that, the HTTP round trip (`GET /healthz` on the same\n\
         kind of keep-alive connection, which runs no command) is the part any HTTP agent pays, and the\n\
         rest is the exec request's own handling (body, spawn bookkeeping, pipes, reaping, the JSON answer).\n\
         The fork + setsid row is how the agent started commands\n\
         before (a `pre_exec` hook forces std to fork). The session rows run the command in one `sh` shell\n\
         session per round (`POST /v1/sessions/{{id}}/run`, one run at a time, {EXEC_REQUESTS} runs after 100\n\
         warm-ups); their last column compares with the exec `true` p50 at concurrency 1. Machine: {machine}.\n\n{table}\n"
    );
    println!("{section}");
    if let Some(doc) = doc {
        write_section(&doc, &section);
        println!("wrote the `## Agent` section of {}", doc.display());
    }
}
