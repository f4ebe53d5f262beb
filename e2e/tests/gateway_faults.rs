//! The gateway when an agent stops answering (local cluster, real operator): a frozen agent gives
//! 504 `AgentTimeout` after `X-Orchard-Timeout`, a dead one 502 (retryable), and once the operator
//! has marked the sandbox Failed, 409 `NotReady` with phase Failed. An agent killed mid-exec gives the
//! waiting caller 502 `AgentConnectionLost` at once and leaves no process behind. This binary freezes the whole
//! local node, so it holds this one test only. The agent killed while the node was paused is
//! reported when the node resumes (the sandbox turns Failed), like a kubelet that recovers.

use std::time::{Duration, Instant};

use kube::api::Api;
use orchard_operator::api::{Sandbox, SandboxPhase};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::gateway::{Caller, sandbox_path};
use serde_json::json;

/// The `sleep` argument that marks the command killed mid-exec (unique on this machine).
const MID_EXEC_SLEEP: &str = "31.4159";

/// An answer this much later than it is due (the caller's time-out; at once for a dead agent) is
/// broken, not slow: a correctness bound, far above what an idle machine takes.
const BROKEN_AFTER: Duration = Duration::from_secs(15);

/// Whether process `pid` has died (gone, or a zombie its parent has not reaped yet: its sockets are
/// closed either way).
fn dead(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
    })
}

/// Pids of processes whose argv is exactly `argv`.
fn processes_running(argv: &[&str]) -> Vec<u32> {
    let wanted: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted))
        .collect()
}

#[tokio::test]
async fn frozen_and_dead_agents_give_retryable_gateway_errors() {
    let env = TestEnv::shared();
    let ns = env.namespace("gw-faults").await;
    let admin = Caller::user(env, "admin");
    let name = admin
        .create_sandbox(&ns, json!({"name": "victim", "image": "busybox"}))
        .await;
    let doomed = admin
        .create_sandbox(&ns, json!({"name": "doomed", "image": "busybox"}))
        .await;
    admin.wait_ready(&ns, &name).await;
    admin.wait_ready(&ns, &doomed).await;
    let ok = admin.exec(&ns, &name, json!({"argv": ["true"]})).await;
    assert_eq!(ok.status, 200, "{ok:?}");

    // Frozen (SIGSTOP): connections are accepted by the kernel, nothing answers.
    env.node.hollow().pause().await.expect("pause node");
    let started = Instant::now();
    let frozen = admin
        .send(
            admin
                .request(reqwest::Method::POST, &sandbox_path(&ns, &name, "/exec"))
                .header("x-orchard-timeout", "2")
                .json(&json!({"argv": ["true"]})),
        )
        .await;
    let waited = started.elapsed();
    assert_eq!(frozen.status, 504, "{frozen:?}");
    assert_eq!(frozen.code(), "AgentTimeout");
    assert_eq!(
        frozen.body["retryable"], false,
        "an exec may have run: {frozen:?}"
    );
    // Not before the caller's 2 s, and not so long after that the time-out was not what answered.
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_secs(2) + BROKEN_AFTER,
        "answered {waited:?} after the request, with a 2 s time-out"
    );
    let frozen_read = admin
        .send(
            admin
                .request(
                    reqwest::Method::GET,
                    &sandbox_path(&ns, &name, "/files/list?path=/"),
                )
                .header("x-orchard-timeout", "1"),
        )
        .await;
    assert_eq!(frozen_read.status, 504, "{frozen_read:?}");
    assert_eq!(frozen_read.body["retryable"], true, "reads may be retried");

    // Dead: the agent process is gone while the node (frozen) has not reported it yet.
    let pid = env.node.hollow().agent_pid(&ns, &name).expect("agent pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill agent");
    orchard_testcluster::wait::poll("the agent dead", Duration::from_secs(10), || async {
        dead(pid).then_some(())
    })
    .await;
    let dead = admin.exec(&ns, &name, json!({"argv": ["true"]})).await;
    assert_eq!(dead.status, 502, "{dead:?}");
    assert!(
        ["AgentUnreachable", "AgentConnectionLost"].contains(&dead.code()),
        "{dead:?}"
    );
    let dead_again = admin.exec(&ns, &name, json!({"argv": ["true"]})).await;
    assert_eq!(dead_again.status, 502, "{dead_again:?}");
    assert_eq!(dead_again.code(), "AgentUnreachable");
    assert_eq!(dead_again.body["retryable"], true);

    env.node.hollow().resume().await.expect("resume node");
    let sandboxes: Api<Sandbox> = Api::namespaced(env.client().await, &ns);
    orchard_testcluster::wait::until(
        &sandboxes,
        &name,
        "phase Failed once the resumed node reports the dead agent",
        Duration::from_secs(60),
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.phase == Some(SandboxPhase::Failed))
        },
    )
    .await;

    // An agent that dies mid-exec on a running node: the caller gets 502 AgentConnectionLost at once
    // (not retryable: the command may have run), the node kills the command with the container, the
    // operator fails the sandbox, and later calls get 409 NotReady with phase Failed.
    let long_exec = {
        let admin = admin.clone();
        let (ns, doomed) = (ns.clone(), doomed.clone());
        tokio::spawn(async move {
            admin
                .send(
                    admin
                        .request(reqwest::Method::POST, &sandbox_path(&ns, &doomed, "/exec"))
                        .header("x-orchard-timeout", "60")
                        .json(&json!({"argv": ["sleep", MID_EXEC_SLEEP]})),
                )
                .await
        })
    };
    orchard_testcluster::wait::poll(
        "the long exec to start",
        Duration::from_secs(20),
        || async { (!processes_running(&["sleep", MID_EXEC_SLEEP]).is_empty()).then_some(()) },
    )
    .await;
    let killed_at = Instant::now();
    assert!(
        env.node.hollow().kill_agent(&ns, &doomed),
        "kill the agent of {doomed}"
    );
    let broken = long_exec.await.expect("exec task");
    assert!(
        killed_at.elapsed() < BROKEN_AFTER,
        "the caller learns at once, not at its 60 s time-out: {:?}",
        killed_at.elapsed()
    );
    assert_eq!(broken.status, 502, "{broken:?}");
    assert_eq!(broken.code(), "AgentConnectionLost", "{broken:?}");
    assert_eq!(broken.body["retryable"], false, "{broken:?}");
    assert!(
        broken.message().contains("may have run"),
        "the message says what is unknown: {broken:?}"
    );
    orchard_testcluster::wait::poll(
        "the killed agent's command to be gone",
        Duration::from_secs(10),
        || async {
            processes_running(&["sleep", MID_EXEC_SLEEP])
                .is_empty()
                .then_some(())
        },
    )
    .await;
    orchard_testcluster::wait::until(
        &sandboxes,
        &doomed,
        "phase Failed",
        Duration::from_secs(60),
        |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.phase == Some(SandboxPhase::Failed))
        },
    )
    .await;
    let settled = admin
        .get(&sandbox_path(&ns, &doomed, "/wait?timeoutSeconds=5"))
        .await;
    assert_eq!(settled.status, 200, "{settled:?}");
    assert_eq!(settled.body["status"]["phase"], "Failed", "{settled:?}");
    let failed = admin.exec(&ns, &doomed, json!({"argv": ["true"]})).await;
    assert_eq!(failed.status, 409, "{failed:?}");
    assert_eq!(failed.code(), "NotReady");
    assert_eq!(failed.body["phase"], "Failed");
    assert_eq!(failed.body["retryable"], false);

    let metrics = env.operator().metrics().await.expect("metrics");
    for kind in ["timeout", "unreachable"] {
        assert!(
            orchard_testcluster::operator_process::metric_sum(
                &metrics,
                "orchard_gateway_agent_errors_total",
                &[("kind", kind)]
            ) >= 1.0,
            "agent error kind {kind} counted"
        );
    }
    env.delete_namespace(&ns).await;
}
