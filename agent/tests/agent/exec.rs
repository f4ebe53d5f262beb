//! `/v1/exec` and `/v1/exec/stream`: forms, environment, exit codes, timeouts that kill the whole group,
//! client disconnects, output caps and encodings.

use std::time::{Duration, Instant};

use base64::Engine;
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::{Agent, TOKEN, alive, full, kill_pids, pids_in, wait_dead};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argv_shell_cwd_env_stdin_and_exit_codes() {
    let agent = Agent::start();
    let out = agent
        .exec(json!({"argv": ["echo", "hello world", "'quoted'"]}))
        .await;
    assert_eq!(out["stdout"], "hello world 'quoted'\n");
    assert_eq!(
        (
            out["exitCode"].as_i64(),
            out["signal"].is_null(),
            out["timedOut"].as_bool()
        ),
        (Some(0), true, Some(false))
    );
    assert_eq!(out["outputEncoding"], "text");
    assert!(out["durationMs"].is_u64());

    std::fs::create_dir_all(agent.root.path().join("work/sub")).unwrap();
    let out = agent
        .exec(json!({"command": "pwd; echo \"$GREETING\" >&2; exit 7", "cwd": "work/sub", "env": {"GREETING": "hi there"}}))
        .await;
    assert_eq!(
        out["stdout"],
        format!("{}\n", agent.root.path().join("work/sub").display())
    );
    assert_eq!(out["stderr"], "hi there\n");
    assert_eq!(out["exitCode"], 7);

    // The default cwd is --root.
    let out = agent.exec(json!({"argv": ["pwd"]})).await;
    assert_eq!(out["stdout"], format!("{}\n", agent.root.path().display()));

    let out = agent
        .exec(json!({"argv": ["cat"], "stdin": "piped in"}))
        .await;
    assert_eq!(out["stdout"], "piped in");
    let out = agent
        .exec(json!({"argv": ["wc", "-c"], "stdinBase64": "AAEC/w=="}))
        .await;
    assert_eq!(out["stdout"].as_str().unwrap().trim(), "4");
    let out = agent.exec(json!({"argv": ["cat"]})).await;
    assert_eq!(out["stdout"], "", "stdin is /dev/null when not given");

    let out = agent.exec(json!({"command": "kill -TERM $$"})).await;
    assert_eq!(
        (out["exitCode"].is_null(), out["signal"].as_i64()),
        (true, Some(15))
    );

    let out = agent
        .exec(json!({"command": "echo from bash-less sh", "shell": "/bin/sh"}))
        .await;
    assert_eq!(out["stdout"], "from bash-less sh\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_non_executable_programs_are_127_and_126() {
    let agent = Agent::start();
    let out = agent
        .exec(json!({"argv": ["definitely-not-a-program-xyz"]}))
        .await;
    assert_eq!(out["exitCode"], 127);
    assert!(
        out["error"]
            .as_str()
            .unwrap()
            .contains("definitely-not-a-program-xyz"),
        "{out}"
    );
    assert!(
        out["stderr"].as_str().unwrap().contains("not in PATH"),
        "{out}"
    );

    let script = agent.root.path().join("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let out = agent.exec(json!({"argv": [script]})).await;
    assert_eq!(out["exitCode"], 126, "{out}");
    assert!(out["error"].is_string());

    let out = agent
        .exec(json!({"command": "true", "shell": "/no/such/shell"}))
        .await;
    assert_eq!(out["exitCode"], 127);

    let (status, error) = agent
        .json(
            Method::POST,
            "/v1/exec",
            json!({"argv": ["true"], "cwd": "missing-dir"}),
        )
        .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("InvalidCwd"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_without_a_shebang_run_with_sh_like_execvp() {
    // `posix_spawnp` refuses such a file (ENOEXEC); the agent retries the `execvp` way, which runs it
    // with /bin/sh, as before it used `posix_spawn`.
    let agent = Agent::start();
    let script = agent.root.path().join("no-shebang");
    std::fs::write(&script, "echo \"ran $1\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = agent.exec(json!({"argv": [&script, "by path"]})).await;
    assert_eq!(
        (out["exitCode"].as_i64(), out["stdout"].as_str()),
        (Some(0), Some("ran by path\n")),
        "{out}"
    );
    let out = agent
        .exec(json!({"argv": ["no-shebang", "from PATH"], "env": {"PATH": agent.root.path()}}))
        .await;
    assert_eq!(out["stdout"], "ran from PATH\n", "{out}");
    let out = agent
        .exec(json!({"argv": ["./no-shebang", "relative"], "stdin": "ignored"}))
        .await;
    assert_eq!(out["stdout"], "ran relative\n", "{out}");
}

/// (pid, ppid, pgrp, session) from one `/proc/<pid>/stat` line.
fn stat_ids(line: &str) -> (i64, i64, i64, i64) {
    let (pid, rest) = line.trim().split_once(" (").unwrap();
    let fields: Vec<i64> = rest
        .rsplit_once(") ")
        .unwrap()
        .1
        .split_whitespace()
        .skip(1)
        .take(3)
        .map(|field| field.parse().unwrap())
        .collect();
    (pid.parse().unwrap(), fields[0], fields[1], fields[2])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_leads_its_own_process_group() {
    let agent = Agent::start();
    let command = json!({"command": "cat /proc/$$/stat; sh -c 'cat /proc/$$/stat' & wait"});
    let first = agent.exec(command.clone()).await;
    let second = agent.exec(command).await;
    let lines: Vec<&str> = first["stdout"].as_str().unwrap().lines().collect();
    assert_eq!(lines.len(), 2, "{first}");
    let (pid, agent_pid, pgrp, session) = stat_ids(lines[0]);
    let job = stat_ids(lines[1]);
    assert_eq!(pgrp, pid, "the command leads its group: {first}");
    assert_eq!(
        job.2, pid,
        "a `&` job stays in the command's group: {first}"
    );
    let agent_stat = std::fs::read_to_string(format!("/proc/{agent_pid}/stat")).unwrap();
    let (_, _, agent_pgrp, agent_session) = stat_ids(&agent_stat);
    assert_ne!(pgrp, agent_pgrp, "the command left the agent's group");
    // A process group, not a session of its own (see `process_group`): the agent's session.
    assert_eq!((session, job.3), (agent_session, agent_session));
    let (_, _, second_pgrp, _) =
        stat_ids(second["stdout"].as_str().unwrap().lines().next().unwrap());
    assert_ne!(second_pgrp, pgrp, "every command gets a group of its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_grandchildren_and_background_jobs() {
    let agent = Agent::start();
    let started = Instant::now();
    let out = agent
        .exec(json!({
            "command": "sleep 1000 & echo $!; sh -c 'sleep 1000 & echo $!; sleep 1000' & echo $!; sleep 1000",
            "timeoutSeconds": 1
        }))
        .await;
    assert_eq!(out["timedOut"], true, "{out}");
    assert_eq!(out["signal"], 9);
    assert!(out["exitCode"].is_null());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "timeout took {:?}",
        started.elapsed()
    );
    let pids = pids_in(out["stdout"].as_str().unwrap());
    assert!(
        pids.len() >= 3,
        "expected the pids of the background jobs, got {out}"
    );
    let survivors = wait_dead(&pids, Duration::from_secs(10)).await;
    kill_pids(&survivors);
    assert!(
        survivors.is_empty(),
        "processes survived the timeout: {survivors:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_jobs_die_when_the_command_exits_and_do_not_hold_the_response() {
    let agent = Agent::start();
    let started = Instant::now();
    // The `&` job inherits stdout: without the group kill the response would wait for it.
    let out = agent.exec(json!({"command": "sleep 1000 & echo $!"})).await;
    assert_eq!(out["exitCode"], 0);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "exec waited for the background job: {:?}",
        started.elapsed()
    );
    let pids = pids_in(out["stdout"].as_str().unwrap());
    assert_eq!(pids.len(), 1);
    let survivors = wait_dead(&pids, Duration::from_secs(10)).await;
    kill_pids(&survivors);
    assert!(
        survivors.is_empty(),
        "background job survived: {survivors:?}"
    );

    // A process that left the group (its own session) keeps the pipe open; the agent stops reading
    // shortly after the command exited instead of hanging.
    let started = Instant::now();
    let out = agent
        .exec(json!({"command": "setsid sleep 1000 & echo $!"}))
        .await;
    let escaped = pids_in(out["stdout"].as_str().unwrap());
    kill_pids(&escaped);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "exec hung on an escaped process: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_kills_the_group() {
    let agent = Agent::start();
    for path in ["/v1/exec", "/v1/exec/stream"] {
        let pid_file = agent
            .root
            .path()
            .join(format!("pids{}", path.replace('/', "-")));
        let body = json!({"command": format!("sleep 1000 & echo $! > {}.tmp; echo $$ >> {}.tmp; mv {}.tmp {}; sleep 1000",
            pid_file.display(), pid_file.display(), pid_file.display(), pid_file.display())})
        .to_string();
        let mut stream = tokio::net::TcpStream::connect(agent.addr).await.unwrap();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !pid_file.exists() {
            assert!(Instant::now() < deadline, "command never started");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pids = pids_in(&std::fs::read_to_string(&pid_file).unwrap());
        assert_eq!(pids.len(), 2);
        assert!(pids.iter().all(|pid| alive(*pid)));
        drop(stream);
        let survivors = wait_dead(&pids, Duration::from_secs(10)).await;
        kill_pids(&survivors);
        assert!(
            survivors.is_empty(),
            "{path}: processes survived the disconnect: {survivors:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_output_is_capped_without_growing_memory() {
    let agent = Agent::start();
    let baseline = agent.peak_rss_kib();
    let started = Instant::now();
    let out = agent
        .exec(json!({"command": "head -c 400000000 /dev/zero; head -c 300000000 /dev/zero >&2; echo done >&2", "timeoutSeconds": 120}))
        .await;
    // Drained to the end within the command's time-out (how fast is `make bench-agent`'s business).
    eprintln!("700 MB of output drained in {:?}", started.elapsed());
    assert_eq!(out["timedOut"], false, "{}", out["stderr"]);
    assert_eq!(out["exitCode"], 0);
    assert_eq!(out["stdoutTruncated"], true);
    assert_eq!(out["stderrTruncated"], true);
    assert_eq!(out["stdout"].as_str().unwrap().len(), 4 * 1024 * 1024);
    assert_eq!(out["stderr"].as_str().unwrap().len(), 4 * 1024 * 1024);

    let out = agent
        .exec(json!({"command": "head -c 1000 /dev/zero | tr '\\0' a", "maxOutputBytes": 10}))
        .await;
    assert_eq!(
        (out["stdout"].as_str(), out["stdoutTruncated"].as_bool()),
        (Some("aaaaaaaaaa"), Some(true))
    );

    let peak = agent.peak_rss_kib();
    // Two 4 MiB captures plus their JSON copy; nowhere near the 700 MB printed.
    assert!(
        peak < baseline + 96 * 1024,
        "agent peak RSS grew from {baseline} KiB to {peak} KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_output_in_text_and_base64() {
    let agent = Agent::start();
    let out = agent
        .exec(json!({"command": "printf 'ok\\377\\376'; printf 'fine' >&2"}))
        .await;
    assert_eq!(out["stdout"], "ok\u{FFFD}\u{FFFD}");
    assert_eq!(
        (out["stdoutLossy"].as_bool(), out["stderrLossy"].as_bool()),
        (Some(true), Some(false))
    );

    let out = agent
        .exec(json!({"command": "printf 'ok\\377\\376'", "outputEncoding": "base64"}))
        .await;
    assert_eq!(out["outputEncoding"], "base64");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(out["stdout"].as_str().unwrap())
        .unwrap();
    assert_eq!(bytes, b"ok\xff\xfe");
    assert_eq!(out["stdoutLossy"], false);

    let out = agent
        .exec(json!({"command": "printf 'h\\303\\251llo \\342\\202\\254'"}))
        .await;
    assert_eq!(
        (out["stdout"].as_str(), out["stdoutLossy"].as_bool()),
        (Some("héllo €"), Some(false))
    );
}

async fn stream_events(agent: &Agent, body: Value) -> Vec<Value> {
    let response = agent
        .send(
            Method::POST,
            "/v1/exec/stream",
            full(body.to_string()),
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("bad event line {line:?}: {error}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_events_arrive_in_order() {
    let agent = Agent::start();
    let events = stream_events(
        &agent,
        json!({"command": "echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 3"}),
    )
    .await;
    assert_eq!(events.first().unwrap()["type"], "started");
    assert!(events[0]["pid"].as_u64().unwrap() > 1);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "exit");
    assert_eq!(
        (last["exitCode"].as_i64(), last["timedOut"].as_bool()),
        (Some(3), Some(false))
    );
    let chunks: Vec<(String, String)> = events[1..events.len() - 1]
        .iter()
        .map(|event| {
            (
                event["type"].as_str().unwrap().to_string(),
                event["data"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        chunks,
        vec![
            ("stdout".into(), "one\n".into()),
            ("stderr".into(), "two\n".into()),
            ("stdout".into(), "three\n".into())
        ]
    );

    let events = stream_events(&agent, json!({"command": "head -c 100000 /dev/zero", "maxOutputBytes": 1000, "outputEncoding": "base64"})).await;
    let last = events.last().unwrap();
    assert_eq!(last["stdoutTruncated"], true);
    let total: usize = events
        .iter()
        .filter(|event| event["type"] == "stdout")
        .map(|event| {
            base64::engine::general_purpose::STANDARD
                .decode(event["data"].as_str().unwrap())
                .unwrap()
                .len()
        })
        .sum();
    assert_eq!(total, 1000);

    let events = stream_events(
        &agent,
        json!({"command": "sleep 1000", "timeoutSeconds": 0.5}),
    )
    .await;
    assert_eq!(events.last().unwrap()["timedOut"], true);

    let events = stream_events(&agent, json!({"argv": ["no-such-program-abc"]})).await;
    let last = events.last().unwrap();
    assert_eq!(last["exitCode"], 127);
    assert!(last["error"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_environment_never_reaches_children() {
    let agent = crate::common::Agent::start_with(crate::common::AgentOptions {
        env: vec![
            ("ORCHARD_AGENT_MAX_CONCURRENT".into(), "100".into()),
            ("ORCHARD_AGENT_EXTRA".into(), "secret".into()),
        ],
        ..Default::default()
    });
    let out = agent.exec(json!({"argv": ["env"]})).await;
    let env = out["stdout"].as_str().unwrap();
    assert!(
        !env.contains("ORCHARD_AGENT_"),
        "agent settings leaked: {env}"
    );
    assert!(env.contains("PATH="));
    // Closing the response early is fine for the agent.
    let mut stream = tokio::net::TcpStream::connect(agent.addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = [0u8; 64];
    let read = stream.read(&mut buffer).await.unwrap();
    assert!(buffer[..read].starts_with(b"HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn total_output_budget_truncates_concurrent_execs() {
    // 64 KiB for everything; each command writes 40 KB, well under its own 4 MiB cap.
    let agent = crate::common::Agent::start_with(crate::common::AgentOptions {
        args: vec!["--max-output-bytes-total".into(), "64K".into()],
        ..crate::common::AgentOptions::default()
    });
    // The first one writes its 40 KB, gives the agent 0.5 s to read them, says so, and holds them
    // (its response is not sent) for 3 s more.
    let first = agent.exec(json!({
        "command": "head -c 40000 /dev/zero | tr '\\0' a; sleep 0.5; touch ready; sleep 3"
    }));
    let ready = agent.root.path().join("ready");
    let second = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !ready.exists() {
            assert!(
                Instant::now() < deadline,
                "the first command never got ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        agent
            .exec(json!({"command": "head -c 40000 /dev/zero | tr '\\0' b"}))
            .await
    };
    let (first, second) = tokio::join!(first, second);
    assert_eq!(first["stdout"].as_str().map(str::len), Some(40000));
    assert_eq!(first["stdoutTruncated"], false);
    assert_eq!(
        second["stdout"].as_str().map(str::len),
        Some(64 * 1024 - 40000),
        "the second gets what the budget has left"
    );
    assert_eq!(second["stdoutTruncated"], true);
    assert_eq!(second["exitCode"], 0, "truncation never fails the command");
    // Both responses arrived; the agent gives their bytes back when it drops the bodies it sent, a
    // moment later. Once it has, a 60 KB capture gets through whole: tried until it does (a budget
    // never given back would truncate it for ever).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let third = agent
            .exec(json!({"command": "head -c 60000 /dev/zero | tr '\\0' c"}))
            .await;
        if third["stdoutTruncated"] == false {
            assert_eq!(third["stdout"].as_str().map(str::len), Some(60000));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the budget was not given back: {third}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An exec's answer says its length (it is one JSON document, built whole): a client, or the
/// gateway in front of the agent, knows it has it all without reading a chunked stream, and the
/// gateway passes it on without watching it as a download of unknown length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_answer_has_a_content_length() {
    let agent = Agent::start();
    let response = agent
        .send(
            Method::POST,
            "/v1/exec",
            full(json!({"argv": ["echo", "hi"]}).to_string()),
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers.get("transfer-encoding"), None, "{headers:?}");
    let length: usize = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .expect("a Content-Length");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), length);
    let out: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(out["stdout"], "hi\n");
}
