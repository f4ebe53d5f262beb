//! What the watches tell the queues: a queue's slots may have changed when a Sandbox or Pod of a
//! queued trajectory (label `orchard.dev/rollout-queue`) changes or goes, when a group that named
//! the queue is deleted (it leaves the waiting list) or, with a `retry` policy, records an outcome
//! (its unfinished trajectories hold slots: `accounting::retrying`), or when the RolloutQueue itself
//! changes.

use crate::plumbing::cached_pod::CachedPod;
use std::sync::Arc;

use kube::Resource;
use kube::runtime::watcher;

use crate::plumbing::triggers::{Forward, forwarded};
use crate::plumbing::watch::Subscriber;
use crate::queue::admission::queue_of;
use crate::queue::book::{QueueBook, QueueKey};
use orchard_api::{ROLLOUT_QUEUE_LABEL, RolloutGroup, RolloutQueue, Sandbox};

/// The queue a changed or deleted object of a queued trajectory holds a slot of (pure).
fn labelled_queue<K: Resource>(event: &watcher::Event<K>) -> Option<QueueKey> {
    let object = forwarded(event, Forward::AppliedAndDeleted)?;
    let queue = object.meta().labels.as_ref()?.get(ROLLOUT_QUEUE_LABEL)?;
    Some(QueueKey {
        namespace: object.meta().namespace.clone().unwrap_or_default(),
        name: queue.clone(),
    })
}

impl Subscriber<Sandbox> for Arc<QueueBook> {
    fn notify(&mut self, event: &watcher::Event<Sandbox>) {
        if let Some(key) = labelled_queue(event) {
            self.mark_dirty(key);
        }
    }
}

impl Subscriber<CachedPod> for Arc<QueueBook> {
    fn notify(&mut self, event: &watcher::Event<CachedPod>) {
        if let Some(key) = labelled_queue(event) {
            self.mark_dirty(key);
        }
    }
}

impl Subscriber<RolloutGroup> for Arc<QueueBook> {
    fn notify(&mut self, event: &watcher::Event<RolloutGroup>) {
        // A deleted group leaves its queue's waiting list; a retrying group's status says which of
        // its trajectories still hold slots.
        let changed = match event {
            watcher::Event::Delete(group) => Some(group),
            watcher::Event::Apply(group) if group.spec.retry.is_some() => Some(group),
            _ => None,
        };
        if let Some(key) = changed.and_then(queue_of) {
            self.mark_dirty(key);
        }
    }
}

impl Subscriber<RolloutQueue> for Arc<QueueBook> {
    fn notify(&mut self, event: &watcher::Event<RolloutQueue>) {
        if let Some(queue) = forwarded(event, Forward::AppliedAndDeleted) {
            self.mark_dirty(QueueKey {
                namespace: queue.meta().namespace.clone().unwrap_or_default(),
                name: queue.meta().name.clone().unwrap_or_default(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use orchard_api::{RolloutGroupSpec, SandboxSpec};
    use std::collections::BTreeMap;

    fn queued_sandbox(queue: Option<&str>) -> Sandbox {
        let mut s = Sandbox::new("t-0", SandboxSpec::default());
        s.metadata.namespace = Some("ns".into());
        s.metadata.labels = queue.map(|q| BTreeMap::from([(ROLLOUT_QUEUE_LABEL.into(), q.into())]));
        s
    }

    fn dirty(book: &mut Arc<QueueBook>) -> Vec<String> {
        let mut receivers = book.take_receivers().expect("receivers");
        let mut seen = Vec::new();
        while let Ok(key) = receivers.dirty.try_recv() {
            seen.push(key.to_string());
        }
        seen
    }

    #[test]
    fn what_makes_a_queue_look_again() {
        let mut book = Arc::new(QueueBook::default());
        book.notify(&watcher::Event::Apply(queued_sandbox(Some("q"))));
        book.notify(&watcher::Event::Delete(queued_sandbox(Some("q2"))));
        book.notify(&watcher::Event::Apply(queued_sandbox(None)));
        book.notify(&watcher::Event::<Sandbox>::InitDone);
        let mut group = RolloutGroup::new(
            "g",
            serde_json::from_value::<RolloutGroupSpec>(serde_json::json!({
                "groupSize": 2,
                "maxTrajectories": 4,
                "positiveFraction": {"min": 0.5, "max": 0.5},
                "earlyStop": "StrideBoundary",
                "template": {"spec": {"image": "x"}}
            }))
            .unwrap(),
        );
        group.metadata.namespace = Some("ns".into());
        group.spec.queue = Some("q3".into());
        book.notify(&watcher::Event::Apply(group.clone()));
        book.notify(&watcher::Event::Delete(group.clone()));
        group.spec.queue = Some("q4".into());
        group.spec.retry = Some(orchard_api::RetryPolicy {
            max_attempts: 2,
            on_oom: None,
            on_eviction: true,
        });
        book.notify(&watcher::Event::Apply(group));
        let seen = dirty(&mut book);
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert_eq!(seen, ["ns/q", "ns/q2", "ns/q3", "ns/q4"]);
    }
}
