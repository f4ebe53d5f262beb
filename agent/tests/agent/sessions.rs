//! Shell sessions: state carried between runs, prompts answered through input, time-outs that leave
//! the session usable, bash and sh (dash, busybox), unknown ids, overlapping runs, independence of
//! sessions, the cap, and the end of sessions on DELETE and at shutdown.

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
