//! Heartbeat and TTL expiry on the local cluster: the operator deletes a sandbox at its deadline
//! (requeued exactly then, no sweep), and a heartbeat annotation postpones it.
//!
//! The bounds are correctness, not speed: never deleted before its deadline (a watch sees the
//! deletion after it happened, so one seen before the deadline was early) and deleted within
//! [`BROKEN_LATENESS`] of it. How late expiry is on this machine is measured by `make
//! bench-lifecycle` (docs/BENCHMARKS.md).

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::sandboxes::{is_ready, sandbox};
use orchard_testcluster::wait;
use serde_json::json;

/// Later than this after its deadline, expiry is broken (not slow).
const BROKEN_LATENESS: f64 = 10.0;

/// Asserts `lateness` (seconds from the deadline to the deletion a watch saw) is within the
/// correctness bounds: not before the deadline, not [`BROKEN_LATENESS`] after it.
fn assert_deleted_at_deadline(what: &str, lateness: f64) {
    assert!(
        lateness >= 0.0,
        "{what}: deleted {:.3} s before its deadline",
        -lateness
    );
    assert!(
        lateness <= BROKEN_LATENESS,
        "{what}: deleted {lateness:.3} s after its deadline (broken beyond {BROKEN_LATENESS} s)"
    );
}

/// Waits for the deletion of `name` and returns when the watch saw it.
async fn deletion_time(api: &Api<Sandbox>, name: &str, timeout: Duration) -> Timestamp {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api.clone(), config).boxed();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let next = tokio::time::timeout_at(deadline, events.next()).await;
        match next {
            Ok(Some(Ok(watcher::Event::Delete(_)))) => return Timestamp::now(),
            Ok(Some(Ok(watcher::Event::InitDone))) => {
                if api.get_opt(name).await.ok().flatten().is_none() {
                    return Timestamp::now();
                }
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("watch ended"),
            Err(_) => panic!("{name} was not deleted within {timeout:?}"),
        }
    }
}

fn expires_at(s: &Sandbox) -> Timestamp {
    s.status
        .as_ref()
        .and_then(|st| st.expires_at.as_ref())
        .expect("expiresAt set")
        .0
}

#[tokio::test]
async fn a_silent_sandbox_is_deleted_at_its_heartbeat_deadline() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("heartbeat").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &sandbox(
            "quiet",
            json!({"image": "busybox", "lifecycle": {"heartbeatTimeoutSeconds": 3}}),
        ),
    )
    .await
    .expect("create");
    let ready = wait::until(&api, "quiet", "Ready", Duration::from_secs(60), is_ready).await;
    let deadline = expires_at(&ready);
    let ready_time = ready
        .status
        .as_ref()
        .and_then(|s| s.ready_time.as_ref())
        .expect("readyTime")
        .0;
    assert_eq!(
        deadline.duration_since(ready_time).as_secs(),
        3,
        "deadline = readyTime + 3 s"
    );
    let deleted = deletion_time(&api, "quiet", Duration::from_secs(30)).await;
    let lateness = deleted.duration_since(deadline).as_secs_f64();
    println!("heartbeat expiry lateness: {lateness:.3} s");
    assert_deleted_at_deadline("heartbeat deadline", lateness);
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn a_heartbeat_annotation_postpones_expiry() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("postpone").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &sandbox(
            "kept",
            json!({"image": "busybox", "lifecycle": {"heartbeatTimeoutSeconds": 5}}),
        ),
    )
    .await
    .expect("create");
    let ready = wait::until(&api, "kept", "Ready", Duration::from_secs(60), is_ready).await;
    let first_deadline = expires_at(&ready);
    // Beat three times, two seconds apart: each beat moves the deadline to beat + 5 s. (The first
    // beat is 2 s after the test saw Ready: the 5 s timeout leaves 3 s for the watch to be late under
    // the load of the whole suite; by the last beat the first deadline has passed.)
    let mut beat = Timestamp::now();
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        beat = Timestamp::now();
        let patch =
            json!({"metadata": {"annotations": {"orchard.dev/heartbeat": beat.to_string()}}});
        api.patch("kept", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("annotate");
    }
    let expected = beat.as_second() + 5 + i64::from(beat.subsec_nanosecond() > 0);
    let moved = wait::until(
        &api,
        "kept",
        "deadline = last heartbeat (rounded up) + 5 s",
        Duration::from_secs(10),
        move |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref()?.expires_at.as_ref())
                .is_some_and(|t| t.0.as_second() == expected)
        },
    )
    .await;
    let new_deadline = expires_at(&moved);
    assert!(new_deadline > first_deadline);
    // The first deadline has passed (three beats of 2 s against a 5 s timeout): the sandbox is still
    // there, because it kept beating.
    assert!(Timestamp::now() > first_deadline);
    let still = api.get_opt("kept").await.expect("get");
    assert_eq!(
        still.and_then(|s| s.metadata.uid),
        moved.metadata.uid,
        "the sandbox was deleted at its first deadline though it kept beating"
    );
    let deleted = deletion_time(&api, "kept", Duration::from_secs(30)).await;
    let lateness = deleted.duration_since(new_deadline).as_secs_f64();
    assert_deleted_at_deadline("postponed heartbeat deadline", lateness);
    env.delete_namespace(&ns).await;
}

#[tokio::test]
async fn ttl_deletes_even_a_beating_sandbox() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("ttl").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &sandbox("short", json!({"image": "busybox", "lifecycle": {"ttlSeconds": 4, "heartbeatTimeoutSeconds": 3}})))
        .await
        .expect("create");
    let ready = wait::until(&api, "short", "Ready", Duration::from_secs(60), is_ready).await;
    let ready_time = ready
        .status
        .as_ref()
        .and_then(|s| s.ready_time.as_ref())
        .expect("readyTime")
        .0;
    let beater = {
        let api = api.clone();
        tokio::spawn(async move {
            loop {
                let patch = json!({"metadata": {"annotations": {"orchard.dev/heartbeat": Timestamp::now().to_string()}}});
                if api
                    .patch("short", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
        })
    };
    let deleted = deletion_time(&api, "short", Duration::from_secs(30)).await;
    beater.abort();
    // readyTime + 4 s is the TTL deadline; the beats every 700 ms keep the 3 s heartbeat deadline
    // ahead of it all along, so only the TTL can end the sandbox.
    let age = deleted.duration_since(ready_time).as_secs_f64();
    println!("deleted {age:.3} s after Ready (TTL 4 s)");
    assert_deleted_at_deadline("TTL deadline", age - 4.0);
    env.delete_namespace(&ns).await;
}
