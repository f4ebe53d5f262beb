//! Background processes: start, id conflicts, list, long-poll, signals, delete, timeout, startup command.

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{Agent, AgentOptions, alive, kill_pids, wait_dead};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_with_conflict_list_and_long_poll() {
    let agent = Agent::start();
    let (status, created) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "runner-1", "command": "echo started; sleep 1; echo done"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        (created["id"].as_str(), created["state"].as_str()),
        (Some("runner-1"), Some("running"))
    );
    assert!(created["pid"].as_u64().unwrap() > 1);
    assert!(created["startedAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(created["command"], "echo started; sleep 1; echo done");

    let (status, conflict) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "runner-1", "argv": ["true"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(conflict["code"], "Conflict");
    assert_eq!(conflict["process"]["id"], "runner-1");
    assert_eq!(conflict["process"]["pid"], created["pid"]);

    let (status, generated) = agent
        .json(Method::POST, "/v1/processes", json!({"argv": ["true"]}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let generated_id = generated["id"].as_str().unwrap().to_string();

    let (_, list) = agent.get("/v1/processes").await;
    let ids: Vec<&str> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|process| process["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["runner-1", generated_id.as_str()]);
    let (_, short) = agent.get("/v1/processes?output=false").await;
    assert!(short["processes"][0].get("stdout").is_none());

    let started = Instant::now();
    let (status, finished) = agent.get("/v1/processes/runner-1?wait=60").await;
    assert_eq!(status, StatusCode::OK);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(finished["state"], "exited", "{finished}");
    assert_eq!(finished["exitCode"], 0);
    assert_eq!(finished["stdout"], "started\ndone\n");
    assert!(finished["finishedAt"].is_string());
    assert!(finished["durationMs"].as_u64().unwrap() >= 900);

    // A wait on an exited process returns at once.
    let started = Instant::now();
    agent.get("/v1/processes/runner-1?wait=100").await;
    assert!(started.elapsed() < Duration::from_secs(5));

    for path in ["/v1/processes/nope", "/v1/processes/nope?wait=1"] {
        let (status, error) = agent.get(path).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("NotFound"))
        );
    }
    let (status, _) = agent
        .json(Method::DELETE, "/v1/processes/nope", Value::Null)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/processes/nope/signal",
            json!({"signal": "TERM"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_delete_and_timeout() {
    let agent = Agent::start();
    // A shell that traps TERM shows the signal reached it; a background job shows the whole group gets it.
    let (_, created) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "trap", "command": "trap 'echo got-term; exit 42' TERM; sleep 1000 & echo $! > bg.pid; while true; do sleep 0.1; done"}),
        )
        .await;
    let pid = created["pid"].as_u64().unwrap() as u32;
    let bg_file = agent.root.path().join("bg.pid");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&bg_file)
        .map(|text| text.trim().is_empty())
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let background: u32 = std::fs::read_to_string(&bg_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (status, signalled) = agent
        .json(
            Method::POST,
            "/v1/processes/trap/signal",
            json!({"signal": "TERM"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{signalled}");
    let (_, finished) = agent.get("/v1/processes/trap?wait=30").await;
    assert_eq!(finished["exitCode"], 42, "{finished}");
    assert_eq!(finished["stdout"], "got-term\n");
    let survivors = wait_dead(&[pid, background], Duration::from_secs(10)).await;
    kill_pids(&survivors);
    assert!(survivors.is_empty(), "{survivors:?}");

    let (status, error) = agent
        .json(
            Method::POST,
            "/v1/processes/trap/signal",
            json!({"signal": 15}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    let (status, error) = agent
        .json(
            Method::POST,
            "/v1/processes/trap/signal",
            json!({"signal": "BOGUS"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");

    // Numeric signals and STOP/CONT.
    agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "sleeper", "argv": ["sleep", "1000"]}),
        )
        .await;
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/processes/sleeper/signal",
            json!({"signal": "STOP"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = agent
        .json(
            Method::POST,
            "/v1/processes/sleeper/signal",
            json!({"signal": "CONT"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    // DELETE kills a running process and forgets it.
    let (_, sleeper) = agent.get("/v1/processes/sleeper").await;
    let sleeper_pid = sleeper["pid"].as_u64().unwrap() as u32;
    let (status, deleted) = agent
        .json(Method::DELETE, "/v1/processes/sleeper", Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (deleted["state"].as_str(), deleted["signal"].as_i64()),
        (Some("exited"), Some(9)),
        "{deleted}"
    );
    assert!(
        wait_dead(&[sleeper_pid], Duration::from_secs(10))
            .await
            .is_empty()
    );
    assert_eq!(
        agent.get("/v1/processes/sleeper").await.0,
        StatusCode::NOT_FOUND
    );

    // The agent-side timeout kills the group and says so.
    let (_, _) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "slow", "command": "sleep 1000", "timeoutSeconds": 0.5}),
        )
        .await;
    let (_, slow) = agent.get("/v1/processes/slow?wait=30").await;
    assert_eq!(
        (slow["timedOut"].as_bool(), slow["signal"].as_i64()),
        (Some(true), Some(9)),
        "{slow}"
    );

    // A missing program is recorded like exec reports it.
    let (status, missing) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "missing", "argv": ["no-such-program-q"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        (missing["state"].as_str(), missing["exitCode"].as_i64()),
        (Some("exited"), Some(127))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_command_runs_at_boot() {
    let agent = Agent::start_with(AgentOptions {
        env: vec![(
            "ORCHARD_AGENT_STARTUP".into(),
            r#"{"command": "echo booted; sleep 1000"}"#.into(),
        )],
        ..AgentOptions::default()
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, startup) = agent.get("/v1/processes/startup").await;
        assert_eq!(status, StatusCode::OK, "{startup}");
        assert_eq!(startup["state"], "running");
        if startup["stdout"] == "booted\n" {
            let pid = startup["pid"].as_u64().unwrap() as u32;
            assert!(alive(pid));
            break;
        }
        assert!(Instant::now() < deadline, "{startup}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_is_for_processes_and_budgets_their_output() {
    let agent = Agent::start_with(AgentOptions {
        args: vec!["--max-output-bytes-total".into(), "10K".into()],
        ..AgentOptions::default()
    });
    let (status, error) = agent
        .json(
            Method::POST,
            "/v1/exec",
            json!({"argv": ["true"], "keep": true}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    let (status, created) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "kept", "command": "head -c 30000 /dev/zero | tr '\\0' k", "keep": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (_, done) = agent.get("/v1/processes/kept?wait=10").await;
    assert_eq!(done["state"], "exited", "{done}");
    assert_eq!(done["stdout"].as_str().map(str::len), Some(10 * 1024));
    assert_eq!(done["stdoutTruncated"], true);
    // Its output holds the whole budget until it is deleted.
    let out = agent.exec(json!({"command": "echo hi"})).await;
    assert_eq!(
        (&out["stdout"], &out["stdoutTruncated"]),
        (&json!(""), &json!(true))
    );
    let (status, _) = agent
        .json(Method::DELETE, "/v1/processes/kept", Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK);
    let out = agent.exec(json!({"command": "echo hi"})).await;
    assert_eq!(out["stdout"], "hi\n");
}
