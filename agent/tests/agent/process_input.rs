//! Stdin and terminals of background processes: `cat` through a kept stdin pipe, closing it, `tty` and
//! `stty` on a pseudo-terminal, resizing it, and the refusals.

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::Agent;

/// Polls the process until `done` accepts its status (or 10 s pass).
async fn wait_for(agent: &Agent, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, status) = agent.get(&format!("/v1/processes/{id}")).await;
        if done(&status) || Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn stdin(agent: &Agent, id: &str, body: Value) -> (StatusCode, Value) {
    agent
        .json(Method::POST, &format!("/v1/processes/{id}/stdin"), body)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cat_echoes_a_kept_stdin_and_exits_when_it_closes() {
    let agent = Agent::start();
    let (status, started) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "cat", "argv": ["cat"], "keepStdin": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    assert_eq!(started["stdinOpen"], true);
    let (status, _) = stdin(&agent, "cat", json!({"data": "hello\n"})).await;
    assert_eq!(status, StatusCode::OK);
    let echoed = wait_for(&agent, "cat", |status| status["stdout"] == "hello\n").await;
    assert_eq!(echoed["stdout"], "hello\n", "{echoed}");
    assert_eq!(echoed["state"], "running");
    let (status, _) = stdin(&agent, "cat", json!({"dataBase64": "AP8K", "close": true})).await;
    assert_eq!(status, StatusCode::OK);
    let (_, done) = agent.get("/v1/processes/cat?wait=10").await;
    assert_eq!(
        (done["state"].as_str(), done["exitCode"].as_i64()),
        (Some("exited"), Some(0)),
        "{done}"
    );
    assert!(done.get("stdinOpen").is_none(), "closed: {done}");
    let (status, error) = stdin(&agent, "cat", json!({"data": "more"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");

    // Without keepStdin there is no stdin to write to.
    agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "plain", "argv": ["sleep", "5"]}),
        )
        .await;
    let (status, error) = stdin(&agent, "plain", json!({"data": "x"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("keepStdin"),
        "{error}"
    );
    let (status, _) = stdin(&agent, "nope", json!({"data": "x"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = stdin(&agent, "plain", json!({"data": "x", "dataBase64": "eA=="})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/processes/plain/resize",
            json!({"rows": 10, "cols": 10}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "no terminal");
    agent
        .json(Method::DELETE, "/v1/processes/plain", Value::Null)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_on_a_terminal_sees_it_and_its_size() {
    let agent = Agent::start();
    let (status, started) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "tty", "argv": ["tty"], "pty": {"rows": 24, "cols": 80}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    assert_eq!(started["pty"], true);
    let (_, done) = agent.get("/v1/processes/tty?wait=10").await;
    assert_eq!(done["exitCode"], 0, "{done}");
    assert!(
        done["stdout"].as_str().unwrap().starts_with("/dev/pts/"),
        "{done}"
    );

    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "size", "command": "stty size; read line; stty size; echo \"got $line\"", "pty": {"rows": 24, "cols": 80}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    wait_for(&agent, "size", |status| {
        status["stdout"]
            .as_str()
            .is_some_and(|out| out.contains("24 80"))
    })
    .await;
    let (status, resized) = agent
        .json(
            Method::POST,
            "/v1/processes/size/resize",
            json!({"rows": 40, "cols": 132}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{resized}");
    let (status, _) = stdin(&agent, "size", json!({"data": "typed\n"})).await;
    assert_eq!(status, StatusCode::OK);
    let (_, done) = agent.get("/v1/processes/size?wait=10").await;
    let output = done["stdout"].as_str().unwrap();
    assert!(
        output.contains("24 80") && output.contains("40 132") && output.contains("got typed"),
        "{done}"
    );
    assert_eq!(done["exitCode"], 0);

    // Ctrl-D ends `cat` on a terminal.
    agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "tcat", "argv": ["cat"], "pty": {"rows": 24, "cols": 80}}),
        )
        .await;
    let (status, _) = stdin(&agent, "tcat", json!({"data": "", "close": true})).await;
    assert_eq!(status, StatusCode::OK);
    let (_, done) = agent.get("/v1/processes/tcat?wait=10").await;
    assert_eq!(
        (done["state"].as_str(), done["exitCode"].as_i64()),
        (Some("exited"), Some(0)),
        "{done}"
    );

    for body in [
        json!({"argv": ["tty"], "pty": {"rows": 0, "cols": 80}}),
        json!({"argv": ["tty"], "pty": {"rows": 24}}),
        json!({"argv": ["cat"], "keepStdin": true, "stdin": "x"}),
    ] {
        let (status, error) = agent
            .json(Method::POST, "/v1/processes", body.clone())
            .await;
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {status} {error}"
        );
    }
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/exec",
            json!({"argv": ["tty"], "pty": {"rows": 24, "cols": 80}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "processes only");
}
