//! Keeping the token away from the commands the agent runs: no serving without a token unless asked
//! for explicitly, the token wiped from /proc/<pid>/environ, the agent's /proc files closed to its
//! children (non-dumpable), and the token verifier (`ORCHARD_AGENT_TOKEN_SHA256`: the agent is given
//! only the token's SHA-256); and keeping connections from being held against the agent (header-read
//! timeout, connection cap).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::common::{
    Agent, AgentOptions, TOKEN, TempDir, agent_binary, full, healthz_on, http_connection,
};

/// A uid without any privilege (`nobody`).
const NOBODY: u32 = 65534;

/// Runs `orchard-agent <args>` with no `ORCHARD_AGENT_*` variable but `env`; returns exit code and
/// stderr. A program still running after 20 s (a `serve` that should have refused to start) is killed
/// and reported with no exit code.
fn run_agent(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(agent_binary());
    command.args(args);
    for (key, _) in std::env::vars() {
        if key.starts_with("ORCHARD_AGENT_") {
            command.env_remove(key);
        }
    }
    command.envs(env.iter().copied());
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run orchard-agent");
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait for orchard-agent") {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    (code, stderr)
}

async fn authorised(agent: &Agent, token: Option<&str>) -> StatusCode {
    agent
        .send(
            Method::POST,
            "/v1/exec",
            full(json!({"argv": ["true"]}).to_string()),
            token,
        )
        .await
        .status()
}

#[test]
fn serve_refuses_to_start_without_a_token() {
    let root = TempDir::new("no-token");
    let root = root.path().display().to_string();
    let (code, stderr) = run_agent(&["serve", "--listen", "127.0.0.1:0", "--root", &root], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no bearer token"), "{stderr}");
    assert!(stderr.contains("--insecure-no-auth"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_no_auth_serves_openly_with_a_loud_warning() {
    let agent = Agent::start_with(AgentOptions {
        with_token: false,
        ..AgentOptions::default()
    });
    assert_eq!(authorised(&agent, None).await, StatusCode::OK);
    let logs = agent.logs.lock().unwrap().join("\n");
    assert!(
        logs.contains("WARNING: INSECURE: --insecure-no-auth"),
        "{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_no_auth_from_the_environment() {
    let agent = Agent::start_with(AgentOptions {
        with_token: false,
        env: vec![("ORCHARD_AGENT_INSECURE_NO_AUTH".into(), "true".into())],
        ..AgentOptions::default()
    });
    assert_eq!(authorised(&agent, None).await, StatusCode::OK);
}

/// The whole environment block of `pid`, as /proc shows it.
fn proc_environ(pid: u32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/environ")).expect("read /proc/<pid>/environ (as root)")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_from_the_environment_is_wiped_from_proc_environ() {
    let secret = "env-token-7f3a9c2e51d84b06";
    let agent = Agent::start_with(AgentOptions {
        with_token: false,
        env: vec![("ORCHARD_AGENT_TOKEN".into(), secret.into())],
        ..AgentOptions::default()
    });
    let environ = proc_environ(agent.pid());
    // The block is the agent's (other variables are still there), but the token's value is gone.
    assert!(contains(&environ, "ORCHARD_AGENT_LOG=info"));
    assert!(
        !contains(&environ, secret),
        "the token is readable in /proc/{}/environ",
        agent.pid()
    );
    // The agent still knows it.
    assert_eq!(authorised(&agent, Some(secret)).await, StatusCode::OK);
    assert_eq!(authorised(&agent, None).await, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_cannot_read_the_agents_proc_files() {
    // The agent runs as an unprivileged uid; its commands run as the same uid without CAP_SYS_PTRACE,
    // which is exactly the task's position. A dumpable agent would let them read all of this.
    let agent = Agent::start_with(AgentOptions {
        uid: Some(NOBODY),
        ..AgentOptions::default()
    });
    let pid = agent.pid();
    let out = agent.exec(json!({"argv": ["id", "-u"]})).await;
    assert_eq!(out["stdout"], format!("{NOBODY}\n"), "{out}");
    for path in ["environ", "mem", "fd/0"] {
        let out = agent
            .exec(json!({"command": format!("exec 3< /proc/{pid}/{path} && echo opened")}))
            .await;
        assert_ne!(
            out["exitCode"], 0,
            "/proc/{pid}/{path} is open to commands: {out}"
        );
        assert!(
            out["stderr"]
                .as_str()
                .is_some_and(|stderr| stderr.contains("Permission denied")),
            "{path}: {out}"
        );
    }
    // Commands themselves are dumpable again (execve resets the flag): a command's own child can read
    // the command's environment, and output and exit codes are as usual.
    let out = agent
        .exec(json!({"command": "sh -c 'cat /proc/$PPID/environ >/dev/null' && echo readable"}))
        .await;
    assert_eq!(out["stdout"], "readable\n", "{out}");
    assert_eq!(out["exitCode"], 0, "{out}");
}

/// The token verifier the operator puts in the pod spec: lowercase hex SHA-256 of the token.
fn sha256_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_verifier_accepts_only_the_token_it_hashes() {
    let secret = "pod-token-5b2e8f14c7a3d960";
    let verifier = sha256_hex(secret);
    let agent = Agent::start_with(AgentOptions {
        with_token: false,
        env: vec![("ORCHARD_AGENT_TOKEN_SHA256".into(), verifier.clone())],
        ..AgentOptions::default()
    });
    assert_eq!(authorised(&agent, Some(secret)).await, StatusCode::OK);
    assert_eq!(
        authorised(&agent, Some(TOKEN)).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        authorised(&agent, Some(&verifier)).await,
        StatusCode::UNAUTHORIZED,
        "the verifier is public: it must not work as a token"
    );
    assert_eq!(authorised(&agent, None).await, StatusCode::UNAUTHORIZED);
    // The readiness probe needs no token.
    let health = agent
        .send(Method::GET, "/healthz", full(""), None)
        .await
        .status();
    assert_eq!(health, StatusCode::OK);

    // Commands do not inherit the verifier (nor any ORCHARD_AGENT_* variable).
    let response = agent
        .send(
            Method::POST,
            "/v1/exec",
            full(json!({"argv": ["env"], "env": {"MARKER": "from-request"}}).to_string()),
            Some(secret),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let out: Value = serde_json::from_slice(&body).unwrap();
    let stdout = out["stdout"].as_str().unwrap_or_default();
    assert_eq!(out["exitCode"], 0, "{out}");
    assert!(stdout.contains("MARKER=from-request"), "{out}");
    assert!(!stdout.contains("ORCHARD_AGENT_TOKEN_SHA256"), "{stdout}");
    assert!(!stdout.contains(&verifier), "{stdout}");
    // Nor does /proc/<pid>/environ show it any more.
    let environ = proc_environ(agent.pid());
    assert!(contains(&environ, "ORCHARD_AGENT_LOG=info"));
    assert!(
        !contains(&environ, &verifier),
        "the verifier is readable in /proc/{}/environ",
        agent.pid()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_verifier_flag_accepts_upper_case_hex() {
    let agent = Agent::start_with(AgentOptions {
        with_token: false,
        args: vec![
            "--token-sha256".into(),
            sha256_hex(TOKEN).to_ascii_uppercase(),
        ],
        ..AgentOptions::default()
    });
    assert_eq!(authorised(&agent, Some(TOKEN)).await, StatusCode::OK);
    assert_eq!(
        authorised(&agent, Some("wrong")).await,
        StatusCode::UNAUTHORIZED
    );
}

#[test]
fn serve_refuses_a_bad_verifier_two_token_sources_and_the_removed_hand_over() {
    let root = TempDir::new("bad-verifier");
    let root = root.path().display().to_string();
    let serve = ["serve", "--listen", "127.0.0.1:0", "--root", &root];
    let verifier = sha256_hex(TOKEN);

    let (code, stderr) = run_agent(&serve, &[("ORCHARD_AGENT_TOKEN_SHA256", "not-a-digest")]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("ORCHARD_AGENT_TOKEN_SHA256"), "{stderr}");
    assert!(stderr.contains("hex"), "{stderr}");
    let short = &verifier[..63];
    let (code, stderr) = run_agent(&[&serve[..], &["--token-sha256", short]].concat(), &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("exactly 64 hex characters"), "{stderr}");

    let (code, stderr) = run_agent(
        &serve,
        &[
            ("ORCHARD_AGENT_TOKEN_SHA256", &verifier),
            ("ORCHARD_AGENT_TOKEN", TOKEN),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("ORCHARD_AGENT_TOKEN)"), "{stderr}");
    assert!(stderr.contains("ORCHARD_AGENT_TOKEN_SHA256"), "{stderr}");

    // The token hand-over flags are gone.
    let (code, stderr) = run_agent(
        &[
            &serve[..],
            &["--token-file", "/proc/version", "--consume-token-file"],
        ]
        .concat(),
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("unknown option `--consume-token-file`"),
        "{stderr}"
    );
    let opt = TempDir::new("install");
    let (code, stderr) = run_agent(
        &[
            "install",
            &opt.path().display().to_string(),
            "--token-from",
            "/proc/version",
            "--token-to",
            "/tmp/token",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unknown option `--token-from`"), "{stderr}");
}

/// Raises this process' soft `RLIMIT_NOFILE` to at least `wanted` (agents started afterwards inherit
/// it), within the hard limit.
fn raise_open_file_limit(wanted: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to fill in.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    if limit.rlim_cur < wanted {
        limit.rlim_cur = wanted.min(limit.rlim_max);
        // SAFETY: a valid rlimit, within the hard limit.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
    }
    assert!(
        limit.rlim_cur >= wanted,
        "this test needs {wanted} open files; the hard RLIMIT_NOFILE is {}",
        limit.rlim_max
    );
}

/// Whether the agent closes `stream` within `wait`: reads (discarding anything) until end of file.
async fn closed_within(stream: &mut tokio::net::TcpStream, wait: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    tokio::time::timeout(wait, async {
        let mut buffer = [0u8; 256];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Idle connections opened by the test below: more than the default connection cap (1024), and more
/// than the default soft RLIMIT_NOFILE (1024).
const IDLE_CONNECTIONS: usize = 5_000;

/// Security review L8: any pod that reaches the agent's port (no token needed) could hold thousands
/// of connections open without sending anything; they were never closed, used up the agent's file
/// descriptors, and locked the operator out. Now the cap makes room by closing the oldest connection
/// waiting for a request, and the header-read timeout closes the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_connections_neither_lock_out_callers_nor_stay_open() {
    raise_open_file_limit(IDLE_CONNECTIONS as u64 + 1024);
    let agent = Agent::start_with(AgentOptions {
        env: vec![("ORCHARD_AGENT_HEADER_READ_TIMEOUT".into(), "2s".into())],
        ..AgentOptions::default()
    });
    let mut idle = Vec::with_capacity(IDLE_CONNECTIONS);
    for _ in 0..IDLE_CONNECTIONS {
        idle.push(
            tokio::net::TcpStream::connect(agent.addr)
                .await
                .expect("connect to the agent"),
        );
    }
    // One of them sends half a request head, slowly, and then nothing.
    tokio::io::AsyncWriteExt::write_all(
        &mut idle[IDLE_CONNECTIONS - 1],
        b"GET /healthz HTTP/1.1\r\n",
    )
    .await
    .unwrap();

    // The operator's call still gets through (a generous bound: this is not a latency test).
    let health = tokio::time::timeout(
        Duration::from_secs(5),
        agent.send(Method::GET, "/healthz", full(""), Some(TOKEN)),
    )
    .await
    .expect("GET /healthz answered within 5 s with 5,000 idle connections open");
    assert_eq!(health.status(), StatusCode::OK);

    // Every silent connection is closed by the agent: evicted, or after the 2 s header-read timeout.
    let closed = futures::future::join_all(
        idle.iter_mut()
            .map(|stream| closed_within(stream, Duration::from_secs(30))),
    )
    .await;
    let open = closed.iter().filter(|closed| !**closed).count();
    assert_eq!(
        open, 0,
        "{open} of {IDLE_CONNECTIONS} idle connections still open after 30 s"
    );
}

/// At the cap, a new connection is accepted and the connection that has waited longest for a request
/// head (a silent one, or a kept-alive one between requests) is closed; a request in progress is
/// never cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_the_longest_waiting_connection_makes_room() {
    let agent = Agent::start_with(AgentOptions {
        env: vec![
            ("ORCHARD_AGENT_MAX_CONNECTIONS".into(), "3".into()),
            // Far beyond the waits below: every close seen here is an eviction.
            ("ORCHARD_AGENT_HEADER_READ_TIMEOUT".into(), "60s".into()),
        ],
        ..AgentOptions::default()
    });
    // A: a streamed command in progress (its `started` event has arrived).
    let mut busy = http_connection(agent.addr).await;
    let request = hyper::Request::post("/v1/exec/stream")
        .header("Host", "agent")
        .header("Authorization", format!("Bearer {TOKEN}"))
        .body(full(json!({"argv": ["sleep", "2"]}).to_string()))
        .unwrap();
    let response = busy.send_request(request).await.expect("the stream starts");
    assert_eq!(response.status(), StatusCode::OK);
    let mut stream = response.into_body();
    let first = stream
        .frame()
        .await
        .expect("a first event")
        .expect("a frame");
    let first = first.into_data().expect("data");
    assert!(
        String::from_utf8_lossy(&first).contains("\"started\""),
        "{first:?}"
    );
    // B, then C: silent, B after half a request head (evicted, it must not keep its descriptor
    // until the header-read timeout).
    let mut silent_b = tokio::net::TcpStream::connect(agent.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut silent_b, b"GET /healthz HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut silent_c = tokio::net::TcpStream::connect(agent.addr).await.unwrap();

    // D is the fourth: B (the oldest waiting) makes room, D is answered.
    let mut kept_alive_d = http_connection(agent.addr).await;
    assert_eq!(healthz_on(&mut kept_alive_d).await, StatusCode::OK);
    assert!(
        closed_within(&mut silent_b, Duration::from_secs(5)).await,
        "the oldest silent connection (half a request head) was not closed"
    );
    // E: C has waited for a request head longer than D, kept alive since its answer.
    let mut e = http_connection(agent.addr).await;
    assert_eq!(healthz_on(&mut e).await, StatusCode::OK);
    assert!(
        closed_within(&mut silent_c, Duration::from_secs(5)).await,
        "the silent connection was not closed before the kept-alive one"
    );
    assert_eq!(healthz_on(&mut kept_alive_d).await, StatusCode::OK);

    // A's command ran to its end on its connection.
    let rest = stream
        .collect()
        .await
        .expect("the rest of the stream")
        .to_bytes();
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.contains("\"exit\"") && text.contains("\"exitCode\":0"),
        "{text}"
    );
}
