//! Heartbeats through the gateway on the local cluster: gateway activity (exec) and explicit
//! `/heartbeat` calls keep a sandbox alive past its heartbeat timeout, while the API writes they cause
//! are coalesced (at most one per sandbox per third of its timeout). Prints the measured numbers.
//!
//! The writes are counted without timing the machine: every call through the gateway either reserves
//! a write or is counted as coalesced (`orchard_gateway_heartbeats_coalesced_total`) before it is
//! answered, so once the calls returned, calls minus coalesced is exactly the writes reserved; the
//! test then waits for those writes to land (`orchard_gateway_heartbeat_writes_total`, a watch of the
//! annotation) instead of sleeping.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use orchard_operator::api::{HEARTBEAT_ANNOTATION, Sandbox};
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::operator_process::{OperatorProcess, metric_sum};
use orchard_testcluster::test_support::gateway::{Caller, sandbox_path};
use orchard_testcluster::wait;
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

/// The gateway's heartbeat counters: (writes sent, heartbeats coalesced).
async fn heartbeat_counters(operator: &OperatorProcess) -> (f64, f64) {
    let metrics = operator.metrics().await.expect("metrics");
    (
        metric_sum(&metrics, "orchard_gateway_heartbeat_writes_total", &[]),
        metric_sum(&metrics, "orchard_gateway_heartbeats_coalesced_total", &[]),
    )
}

/// Of `calls` gateway calls made since `before` was read, how many reserved a heartbeat write (the
/// rest were counted as coalesced before they were answered); then waits until that many writes have
/// been sent (a reserved write lands in the background) and `seen` holds at least that many
/// annotation values.
async fn reserved_writes(
    operator: &OperatorProcess,
    before: (f64, f64),
    calls: usize,
    seen: &Mutex<BTreeSet<String>>,
) -> usize {
    let (_, coalesced) = heartbeat_counters(operator).await;
    let reserved = calls as f64 - (coalesced - before.1);
    assert!(
        reserved >= 0.0 && reserved.fract() == 0.0,
        "{calls} calls, {} coalesced",
        coalesced - before.1
    );
    wait::poll(
        "the reserved heartbeat writes sent and seen",
        Duration::from_secs(15),
        || async {
            let (writes, _) = heartbeat_counters(operator).await;
            let watched = seen.lock().unwrap_or_else(|p| p.into_inner()).len();
            (writes - before.0 >= reserved && watched as f64 >= reserved).then_some(())
        },
    )
    .await;
    let (writes, _) = heartbeat_counters(operator).await;
    assert_eq!(
        writes - before.0,
        reserved,
        "every reserved write sent, once"
    );
    reserved as usize
}

#[tokio::test]
async fn gateway_activity_keeps_sandboxes_alive_with_coalesced_writes() {
    let env = TestEnv::shared();
    let operator = env.operator();
    let ns = env.namespace("gw-beat").await;
    let admin = Caller::user(env, "admin");
    let api: Api<Sandbox> = Api::namespaced(env.client().await, &ns);

    // Timeout 60 s: writes at most every 20 s. Explicit heartbeats and execs for 6 s: one write.
    let interval = Duration::from_secs(20);
    let slow = admin
        .create_sandbox(
            &ns,
            json!({"name": "slow", "image": "busybox", "heartbeatTimeoutSeconds": 60}),
        )
        .await;
    admin.wait_ready(&ns, &slow).await;
    let (seen, watch) = count_heartbeat_writes(api.clone(), &slow);
    let before = heartbeat_counters(operator).await;
    let started = Instant::now();
    let first = admin
        .post(&sandbox_path(&ns, &slow, "/heartbeat"), json!({}))
        .await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.body["written"], true);
    assert_eq!(first.body["heartbeatTimeoutSeconds"], 60);
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
    let traffic = started.elapsed();
    // What "one write" means: every call came within one write interval of the first.
    assert!(
        traffic < interval,
        "the calls took {traffic:?}, more than one write interval ({interval:?}): this check needs them within one"
    );
    let writes = reserved_writes(operator, before, execs + beats, &seen).await;
    let values = seen.lock().unwrap_or_else(|p| p.into_inner()).len();
    watch.abort();
    println!(
        "heartbeat coalescing, timeout 60 s: {} calls ({execs} exec + {beats} heartbeat) in {traffic:?} -> {writes} API write(s)",
        execs + beats
    );
    assert_eq!(writes, 1, "one write per 20 s interval");
    assert_eq!(values, 1, "one heartbeat annotation written");

    // Timeout 3 s: writes at most every 1 s; 9 s of exec traffic keeps it alive well past 3 s.
    let interval = Duration::from_secs(1);
    let fast = admin
        .create_sandbox(
            &ns,
            json!({"name": "fast", "image": "busybox", "heartbeatTimeoutSeconds": 3, "ttlSeconds": 600}),
        )
        .await;
    admin.wait_ready(&ns, &fast).await;
    let (seen, watch) = count_heartbeat_writes(api.clone(), &fast);
    let before = heartbeat_counters(operator).await;
    let started = Instant::now();
    let execs = exec_load(&admin, &ns, &fast, 4, Duration::from_secs(9)).await;
    let busy = started.elapsed();
    let writes = reserved_writes(operator, before, execs, &seen).await;
    watch.abort();
    // At most one write per interval: one at the first call, then one per whole interval passed.
    let bound = (busy.as_secs_f64() / interval.as_secs_f64()).floor() as usize + 1;
    println!(
        "heartbeat coalescing, timeout 3 s: {execs} exec calls in {busy:?} -> {writes} API write(s) (bound {bound})"
    );
    assert!(writes <= bound, "{writes} writes for {execs} calls");
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
    orchard_testcluster::wait::deleted(&api, &fast, Duration::from_secs(15)).await;
    println!("expired {:?} after the last activity", quiet.elapsed());
    env.delete_namespace(&ns).await;
}
