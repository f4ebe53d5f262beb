//! Shell sessions: state carried between runs, prompts answered through input, time-outs that leave
//! the session usable, signals for the running command (interrupts), status during a run, bash and sh
//! (dash, busybox), unknown ids, overlapping runs, independence of sessions, the cap, and the end of
//! sessions on DELETE and at shutdown.

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{Agent, TempDir, alive, wait_dead};

async fn start_session(agent: &Agent, body: Value) -> String {
    let (status, created) = agent.json(Method::POST, "/v1/sessions", body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["state"], "running");
    created["id"].as_str().unwrap().to_string()
}

async fn run(agent: &Agent, id: &str, command: &str, timeout_ms: u64) -> Value {
    let (status, result) = agent
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/run"),
            json!({"command": command, "timeoutMs": timeout_ms}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{result}");
    result
}

async fn signal(agent: &Agent, id: &str, body: Value) -> Value {
    let (status, answer) = agent
        .json(Method::POST, &format!("/v1/sessions/{id}/signal"), body)
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer
}

/// Runs `command` (up to 120 s) and answers its result and when it came.
async fn timed_run(agent: &Agent, id: &str, command: &str) -> (Value, Instant) {
    let result = run(agent, id, command, 120_000).await;
    (result, Instant::now())
}

/// How long after a signal a run it interrupted may answer.
const PROMPTLY: Duration = Duration::from_secs(5);

/// Waits until the running command has printed `ready\n`, and a moment more (for what it starts next).
async fn wait_ready(agent: &Agent, id: &str) {
    wait_busy(agent, id).await;
    let (_, ready) = agent
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/read"),
            json!({"until": "ready\n", "timeoutMs": 60_000}),
        )
        .await;
    assert_eq!(ready["matched"], true, "{ready}");
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// Waits until the session shows a run in progress.
async fn wait_busy(agent: &Agent, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, session) = agent.get(&format!("/v1/sessions/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{session}");
        if session["busy"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run never started: {session}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The shells to test: bash, dash as `/bin/sh`, and busybox's ash (through a symlink named `sh`,
/// as busybox images have it) when busybox is installed.
fn shells(scratch: &TempDir) -> Vec<String> {
    let mut shells = vec!["bash".to_string(), "/bin/sh".to_string()];
    for busybox in ["/bin/busybox", "/usr/bin/busybox"] {
        if std::path::Path::new(busybox).exists() {
            let link = scratch.path().join("sh");
            std::os::unix::fs::symlink(busybox, &link).unwrap();
            shells.push(link.display().to_string());
            break;
        }
    }
    shells
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_carries_over_and_a_timeout_leaves_the_session_usable_in_every_shell() {
    let agent = Agent::start();
    let scratch = TempDir::new("shells");
    std::fs::create_dir_all(agent.root.path().join("sub/dir")).unwrap();
    for shell in shells(&scratch) {
        let id = start_session(&agent, json!({"shell": shell})).await;
        let result = run(&agent, &id, "cd sub/dir && export GREETING=hello", 10_000).await;
        assert_eq!(
            (result["exitCode"].as_i64(), &result["output"]),
            (Some(0), &json!("")),
            "{shell}: {result}"
        );
        run(&agent, &id, "shout() { echo \"$1!\"; }; COUNT=2", 10_000).await;
        let result = run(&agent, &id, "pwd; echo $GREETING $COUNT; shout hey", 10_000).await;
        let expected = format!(
            "{}\nhello 2\nhey!\n",
            agent.root.path().join("sub/dir").display()
        );
        assert_eq!(result["output"], expected.as_str(), "{shell}: {result}");

        let result = run(&agent, &id, "printf 'no newline'; (exit 7)", 10_000).await;
        assert_eq!(
            (result["output"].as_str(), result["exitCode"].as_i64()),
            (Some("no newline"), Some(7)),
            "{shell}"
        );
        let result = run(&agent, &id, "echo out; echo err >&2", 10_000).await;
        assert_eq!(result["output"], "out\nerr\n", "{shell}: {result}");
        let result = run(&agent, &id, "if then", 10_000).await;
        assert!(
            result["output"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("syntax error"),
            "{shell}: {result}"
        );
        assert_ne!(
            result["exitCode"], 0,
            "a syntax error is a failed run: {result}"
        );

        let started = Instant::now();
        let result = run(&agent, &id, "echo before; sleep 1000; echo after", 1_000).await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{shell}: {:?}",
            started.elapsed()
        );
        assert_eq!(result["timedOut"], true, "{shell}: {result}");
        assert_eq!(result["exitCode"], 130, "{shell}: {result}");
        assert_eq!(result["output"], "before\n", "{shell}: {result}");
        assert_eq!(result["shellRestarted"], false, "{shell}: {result}");

        let result = run(&agent, &id, "echo $GREETING; pwd", 10_000).await;
        assert_eq!(
            result["output"],
            format!("hello\n{}\n", agent.root.path().join("sub/dir").display()),
            "{shell}: {result}"
        );
        assert_eq!(result["timedOut"], false);

        // A loop is aborted as a whole, not just its current command.
        let result = run(&agent, &id, "while true; do sleep 1; done", 500).await;
        assert_eq!(
            (result["timedOut"].as_bool(), result["exitCode"].as_i64()),
            (Some(true), Some(130)),
            "{shell}: {result}"
        );
        assert_eq!(
            run(&agent, &id, "echo fine", 10_000).await["output"],
            "fine\n",
            "{shell}"
        );
        let (status, _) = agent
            .json(Method::DELETE, &format!("/v1/sessions/{id}"), Value::Null)
            .await;
        assert_eq!(status, StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_is_answered_through_input() {
    let agent = Agent::start();
    for shell in ["bash", "/bin/sh"] {
        let id = start_session(&agent, json!({"shell": shell})).await;
        let command = "printf 'name? '; read x; echo \"got $x\"";
        let running = run(&agent, &id, command, 20_000);
        let answer = async {
            let (status, prompt) = agent
                .json(
                    Method::POST,
                    &format!("/v1/sessions/{id}/read"),
                    json!({"until": "name? ", "timeoutMs": 10_000}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{prompt}");
            assert_eq!(
                (prompt["output"].as_str(), prompt["matched"].as_bool()),
                (Some("name? "), Some(true)),
                "{shell}"
            );
            // A run is in progress: a second one is refused.
            let (status, busy) = agent
                .json(
                    Method::POST,
                    &format!("/v1/sessions/{id}/run"),
                    json!({"command": "true"}),
                )
                .await;
            assert_eq!(
                (status, busy["code"].as_str()),
                (StatusCode::CONFLICT, Some("Conflict")),
                "{busy}"
            );
            let (_, listed) = agent.get(&format!("/v1/sessions/{id}")).await;
            assert_eq!(listed["busy"], true);
            let (status, _) = agent
                .json(
                    Method::POST,
                    &format!("/v1/sessions/{id}/input"),
                    json!({"text": "bob\n"}),
                )
                .await;
            assert_eq!(status, StatusCode::OK);
        };
        let (result, ()) = tokio::join!(running, answer);
        assert_eq!(result["output"], "name? got bob\n", "{shell}: {result}");
        assert_eq!(result["exitCode"], 0);

        // A read that does not find its text returns what there is when it gives up: here the
        // ended run's output that no read returned.
        let started = Instant::now();
        let (_, read) = agent
            .json(
                Method::POST,
                &format!("/v1/sessions/{id}/read"),
                json!({"until": "never", "timeoutMs": 300}),
            )
            .await;
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(
            (read["output"].as_str(), read["matched"].as_bool()),
            (Some("got bob\n"), Some(false)),
            "{shell}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_ids_are_404_and_bad_requests_are_refused() {
    let agent = Agent::start();
    for (method, path, body) in [
        (Method::GET, "/v1/sessions/s-nope", Value::Null),
        (Method::DELETE, "/v1/sessions/s-nope", Value::Null),
        (
            Method::POST,
            "/v1/sessions/s-nope/run",
            json!({"command": "true"}),
        ),
        (
            Method::POST,
            "/v1/sessions/s-nope/input",
            json!({"text": "x"}),
        ),
        (Method::POST, "/v1/sessions/s-nope/read", json!({})),
        (Method::POST, "/v1/sessions/s-nope/signal", json!({})),
    ] {
        let (status, error) = agent.json(method, path, body).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("NotFound")),
            "{path}"
        );
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("no session with id `s-nope`"),
            "{error}"
        );
    }
    let (status, error) = agent
        .json(
            Method::POST,
            "/v1/sessions",
            json!({"shell": "/no/such/shell"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    let (status, _) = agent
        .json(Method::POST, "/v1/sessions", json!({"cwd": "/no/such/dir"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = agent
        .json(Method::POST, "/v1/sessions", json!({"bogus": 1}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let id = start_session(&agent, json!({})).await;
    let (status, _) = agent
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/run"),
            json!({"command": "true", "timeoutMs": 0}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = agent
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/read"),
            json!({"until": ""}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_independent_and_run_concurrently() {
    let agent = Agent::start();
    let first = start_session(&agent, json!({"env": {"WHO": "first"}})).await;
    let second = start_session(&agent, json!({"env": {"WHO": "second"}, "cwd": "/tmp"})).await;
    run(&agent, &first, "X=1; cd /", 10_000).await;
    run(&agent, &second, "X=2", 10_000).await;
    let started = Instant::now();
    let (a, b) = tokio::join!(
        run(&agent, &first, "sleep 1; echo $WHO $X $(pwd)", 10_000),
        run(&agent, &second, "sleep 1; echo $WHO $X $(pwd)", 10_000),
    );
    assert!(
        started.elapsed() < Duration::from_millis(1900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(a["output"], "first 1 /\n");
    assert_eq!(b["output"], "second 2 /tmp\n");
    let (_, list) = agent.get("/v1/sessions").await;
    let ids: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![first.as_str(), second.as_str()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_ends_the_session_and_delete_kills_the_shell() {
    let agent = Agent::start();
    let id = start_session(&agent, json!({})).await;
    let result = run(&agent, &id, "echo bye; exit 3", 10_000).await;
    assert_eq!(
        (
            result["output"].as_str(),
            result["exitCode"].as_i64(),
            result["shellExited"].as_bool()
        ),
        (Some("bye\n"), Some(3), Some(true)),
        "{result}"
    );
    let (status, error) = agent
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/run"),
            json!({"command": "true"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("has exited with code 3"),
        "{error}"
    );
    let (_, ended) = agent.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(
        (ended["state"].as_str(), ended["exitCode"].as_i64()),
        (Some("exited"), Some(3))
    );

    let id = start_session(&agent, json!({})).await;
    let result = run(&agent, &id, "sleep 300 & echo $!", 10_000).await;
    let background: u32 = result["output"].as_str().unwrap().trim().parse().unwrap();
    let (_, status) = agent.get(&format!("/v1/sessions/{id}")).await;
    let shell = status["pid"].as_u64().unwrap() as u32;
    assert!(alive(shell) && alive(background));
    let (status, deleted) = agent
        .json(Method::DELETE, &format!("/v1/sessions/{id}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(deleted["state"], "exited");
    assert!(
        wait_dead(&[shell, background], Duration::from_secs(5))
            .await
            .is_empty()
    );
    let (status, _) = agent.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_cannot_be_interrupted_gets_a_fresh_shell() {
    let agent = Agent::start();
    let id = start_session(&agent, json!({})).await;
    run(&agent, &id, "KEPT=yes", 10_000).await;
    let result = run(
        &agent,
        &id,
        "echo spinning; trap '' INT; while :; do :; done",
        500,
    )
    .await;
    assert_eq!(
        (
            result["timedOut"].as_bool(),
            result["shellRestarted"].as_bool()
        ),
        (Some(true), Some(true)),
        "{result}"
    );
    assert_eq!(result["output"], "spinning\n");
    let result = run(&agent, &id, "echo \"kept=$KEPT\"", 10_000).await;
    assert_eq!(result["output"], "kept=\n", "a fresh shell: {result}");

    // A command that ignores SIGINT in a child is killed, and the shell stays.
    run(&agent, &id, "KEPT=again", 10_000).await;
    let result = run(&agent, &id, "sh -c 'trap \"\" INT; sleep 1000'", 500).await;
    assert_eq!(
        (
            result["timedOut"].as_bool(),
            result["shellRestarted"].as_bool()
        ),
        (Some(true), Some(false)),
        "{result}"
    );
    assert_eq!(
        run(&agent, &id, "echo $KEPT", 10_000).await["output"],
        "again\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_capped_and_sessions_are_capped() {
    let agent = Agent::start();
    let id = start_session(&agent, json!({"maxOutputBytes": 10})).await;
    let result = run(&agent, &id, "seq 1 10000; echo done", 10_000).await;
    assert_eq!(
        (
            result["output"].as_str(),
            result["outputTruncated"].as_bool()
        ),
        (Some("1\n2\n3\n4\n5\n"), Some(true)),
        "{result}"
    );
    assert_eq!(result["exitCode"], 0);
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/sessions",
            json!({"maxOutputBytes": 1u64 << 40}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let mut pids = Vec::new();
    for _ in 1..64 {
        let (status, created) = agent
            .json(Method::POST, "/v1/sessions", json!({"shell": "/bin/sh"}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        pids.push(created["pid"].as_u64().unwrap() as u32);
    }
    let (status, refused) = agent.json(Method::POST, "/v1/sessions", json!({})).await;
    assert_eq!(
        (status, refused["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("TooManyRequests"))
    );
    // Shutdown ends every session.
    drop(agent);
    assert!(wait_dead(&pids, Duration::from_secs(5)).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_stops_the_running_command_and_the_session_carries_on() {
    let agent = Agent::start();
    let scratch = TempDir::new("shells");
    for shell in shells(&scratch) {
        let id = start_session(&agent, json!({"shell": shell})).await;
        run(&agent, &id, "KEPT=yes", 10_000).await;
        let python = run(
            &agent,
            &id,
            "command -v python3 >/dev/null && echo yes",
            10_000,
        )
        .await;
        // Each command prints its first line once it runs: the interrupt comes after it.
        let mut commands = vec![
            "echo ready; sleep 100; echo after",
            "echo ready; yes | head -c 100000000000 | wc -c",
            "echo ready; while true; do sleep 1; done",
        ];
        if python["output"] == "yes\n" {
            commands.push("python3 -c 'print(\"ready\", flush=True)\nwhile True: pass'");
        }
        for command in commands {
            let interrupt = async {
                wait_ready(&agent, &id).await;
                let signalled = Instant::now();
                let answer = signal(&agent, &id, json!({})).await;
                assert_eq!(answer["running"], true, "{shell} {command}: {answer}");
                assert_eq!(
                    (
                        answer["session"]["id"].as_str(),
                        answer["session"]["state"].as_str()
                    ),
                    (Some(id.as_str()), Some("running")),
                    "{answer}"
                );
                signalled
            };
            let ((result, ended), signalled) =
                tokio::join!(timed_run(&agent, &id, command), interrupt);
            let took = ended - signalled;
            assert!(took < PROMPTLY, "{shell} {command}: {took:?}");
            assert_eq!(
                (
                    result["exitCode"].as_i64(),
                    result["timedOut"].as_bool(),
                    result["shellRestarted"].as_bool(),
                ),
                (Some(130), Some(false), Some(false)),
                "{shell} {command}: {result}"
            );
            // Python prints its KeyboardInterrupt traceback; the others print nothing more.
            let output = result["output"].as_str().unwrap();
            assert!(output.starts_with("ready\n"), "{shell} {command}: {result}");
            assert!(!output.contains("after"), "{shell} {command}: {result}");
            assert_eq!(
                run(&agent, &id, "echo ok $KEPT", 10_000).await["output"],
                "ok yes\n",
                "{shell} {command}: the same shell runs the next command"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_during_a_run_says_busy() {
    let agent = Agent::start();
    let id = start_session(&agent, json!({})).await;
    let polls = async {
        wait_busy(&agent, &id).await;
        for _ in 0..20 {
            let (status, session) = agent.get(&format!("/v1/sessions/{id}")).await;
            assert_eq!(
                (status, session["busy"].as_bool()),
                (StatusCode::OK, Some(true)),
                "{session}"
            );
            let (status, list) = agent.get("/v1/sessions").await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(list["sessions"][0]["busy"], true, "{list}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (result, ()) = tokio::join!(run(&agent, &id, "sleep 1.5; echo done", 10_000), polls);
    assert_eq!(result["output"], "done\n");
    let (_, session) = agent.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(session["busy"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_signals_reach_the_command_but_neither_the_shell_nor_its_earlier_jobs() {
    let agent = Agent::start();
    let scratch = TempDir::new("shells");
    for shell in shells(&scratch) {
        let id = start_session(&agent, json!({"shell": shell})).await;
        run(&agent, &id, "KEPT=yes", 10_000).await;
        let started = run(&agent, &id, "sleep 300 & echo $!", 10_000).await;
        let job: u32 = started["output"].as_str().unwrap().trim().parse().unwrap();

        // SIGINT is ignored by this command; SIGKILL then stops it, and the shell's trap of the
        // SIGINT it got abandons the rest of the command line.
        let command = "sh -c 'trap \"\" INT; echo ready; sleep 1000'; echo after";
        let escalate = async {
            wait_ready(&agent, &id).await;
            assert_eq!(signal(&agent, &id, json!({})).await["running"], true);
            tokio::time::sleep(Duration::from_millis(700)).await;
            let (_, session) = agent.get(&format!("/v1/sessions/{id}")).await;
            assert_eq!(session["busy"], true, "{shell}: SIGINT is ignored");
            let signalled = Instant::now();
            let answer = signal(&agent, &id, json!({"signal": "SIGKILL"})).await;
            assert_eq!(answer["running"], true, "{answer}");
            signalled
        };
        let ((result, ended), signalled) = tokio::join!(timed_run(&agent, &id, command), escalate);
        assert!(
            ended - signalled < PROMPTLY,
            "{shell}: {:?}",
            ended - signalled
        );
        assert_eq!(
            (
                result["exitCode"].as_i64(),
                result["shellRestarted"].as_bool()
            ),
            (Some(130), Some(false)),
            "{shell}: {result}"
        );
        // dash reports the kill ("Killed"), bash does not.
        assert!(
            !result["output"].as_str().unwrap().contains("after"),
            "{shell}: {result}"
        );

        // Without an interrupt first, the shell carries on after its child died of the signal.
        let terminate = async {
            wait_ready(&agent, &id).await;
            let answer = signal(&agent, &id, json!({"signal": 15})).await;
            assert_eq!(answer["running"], true, "{answer}");
        };
        let ((result, _), ()) = tokio::join!(
            timed_run(&agent, &id, "echo ready; sleep 1000; echo after $?"),
            terminate
        );
        assert_eq!(result["exitCode"], 0, "{shell}: {result}");
        assert!(
            result["output"].as_str().unwrap().ends_with("after 143\n"),
            "{shell}: {result}"
        );

        assert!(alive(job), "{shell}: the earlier `&` job is left alone");
        let (_, session) = agent.get(&format!("/v1/sessions/{id}")).await;
        assert_eq!(session["state"], "running");
        assert_eq!(
            run(&agent, &id, "echo $KEPT", 10_000).await["output"],
            "yes\n",
            "{shell}: the same shell"
        );
        agent
            .json(Method::DELETE, &format!("/v1/sessions/{id}"), Value::Null)
            .await;
        assert!(wait_dead(&[job], Duration::from_secs(5)).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_with_nothing_running_is_a_no_op_and_bad_signals_are_refused() {
    let agent = Agent::start();
    let id = start_session(&agent, json!({})).await;
    for body in [
        json!({}),
        json!({"signal": "SIGINT"}),
        json!({"signal": "KILL"}),
        json!({"signal": 9}),
    ] {
        let answer = signal(&agent, &id, body.clone()).await;
        assert_eq!(
            (
                answer["running"].as_bool(),
                answer["session"]["busy"].as_bool(),
                answer["session"]["state"].as_str()
            ),
            (Some(false), Some(false), Some("running")),
            "{body}: {answer}"
        );
    }
    let result = run(&agent, &id, "echo ok", 10_000).await;
    assert_eq!(
        (result["output"].as_str(), result["exitCode"].as_i64()),
        (Some("ok\n"), Some(0)),
        "the idle shell got nothing: {result}"
    );
    for (body, expected) in [
        (json!({"signal": "BOGUS"}), StatusCode::BAD_REQUEST),
        (json!({"signal": 0}), StatusCode::BAD_REQUEST),
        (json!({"signal": 65}), StatusCode::BAD_REQUEST),
        (json!({"sig": "INT"}), StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let (status, error) = agent
            .json(
                Method::POST,
                &format!("/v1/sessions/{id}/signal"),
                body.clone(),
            )
            .await;
        assert_eq!(status, expected, "{body}: {error}");
    }
    run(&agent, &id, "exit 2", 10_000).await;
    let (status, error) = agent
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/signal"),
            json!({}),
        )
        .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (StatusCode::CONFLICT, Some("Conflict")),
        "{error}"
    );
}
