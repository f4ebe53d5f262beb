//! PID 1 behaviour, in a fresh PID namespace (`unshare --pid --fork`): orphans are reaped, and SIGTERM
//! to the agent reaches the commands and ends the agent cleanly. Needs root and util-linux `unshare`.

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use serde_json::json;

use crate::common::{Agent, AgentOptions};

fn unshare_available() -> bool {
    (unsafe { libc::geteuid() }) == 0
        && std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "true"])
            .status()
            .is_ok_and(|status| status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid1_it_reaps_orphans_and_forwards_sigterm() {
    if !unshare_available() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "PID 1 test needs root and `unshare` under CI=true"
        );
        eprintln!("skipping the PID 1 test: needs root and `unshare --pid`");
        return;
    }
    let agent = Agent::start_with(AgentOptions {
        wrapper: vec![
            "unshare".into(),
            "--pid".into(),
            "--fork".into(),
            "--mount-proc".into(),
            "--kill-child".into(),
        ],
        ..AgentOptions::default()
    });
    let out = agent
        .exec(json!({"command": "cat /proc/1/cmdline | tr '\\0' ' '"}))
        .await;
    assert!(
        out["stdout"]
            .as_str()
            .unwrap()
            .contains("orchard-agent serve"),
        "PID 1 is not the agent: {out}"
    );

    // Orphans: processes that escaped their group and outlive their parent are re-parented to PID 1.
    for _ in 0..5 {
        agent
            .exec(json!({"command": "setsid sh -c 'sleep 0.2' & setsid sh -c 'exit 0' &"}))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let zombies = agent
        .exec(json!({"command": "for s in /proc/[0-9]*/stat; do cat $s 2>/dev/null; echo; done | grep -c ') Z ' || true"}))
        .await;
    assert_eq!(
        zombies["stdout"].as_str().unwrap().trim(),
        "0",
        "zombies were not reaped: {zombies}"
    );

    // SIGTERM to the namespace's PID 1 (the child of `unshare`) stops the running commands and the agent.
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "long", "command": "trap 'exit 0' TERM; sleep 1000 & wait"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", agent.pid())).unwrap();
    let init_pid: i32 = children
        .split_whitespace()
        .next()
        .expect("unshare has a child")
        .parse()
        .unwrap();
    unsafe { libc::kill(init_pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::path::Path::new(&format!("/proc/{init_pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{init_pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
    {
        assert!(
            Instant::now() < deadline,
            "the agent did not stop after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let logs = agent.logs.lock().unwrap().join("\n");
    assert!(logs.contains("shutting down"), "{logs}");
}
