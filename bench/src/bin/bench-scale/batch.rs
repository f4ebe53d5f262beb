//! One sandbox's lifecycle through the gateway (create -> Ready -> execs -> delete), timed step by
//! step, and the batch of them with bounded concurrency; the local node's agent processes.

use std::time::Instant;

use orchard_testcluster::supervise::processes_with_env;
use serde_json::{Value, json};

#[derive(Default)]
pub(crate) struct Outcome {
    pub(crate) ok: bool,
    pub(crate) error: Option<String>,
    pub(crate) create_ms: f64,
    pub(crate) ready_ms: f64,
    pub(crate) exec_ms: Vec<f64>,
    pub(crate) delete_ms: f64,
}

/// Sends `request` and reads a successful answer's JSON body (`Null` when there is none); any
/// other answer or a transport error is the failure message of `step`, with the error's causes and
/// how long after sending it came.
pub(crate) async fn send_ok(request: reqwest::RequestBuilder, step: &str) -> Result<Value, String> {
    let sent = Instant::now();
    match request.send().await {
        Ok(r) if r.status().is_success() => Ok(r.json().await.unwrap_or(Value::Null)),
        Ok(r) => Err(format!(
            "{step}: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        )),
        Err(e) => Err(format!(
            "{step}: {} (after {:.1} s)",
            orchard_testcluster::with_causes(&e),
            sent.elapsed().as_secs_f64()
        )),
    }
}

pub(crate) async fn lifecycle(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    name: String,
    image: &str,
    execs: usize,
) -> Outcome {
    let mut out = Outcome::default();
    if let Err(error) = run_lifecycle(http, base, token, &name, image, execs, &mut out).await {
        out.error = Some(error);
        // Leave nothing behind for the next round (the failure is counted already).
        let _ = http
            .delete(format!("{base}/v1/namespaces/default/sandboxes/{name}"))
            .bearer_auth(token)
            .send()
            .await;
    } else {
        out.ok = true;
    }
    out
}

pub(crate) async fn run_lifecycle(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    name: &str,
    image: &str,
    execs: usize,
    out: &mut Outcome,
) -> Result<(), String> {
    let sandboxes = format!("{base}/v1/namespaces/default/sandboxes");
    let started = Instant::now();
    send_ok(
        http.post(&sandboxes)
            .bearer_auth(token)
            .json(&json!({"name": name, "image": image})),
        "create",
    )
    .await?;
    out.create_ms = started.elapsed().as_secs_f64() * 1e3;
    let body = send_ok(
        http.get(format!("{sandboxes}/{name}/wait?timeoutSeconds=300"))
            .bearer_auth(token),
        "wait",
    )
    .await?;
    let phase = body
        .pointer("/status/phase")
        .or_else(|| body.get("phase"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if phase != "Ready" {
        return Err(format!("wait: phase {phase:?}: {body}"));
    }
    out.ready_ms = started.elapsed().as_secs_f64() * 1e3;
    for i in 0..execs {
        let t = Instant::now();
        let request =
            json!({"argv": ["/bin/sh", "-c", format!("echo step {i} of $ORCHARD_SANDBOX")]});
        let body = send_ok(
            http.post(format!("{sandboxes}/{name}/exec"))
                .bearer_auth(token)
                .json(&request),
            "exec",
        )
        .await?;
        if body.get("exitCode").and_then(Value::as_i64) != Some(0) {
            return Err(format!("exec: {body}"));
        }
        out.exec_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let t = Instant::now();
    send_ok(
        http.delete(format!("{sandboxes}/{name}"))
            .bearer_auth(token),
        "delete",
    )
    .await?;
    out.delete_ms = t.elapsed().as_secs_f64() * 1e3;
    Ok(())
}

pub(crate) fn agent_pids() -> Vec<u32> {
    // The local node marks each pod's agent process (and only it keeps the marker with this value
    // shape); commands inherit it too, so keep processes whose executable is the agent.
    processes_with_env("ORCHARD_E2E_AGENT", None)
        .into_iter()
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .map(|p| p.to_string_lossy().ends_with("orchard-agent"))
                .unwrap_or(false)
        })
        .collect()
}
