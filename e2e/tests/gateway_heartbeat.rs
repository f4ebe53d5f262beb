//! Heartbeats through the gateway on the local cluster: gateway activity (exec) and explicit
//! `/heartbeat` calls keep a sandbox alive past its heartbeat timeout, while the API writes they cause
//! are coalesced (at most one per sandbox per third of its timeout). Prints the measured numbers.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use orchard_e2e::env::TestEnv;
use orchard_e2e::test_support::gateway::{Caller, sandbox_path};
use orchard_operator::api::{HEARTBEAT_ANNOTATION, Sandbox};
use serde_json::json;

/// Counts the distinct heartbeat annotation values `name` carries while the returned guard lives.
fn count_heartbeat_writes(
    api: Api<Sandbox>,
    name: &str,
) -> (Arc<Mutex<BTreeSet<String>>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let task = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, config).boxed();
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) = event
                    && let Some(value) = s
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(HEARTBEAT_ANNOTATION))
                {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(value.clone());
                }
            }
        })
    };
    (seen, task)
}

/// Calls `exec true` through the gateway with `concurrency` callers for `duration`; returns the calls.
async fn exec_load(
    caller: &Caller,
    ns: &str,
    name: &str,
    concurrency: usize,
    duration: Duration,
) -> usize {
    let deadline = Instant::now() + duration;
    let workers = (0..concurrency).map(|_| {
        let caller = caller.clone();
        let path = sandbox_path(ns, name, "/exec");
        async move {
            let mut calls = 0;
            while Instant::now() < deadline {
                let answer = caller.post(&path, json!({"argv": ["true"]})).await;
                assert_eq!(answer.status, 200, "{answer:?}");
                calls += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            calls
        }
    });
    futures::future::join_all(workers).await.into_iter().sum()
}

#[tokio::test]
async fn gateway_activity_keeps_sandboxes_alive_with_coalesced_writes() {
    let env = TestEnv::shared();
    let ns = env.namespace("gw-beat").await;
    let admin = Caller::user(env, "admin");
    let api: Api<Sandbox> = Api::namespaced(env.client().await, &ns);

    // Timeout 30 s: writes at most every 10 s. Explicit heartbeats and execs for 6 s: one write.
    let slow = admin
        .create_sandbox(
            &ns,
            json!({"name": "slow", "image": "busybox", "heartbeatTimeoutSeconds": 30}),
        )
        .await;
    admin.wait_ready(&ns, &slow).await;
    let (seen, watch) = count_heartbeat_writes(api.clone(), &slow);
    let first = admin
        .post(&sandbox_path(&ns, &slow, "/heartbeat"), json!({}))
        .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.body["written"], true);
    assert_eq!(first.body["heartbeatTimeoutSeconds"], 30);
    let second = admin
        .post(&sandbox_path(&ns, &slow, "/heartbeat"), json!({}))
        .await;
    assert_eq!(second.body["written"], false, "coalesced: {second:?}");
    let mut beats = 2;
    let beat_loop = async {
        let deadline = Instant::now() + Duration::from_secs(6);
        while Instant::now() < deadline {
            let answer = admin
                .post(&sandbox_path(&ns, &slow, "/heartbeat"), json!({}))
                .await;
            assert_eq!(answer.body["written"], false);
            beats += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let (execs, ()) = tokio::join!(
        exec_load(&admin, &ns, &slow, 8, Duration::from_secs(6)),
        beat_loop
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writes = seen.lock().unwrap_or_else(|p| p.into_inner()).len();
    watch.abort();
    println!(
        "heartbeat coalescing, timeout 30 s: {} calls ({execs} exec + {beats} heartbeat) in 6 s -> {writes} API write(s)",
        execs + beats
    );
    assert_eq!(writes, 1, "one write per 10 s interval");

    // Timeout 3 s: writes at most every 1 s; 9 s of exec traffic keeps it alive well past 3 s.
    let fast = admin
        .create_sandbox(
            &ns,
            json!({"name": "fast", "image": "busybox", "heartbeatTimeoutSeconds": 3, "ttlSeconds": 600}),
        )
        .await;
    admin.wait_ready(&ns, &fast).await;
    let (seen, watch) = count_heartbeat_writes(api.clone(), &fast);
    let busy = Duration::from_secs(9);
    let execs = exec_load(&admin, &ns, &fast, 4, busy).await;
    let writes = seen.lock().unwrap_or_else(|p| p.into_inner()).len();
    watch.abort();
    println!(
        "heartbeat coalescing, timeout 3 s: {execs} exec calls in {busy:?} -> {writes} API write(s) (bound {})",
        busy.as_secs() + 1
    );
    assert!(
        writes <= busy.as_secs() as usize + 1,
        "{writes} writes for {execs} calls"
    );
    assert!(
        writes >= 3,
        "activity must keep writing heartbeats ({writes})"
    );
    let alive = admin.get(&sandbox_path(&ns, &fast, "")).await;
    assert_eq!(
        alive.status, 200,
        "alive after 9 s of activity with a 3 s timeout"
    );
    assert_eq!(alive.body["status"]["phase"], "Ready");

    // Silence: it expires within its timeout (plus one coalescing interval).
    let quiet = Instant::now();
    orchard_e2e::wait::deleted(&api, &fast, Duration::from_secs(15)).await;
    println!("expired {:?} after the last activity", quiet.elapsed());

    let metrics = env.operator().metrics().await.expect("metrics");
    let total = orchard_e2e::operator_process::metric_sum(
        &metrics,
        "orchard_gateway_heartbeat_writes_total",
        &[],
    );
    let coalesced = orchard_e2e::operator_process::metric_sum(
        &metrics,
        "orchard_gateway_heartbeats_coalesced_total",
        &[],
    );
    println!("operator metrics: heartbeat writes {total}, coalesced {coalesced}");
    assert!(total >= 4.0 && coalesced > 100.0, "{total} {coalesced}");
    env.delete_namespace(&ns).await;
}
