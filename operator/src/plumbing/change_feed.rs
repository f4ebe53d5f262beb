//! "This object changed" notes, published after the watch cache applied the change, and delivered only
//! to those waiting on that object (the gateway's `/wait` endpoints, a gateway delete waiting for the
//! cache to show it, the start-up wait for the caches to fill). A waiter re-reads the cache when
//! told, so notes that arrive while it is busy collapse into one: nothing is lost, it just re-checks.
//! Publishing never blocks, so it never applies backpressure to the watch.
//!
//! Keyed by object rather than one broadcast to every waiter: with a broadcast, each change woke
//! every waiting request (each wake-up polls that request's whole future) only for it to find the
//! note was about another object. With 500 clients waiting for their sandboxes in `make bench-scale`,
//! those wake-ups were the largest share of the operator's CPU in `perf`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

/// What a subscription has been told: counts since the topic was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    /// Notes naming the object (the watch applied or deleted it).
    named: u64,
    /// Re-lists of its kind (the watch replaced the cache: anything may have changed).
    relisted: u64,
}

/// What happened since a subscriber last looked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The watch applied or deleted the object, and nothing else happened.
    Named,
    /// The cache of its kind was (re-)listed: the object may have changed, appeared or gone without
    /// a note naming it.
    Relisted,
}

/// One object (`name` non-empty), or a whole kind (`namespace` and `name` empty: re-lists only).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Topic {
    kind: String,
    namespace: String,
    name: String,
}

type Topics = HashMap<Topic, watch::Sender<Counts>>;

/// The feed: cloned into every watch that publishes and into the gateway, which subscribes.
#[derive(Clone, Debug, Default)]
pub struct ChangeFeed {
    topics: Arc<Mutex<Topics>>,
}

impl ChangeFeed {
    fn topics(&self) -> MutexGuard<'_, Topics> {
        // A panic while holding the lock leaves the map consistent (every step is one insert,
        // remove or counter bump), so a poisoned lock is used as is.
        self.topics
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Publishes a change of `kind` `namespace/name`, or, without a name, a re-list of `kind` (the
    /// watch's `InitDone`), which concerns every subscriber of that kind. Never blocks; while nobody
    /// waits for anything (the usual case: every watch event comes through here) it costs a check
    /// of an empty map, and otherwise one lookup.
    pub fn publish(&self, kind: &str, namespace: Option<&str>, name: Option<&str>) {
        let topics = self.topics();
        if topics.is_empty() {
            return;
        }
        match name {
            Some(name) => {
                let topic = Topic {
                    kind: kind.to_string(),
                    namespace: namespace.unwrap_or_default().to_string(),
                    name: name.to_string(),
                };
                if let Some(sender) = topics.get(&topic) {
                    sender.send_modify(|counts| counts.named += 1);
                }
            }
            None => {
                for (topic, sender) in topics.iter() {
                    if topic.kind == kind {
                        sender.send_modify(|counts| counts.relisted += 1);
                    }
                }
            }
        }
    }

    /// Notes about `kind` `namespace/name` (and re-lists of `kind`) published from now on.
    pub fn subscribe(&self, kind: &str, namespace: &str, name: &str) -> Subscription {
        self.subscribe_to(Topic {
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }

    /// Re-lists of `kind` published from now on.
    pub fn relists(&self, kind: &str) -> Subscription {
        self.subscribe_to(Topic {
            kind: kind.to_string(),
            namespace: String::new(),
            name: String::new(),
        })
    }

    fn subscribe_to(&self, topic: Topic) -> Subscription {
        let receiver = {
            let mut topics = self.topics();
            topics
                .entry(topic.clone())
                .or_insert_with(|| watch::channel(Counts::default()).0)
                .subscribe()
        };
        let seen = *receiver.borrow();
        Subscription {
            feed: self.clone(),
            topic,
            receiver: Some(receiver),
            seen,
        }
    }

    /// Topics with subscribers (for tests).
    #[cfg(test)]
    fn topic_count(&self) -> usize {
        self.topics().len()
    }
}

/// A subscriber's end; dropping it removes the topic once nobody else follows it.
#[derive(Debug)]
pub struct Subscription {
    feed: ChangeFeed,
    topic: Topic,
    receiver: Option<watch::Receiver<Counts>>,
    seen: Counts,
}

impl Subscription {
    /// Waits until something was published for this topic since the subscription or the last call,
    /// and says what: [`Change::Relisted`] if a re-list was among it, else [`Change::Named`].
    pub async fn next(&mut self) -> Change {
        let Some(receiver) = self.receiver.as_mut() else {
            return std::future::pending().await;
        };
        loop {
            let now = *receiver.borrow_and_update();
            if now != self.seen {
                let change = if now.relisted != self.seen.relisted {
                    Change::Relisted
                } else {
                    Change::Named
                };
                self.seen = now;
                return change;
            }
            // The sender lives in the feed while this receiver exists, so this does not end early;
            // if it ever did, there would be nothing more to wait for.
            if receiver.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut topics = self.feed.topics();
        // Dropped under the lock, so a concurrent subscribe either sees this receiver gone or
        // creates its own entry after the removal.
        drop(self.receiver.take());
        if topics
            .get(&self.topic)
            .is_some_and(|sender| sender.receiver_count() == 0)
        {
            topics.remove(&self.topic);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;

    use super::*;

    /// Whether `subscription` has a note waiting, without waiting for one.
    fn ready(subscription: &mut Subscription) -> Option<Change> {
        subscription.next().now_or_never()
    }

    #[tokio::test]
    async fn a_subscriber_is_told_of_its_own_object_only() {
        let feed = ChangeFeed::default();
        let mut mine = feed.subscribe("Sandbox", "ns", "a");
        let mut other = feed.subscribe("Sandbox", "ns", "b");
        feed.publish("Sandbox", Some("ns"), Some("a"));
        assert_eq!(ready(&mut mine), Some(Change::Named));
        assert_eq!(ready(&mut other), None);
        // Same name, other namespace or kind: not mine.
        feed.publish("Sandbox", Some("other"), Some("a"));
        feed.publish("RolloutGroup", Some("ns"), Some("a"));
        assert_eq!(ready(&mut mine), None);
    }

    #[tokio::test]
    async fn notes_before_the_subscription_are_not_delivered() {
        let feed = ChangeFeed::default();
        let _keeps_the_topic = feed.subscribe("Sandbox", "ns", "a");
        feed.publish("Sandbox", Some("ns"), Some("a"));
        let mut late = feed.subscribe("Sandbox", "ns", "a");
        assert_eq!(ready(&mut late), None);
        feed.publish("Sandbox", Some("ns"), Some("a"));
        assert_eq!(ready(&mut late), Some(Change::Named));
    }

    #[tokio::test]
    async fn notes_while_busy_collapse_into_one_and_a_relist_wins() {
        let feed = ChangeFeed::default();
        let mut waiter = feed.subscribe("Sandbox", "ns", "a");
        feed.publish("Sandbox", Some("ns"), Some("a"));
        feed.publish("Sandbox", Some("ns"), Some("a"));
        assert_eq!(ready(&mut waiter), Some(Change::Named));
        assert_eq!(ready(&mut waiter), None);
        feed.publish("Sandbox", Some("ns"), Some("a"));
        feed.publish("Sandbox", None, None);
        assert_eq!(ready(&mut waiter), Some(Change::Relisted));
        assert_eq!(ready(&mut waiter), None);
    }

    #[tokio::test]
    async fn a_relist_reaches_every_subscriber_of_its_kind() {
        let feed = ChangeFeed::default();
        let mut object = feed.subscribe("Sandbox", "ns", "a");
        let mut kind = feed.relists("Sandbox");
        let mut groups = feed.relists("RolloutGroup");
        feed.publish("Sandbox", None, None);
        assert_eq!(ready(&mut object), Some(Change::Relisted));
        assert_eq!(ready(&mut kind), Some(Change::Relisted));
        assert_eq!(ready(&mut groups), None);
    }

    #[tokio::test]
    async fn a_waiting_subscriber_wakes_when_its_object_changes() {
        let feed = ChangeFeed::default();
        let mut waiter = feed.subscribe("Sandbox", "ns", "a");
        let publisher = feed.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            publisher.publish("Sandbox", Some("ns"), Some("b"));
            publisher.publish("Sandbox", Some("ns"), Some("a"));
        });
        let change = tokio::time::timeout(Duration::from_secs(5), waiter.next()).await;
        assert_eq!(change, Ok(Change::Named));
    }

    #[tokio::test]
    async fn a_topic_ends_with_its_last_subscriber() {
        let feed = ChangeFeed::default();
        let first = feed.subscribe("Sandbox", "ns", "a");
        let second = feed.subscribe("Sandbox", "ns", "a");
        let kind = feed.relists("Sandbox");
        assert_eq!(feed.topic_count(), 2);
        drop(first);
        assert_eq!(feed.topic_count(), 2);
        drop(second);
        drop(kind);
        assert_eq!(feed.topic_count(), 0);
        // Nobody listens: publishing is a lookup that finds nothing.
        feed.publish("Sandbox", Some("ns"), Some("a"));
        feed.publish("Sandbox", None, None);
        assert_eq!(feed.topic_count(), 0);
    }
}
