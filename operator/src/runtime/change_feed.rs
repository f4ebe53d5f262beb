//! A lossy broadcast of "this object changed" notes, published after the watch cache applied the
//! change. Waiters (the gateway's `/wait` endpoints) re-read the cache when notified, so a lagging
//! receiver loses nothing: it just re-checks. Unlike a reflector subscription it never applies
//! backpressure to the watch.

use tokio::sync::broadcast;

/// Which object changed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Changed {
    /// `Sandbox` or `RolloutGroup`.
    pub kind: &'static str,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// Sender side, cloned into every watch that publishes.
#[derive(Clone, Debug)]
pub struct ChangeFeed {
    sender: broadcast::Sender<Changed>,
}

impl Default for ChangeFeed {
    fn default() -> Self {
        Self::new(4096)
    }
}

impl ChangeFeed {
    /// A feed keeping the last `capacity` notes for slow receivers.
    pub fn new(capacity: usize) -> Self {
        let (sender, _) = broadcast::channel(capacity);
        Self { sender }
    }

    /// Publishes a change (never blocks; without receivers the note is dropped).
    pub fn publish(&self, kind: &'static str, namespace: Option<&str>, name: Option<&str>) {
        if self.sender.receiver_count() == 0 {
            return;
        }
        let _ = self.sender.send(Changed {
            kind,
            namespace: namespace.unwrap_or_default().to_string(),
            name: name.unwrap_or_default().to_string(),
        });
    }

    /// A new receiver of every note published from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Changed> {
        self.sender.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn receivers_see_changes_published_after_they_subscribed() {
        let feed = ChangeFeed::new(4);
        feed.publish("Sandbox", Some("ns"), Some("before"));
        let mut rx = feed.subscribe();
        feed.publish("Sandbox", Some("ns"), Some("after"));
        let got = rx.recv().await.unwrap();
        assert_eq!(got.name, "after");
        assert_eq!(got.kind, "Sandbox");
    }
}
