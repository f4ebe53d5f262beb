//! Heartbeat expiry under load: many sandboxes whose deadlines fall within a few seconds of each
//! other, each deleted at its `expiresAt`: never before it, and each within a bound a user would call
//! broken (10 s late). Prints the lateness distribution; the measurement with the machine's load and
//! several rounds is `make bench-lifecycle` (docs/BENCHMARKS.md).

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use orchard_operator::api::Sandbox;
use orchard_testcluster::env::TestEnv;
use orchard_testcluster::test_support::sandboxes::sandbox;
use serde_json::json;

const SANDBOXES: usize = 100;
/// Later than this after its deadline, a sandbox's expiry is broken (not slow).
const BROKEN_LATENESS: f64 = 10.0;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[tokio::test]
async fn expiry_is_precise_under_load() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("expiry-load").await;
    let api: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    let creates = futures::stream::iter(0..SANDBOXES)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &sandbox(
                        &format!("x{i}"),
                        json!({"image": "busybox", "lifecycle": {"heartbeatTimeoutSeconds": 4}}),
                    ),
                )
                .await
                .expect("create");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>();
    let (_, deadlines_and_deletions) = tokio::join!(creates, async {
        let mut deadlines: HashMap<String, Timestamp> = HashMap::new();
        let mut lateness = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
        while lateness.len() < SANDBOXES {
            let event = tokio::time::timeout_at(deadline, events.next()).await;
            match event {
                Ok(Some(Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)))) => {
                    if let Some(at) = s.status.as_ref().and_then(|st| st.expires_at.as_ref()) {
                        deadlines.insert(s.name_any(), at.0);
                    }
                }
                Ok(Some(Ok(watcher::Event::Delete(s)))) => {
                    let now = Timestamp::now();
                    let due = deadlines
                        .get(&s.name_any())
                        .copied()
                        .expect("deadline seen before deletion");
                    lateness.push(now.duration_since(due).as_secs_f64());
                }
                Ok(Some(_)) => {}
                Ok(None) => panic!("watch ended"),
                Err(_) => panic!(
                    "only {} of {SANDBOXES} sandboxes expired in time",
                    lateness.len()
                ),
            }
        }
        lateness
    });
    let mut lateness = deadlines_and_deletions;
    lateness.sort_by(f64::total_cmp);
    let (p50, p99, max) = (
        percentile(&lateness, 50.0),
        percentile(&lateness, 99.0),
        lateness[lateness.len() - 1],
    );
    let min = lateness[0];
    println!(
        "expiry lateness over {SANDBOXES} sandboxes (deletion seen by a watch - expiresAt): min {min:.3} s, p50 {p50:.3} s, p99 {p99:.3} s, max {max:.3} s"
    );
    // The watch sees a deletion after it happened: seen before its deadline, it was early.
    assert!(
        min >= 0.0,
        "a sandbox was deleted {:.3} s before its deadline",
        -min
    );
    assert!(
        max <= BROKEN_LATENESS,
        "a sandbox was deleted {max:.3} s after its deadline (broken beyond {BROKEN_LATENESS} s)"
    );
    env.delete_namespace(&ns).await;
}
