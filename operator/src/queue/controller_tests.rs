//! The exact requests one queue loop pass sends, against a scripted API server
//! (`plumbing::mock_api`): a changed status is written once, the next write within
//! `STATUS_INTERVAL` is held back, and a queue that does not exist is never written. The decisions
//! themselves are tabled in `decide_tests.rs`.

use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::plumbing::mock_api::{Expect, TestCaches, cache, scripted};
use crate::queue::decide::STATUS_INTERVAL;
use orchard_api::{AdmissionOrder, RolloutQueue, RolloutQueueSpec};

fn key() -> QueueKey {
    QueueKey {
        namespace: "rl".into(),
        name: "q".into(),
    }
}

fn queue() -> RolloutQueue {
    let mut queue = RolloutQueue::new(
        "q",
        RolloutQueueSpec {
            max_running_trajectories: 4,
            admission: AdmissionOrder::Fifo,
        },
    );
    queue.metadata.namespace = Some("rl".into());
    queue.metadata.uid = Some("uid-q".into());
    queue.metadata.generation = Some(1);
    queue.metadata.resource_version = Some("5".into());
    queue
}

#[tokio::test]
async fn a_changed_status_is_written_once_and_the_next_write_held_back() {
    let q = queue();
    let mut caches = TestCaches::default();
    cache(&mut caches.rollout_queues, q.clone());
    let mut written = q.clone();
    written.metadata.resource_version = Some("6".into());
    let script = scripted(
        &caches,
        vec![
            Expect::new(
                "PATCH",
                "/apis/orchard.dev/v1alpha1/namespaces/rl/rolloutqueues/q/status",
                200,
                serde_json::to_value(&written).expect("json"),
            )
            .body(|patch| {
                assert_eq!(
                    patch.as_array().and_then(|ops| ops.first()),
                    Some(&json!({"op": "test", "path": "/metadata/uid", "value": "uid-q"})),
                    "{patch}"
                );
            }),
        ],
    );
    let ctx = QueueCtx {
        kube: script.kube.clone(),
        book: Arc::default(),
    };
    let mut last_write = BTreeMap::new();
    assert_eq!(pass(&ctx, &key(), &mut last_write).await, None);
    // The cache does not show the write yet: the status still differs, and waits its turn.
    let again = pass(&ctx, &key(), &mut last_write).await;
    assert!(
        again.is_some_and(|after| after > Duration::ZERO && after <= STATUS_INTERVAL),
        "{again:?}"
    );
    script.finish().await;
}

#[tokio::test]
async fn a_queue_that_does_not_exist_is_never_written() {
    let script = scripted(&TestCaches::default(), vec![]);
    let ctx = QueueCtx {
        kube: script.kube.clone(),
        book: Arc::default(),
    };
    let mut last_write = BTreeMap::new();
    assert_eq!(pass(&ctx, &key(), &mut last_write).await, None);
    assert!(last_write.is_empty());
    script.finish().await;
}
