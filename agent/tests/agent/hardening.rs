//! Keeping the token away from the commands the agent runs: no serving without a token unless asked
//! for explicitly, the token wiped from /proc/<pid>/environ, the agent's /proc files closed to its
//! children (non-dumpable), and the token hand-over (`install --token-from/--token-to`, then
//! `serve --consume-token-file`).

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use serde_json::json;

use crate::common::{Agent, AgentOptions, TOKEN, TempDir, agent_binary, full};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_token_file_deletes_it_before_serving() {
    let agent = Agent::start_with(AgentOptions {
        args: vec!["--consume-token-file".into()],
        ..AgentOptions::default()
    });
    assert!(
        !agent.token_file.exists(),
        "the token file is still there after start"
    );
    assert_eq!(authorised(&agent, Some(TOKEN)).await, StatusCode::OK);
    assert_eq!(
        authorised(&agent, Some("wrong")).await,
        StatusCode::UNAUTHORIZED
    );
}

#[test]
fn consume_token_file_fails_closed_when_the_file_cannot_be_removed() {
    // procfs refuses every unlink, even root's: the token "file" stays, so the agent must not start.
    let root = TempDir::new("consume-fail");
    let root = root.path().display().to_string();
    let (code, stderr) = run_agent(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--root",
            &root,
            "--token-file",
            "/proc/version",
            "--consume-token-file",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("`/proc/version`"), "{stderr}");
    assert!(stderr.contains("refusing to start"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_hand_over_from_install_to_serve() {
    // The init container: the Secret mounted at .../orchard-token/token, a shared memory volume at
    // .../orchard; `install` copies the agent and the token.
    let pod = TempDir::new("handover");
    let secret = pod.path().join("var/run/orchard-token/token");
    std::fs::create_dir_all(secret.parent().unwrap()).unwrap();
    std::fs::write(&secret, format!("{TOKEN}\n")).unwrap();
    let shared = pod.path().join("var/run/orchard/token");
    let opt = pod.path().join("opt/orchard");
    let (code, stderr) = run_agent(
        &[
            "install",
            &opt.display().to_string(),
            "--token-from",
            &secret.display().to_string(),
            "--token-to",
            &shared.display().to_string(),
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(opt.join("orchard-agent").is_file());
    assert_eq!(
        std::fs::read_to_string(&shared).unwrap(),
        format!("{TOKEN}\n")
    );
    assert_eq!(std::fs::metadata(&shared).unwrap().mode() & 0o7777, 0o444);
    // `install DIR` alone still works and copies no token.
    let (code, stderr) = run_agent(&["install", &opt.display().to_string()], &[]);
    assert_eq!(code, Some(0), "{stderr}");

    // The task container: the agent reads the shared copy and deletes it before serving.
    let agent = Agent::start_with(AgentOptions {
        with_token: false,
        env: vec![
            (
                "ORCHARD_AGENT_TOKEN_FILE".into(),
                shared.display().to_string(),
            ),
            ("ORCHARD_AGENT_CONSUME_TOKEN_FILE".into(), "true".into()),
        ],
        ..AgentOptions::default()
    });
    assert!(!shared.exists(), "the shared token copy is still there");
    assert_eq!(authorised(&agent, Some(TOKEN)).await, StatusCode::OK);
    assert_eq!(authorised(&agent, None).await, StatusCode::UNAUTHORIZED);
}
