//! The network-policy gate on the real binary: with `--egress-canary`, the agent serves nothing and
//! holds the startup command back while the canary accepts connections, and serves everything once it
//! refuses them (the enforcer has programmed the sandbox's rules).

use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde_json::json;

use crate::common::{Agent, AgentOptions, full};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_served_and_nothing_started_until_the_canary_is_denied() {
    // The canary: accepts and drops connections, as the API server does with one that sends nothing.
    let canary = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("canary");
    let address = canary.local_addr().expect("canary address");
    let server = tokio::spawn(async move {
        loop {
            if let Ok((stream, _)) = canary.accept().await {
                drop(stream);
            }
        }
    });
    let agent = Agent::start_with(AgentOptions {
        args: vec![format!("--egress-canary={address}")],
        env: vec![(
            "ORCHARD_AGENT_STARTUP".into(),
            r#"{"command": "echo started > started"}"#.into(),
        )],
        ..AgentOptions::default()
    });
    let marker = agent.root.path().join("started");

    let asked = Instant::now();
    let (status, health) = agent.get("/healthz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{health}");
    assert_eq!(health["code"], "Unavailable", "{health}");
    assert!(
        asked.elapsed() >= Duration::from_millis(500),
        "/healthz waits for the gate before refusing"
    );
    let (status, refused) = agent
        .json(Method::POST, "/v1/exec", json!({"argv": ["true"]}))
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(message.contains("NetworkPolicies"), "{refused}");
    // A wrong token is still told so first.
    let anonymous = agent
        .send(Method::GET, "/v1/processes", full(Bytes::new()), None)
        .await;
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert!(
        !marker.exists(),
        "the startup command ran before the gate opened"
    );

    // The enforcer arrives: connections to the canary are refused from now on.
    server.abort();
    let _ = server.await;
    let opened = Instant::now();
    let (status, health) = agent.get("/healthz").await;
    assert_eq!(status, StatusCode::OK, "{health}");
    assert!(
        opened.elapsed() < Duration::from_secs(5),
        "/healthz answered 200 {:?} after the canary closed",
        opened.elapsed()
    );
    let out = agent.exec(json!({"argv": ["echo", "served"]})).await;
    assert_eq!(out["stdout"], "served\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "the startup command never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        agent
            .logs
            .lock()
            .unwrap()
            .iter()
            .any(|line| line.contains("network policy enforced")),
        "the agent logs when it starts serving"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_that_is_not_literal_is_refused_at_start() {
    let output = std::process::Command::new(crate::common::agent_binary())
        .args([
            "serve",
            "--insecure-no-auth",
            "--egress-canary",
            "kubernetes:443",
        ])
        .output()
        .expect("run the agent");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`kubernetes:443`"), "{stderr}");
}
