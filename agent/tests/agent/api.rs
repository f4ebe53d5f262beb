//! Authentication, health, routing and request-validation errors.

use hyper::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{Agent, AgentOptions, TOKEN, full};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_needs_no_token_and_v1_does() {
    let agent = Agent::start();
    let (status, health) = agent.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health["status"], "ok");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"));

    let body = || full(json!({"argv": ["true"]}).to_string());
    for token in [None, Some("wrong"), Some(&TOKEN[..TOKEN.len() - 1])] {
        let response = agent.send(Method::POST, "/v1/exec", body(), token).await;
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "token {token:?}"
        );
        let bytes = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        let error: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(error["code"], "Unauthorized");
    }
    for path in ["/v1/processes", "/v1/files/list?path=.", "/v1/files?path=x"] {
        let response = agent.send(Method::GET, path, full(""), None).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let response = agent
        .send(Method::POST, "/v1/exec", body(), Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_everything_is_open() {
    let agent = Agent::start_with(AgentOptions {
        with_token: false,
        ..AgentOptions::default()
    });
    let response = agent
        .send(
            Method::POST,
            "/v1/exec",
            full(json!({"argv": ["true"]}).to_string()),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_json_errors() {
    let agent = Agent::start_with(AgentOptions {
        args: vec!["--max-body-bytes".into(), "64K".into()],
        ..AgentOptions::default()
    });
    let cases: Vec<(&str, Vec<u8>, StatusCode, &str, &str)> = vec![
        (
            "/v1/exec",
            b"{\"argv\": [".to_vec(),
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "malformed JSON",
        ),
        (
            "/v1/exec",
            b"".to_vec(),
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "empty",
        ),
        (
            "/v1/exec",
            br#"{"argv":["true"],"tiemout":1}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "InvalidRequest",
            "unknown field `tiemout`",
        ),
        (
            "/v1/exec",
            br#"{"cwd":"/"}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "InvalidRequest",
            "argv",
        ),
        (
            "/v1/exec",
            br#"{"argv":"true"}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "InvalidRequest",
            "invalid type",
        ),
        (
            "/v1/exec",
            br#"{"argv":["true"],"cwd":"/no/such/dir"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "InvalidCwd",
            "/no/such/dir",
        ),
        (
            "/v1/patch",
            br#"{"patch":"x","strip":1,"extra":true}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "InvalidRequest",
            "unknown field `extra`",
        ),
        (
            "/v1/processes",
            br#"{"id":"bad id","argv":["true"]}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "invalid process id",
        ),
    ];
    for (path, body, status, code, needle) in cases {
        let (got, bytes) = agent.call(Method::POST, path, body.clone()).await;
        let error: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            got,
            status,
            "{path} {}: {error}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(error["code"], code, "{error}");
        assert!(
            error["message"].as_str().unwrap().contains(needle),
            "{error}"
        );
    }

    // Bodies over the JSON limit are refused with 413, whether or not Content-Length announces them.
    let huge = json!({"argv": ["true"], "stdin": "x".repeat(100_000)}).to_string();
    let (status, bytes) = agent.call(Method::POST, "/v1/exec", huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        serde_json::from_slice::<Value>(&bytes).unwrap()["code"],
        "PayloadTooLarge"
    );

    // Wrong media type, unknown route, wrong method: JSON too.
    let request = hyper::Request::builder()
        .method(Method::POST)
        .uri(agent.url("/v1/exec"))
        .header("Authorization", format!("Bearer {TOKEN}"))
        .header("Content-Type", "text/plain")
        .body(full("{}"))
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (status, error) = agent.get("/v1/nope").await;
    assert_eq!(
        (status, error["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("NotFound"))
    );
    let (status, error) = agent.json(Method::DELETE, "/v1/exec", Value::Null).await;
    assert_eq!(
        (status, error["code"].as_str()),
        (StatusCode::METHOD_NOT_ALLOWED, Some("MethodNotAllowed"))
    );

    // The agent survived all of it.
    assert_eq!(agent.exec(json!({"argv": ["true"]})).await["exitCode"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_body_at_the_default_limit_is_413() {
    let agent = Agent::start();
    let huge = json!({"argv": ["true"], "stdin": "x".repeat(17 * 1024 * 1024)}).to_string();
    let (status, _) = agent.call(Method::POST, "/v1/exec", huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_execs_do_not_serialize() {
    // 32 commands that each wait until all 32 have started: run one after another, the first would
    // wait for the others until its time-out. No clock is read.
    let agent = std::sync::Arc::new(Agent::start());
    let barrier = agent.root.path().join("barrier");
    std::fs::create_dir_all(&barrier).unwrap();
    let mut tasks = Vec::new();
    for i in 0..32 {
        let agent = std::sync::Arc::clone(&agent);
        let command = format!(
            "touch {dir}/{i}; while [ $(ls {dir} | wc -l) -lt 32 ]; do sleep 0.05; done",
            dir = barrier.display()
        );
        tasks.push(tokio::spawn(async move {
            agent
                .exec(json!({"command": command, "timeoutSeconds": 60}))
                .await
        }));
    }
    for task in tasks {
        let out = task.await.unwrap();
        assert_eq!(
            (out["exitCode"].as_i64(), out["timedOut"].as_bool()),
            (Some(0), Some(false)),
            "a command waited for the others until its time-out: {out}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_concurrency_cap_is_429_immediately() {
    let agent = std::sync::Arc::new(Agent::start_with(AgentOptions {
        args: vec!["--max-concurrent".into(), "2".into()],
        ..AgentOptions::default()
    }));
    let mut slow = Vec::new();
    for index in 0..2 {
        let agent = std::sync::Arc::clone(&agent);
        let marker = agent.root.path().join(format!("running-{index}"));
        let command = format!("touch {}; sleep 3", marker.display());
        slow.push(tokio::spawn(async move {
            agent.exec(json!({"command": command})).await
        }));
    }
    // Wait until both are in flight.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(0..2).all(|index| agent.root.path().join(format!("running-{index}")).exists()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the two slow execs never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let started = std::time::Instant::now();
    let (status, error) = agent
        .json(Method::POST, "/v1/exec", json!({"argv": ["true"]}))
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{error}");
    assert_eq!(error["code"], "TooManyRequests");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "429 must not wait for a slot"
    );
    // Health is not counted.
    assert_eq!(agent.get("/healthz").await.0, StatusCode::OK);
    for task in slow {
        assert_eq!(task.await.unwrap()["exitCode"], 0);
    }
    assert_eq!(agent.exec(json!({"argv": ["true"]})).await["exitCode"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_identity_names_the_sandbox_to_later_commands() {
    let agent = Agent::start();
    let echo = json!({"argv": ["/bin/sh", "-c", "printf %s \"${ORCHARD_SANDBOX:-unset}\""]});
    let before = agent.exec(echo.clone()).await;
    let (status, answer) = agent
        .json(Method::PUT, "/v1/identity", json!({"sandbox": "task-7"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["sandbox"], "task-7");
    assert_eq!(agent.exec(echo.clone()).await["stdout"], "task-7");
    assert_ne!(before["stdout"], "task-7");
    let own = json!({"argv": ["/bin/sh", "-c", "printf %s \"$ORCHARD_SANDBOX\""],
                     "env": {"ORCHARD_SANDBOX": "mine"}});
    assert_eq!(
        agent.exec(own).await["stdout"],
        "mine",
        "the request's env wins"
    );
    let (status, process) = agent
        .json(
            Method::POST,
            "/v1/processes",
            json!({"id": "p", "argv": ["/bin/sh", "-c", "test \"$ORCHARD_SANDBOX\" = task-7"]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{process}");
    let (_, done) = agent.get("/v1/processes/p?wait=10").await;
    assert_eq!(done["exitCode"], 0, "background processes too: {done}");
    for bad in [json!({"sandbox": ""}), json!({"sandbox": "a\nb"})] {
        let (status, error) = agent.json(Method::PUT, "/v1/identity", bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {error}");
    }
    let (status, error) = agent
        .json(Method::PUT, "/v1/identity", json!({"name": "x"}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    let response = agent
        .send(
            Method::PUT,
            "/v1/identity",
            full(json!({"sandbox": "x"}).to_string()),
            None,
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

/// Security review L5: the agent listened on IPv4 only, so in IPv6 clusters nothing answered at the
/// Pod IP. `[::]:PORT` (the default) and `:PORT` are now one dual-stack socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_listen_answers_on_ipv4_and_ipv6_loopback() {
    let ipv6_loopback = match std::net::TcpListener::bind("[::1]:0") {
        Ok(_) => true,
        Err(error) => {
            eprintln!("skipping the IPv6 half: this machine has no ::1 ({error})");
            false
        }
    };
    for listen in ["[::]:0", ":0"] {
        let agent = Agent::start_with(AgentOptions {
            args: vec!["--listen".into(), listen.into()],
            ..AgentOptions::default()
        });
        let port = agent.addr.port();
        let mut clients = vec![std::net::SocketAddr::from(([127, 0, 0, 1], port))];
        if ipv6_loopback {
            assert!(agent.addr.is_ipv6(), "--listen {listen}: {}", agent.addr);
            clients.push(std::net::SocketAddr::from((
                std::net::Ipv6Addr::LOCALHOST,
                port,
            )));
        }
        for client in clients {
            let mut connection = crate::common::http_connection(client).await;
            assert_eq!(
                crate::common::healthz_on(&mut connection).await,
                StatusCode::OK,
                "--listen {listen}, GET /healthz at {client}"
            );
        }
    }
}
