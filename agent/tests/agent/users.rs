//! Running commands as another user: unknown users, the switch itself (when the tests run as root) for
//! exec, background processes and sessions, and the refusal of an agent that is not root.

use hyper::{Method, StatusCode};
use serde_json::json;

use crate::common::{Agent, AgentOptions};

const NOBODY: u32 = 65534;

fn running_as_root() -> bool {
    // SAFETY: plain syscall.
    unsafe { libc::geteuid() == 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_users_and_groups_are_bad_requests_everywhere() {
    let agent = Agent::start();
    for (path, body) in [
        (
            "/v1/exec",
            json!({"argv": ["true"], "user": "no-such-user"}),
        ),
        (
            "/v1/exec/stream",
            json!({"argv": ["true"], "user": "no-such-user"}),
        ),
        (
            "/v1/processes",
            json!({"argv": ["true"], "user": "no-such-user"}),
        ),
        ("/v1/sessions", json!({"user": "no-such-user"})),
        (
            "/v1/exec",
            json!({"argv": ["true"], "user": "0:no-such-group"}),
        ),
        ("/v1/exec", json!({"argv": ["true"], "user": "1000:"})),
    ] {
        let (status, error) = agent.json(Method::POST, path, body.clone()).await;
        assert_eq!(
            (status, error["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("BadRequest")),
            "{path} {body}: {error}"
        );
    }
    let (_, error) = agent
        .json(
            Method::POST,
            "/v1/exec",
            json!({"argv": ["true"], "user": "no-such-user"}),
        )
        .await;
    assert_eq!(
        error["message"],
        "no user `no-such-user` in the image's /etc/passwd"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_run_as_the_requested_user() {
    if !running_as_root() {
        eprintln!("skipped: switching users needs root");
        return;
    }
    let agent = Agent::start();
    let out = agent
        .exec(json!({"command": "id -u; id -g; id -G", "user": "65534", "cwd": "/"}))
        .await;
    assert_eq!(
        out["stdout"],
        format!("{NOBODY}\n{NOBODY}\n{NOBODY}\n"),
        "{out}"
    );
    let out = agent
        .exec(json!({"command": "id -u; id -g", "user": "4321:99", "cwd": "/"}))
        .await;
    assert_eq!(
        out["stdout"], "4321\n99\n",
        "an id that /etc/passwd does not know: {out}"
    );
    let out = agent
        .exec(json!({"command": "id -un; echo $HOME $USER", "user": "nobody", "cwd": "/"}))
        .await;
    assert_eq!(out["stdout"], "nobody\n/nonexistent nobody\n", "{out}");
    let out = agent
        .exec(json!({"command": "echo $HOME", "user": "nobody", "cwd": "/", "env": {"HOME": "/work"}}))
        .await;
    assert_eq!(out["stdout"], "/work\n", "the request's env wins: {out}");

    let (status, started) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "as-nobody", "argv": ["id", "-u"], "user": "65534", "cwd": "/"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    let (_, done) = agent.get("/v1/processes/as-nobody?wait=10").await;
    assert_eq!(done["stdout"], format!("{NOBODY}\n"), "{done}");

    let (status, session) = agent
        .json(
            Method::POST,
            "/v1/sessions",
            json!({"user": "65534", "cwd": "/"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().unwrap();
    let (_, result) = agent
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/run"),
            json!({"command": "id -u"}),
        )
        .await;
    assert_eq!(result["output"], format!("{NOBODY}\n"), "{result}");
    // The switch is real: root's files stay closed.
    let (_, result) = agent
        .json(
            Method::POST,
            &format!("/v1/sessions/{id}/run"),
            json!({"command": "cat /etc/shadow >/dev/null", "timeoutMs": 10_000}),
        )
        .await;
    assert_ne!(result["exitCode"], 0, "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_is_not_root_refuses_to_switch() {
    if !running_as_root() {
        eprintln!("skipped: starting the agent as another uid needs root");
        return;
    }
    let agent = Agent::start_with(AgentOptions {
        uid: Some(NOBODY),
        ..AgentOptions::default()
    });
    let (status, error) = agent
        .json(
            Method::POST,
            "/v1/exec",
            json!({"argv": ["id", "-u"], "user": "0"}),
        )
        .await;
    assert_eq!(
        (status, error["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("Forbidden")),
        "{error}"
    );
    assert!(
        error["message"].as_str().unwrap().contains("not root"),
        "{error}"
    );
    // Its own user needs no switch.
    let out = agent
        .exec(json!({"argv": ["id", "-u"], "user": "65534"}))
        .await;
    assert_eq!(out["stdout"], format!("{NOBODY}\n"), "{out}");
}
